"""`protofed partition --plot`: the clients x classes heat map of a partition.

The papers show their partitions as such maps (the Dirichlet bubbles of FedProto and PFLlib,
PFPL's mixed domains): one row per client, one column per class, the cell's colour its
sample count (train + val + test). Where clients come from domains (digits_domains,
office_caltech with `mixed`, any data set whose clients each lie in one natural group that
others share), a colour strip left of the rows names each client's domain. Counts are written
in the cells while they fit; a federation of 100+ clients gets thin rows, no numbers and
sparse client labels, so it stays readable. `style=` sizes it for a screen or a paper
(`protofed.plots.STYLES`), `title=` replaces its title ("" for none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from protofed.data.federated import FederatedData
from protofed.plots import (
    Style,
    get_style,
    new_figure,
    set_title,
    style_context,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MAX_ANNOTATED_CELLS = 400  # beyond this, numbers in cells are unreadable
MAX_LABELLED_CLIENTS = 40  # beyond this, only every n-th client is labelled
MAX_LABELLED_CLASSES = 40
STRIP_POINTS = 7  # the width of the domain strip left of the rows
PAPER_ROW = 0.13  # inches per client's row on paper (a screen's is 0.28)
MARGINS = (1.9, 1.1)  # inches around the cells: labels, strip, colour bar; titles, x labels
LABEL_POINTS = 9.0  # the least row height, in points, that a client's name is written in
HEATMAP = "heatmap"  # the label of the heat map's axes (tests and callers find it by it)


def client_domains(fed: FederatedData) -> tuple[list[int], list[str]] | None:
    """Each client's domain index and the domain names, or None where domains say nothing.

    Domains are shown when every client lies in one natural group and some group holds
    several clients (a natural partition of people gives each its own group: the client
    names already say it).
    """
    groups = [c.group for c in fed.clients if c.group is not None]
    if len(groups) < len(fed.clients) or len(set(groups)) == len(groups):
        return None
    names = fed.meta.get("group_names") or []
    used = sorted(set(groups))
    label = [names[g] if g < len(names) else f"group_{g}" for g in used]
    return [used.index(g) for g in groups], label


def figure_size(style: Style, n_clients: int, n_classes: int, domains: bool) -> tuple[float, float]:
    """The heat map's size in inches: on screen it grows with the clients and classes; on
    paper it is the style's width and at most 1.3 widths (5.5 in) tall."""
    extra = 0.5 if domains else 0.0
    if style.width is None:
        width = min(max(4.5, 0.45 * n_classes + 2.5), 16.0)
        return width, min(max(3.0, 0.28 * n_clients + 1.6), 12.0) + extra
    height = max(2.2, PAPER_ROW * n_clients + 1.1) + extra
    return style.width, min(height, 1.3 * style.width, 5.5)


def partition_figure(
    fed: FederatedData, title: str | None = None, *, style: str | Style = "screen"
) -> Figure:
    """The heat map of `fed.counts` (clients x classes), with domains where clients have them.
    `title`: None the default, "" none; `style`: `screen`, `paper` or `paper-wide`."""
    chosen = get_style(style)
    counts = np.asarray(fed.counts)
    n_clients, n_classes = counts.shape
    domains = client_domains(fed)
    size = figure_size(chosen, n_clients, n_classes, domains is not None)
    with style_context(chosen):
        fig, ax = new_figure(*size, style=chosen)
        ax.set_label(HEATMAP)
        image = ax.imshow(counts, aspect="auto", cmap="Blues", interpolation="nearest", vmin=0)
        bar = fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
        bar.set_label("samples (train + val + test)")
        cell = ((size[0] - MARGINS[0]) * 72 / n_classes, _row_points(size, n_clients, domains))
        if counts.size <= MAX_ANNOTATED_CELLS and _numbers_fit(counts, cell):
            _annotate_cells(ax, counts)
        _label_axes(ax, fed, chosen, cell[1])
        if domains is not None:
            _domain_strip(ax, *domains)
        partition = fed.meta.get("partition", "")
        if chosen.paper:  # short enough for a column
            default = f"{fed.dataset}, {partition}: {n_clients} clients"
        else:
            default = f"{fed.dataset}: {partition} partition, {n_clients} clients"
        set_title(fig, title, default)
    return fig


