"""`protofed report --cd`: the critical-difference diagram of Demšar (2006).

The methods' average ranks (`protofed.report.rank_table`: 1 = best) lie on one axis, the best
at the left; a bar of Nemenyi's critical difference (CD) stands above it, and a thick line
joins each run of methods whose average ranks lie less than the CD apart (no difference
found between them at alpha = 0.05).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from protofed.plots import mark_style, new_figure, style_context

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from protofed.report import RankTable


def cd_diagram(
    table: RankTable,
    style: str = "screen",
    title: str | None = None,
    labels: Sequence[str] | None = None,
) -> Figure:
    """The CD diagram of `table`: one tick per method at its average rank, its label (from
    `labels`, one a method, else the method's name) and rank beside it (the better half at
    the left, the rest at the right)."""
    k = len(table.methods)
    names = list(labels) if labels is not None else table.methods
    ranks = table.average_ranks
    order = list(np.argsort(ranks, kind="stable"))
    half = (k + 1) // 2
    rows = max(half, k - half)
    with style_context(style):
        fig, ax = new_figure(6.4, 1.4 + 0.3 * rows, style=style)
        ax.set_xlim(0.5, k + 0.5)
        ax.set_ylim(-(rows + 1.2), 2.2)
        ax.axis("off")
        ax.hlines(0, 1, k, color="black", linewidth=1)
        for r in range(1, k + 1):
            ax.vlines(r, 0, 0.15, color="black", linewidth=1)
            ax.text(r, 0.25, str(r), ha="center", va="bottom")
        for pos, i in enumerate(order):  # ticks down to a label, left or right
            left = pos < half
            y = -(pos + 1) if left else -(k - pos)
            x_end = 0.6 if left else k + 0.4
            ax.plot([ranks[i], ranks[i], x_end], [0, y, y], color="black", linewidth=0.8)
            ax.text(
                x_end + (-0.05 if left else 0.05),
                y,
                f"{names[i]} ({ranks[i]:.2f})",
                ha="right" if left else "left",
                va="center",
            )
        ax.plot([1, 1 + table.cd], [1.5, 1.5], color="black", linewidth=1.5)
        ax.vlines([1, 1 + table.cd], 1.4, 1.6, color="black", linewidth=1.5)
        ax.text(1 + table.cd / 2, 1.65, f"CD = {table.cd:.3g}", ha="center", va="bottom")
        sorted_ranks = np.sort(ranks)
        for n, (lo, hi) in enumerate(table.cliques()):
            bar_y = -0.3 - 0.25 * n
            ax.plot([sorted_ranks[lo] - 0.05, sorted_ranks[hi] + 0.05], [bar_y, bar_y], linewidth=3,
                    color="black", solid_capstyle="round")  # fmt: skip
        if title is None:
            title = f"{table.column}: average ranks over {len(table.blocks)} {table.block_kind}s"
        if title:
            ax.set_title(title)
    mark_style(fig, style)
    return fig
