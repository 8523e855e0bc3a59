"""`protofed report --plot`: learning curves, per-client distributions, pers. vs gen.

Each figure compares the groups of `protofed.report.group_runs` (runs that differ only in the
seed). Curves come from `protofed.Run(path).history` (one row per round and client); a round's
value is the mean over the clients evaluated in it, as `metrics.jsonl` records it. The band
around a group's mean curve is the 95 % confidence interval of the mean over its runs,
mean ± t(0.975, n - 1) · s / √n with s the sample std (ddof = 1); a group of one run has no
band. Rounds where a class returns to some clients (`data.dynamic`) are dotted lines.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from protofed.api import Run
from protofed.core.files import check_writable
from protofed.errors import ConfigError
from protofed.plots import figure_paths, new_figure, new_grid, save_figure
from protofed.report import Group
from protofed.runs import PARTITION

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# per-round curves: history column, y label, whether it is a score (shown in %)
CURVES = [
    ("pers_f1", "personalization macro-F1 (%)", True),
    ("gen_f1", "generalization macro-F1 (%)", True),
    ("global_f1", "global model macro-F1 (%)", True),
    ("train_loss", "training loss (log scale, geometric mean)", False),
]
CONFIDENCE = 0.95
BAND_ALPHA = 0.2
CURVES_NAME, CLIENTS_NAME, PERS_GEN_NAME = "curves", "clients", "pers_gen"


def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided t quantile for `df` degrees of freedom (scipy comes with scikit-learn)."""
    from scipy.stats import t

    return float(t.ppf(0.5 + confidence / 2, df))


def mean_band(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column of runs x rounds: the mean, and the 95 % CI's lower and upper edges (NaN
    where fewer than two runs have a value)."""
    n = np.sum(~np.isnan(values), axis=0)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a round no run scored: NaN
        mean = np.nanmean(values, axis=0)
        std = np.array(
            [
                np.nanstd(col, ddof=1) if k > 1 else np.nan
                for col, k in zip(values.T, n, strict=True)
            ]
        )
        half = np.array([t_quantile(k - 1) if k > 1 else np.nan for k in n]) * std / np.sqrt(n)
    return mean, mean - half, mean + half


def _history(path: str | Path, cache: dict[str, pd.DataFrame]) -> pd.DataFrame:
    key = str(path)
    if key not in cache:
        cache[key] = Run(path).history
    return cache[key]


def per_round(history: pd.DataFrame, column: str) -> pd.Series:
    """A history column per round: the mean over that round's clients (NaN left out)."""
    if column not in history or history.empty:
        return pd.Series(dtype=float)
    values = pd.to_numeric(history[column], errors="coerce")
    return values.groupby(history["round"]).mean()


def curve_matrix(
    group: Group, column: str, cache: dict[str, pd.DataFrame] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, runs x rounds values) of one group; a run without a round has NaN there."""
    cache = {} if cache is None else cache
    series = [per_round(_history(r["path"], cache), column) for r in group.runs]
    rounds = np.array(sorted({int(x) for s in series for x in s.index}), dtype=int)
    values = np.full((len(series), len(rounds)), np.nan)
    for i, s in enumerate(series):
        for j, rnd in enumerate(rounds):
            if rnd in s.index:
                values[i, j] = s.loc[rnd]
    return rounds, values


def _colors(count: int) -> list:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if count <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(count)]


def _legend_label(group: Group) -> str:
    return f"{group.label} (n={group.n})"


def _arrivals(groups: Sequence[Group]) -> list[int]:
    """Rounds where a withheld class returns (data.dynamic), from the first run's partition."""
    for g in groups:
        for r in g.runs:
            meta = (Run(r["path"]).dir.read_json(PARTITION).get("meta") or {}).get("dynamic")
            if meta:
                longest = max((len(v) for v in meta["withheld"].values()), default=0)
                return [k * int(meta["every"]) for k in range(1, longest + 1)]
    return []


