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

import functools
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from protofed.core.files import atomic_write, check_writable
from protofed.errors import ConfigError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS = ("png", "pdf")
DPI = 150


def new_figure(
    width: float = 6.4, height: float = 4.2, *, layout: str | None = None
) -> tuple[Figure, Axes]:
    """A figure with one axes, on the headless backend, in the house style."""
    fig, axes = new_grid(width, height, 1, 1, layout=layout)
    return fig, axes[0]


def new_grid(
    width: float, height: float, rows: int, cols: int, *, layout: str | None = None
) -> tuple[Figure, list[Axes]]:
    """A figure and its rows x cols axes, row by row, on the headless backend, in the house
    style. `layout` is matplotlib's ("constrained" keeps legends outside the axes)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    with plt.style.context("default"):
        fig, grid = plt.subplots(rows, cols, figsize=(width, height), squeeze=False, layout=layout)
    axes: list[Axes] = list(grid.ravel())
    return fig, axes


def figure_paths(prefix: str | Path) -> list[Path]:
    """The files `save_figure(fig, prefix)` writes: PREFIX.png and PREFIX.pdf."""
    prefix = Path(prefix)
    return [prefix.with_name(f"{prefix.name}.{fmt}") for fmt in FORMATS]


def _save_as(fig: Figure, fmt: str, handle: BinaryIO) -> None:
    fig.savefig(handle, format=fmt, dpi=DPI)


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
        atomic_write(path, functools.partial(_save_as, fig, fmt))
    plt.close(fig)
    return paths