def _row_points(size: tuple[float, float], n_clients: int, domains: object) -> float:
    """About how tall a client's row is, in points."""
    return (size[1] - MARGINS[1] - (0.5 if domains else 0.0)) * 72 / max(1, n_clients)


def _numbers_fit(counts: np.ndarray, cell: tuple[float, float]) -> bool:
    """Whether the largest count, in its font, fits a cell (`cell`: width, height in pt)."""
    largest = int(counts.max()) if counts.size else 0
    size = 7 if largest < 1000 else 6
    return len(str(largest)) * size * 0.62 <= cell[0] and 1.1 * size <= cell[1]


def _annotate_cells(ax: Axes, counts: np.ndarray) -> None:
    """Each nonzero count in its cell, white on dark cells."""
    threshold = counts.max() / 2 if counts.size else 0
    for i, j in np.ndindex(counts.shape):
        value = int(counts[i, j])
        if value:
            ax.text(
                j,
                i,
                str(value),
                ha="center",
                va="center",
                fontsize=7 if value < 1000 else 6,
                color="white" if value > threshold else "black",
            )


def _label_axes(ax: Axes, fed: FederatedData, style: Style, row_points: float) -> None:
    """Class names below, client names left: every n-th where rows are too thin for each."""
    n_clients, n_classes = np.asarray(fed.counts).shape
    ax.set_xlabel("class")
    if n_classes <= MAX_LABELLED_CLASSES:
        ax.set_xticks(range(n_classes))
        long = max((len(n) for n in fed.class_names), default=0) > 3
        ax.set_xticklabels(
            fed.class_names, rotation=45 if long else 0, ha="right" if long else "center"
        )
    step = 1 if n_clients <= MAX_LABELLED_CLIENTS else int(np.ceil(n_clients / 20))
    step = max(step, int(np.ceil(LABEL_POINTS / max(row_points, 1e-9))))
    ticks = list(range(0, n_clients, step))
    names = [fed.clients[i].name for i in ticks]
    if style.paper:  # the style's tick size: legible in print
        ax.set_yticks(ticks, names)
    else:
        ax.set_yticks(ticks, names, fontsize=8 if n_clients <= MAX_LABELLED_CLIENTS else 7)
    ax.set_ylabel(f"client ({n_clients})")


def _domain_strip(ax: Axes, index: list[int], names: list[str]) -> None:
    """A coloured cell left of each client's row, and the legend of the domains above."""
    from matplotlib.patches import Patch
    from matplotlib.transforms import ScaledTranslation, blended_transform_factory

    # x: 7 points left of the axes, whatever the figure's width; y: the client's row
    where = blended_transform_factory(ax.transAxes, ax.transData) + ScaledTranslation(
        -STRIP_POINTS / 72, 0, ax.figure.dpi_scale_trans
    )
    for row, k in enumerate(index):
        ax.plot(
            [0, 0],
            [row - 0.5, row + 0.5],
            transform=where,
            color=_palette(k),
            linewidth=STRIP_POINTS,
            solid_capstyle="butt",
            clip_on=False,
        )
    ax.tick_params(axis="y", pad=2 * STRIP_POINTS)
    handles = [Patch(color=_palette(k), label=n) for k, n in enumerate(names)]
    ax.legend(
        handles=handles,
        title="client's domain",
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),
        ncol=min(len(handles), 5),
        frameon=False,
        fontsize=8,
        title_fontsize=8,
    )


def _palette(k: int) -> tuple[float, float, float, float]:
    import matplotlib

    return matplotlib.colormaps["tab10"](k % 10)