def _legend_below(fig: Figure, handles: list, labels: list[str]) -> None:
    """One legend for the figure, under the axes (never over the data), in as many columns
    as fit the figure's width."""
    fits = int(fig.get_figwidth() * 72 / (8 * 0.62))  # characters of 8 pt across the figure
    longest = max((len(x) for x in labels), default=1) + 6
    ncols = max(1, min(len(labels), fits // longest))
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize=8, frameon=False)


def _tick_label(label: str, width: int = 18) -> str:
    """A group label over lines: one `key=value` per line, a long one broken after `=`."""
    lines = []
    for part in label.split(", "):
        key, eq, value = part.partition("=")
        lines += [key + eq, value] if eq and len(part) > width else [part]
    return "\n".join(lines)


def learning_curves(groups: Sequence[Group], title: str | None = None) -> Figure:
    """Pers. F1, gen. F1 and global F1 (where recorded) and the training loss against the
    round: one line per group (mean over its runs) with its 95 % CI band over runs."""
    cache: dict[str, pd.DataFrame] = {}
    panels = []
    for column, label, score in CURVES:
        data = [curve_matrix(g, column, cache) for g in groups]
        if any(np.isfinite(v).any() for _, v in data):
            panels.append((column, label, score, data))
    if not panels:
        runs = ", ".join(str(r["path"]) for g in groups for r in g.runs)
        raise ConfigError(f"nothing to plot: no evaluated round in the metrics.jsonl of {runs}")
    cols = 1 if len(panels) == 1 else 2
    rows = (len(panels) + 1) // 2 if cols == 2 else 1
    fig, flat = new_grid(
        5.2 * cols, 3.4 * rows + 0.6 + 0.22 * len(groups), rows, cols, layout="constrained"
    )
    colors = _colors(len(groups))
    arrivals = _arrivals(groups)
    handles: list = []
    for ax, (column, label, score, data) in zip(flat, panels, strict=False):
        scale = 100.0 if score else 1.0
        log_scale = column == "train_loss" and all((v[np.isfinite(v)] > 0).all() for _, v in data)
        for g, color, (rounds, values) in zip(groups, colors, data, strict=True):
            if log_scale:  # a loss on a log axis: the band of log(loss), which stays positive
                mean, low, high = np.exp(mean_band(np.log(values)))
            else:
                mean, low, high = mean_band(values * scale)
            if score:  # a score lies in [0, 100]: so does the part of its band worth drawing
                low, high = np.clip(low, 0, 100), np.clip(high, 0, 100)
            few = len(rounds) <= 12  # a run scored a few times: its points, not only a line
            (line,) = ax.plot(
                rounds,
                mean,
                color=color,
                lw=1.4,
                marker="o" if few else None,
                ms=3,
                label=_legend_label(g),
            )
            if g.n > 1 and np.isfinite(low).any():
                ax.fill_between(rounds, low, high, color=color, alpha=BAND_ALPHA, lw=0)
            if ax is flat[0]:
                handles.append(line)
        for k, rnd in enumerate(arrivals):
            ax.axvline(
                rnd, color="grey", ls=":", lw=0.9, label="a class returns" if k == 0 else None
            )
        if log_scale:
            ax.set_yscale("log")
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.set_title(label.split(" (")[0])
        ax.grid(alpha=0.3)
    for ax in flat[len(panels) :]:
        ax.set_visible(False)
    labels = [h.get_label() for h in handles]
    if arrivals:
        handles.append(flat[0].lines[-1])
        labels.append("a class returns (data.dynamic)")
    _legend_below(fig, handles, labels)
    fig.suptitle(title or "Learning curves: mean over runs, 95 % CI band over seeds (t)")
    return fig


def client_distributions(groups: Sequence[Group], title: str | None = None) -> Figure:
    """Each client's personalization F1 at the reported round, per group (the clients of all
    its runs): a box plot with every client as a point."""
    cache: dict[str, pd.DataFrame] = {}
    data = []
    for g in groups:
        vals = []
        for r in g.runs:
            h = _history(r["path"], cache)
            at = h[h["round"] == r["round"]]
            vals += [100 * v for v in pd.to_numeric(at["pers_f1"], errors="coerce").dropna()]
        data.append(np.array(vals))
    width = min(max(4.5, 1.4 * len(groups) + 2.5), 16.0)
    fig, ax = new_figure(width, 4.6, layout="constrained")
    colors = _colors(len(groups))
    positions = np.arange(1, len(groups) + 1)
    ax.boxplot(
        data, positions=positions, widths=0.55, showfliers=False, medianprops={"color": "black"}
    )
    rng = np.random.default_rng(0)  # jitter only: where a point sits sideways means nothing
    for pos, scores, color in zip(positions, data, colors, strict=True):
        ax.scatter(
            pos + rng.uniform(-0.18, 0.18, len(scores)),
            scores,
            s=12,
            color=color,
            alpha=0.7,
            zorder=3,
            edgecolors="none",
        )
    ax.set_xticks(positions, [f"{_tick_label(g.label)}\n(n={g.n})" for g in groups])
    if len(groups) > 6:
        ax.tick_params(axis="x", labelrotation=30)
    ax.set_xlabel("group (n = runs)")
    ax.set_ylabel("personalization macro-F1 per client (%)")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title or "Per-client personalization F1, clients of all seeds", fontsize=10)
    return fig


