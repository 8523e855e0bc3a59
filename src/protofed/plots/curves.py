"""`protofed report --plot`: learning curves, per-client distributions, pers. vs gen.

Each figure compares the groups of `protofed.report.group_runs` (runs that differ only in the
seed). Curves come from `protofed.Run(path).history` (one row per round and client); a round's
value is the mean over the clients evaluated in it, as `metrics.jsonl` records it. The band
around a group's mean curve (`band=`, `BANDS`):

- `ci`: the 95 % confidence interval of the mean over its runs, mean ± t(0.975, n - 1) · s / √n
  with s the sample std (ddof = 1);
- `std`: mean ± s, the spread of the runs themselves;
- `none`: no band;
- `auto` (default): `ci` when every group has n >= 3 runs, else `std`. With n = 2 the t
  quantile is 12.7, so a 95 % CI is 9 times as wide as s: honest, but a band that fills the
  axes shows nothing; ±s says how far two seeds lie apart, and the caption says which it is.

A group of one run has no band, and a title names a band only where one is drawn. The y
axis is scaled to the mean curves (a band may reach past the means by half their span, no
further), so that no band rescales the axes. Curves are drawn at the evaluated rounds, and
the round ticks are those rounds (every k-th where there are many). A run that stopped
early (status diverged or incomplete, `protofed.report.run_status`) ends with an `x` on its
group's curve at its last evaluated round. Rounds where a class returns to some clients
(`data.dynamic`) are dotted lines. Each label has one colour and dash style in every figure
of a report (`label_styles`). Labels: `protofed.report.relabel` (`labels=`); sizes and fonts:
`protofed.plots.STYLES` (`style=`); panels: `PANELS` (`panels=`).
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from protofed.api import Run
from protofed.core.files import atomic_write_text, check_writable
from protofed.errors import ConfigError
from protofed.plots import (
    Style,
    figure_paths,
    get_style,
    legend_below,
    new_figure,
    new_grid,
    save_figure,
    set_title,
    style_context,
    style_of,
    wrap_text,
)
from protofed.report import COMPLETE, Group, n_suffixes, relabel
from protofed.runs import PARTITION

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# per-round curves: history column, y label, short y label (paper styles), whether a score
CURVES = [
    ("pers_f1", "personalization macro-F1 (%)", "pers. F1 (%)", True),
    ("gen_f1", "generalization macro-F1 (%)", "gen. F1 (%)", True),
    ("global_f1", "global model macro-F1 (%)", "global F1 (%)", True),
    ("unseen_f1", "unseen users' macro-F1 (%)", "unseen F1 (%)", True),  # eval.unseen_clients
    ("train_loss", "training loss (log scale, geometric mean)", "training loss", False),
]
PANELS = tuple(column for column, _, _, _ in CURVES)  # the names `--panels` takes
# the panel title says whose training loss it is: the `loss` each client's fit reports
LOSS_TITLE = "training loss (as reported by each client's fit)"
# where that loss is not the loss of the model the algorithm personalizes
LOSS_OF = {
    "ditto": "the global model's loss, not the personal one's",
    "fedrep": "the body phase's loss",
    "fedbabu": "the body's loss, before fine-tuning",
}
# a fixed palette (tab10, then tab20's lighter shades) and the dash styles cycled over labels
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#c7c7c7",
    "#dbdb8d",
    "#9edae5",
)
DASHES = ("-", "--", "-.", ":")
STOP_MARKER = "x"  # the last evaluated round of a run that stopped early
MAX_TICKS = {"screen": 10, "paper": 5, "paper-wide": 6}
CONFIDENCE = 0.95
BAND_ALPHA = 0.2
BANDS = ("auto", "std", "ci", "none")
BAND_TEXT = {
    "ci": "95 % confidence interval of the mean over seeds (Student's t, n - 1 df)",
    "std": "mean ± 1 sample std over seeds (ddof = 1)",
    "none": "no band",
}
BAND_SHORT = {"ci": "95 % CI", "std": "±1 std", "none": "no band"}
CURVES_NAME, CLIENTS_NAME, PERS_GEN_NAME = "curves", "clients", "pers_gen"


def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided t quantile for `df` degrees of freedom (scipy comes with scikit-learn)."""
    from scipy.stats import t

    return float(t.ppf(0.5 + confidence / 2, df))


