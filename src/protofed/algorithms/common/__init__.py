"""Mechanics shared by several algorithms: aggregation, body/head split, ALA, regularizers,
prototype losses, decoupled training. Each lives here once; algorithms compose them."""