def pers_vs_gen(groups: Sequence[Group], title: str | None = None) -> Figure | None:
    """Personalization F1 against generalization F1: one point per run, a large marker per
    group mean. None when no run has generalization scores."""
    if not any(r.get("gen_f1") is not None for g in groups for r in g.runs):
        return None
    fig, ax = new_figure(6.4, 4.8 + 0.22 * len(groups), layout="constrained")
    handles = []
    for g, color in zip(groups, _colors(len(groups)), strict=True):
        pts = [(r["gen_f1"], r["pers_f1"]) for r in g.runs if r.get("gen_f1") is not None]
        if not pts:
            continue
        x, y = np.array(pts).T
        ax.scatter(x, y, color=color, s=22, alpha=0.6, edgecolors="none")
        handles.append(
            ax.scatter(
                [x.mean()],
                [y.mean()],
                color=color,
                s=110,
                marker="D",
                edgecolors="black",
                linewidths=0.8,
                zorder=3,
                label=_legend_label(g),
            )
        )
    ax.set_xlabel("generalization macro-F1 (%)")
    ax.set_ylabel("personalization macro-F1 (%)")
    ax.grid(alpha=0.3)
    _legend_below(fig, handles, [str(h.get_label()) for h in handles])
    ax.set_title(
        title or "Personalization vs generalization:\nruns (dots), group means (diamonds)",
        fontsize=10,
    )
    return fig


def figures(groups: Sequence[Group]) -> dict[str, Figure]:
    """Every figure of `report --plot`, by the suffix of its file name."""
    out = {CURVES_NAME: learning_curves(groups), CLIENTS_NAME: client_distributions(groups)}
    pg = pers_vs_gen(groups)
    if pg is not None:
        out[PERS_GEN_NAME] = pg
    return out


def figure_prefixes(drawn: dict[str, Figure], prefix: str | Path) -> dict[str, Path]:
    """PREFIX-curves, PREFIX-clients, PREFIX-pers_gen: where `write_figures` puts each."""
    prefix = Path(prefix)
    return {name: prefix.with_name(f"{prefix.name}-{name}") for name in drawn}


def close_figures(drawn: dict[str, Figure]) -> None:
    """Release figures that will not be written (pyplot keeps every open one alive)."""
    import matplotlib.pyplot as plt

    for fig in drawn.values():
        plt.close(fig)


def check_figures_writable(drawn: dict[str, Figure], prefix: str | Path) -> None:
    """Probe every file `write_figures` would write: a blocked one (a folder of its name)
    is refused before any of the set, or the report's tables, are written."""
    for target in figure_prefixes(drawn, prefix).values():
        for path in figure_paths(target):
            check_writable(path)


def write_figures(drawn: dict[str, Figure], prefix: str | Path, which: str | int) -> list[Path]:
    """PREFIX-curves, PREFIX-clients, PREFIX-pers_gen (.png and .pdf) of `figures(groups)`
    (drawn first, so that runs it cannot draw fail before anything is written)."""
    try:
        check_figures_writable(drawn, prefix)
    except ConfigError:
        close_figures(drawn)
        raise
    targets = figure_prefixes(drawn, prefix)
    when = f"round {which}" if isinstance(which, int) else f"{which} round"
    paths: list[Path] = []
    for name, fig in drawn.items():
        if name != CURVES_NAME:
            fig.axes[0].set_title(f"{fig.axes[0].get_title()}\n({when})", fontsize=10)
        paths += save_figure(fig, targets[name])
    return paths
