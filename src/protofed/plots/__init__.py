"""Figures like the papers': learning curves, per-client distributions, partitions, t-SNE.

Every figure is written as PNG (for the docs) and PDF (for papers) by `save_figure`, with
labelled axes and a legend that reads without the text. matplotlib runs headless (Agg).

A style (`STYLES`: `screen`, `paper`, `paper-wide`) sets the figure's width and its fonts
through `style_context`, an rc context: matplotlib's global rcParams are never changed.
`paper` is one column of a two-column paper (3.3 in wide), `paper-wide` the full text width
(7 in); both use 8 pt text, 9 pt titles and TrueType (Type 42) fonts in the PDF, which
publishers' checks accept (Type 3 fonts are refused by some); the PNG is written at 300 dpi.
Every figure function takes `style=` and `title=` (None: its default, "": none; `set_title`),
and lays its legend out with `legend_below` where a paper style puts it under the axes.

```
curves.py      report --plot: learning curves with 95 % bands over seeds, per-client
               distributions, personalization against generalization
partition.py   partition --plot: the clients x classes heat map (and domains)
embed.py       embed RUN: t-SNE of embeddings and of class prototypes across rounds
```
"""

from __future__ import annotations

import contextlib
import functools
import textwrap
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from protofed.core.files import atomic_write, check_writable
from protofed.errors import ConfigError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS = ("png", "pdf")
DPI = 150


@dataclass(frozen=True)
class Style:
    """How big a figure is and how its text looks: `width` in inches (None: each figure's
    own screen size), `rc` the matplotlib settings applied while it is drawn and saved."""

    name: str
    width: float | None
    dpi: int
    rc: dict[str, Any] = field(default_factory=dict)

    @property
    def paper(self) -> bool:
        return self.width is not None


_PRINT_RC: dict[str, Any] = {
    "font.size": 8,
    "axes.titlesize": 9,
    "axes.labelsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "figure.titlesize": 9,
    "lines.linewidth": 1.2,
    "lines.markersize": 3,
    "axes.linewidth": 0.6,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
}
STYLES: dict[str, Style] = {
    "screen": Style("screen", None, DPI),
    "paper": Style("paper", 3.3, 300, _PRINT_RC),
    "paper-wide": Style("paper-wide", 7.0, 300, _PRINT_RC),
}
_STYLE_OF: weakref.WeakKeyDictionary[Figure, Style] = weakref.WeakKeyDictionary()


def get_style(style: str | Style = "screen") -> Style:
    """A style by name (`screen`, `paper`, `paper-wide`); a ConfigError names the others."""
    if isinstance(style, Style):
        return style
    if style not in STYLES:
        raise ConfigError(f"unknown style '{style}' (known: {', '.join(STYLES)})")
    return STYLES[style]


@contextlib.contextmanager
def style_context(style: str | Style = "screen") -> Iterator[Style]:
    """matplotlib's default style with `style`'s settings, for the duration of the block."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    chosen = get_style(style)
    with plt.style.context("default"), plt.rc_context(cast(Any, chosen.rc)):
        yield chosen


def mark_style(fig: Figure, style: str | Style) -> None:
    """Remember the style `fig` was drawn in: `save_figure` saves it in the same one."""
    _STYLE_OF[fig] = get_style(style)


def style_of(fig: Figure) -> Style:
    """The style `fig` was drawn in (`screen` for a figure drawn elsewhere)."""
    return _STYLE_OF.get(fig, STYLES["screen"])


def new_figure(
    width: float = 6.4,
    height: float = 4.2,
    *,
    layout: str | None = None,
    style: str | Style = "screen",
) -> tuple[Figure, Axes]:
    """A figure with one axes, on the headless backend, in the house style."""
    fig, axes = new_grid(width, height, 1, 1, layout=layout, style=style)
    return fig, axes[0]


def new_grid(
    width: float,
    height: float,
    rows: int,
    cols: int,
    *,
    layout: str | None = None,
    style: str | Style = "screen",
) -> tuple[Figure, list[Axes]]:
    """A figure and its rows x cols axes, row by row, on the headless backend, in the house
    style and `style`'s fonts (draw the rest inside `style_context(style)` too). `layout` is
    matplotlib's ("constrained" keeps legends outside the axes)."""
    import matplotlib.pyplot as plt

    with style_context(style):
        fig, grid = plt.subplots(rows, cols, figsize=(width, height), squeeze=False, layout=layout)
    mark_style(fig, style)
    axes: list[Axes] = list(grid.ravel())
    return fig, axes


def chars_across(width_in: float, fontsize: float) -> int:
    """About how many characters of `fontsize` pt text fit `width_in` inches."""
    return int(width_in * 72 / (fontsize * 0.62))


def wrap_text(text: str, width_in: float, fontsize: float) -> str:
    """`text` with each of its lines wrapped to fit `width_in` inches of `fontsize` pt."""
    fits = max(10, chars_across(width_in, fontsize))
    return "\n".join(textwrap.fill(line, fits) for line in text.split("\n"))


def set_title(obj: Figure | Axes, title: str | None, default: str) -> None:
    """`title` None: the default title; "": none; else `title`."""
    from matplotlib.figure import Figure as MplFigure

    text = default if title is None else title
    if not text:
        return
    if isinstance(obj, MplFigure):
        obj.suptitle(text)
    else:
        obj.set_title(text)


def legend_columns(width_in: float, labels: Sequence[str], fontsize: float) -> int:
    """As many legend columns as fit `width_in` inches of `fontsize` pt text."""
    longest = max((len(x) for x in labels), default=1) + 6
    return max(1, min(len(labels), chars_across(width_in, fontsize) // longest))


def legend_below(fig: Figure, handles: list[Any], labels: list[str]) -> None:
    """One legend for the figure, under the axes (never over the data), in as many columns
    as fit the figure's width (a figure with a constrained layout)."""
    import matplotlib as mpl

    size = float(mpl.rcParams["legend.fontsize"]) if style_of(fig).paper else 8.0
    ncols = legend_columns(fig.get_figwidth(), labels, size)
    fig.legend(
        handles, labels, loc="outside lower center", ncols=ncols, fontsize=size, frameon=False
    )


def figure_paths(prefix: str | Path) -> list[Path]:
    """The files `save_figure(fig, prefix)` writes: PREFIX.png and PREFIX.pdf."""
    prefix = Path(prefix)
    return [prefix.with_name(f"{prefix.name}.{fmt}") for fmt in FORMATS]


def _save_as(fig: Figure, fmt: str, dpi: int, handle: BinaryIO) -> None:
    fig.savefig(handle, format=fmt, dpi=dpi)


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
    style = style_of(fig)
    with style_context(style):  # the PDF's font type is read when it is written
        if fig.get_layout_engine() is None:  # a constrained layout (legends outside) stays
            fig.tight_layout()
        for path, fmt in zip(paths, FORMATS, strict=True):
            atomic_write(path, functools.partial(_save_as, fig, fmt, style.dpi))
    plt.close(fig)
    return paths