def choose_band(groups: Sequence[Group], band: str = "auto") -> str:
    """`band` checked; `auto` resolved: `ci` when every group has n >= 3, else `std`."""
    if band not in BANDS:
        raise ConfigError(f"unknown band '{band}' (known: {', '.join(BANDS)})")
    if band == "auto":
        return "ci" if groups and min(g.n for g in groups) >= 3 else "std"
    return band


def mean_band(values: np.ndarray, band: str = "ci") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column of runs x rounds: the mean, and the band's lower and upper edges (`ci`: the
    95 % CI of the mean, `std`: ± the sample std; NaN where fewer than two runs have a value,
    and everywhere for `none`)."""
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
        if band == "ci":
            half = np.array([t_quantile(k - 1) if k > 1 else np.nan for k in n]) * std / np.sqrt(n)
        elif band == "std":
            half = std
        else:
            half = np.full_like(mean, np.nan)
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


def label_styles(labels: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Each label's (colour, dash style), the same in every figure of a report: a label's
    colour is the palette's entry at a stable hash of its text (CRC-32; the next free one
    where two labels meet, the labels taken in sorted order), so a method keeps its colour
    across figures and, where no two labels meet, across reports; its dash style cycles over
    the labels in sorted order, so two labels whose curves coincide (FedAvg's and Ditto's
    global model) still show both."""
    names = sorted(set(labels))
    size = 10 if len(names) <= 10 else len(PALETTE)
    taken: set[int] = set()
    out = {}
    for k, name in enumerate(names):
        slot = zlib.crc32(name.encode()) % size
        while slot in taken and len(taken) < size:
            slot = (slot + 1) % size
        taken.add(slot)
        out[name] = (PALETTE[slot], DASHES[k % len(DASHES)])
    return out


def _styles(groups: Sequence[Group], labels: Mapping[str, str] | None) -> list[tuple[str, str]]:
    """(colour, dash style) of each group, keyed by its label (`label_styles`)."""
    names = relabel(groups, labels)
    styles = label_styles(names)
    return [styles[name] for name in names]


def stopped_runs(group: Group) -> list[dict[str, Any]]:
    """The group's runs that stopped early: status diverged or incomplete."""
    return [r for r in group.runs if r.get("status", COMPLETE) != COMPLETE]


def parse_panels(text: str | Sequence[str]) -> list[str]:
    """`--panels pers_f1,train_loss` as a list of `PANELS` names; an unknown name is a
    ConfigError naming it."""
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else list(text)
    names = [n for n in names if n]
    for name in names:
        if name not in PANELS:
            raise ConfigError(f"--panels: unknown panel '{name}' (known: {', '.join(PANELS)})")
    if not names:
        raise ConfigError(f"--panels: name at least one panel ({', '.join(PANELS)})")
    return list(dict.fromkeys(names))


