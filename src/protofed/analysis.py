"""The public analysis API: run directories into tables, statistics and figures.

What `protofed report` and its `--plot`, `--compare` and `--cd` options do, as functions
(docs/reporting.md, docs/figures.md; the names are stable: docs/python-api.md):

    from protofed.analysis import collect, group_runs, summarize, to_markdown

    groups = group_runs(collect(["runs/fedali_hhar"], "final"))
    print(to_markdown(summarize(groups), "final"))

Everything here is a re-export of protofed's own functions (report.py, plots/); nothing
inside protofed imports this module (it sits in the top layer, docs/architecture.md).
"""

from __future__ import annotations

from protofed.data import FederatedData, build_federated
from protofed.plots import save_figure
from protofed.plots.cd import cd_diagram
from protofed.plots.curves import (
    PANELS,
    caption,
    client_distributions,
    figures,
    learning_curves,
    pers_vs_gen,
    write_figures,
)
from protofed.plots.embed import embedding_figure, prototype_figure
from protofed.plots.heatmap import partition_figure
from protofed.report import (
    Group,
    PairedComparison,
    RankTable,
    collect,
    group_runs,
    paired_comparison,
    rank_table,
    relabel,
    summarize,
    table_labels,
    to_csv,
    to_markdown,
)

__all__ = [
    # tables (report.py)
    "Group",
    "collect",
    "group_runs",
    "relabel",
    "summarize",
    "table_labels",
    "to_csv",
    "to_markdown",
    # seed statistics
    "PairedComparison",
    "RankTable",
    "paired_comparison",
    "rank_table",
    # figures (plots/)
    "PANELS",
    "caption",
    "cd_diagram",
    "client_distributions",
    "embedding_figure",
    "figures",
    "learning_curves",
    "partition_figure",
    "pers_vs_gen",
    "prototype_figure",
    "save_figure",
    "write_figures",
    # a partition without a run, for `partition_figure`
    "FederatedData",
    "build_federated",
]
