"""`protofed partition --plot`: the clients x classes heat map of a partition.

The papers show their partitions as such maps (the Dirichlet bubbles of FedProto and PFLlib,
PFPL's mixed domains): one row per client, one column per class, the cell's colour its
sample count (train + val + test). Where clients come from domains (digits_domains,
office_caltech with `mixed`, any data set whose clients each lie in one natural group that
others share), a colour strip left of the rows names each client's domain. Counts are written
in the cells while they fit; a federation of 100+ clients gets thin rows, no numbers and
sparse client labels, so it stays readable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from protofed.data.federated import FederatedData
from protofed.plots import new_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MAX_ANNOTATED_CELLS = 400  # beyond this, numbers in cells are unreadable
MAX_LABELLED_CLIENTS = 40  # beyond this, only every n-th client is labelled
MAX_LABELLED_CLASSES = 40
STRIP_POINTS = 7  # the width of the domain strip left of the rows
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


def partition_figure(fed: FederatedData, title: str | None = None) -> Figure:
    """The heat map of `fed.counts` (clients x classes), with domains where clients have them."""
    counts = np.asarray(fed.counts)
    n_clients, n_classes = counts.shape
    domains = client_domains(fed)
    width = min(max(4.5, 0.45 * n_classes + 2.5), 16.0)
    height = min(max(3.0, 0.28 * n_clients + 1.6), 12.0) + (0.5 if domains else 0.0)
    fig, ax = new_figure(width, height)
    ax.set_label(HEATMAP)
    image = ax.imshow(counts, aspect="auto", cmap="Blues", interpolation="nearest", vmin=0)
    bar = fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
    bar.set_label("samples (train + val + test)")

    if counts.size <= MAX_ANNOTATED_CELLS:
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

    ax.set_xlabel("class")
    if n_classes <= MAX_LABELLED_CLASSES:
        ax.set_xticks(range(n_classes))
        long = max((len(n) for n in fed.class_names), default=0) > 3
        ax.set_xticklabels(
            fed.class_names, rotation=45 if long else 0, ha="right" if long else "center"
        )
    step = 1 if n_clients <= MAX_LABELLED_CLIENTS else int(np.ceil(n_clients / 20))
    ticks = list(range(0, n_clients, step))
    names = [fed.clients[i].name for i in ticks]
    ax.set_yticks(ticks)
    ax.set_yticklabels(names, fontsize=8 if n_clients <= MAX_LABELLED_CLIENTS else 7)
    ax.set_ylabel(f"client ({n_clients})")
    if domains is not None:
        _domain_strip(ax, *domains)
    partition = fed.meta.get("partition", "")
    fig.suptitle(title or f"{fed.dataset}: {partition} partition, {n_clients} clients")
    return fig


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