def round_ticks(rounds: Sequence[int], most: int) -> list[int]:
    """The x ticks of a curve panel: the evaluated rounds, or where there are more than
    `most`, every k-th of them counted back from the last."""
    rounds = sorted({int(r) for r in rounds})
    step = max(1, -(-len(rounds) // most))
    return rounds[::-1][::step][::-1]


def legend_labels(groups: Sequence[Group], labels: Mapping[str, str] | None = None) -> list[str]:
    """Each group's label in a legend: `relabel`'s, with ` (n=K)` when the groups differ
    in n."""
    return [
        f"{label}{n}" for label, n in zip(relabel(groups, labels), n_suffixes(groups), strict=True)
    ]


def _arrivals(groups: Sequence[Group]) -> list[int]:
    """Rounds where a withheld class returns (data.dynamic), from the first run's partition."""
    for g in groups:
        for r in g.runs:
            meta = (Run(r["path"]).dir.read_json(PARTITION).get("meta") or {}).get("dynamic")
            if meta:
                longest = max((len(v) for v in meta["withheld"].values()), default=0)
                return [k * int(meta["every"]) for k in range(1, longest + 1)]
    return []


def _tick_label(label: str, width: int = 18) -> str:
    """A group label over lines: one part per line, a long `key=value` broken after `=`."""
    lines = []
    for part in label.split(", "):
        key, eq, value = part.partition("=")
        lines += [key + eq, value] if eq and len(part) > width else [part]
    return "\n".join(lines)


def _plain(value: float, _pos: int | None = None) -> str:
    """A tick label as a plain number: 0.2, 1, 30 (never 2 x 10^-1)."""
    return f"{value:.3g}"


def _plain_log_axis(ax: Axes, paper: bool = False) -> None:
    """A log y axis whose tick labels are plain numbers, major and (where matplotlib labels
    them: a range under two decades, on paper under 1.2, where minor labels would collide)
    minor."""
    from matplotlib.ticker import FuncFormatter, LogFormatter

    class PlainLog(LogFormatter):
        def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
            return _plain(x)

    ax.yaxis.set_major_formatter(FuncFormatter(_plain))
    thresholds = (1.2, 0.5) if paper else (2.0, 0.5)
    ax.yaxis.set_minor_formatter(PlainLog(labelOnlyBase=False, minor_thresholds=thresholds))


def _limit_to_means(ax: Axes, means: list[np.ndarray], bands: list[np.ndarray], log: bool) -> None:
    """y limits from the mean curves: a band may add half their span on either side, no
    more (a 2-seed 95 % CI must not flatten the curves)."""
    m = np.concatenate([x[np.isfinite(x)] for x in means]) if means else np.array([])
    if m.size == 0:
        return
    f = np.log if log else (lambda x: x)
    lo, hi = float(np.min(f(m))), float(np.max(f(m)))
    span = hi - lo if hi > lo else max(abs(hi) * 0.1, 0.05 if log else 1.0)
    b = np.concatenate([x[np.isfinite(x)] for x in bands]) if bands else np.array([])
    b = b[b > 0] if log else b
    blo = float(np.min(f(b))) if b.size else lo
    bhi = float(np.max(f(b))) if b.size else hi
    low = max(min(blo, lo), lo - span / 2) - 0.05 * span
    high = min(max(bhi, hi), hi + span / 2) + 0.05 * span
    ax.set_ylim(*((np.exp(low), np.exp(high)) if log else (low, high)))


def _panel_grid(count: int, groups: int, style: Style) -> tuple[float, float, int, int]:
    """(width, height, rows, cols) of `count` curve panels in `style`."""
    cols = min(count, 4) if style.name == "paper-wide" else (1 if count == 1 else 2)
    rows = -(-count // cols)
    if not style.paper:
        return 5.2 * cols, 3.4 * rows + 0.6 + 0.22 * groups, rows, cols
    width = float(style.width or 3.3)
    per_row = 1.55 if style.name == "paper" else 1.9
    return width, per_row * rows + 0.35 + 0.17 * groups / max(1, cols), rows, cols


def _draw_curve(
    ax: Axes,
    rounds: np.ndarray,
    values: np.ndarray,
    style: tuple[str, str],
    how: tuple[str, bool, bool],
) -> tuple[object, np.ndarray, np.ndarray]:
    """One group's mean curve and its band on `ax`: (line, mean, band edges)."""
    band, score, log_scale = how
    color, dash = style
    if log_scale:  # a loss on a log axis: the band of log(loss), which stays positive
        mean, low, high = np.exp(mean_band(np.log(values), band))
    else:
        mean, low, high = mean_band(values * (100.0 if score else 1.0), band)
    if score:  # a score lies in [0, 100]: so does the part of its band worth drawing
        low, high = np.clip(low, 0, 100), np.clip(high, 0, 100)
    few = len(rounds) <= 12  # a run scored a few times: its points, not only a line
    finite = np.isfinite(mean)  # rounds no run of the group reached are not drawn
    (line,) = ax.plot(
        rounds[finite], mean[finite], color=color, ls=dash, marker="o" if few else None
    )
    if band != "none" and values.shape[0] > 1 and np.isfinite(low).any():
        ax.fill_between(rounds, low, high, color=color, alpha=BAND_ALPHA, lw=0)
    return line, mean, np.concatenate([low, high])


def _curve_panels(
    groups: Sequence[Group], chosen: Sequence[str] | None = None
) -> list[tuple[str, str, str, bool, list[Any]]]:
    """The curve panels with data: `chosen` (PANELS names, in that order; one that no run
    recorded is a ConfigError) or every one recorded."""
    cache: dict[str, pd.DataFrame] = {}
    panels = []
    wanted = PANELS if chosen is None else parse_panels(chosen)
    for column, label, short, score in sorted(
        (c for c in CURVES if c[0] in wanted), key=lambda c: wanted.index(c[0])
    ):
        data = [curve_matrix(g, column, cache) for g in groups]
        if any(np.isfinite(v).any() for _, v in data):
            panels.append((column, label, short, score, data))
        elif chosen is not None:
            raise ConfigError(f"--panels: no run recorded {column}, the panel '{column}'")
    if not panels:
        runs = ", ".join(str(r["path"]) for g in groups for r in g.runs)
        raise ConfigError(f"nothing to plot: no evaluated round in the metrics.jsonl of {runs}")
    return panels


def curves_title(groups: Sequence[Group], band: str) -> str:
    """The learning curves' default title: a band named only where one is drawn (n > 1)."""
    many = sorted({g.n for g in groups if g.n > 1})
    if not many:
        return "Learning curves: one run per group"
    n = str(many[0]) if len(many) == 1 else f"{many[0]}-{many[-1]}"
    if band == "none":
        return f"Learning curves: mean over {n} seeds"
    alone = ", none for one run" if min(g.n for g in groups) == 1 else ""
    return f"Learning curves: mean, {BAND_SHORT[band]} over {n} seeds{alone}"


def _loss_note(groups: Sequence[Group], names: Sequence[str]) -> str:
    """Whose training loss a group's curve is, where it is not the personalized model's."""
    notes = []
    for g, name in zip(groups, names, strict=True):
        algos = {str(r.get("algorithm", "")).split("+")[0] for r in g.runs}
        for algo in sorted(algos & set(LOSS_OF)):
            notes.append(f"{name}: {LOSS_OF[algo]}")
    return "; ".join(dict.fromkeys(notes))


def _mark_stops(
    ax: Axes, group: Group, rounds: np.ndarray, values: np.ndarray, mean: np.ndarray, color: str
) -> list[str]:
    """An `x` on the group's curve at the last evaluated round of each run that stopped
    early; the statuses marked."""
    marked = []
    for i, run in enumerate(group.runs):
        if run.get("status", COMPLETE) == COMPLETE:
            continue
        have = np.flatnonzero(np.isfinite(values[i]))
        if have.size == 0 or not np.isfinite(mean[have[-1]]):
            continue
        j = have[-1]
        ax.plot(
            [rounds[j]],
            [mean[j]],
            ls="none",
            marker=STOP_MARKER,
            ms=9,
            mew=2,
            color=color,
            zorder=4,
            label=f"_stopped {run.get('status')}",
        )
        marked.append(str(run.get("status")))
    return marked


def learning_curves(
    groups: Sequence[Group],
    title: str | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    band: str = "auto",
    style: str | Style = "screen",
    panels: Sequence[str] | None = None,
) -> Figure:
    """Pers. F1, gen. F1, global F1 and unseen F1 (where recorded) and the training loss
    against the round: one line per group (mean over its runs) with its band over runs (`band`: auto,
    std, ci, none). `title`: None the default, "" none (no panel titles either). `panels`:
    the PANELS to draw, in order (default: each one recorded)."""
    from matplotlib.lines import Line2D

    chosen, band = get_style(style), choose_band(groups, band)
    names = legend_labels(groups, labels)
    styles = _styles(groups, labels)
    drawn = _curve_panels(groups, panels)
    with style_context(chosen):
        width, height, rows, cols = _panel_grid(len(drawn), len(groups), chosen)
        fig, flat = new_grid(width, height, rows, cols, layout="constrained", style=chosen)
        arrivals = _arrivals(groups)
        handles: list[Any] = []
        stops: set[str] = set()
        for ax, (column, label, short, score, data) in zip(flat, drawn, strict=False):
            log_scale = column == "train_loss" and all(
                (v[np.isfinite(v)] > 0).all() for _, v in data
            )
            means, edges = [], []
            for g, look, (rounds, values) in zip(groups, styles, data, strict=True):
                line, mean, edge = _draw_curve(ax, rounds, values, look, (band, score, log_scale))
                stops |= set(_mark_stops(ax, g, rounds, values, mean, look[0]))
                means.append(mean)
                edges.append(edge)
                if ax is flat[0]:
                    handles.append(line)
            for k, rnd in enumerate(arrivals):
                ax.axvline(rnd, color="grey", ls=":", lw=0.9, label="_" if k else "returns")
            if log_scale:
                ax.set_yscale("log")
                _plain_log_axis(ax, chosen.paper)
            _limit_to_means(ax, means, edges, log_scale)
            evaluated = sorted({int(r) for rounds, _ in data for r in rounds})
            ticks = round_ticks(evaluated, MAX_TICKS.get(chosen.name, 10))
            ax.set_xticks(ticks, [str(t) for t in ticks])
            if len(ticks) < len(evaluated):
                ax.set_xticks(evaluated, minor=True)
            xlabel = "round"
            if column == "train_loss" and (whose := _loss_note(groups, relabel(groups, labels))):
                size = float(ax.xaxis.label.get_fontsize())
                xlabel += "\n" + wrap_text(f"({whose})", 0.95 * width / cols, size)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(short if chosen.paper else label)
            if title != "" and not chosen.paper:
                ax.set_title(LOSS_TITLE if column == "train_loss" else label.split(" (")[0])
            ax.grid(alpha=0.3)
        for ax in flat[len(drawn) :]:
            ax.set_visible(False)
        shown = list(names)
        if arrivals:
            handles.append(next(x for x in flat[0].lines if x.get_label() == "returns"))
            shown.append("a class returns")
        if stops:
            handles.append(Line2D([], [], ls="none", marker=STOP_MARKER, color="black", mew=2))
            shown.append(f"a run stopped early ({', '.join(sorted(stops))})")
        legend_below(fig, handles, shown)
        set_title(fig, title, curves_title(groups, band))
    return fig


def client_distributions(
    groups: Sequence[Group],
    title: str | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    style: str | Style = "screen",
) -> Figure:
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
    chosen = get_style(style)
    names = [_tick_label(x) for x in relabel(groups, labels)]
    names = [
        f"{x}\n{n.strip()}" if n else x for x, n in zip(names, n_suffixes(groups), strict=True)
    ]
    with style_context(chosen):
        if chosen.paper:
            size = (float(chosen.width or 3.3), 2.4 if chosen.name == "paper" else 2.6)
        else:
            size = (min(max(4.5, 1.4 * len(groups) + 2.5), 16.0), 4.6)
        fig, ax = new_figure(*size, layout="constrained", style=chosen)
        positions = np.arange(1, len(groups) + 1)
        ax.boxplot(
            data, positions=positions, widths=0.55, showfliers=False, medianprops={"color": "black"}
        )
        rng = np.random.default_rng(0)  # jitter only: where a point sits sideways means nothing
        colors = [color for color, _ in _styles(groups, labels)]
        for pos, scores, color in zip(positions, data, colors, strict=True):
            ax.scatter(
                pos + rng.uniform(-0.18, 0.18, len(scores)),
                scores,
                s=6 if chosen.paper else 12,
                color=color,
                alpha=0.7,
                zorder=3,
                edgecolors="none",
            )
        ax.set_xticks(positions, names)
        if len(groups) > (3 if chosen.name == "paper" else 6):
            ax.tick_params(axis="x", labelrotation=30)
        ax.set_ylabel(
            "pers. F1 per client (%)" if chosen.paper else "personalization macro-F1 per client (%)"
        )
        ax.grid(axis="y", alpha=0.3)
        default = "Per-client pers. F1" if chosen.paper else "Per-client personalization F1"
        set_title(ax, title, f"{default}, clients of all seeds")
    return fig


def pers_vs_gen(
    groups: Sequence[Group],
    title: str | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    style: str | Style = "screen",
) -> Figure | None:
    """Personalization F1 against generalization F1: one point per run, a large marker per
    group mean. None when no run has generalization scores."""
    if not any(r.get("gen_f1") is not None for g in groups for r in g.runs):
        return None
    chosen = get_style(style)
    names = legend_labels(groups, labels)
    with style_context(chosen):
        if chosen.paper:
            width = float(chosen.width or 3.3)
            size = (width, min(width, 3.3) * 0.8 + 0.17 * len(groups))
        else:
            size = (6.4, 4.8 + 0.22 * len(groups))
        fig, ax = new_figure(*size, layout="constrained", style=chosen)
        handles: list[Any] = []
        shown: list[str] = []
        colors = [color for color, _ in _styles(groups, labels)]
        stopped = False
        for g, color, name in zip(groups, colors, names, strict=True):
            runs = [r for r in g.runs if r.get("gen_f1") is not None]
            if not runs:
                continue
            x, y = np.array([(r["gen_f1"], r["pers_f1"]) for r in runs]).T
            early = np.array([r.get("status", COMPLETE) != COMPLETE for r in runs])
            dot = 12 if chosen.paper else 22
            ax.scatter(x[~early], y[~early], color=color, s=dot, alpha=0.6, lw=0)
            if early.any():  # a run that stopped early: an x, as on the curves
                stopped = True
                ax.scatter(
                    x[early],
                    y[early],
                    color=color,
                    s=2 * dot,
                    marker=STOP_MARKER,
                    lw=1.5,
                    label="_stopped early",
                )
            mean = ax.scatter(
                [x.mean()],
                [y.mean()],
                color=color,
                s=50 if chosen.paper else 110,
                marker="D",
                edgecolors="black",
                linewidths=0.8,
                zorder=3,
            )
            handles.append(mean)
            shown.append(name)
        if stopped:
            from matplotlib.lines import Line2D

            handles.append(Line2D([], [], ls="none", marker=STOP_MARKER, color="black", mew=1.5))
            shown.append("a run that stopped early")
        ax.set_xlabel("generalization macro-F1 (%)")
        ax.set_ylabel("personalization macro-F1 (%)")
        ax.grid(alpha=0.3)
        legend_below(fig, handles, shown)
        default = "Pers. vs gen. F1" if chosen.paper else "Personalization vs generalization"
        set_title(ax, title, f"{default}:\nruns (dots), group means (diamonds)")
    return fig


def figures(
    groups: Sequence[Group],
    *,
    labels: Mapping[str, str] | None = None,
    band: str = "auto",
    style: str | Style = "screen",
    title: str | None = None,
    panels: Sequence[str] | None = None,
) -> dict[str, Figure]:
    """Every figure of `report --plot`, by the suffix of its file name. `title`: None each
    figure's default title, "" none, else this text on each; `panels`: the learning curves'
    (`learning_curves`)."""
    relabel(groups, labels)  # a bad label fails before any figure is drawn
    curves = learning_curves(groups, title, labels=labels, band=band, style=style, panels=panels)
    out = {
        CURVES_NAME: curves,
        CLIENTS_NAME: client_distributions(groups, title, labels=labels, style=style),
    }
    pg = pers_vs_gen(groups, title, labels=labels, style=style)
    if pg is not None:
        out[PERS_GEN_NAME] = pg
    return out


def caption(
    groups: Sequence[Group], drawn: Mapping[str, Figure], band: str, which: str | int
) -> dict[str, str]:
    """The text under each figure of `figures`: what a line, a band, a point is, and n."""
    band = choose_band(groups, band)
    ns = sorted({g.n for g in groups})
    n_text = (
        f"n = {ns[0]} run{'s' if ns[0] > 1 else ''} (seeds) per group"
        if len(ns) == 1
        else "n = runs (seeds) of each group, in its label"
    )
    when = f"round {which}" if isinstance(which, int) else f"the {which} round"
    single = " (a group of one run has none)" if band != "none" else ""
    if all(g.n == 1 for g in groups):
        band, single = "none", " (one run per group)"
    stopped = [r for g in groups for r in stopped_runs(g)]
    stops = (
        f" An x marks the last evaluated round of a run that stopped early "
        f"({', '.join(sorted({str(r['status']) for r in stopped}))}); the mean after it is "
        "over the group's other runs."
        if stopped
        else ""
    )
    texts = {
        CURVES_NAME: f"Learning curves: each line the mean over a group's runs of the mean over "
        f"its clients; band: {BAND_TEXT[band]}{single}; {n_text}; training loss: the `loss` "
        f"each client's fit reports, weighted by its examples.{stops}",
        CLIENTS_NAME: f"Personalization macro-F1 of each client at {when}, the clients of all "
        f"runs of a group: box (quartiles, median) and one point per client; {n_text}.",
        PERS_GEN_NAME: f"Personalization against generalization macro-F1 at {when}: one dot per "
        f"run, a diamond per group mean; {n_text}.",
    }
    return {name: texts[name] for name in drawn}


def write_captions(
    captions: Mapping[str, str], prefix: str | Path, written: Sequence[Path]
) -> Path:
    """PREFIX-figures.md: each figure (its PNG) with its caption, ready to paste."""
    prefix, path = Path(prefix), captions_path(prefix)
    lines = [f"# Figures of {prefix.name}", ""]
    for name, text in captions.items():
        png = f"{prefix.name}-{name}.png"
        if any(p.name == png for p in written):
            lines += [f"![{name}]({png})", "", f"**{name}.** {text}", ""]
    atomic_write_text(path, "\n".join(lines))
    return path


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
    check_writable(captions_path(prefix))


def captions_path(prefix: str | Path) -> Path:
    """PREFIX-figures.md: the figures with their captions (`write_captions`)."""
    prefix = Path(prefix)
    return prefix.with_name(f"{prefix.name}-figures.md")


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
        if name != CURVES_NAME and fig.axes[0].get_title():  # title="": none added
            with style_context(style_of(fig)):  # the title's size of the figure's style
                fig.axes[0].set_title(f"{fig.axes[0].get_title()}\n({when})")
        paths += save_figure(fig, targets[name])
    return paths
