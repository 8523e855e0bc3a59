"""Figures like the papers': learning curves, per-client distributions, partitions, t-SNE.

Every figure is written as PNG (for the docs) and PDF (for papers) by `save_figure`, with
labelled axes and a legend that reads without the text. matplotlib runs headless (Agg).

```
curves.py      report --plot: learning curves with 95 % bands over seeds, per-client
               distributions, personalization against generalization
partition.py   partition --plot: the clients x classes heat map (and domains)
embed.py       embed RUN: t-SNE of embeddings and of class prototypes across rounds
```
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from protofed.core.files import atomic_write, check_writable
from protofed.errors import ConfigError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FORMATS = ("png", "pdf")
DPI = 150


def new_figure(width: float = 6.4, height: float = 4.2, **subplots) -> tuple[Figure, object]:
    """A figure and its axes, on the headless backend, in the house style."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    with plt.style.context("default"):
        fig, axes = plt.subplots(figsize=(width, height), **subplots)
    return fig, axes


def figure_paths(prefix: str | Path) -> list[Path]:
    """The files `save_figure(fig, prefix)` writes: PREFIX.png and PREFIX.pdf."""
    prefix = Path(prefix)
    return [prefix.with_name(f"{prefix.name}.{fmt}") for fmt in FORMATS]


def save_figure(fig: Figure, prefix: str | Path) -> list[Path]:
    """Write `prefix`.png and `prefix`.pdf atomically, close the figure, return the paths.

    Both places are probed first: a PDF path that is a folder must not leave a new PNG
    beside an old PDF."""
    import matplotlib.pyplot as plt

    paths = figure_paths(prefix)
    try:
        for path in paths:
            check_writable(path)
    except ConfigError:
        plt.close(fig)  # refused: not left open in a notebook's session
        raise
    if fig.get_layout_engine() is None:  # a constrained layout (legends outside) stays
        fig.tight_layout()
    for path, fmt in zip(paths, FORMATS, strict=True):
        atomic_write(path, lambda h, fmt=fmt: fig.savefig(h, format=fmt, dpi=DPI))
    plt.close(fig)
    return paths
