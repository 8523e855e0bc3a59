"""`protofed embed RUN`: t-SNE maps of what a run learned.

- `embedding_figure`: client K's personalized model embeds (its features before the head)
  its own test data and N other clients' test data, or one user's windows of another HAR data
  set (`--other-data`, FedAli's Fig. 4: do the same activities of two data sets meet?).
- `prototype_figure`: the class prototypes a run kept (`eval.keep_prototypes_every`),
  global and per client, across rounds (FedDPA's Figs. 7-11): do classes separate, do the
  clients' prototypes gather around the global ones as rounds pass.

Points are subsampled (at most `max_points` per client) and t-SNE is seeded, both from the
run's seed, so the same run draws the same figure. `style=` sizes a figure for a screen or
a paper (`protofed.plots.STYLES`: on paper the legend goes below the map), `title=`
replaces its title ("" for none).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from protofed.api import Run, resolve_config
from protofed.errors import ConfigError
from protofed.plots import (
    Style,
    get_style,
    legend_below,
    legend_columns,
    new_figure,
    set_title,
    style_context,
    wrap_text,
)
from protofed.runs import PARTITION, reading
from protofed.runtime.kept_prototypes import read_kept

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    from protofed.data.federated import FederatedData

EMBED_STREAM = 0xE3BE  # the seed stream of this module's draws (others, subsamples, t-SNE)
MAX_CLASSES_IN_LEGEND = 20
CLIENT_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h")  # one per client while they last


def _set_order(name: str) -> tuple[int, int]:
    """ "global" first, then client_0, client_1, ... in numeric order."""
    tail = name.rsplit("_", 1)[-1]
    return (0, 0) if name == "global" else (1, int(tail)) if tail.isdigit() else (2, 0)


def _rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, EMBED_STREAM, *keys]))


def other_clients(seed: int, client: int, num_clients: int, others: int) -> list[int]:
    """The `others` clients whose data `client`'s model embeds beside its own (seeded)."""
    pool = [i for i in range(num_clients) if i != client]
    picked = _rng(seed, 0).choice(pool, size=min(others, len(pool)), replace=False)
    return sorted(int(i) for i in picked)


def tsne(points: np.ndarray, seed: int) -> np.ndarray:
    """2-D t-SNE of `points` (N, D), seeded; perplexity lowered for small N.

    On one thread: the same map on every machine, and no OpenMP threads spinning against
    each other on a loaded machine (measured far faster there, docs/speed.md).
    """
    from sklearn.manifold import TSNE
    from threadpoolctl import threadpool_limits

    n = len(points)
    if n < 3:
        raise ConfigError(f"t-SNE needs at least 3 points, got {n}")
    if bad := int((~np.isfinite(points).all(axis=1)).sum()):
        raise ConfigError(
            f"{bad} of the {n} points to map hold NaN or infinity (a diverged model?)"
        )
    perplexity = float(min(30.0, max(1.0, (n - 1) / 3)))
    model = TSNE(2, perplexity=perplexity, init="pca", random_state=seed % 2**32)
    with threadpool_limits(1):
        return model.fit_transform(np.asarray(points, dtype=np.float64))


def federation(run: Run, data_dir: str | Path | None = None) -> FederatedData:
    """The run's clients rebuilt from its config (the same seed: the same split), checked
    against its partition.json so changed data cannot pass for the run's."""
    from protofed.data import build_federated

    extra = {} if data_dir is None else {"data.dir": str(data_dir)}
    cfg = resolve_config(run.dir.config(), **extra)
    fed = build_federated(cfg.data, cfg.seed)
    if [c.name for c in fed.clients] != run.client_names or fed.counts.tolist() != (
        run.dir.read_json("partition.json").get("counts")
    ):
        raise ConfigError(
            f"{run.path}: the data rebuilt from its config differ from its partition.json "
            "(moved or changed data files? pass --data-dir)"
        )
    return fed


def _class_colours(num_classes: int) -> list[Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if num_classes <= 10 else "tab20"]
    return [cmap(k % cmap.N) for k in range(num_classes)]


def nearest_own_agreement(points: np.ndarray, labels: np.ndarray, own: np.ndarray) -> float:
    """The share of the others' points whose nearest own point (Euclidean, in the embedding
    space, not the t-SNE map) has their class: how far the model maps the same activity of
    another user or data set where it maps its own (FedAli's Fig. 4 as a number); NaN
    without points on either side."""
    from sklearn.neighbors import NearestNeighbors

    if own.all() or not own.any():
        return float("nan")
    index = NearestNeighbors(n_neighbors=1).fit(points[own])
    nearest = index.kneighbors(points[~own], return_distance=False)[:, 0]
    return float(np.mean(labels[own][nearest] == labels[~own]))


def other_data_windows(
    run: Run, fed: FederatedData, name: str, max_points: int, data_dir: str | Path | None
) -> tuple[np.ndarray, np.ndarray, str]:
    """One user's windows of another HAR data set `name`, as the run's model reads its own
    (`protofed.data.harmonize`: channels by meaning, z-scored, resampled), labelled with the
    run's class indices, only the activities both sets have; and the user's name. The user
    and the subsample are drawn from the run's seed."""
    from protofed.config import DataConfig
    from protofed.data import load_dataset
    from protofed.data.harmonize import (
        canonical_activity,
        channels_of,
        harmonized_windows,
        missing_channels,
        own_sets,
    )

    cfg = resolve_config(
        run.dir.config(), **({} if data_dir is None else {"data.dir": str(data_dir)})
    )
    if name in own_sets(cfg.data.name, cfg.data.members):
        raise ConfigError(f"--other-data {name} is the run's own data set: use --other instead")
    target = load_dataset(cfg.data)
    if target.kind != "sensor" or target.X.ndim != 3:
        raise ConfigError(f"--other-data: the run's data set {cfg.data.name} is not sensor windows")
    other = load_dataset(DataConfig(name=name, channels="all", dir=cfg.data.dir))
    if other.kind != "sensor" or other.X.ndim != 3:
        raise ConfigError(f"--other-data: {name} is not a set of sensor windows")
    want = channels_of(target)
    missing = missing_channels(other, want)
    if missing:
        raise ConfigError(f"--other-data: {name} has no {', '.join(missing)} channel")
    ours = {canonical_activity(c): k for k, c in enumerate(fed.class_names)}
    label = np.array([ours.get(canonical_activity(c), -1) for c in other.class_names])
    mapped = label[other.y]
    if not (mapped >= 0).any():
        raise ConfigError(f"--other-data: {name} shares no activity with {cfg.data.name}")
    groups, group_names = other.groups, other.group_names
    if groups is None or group_names is None:
        raise ConfigError(f"--other-data: {name} does not say which user recorded a window")
    users = np.unique(groups[mapped >= 0])
    user = int(_rng(run.config.seed, 2).choice(users))
    rows = np.flatnonzero((groups == user) & (mapped >= 0))
    rows = np.sort(_rng(run.config.seed, 3).permutation(rows)[:max_points])
    x = harmonized_windows(other, want, target.X.shape[-1])[rows]
    return x, mapped[rows], str(group_names[user])


@dataclass
class EmbeddingMap:
    """A t-SNE map of a client model's embeddings, ready to draw (`draw_embedding`)."""

    xy: np.ndarray  # (N, 2)
    labels: np.ndarray  # class indices
    own: np.ndarray  # True where the point is the client's own data (test, or training)
    class_names: list[str]
    other_label: str  # what the other points are, for the legend
    title: str
    agreement: float  # nearest_own_agreement in the embedding space


def embedding_map(
    run: Run | str | Path,
    client: int,
    others: int = 3,
    max_points: int = 300,
    data_dir: str | Path | None = None,
    other_data: str | None = None,
    pick: list[int] | None = None,
    own_models: bool = False,
    pooled: bool = False,
) -> EmbeddingMap:
    """Client `client`'s personalized embeddings of its own test data and of `others` other
    clients' test data (those of `pick` if given), or (`other_data`) of one user's windows of
    another HAR data set, mapped by t-SNE. FedAli's Fig. 4 is either, in a federation spanning
    two sets (`data.name=har_combined`) the first: an HHAR client's model on a client of the
    other set. With `own_models` (its Fig. 5) every client's model embeds its own training
    data instead, all in one map: do the clients' models put a class in one region?
    `pooled`: the encoder's pooled output before the embedding layer (HART's 192
    dimensions, where FedAli's official code draws these figures) instead of the embedding."""
    import torch

    from protofed.prototypes import embed

    run = run if isinstance(run, Run) else Run(run)
    seed = run.config.seed
    model = run.client_model(client)  # checks the client id and the checkpoint first
    if pooled and not hasattr(model.get_submodule("features"), "pooled"):
        raise ConfigError(
            f"--pooled: model {run.config.model.name} has no pooled encoder output (hart has)"
        )
    fed = federation(run, data_dir)
    if others < 0:
        raise ConfigError(f"--other must be >= 0, got {others}")
    for i in pick or []:
        if not 0 <= i < len(fed.clients) or i == client:
            raise ConfigError(
                f"--with {i}: not another client (0..{len(fed.clients) - 1}, not {client})"
            )
    if other_data and (own_models or pick):
        raise ConfigError("--other-data goes with neither --with nor --own-models")
    device = next(model.parameters()).device
    parts: list[tuple[torch.Tensor, np.ndarray, bool, torch.nn.Module]] = []  # (x, y, own, by)
    if other_data:
        clients = [client]
    elif pick:
        clients = [client, *dict.fromkeys(pick)]
    else:
        clients = [client, *other_clients(seed, client, len(fed.clients), others)]
    for i in clients:
        data = fed.clients[i]
        xs, ys = (data.train_x, data.train_y) if own_models else (data.test_x, data.test_y)
        keep = np.sort(_rng(seed, 1, i).permutation(len(ys))[:max_points])
        by = run.client_model(i) if own_models and i != client else model
        parts.append(
            (xs[torch.as_tensor(keep, dtype=torch.long)], ys.numpy()[keep], i == client, by)
        )
    if other_data:
        x, y, user = other_data_windows(run, fed, other_data, max_points, data_dir)
        parts.append((torch.from_numpy(x), y, False, model))
        others_said, other_label = f"{other_data} user {user}'s", f"{other_data} ({user})"
    elif pick:
        names = ", ".join(fed.clients[i].name for i in clients[1:])
        others_said, other_label = f"{names}'s", names
    else:
        others_said, other_label = f"{len(parts) - 1} other clients'", "other clients"
    points = np.concatenate(
        [embed(by, x.to(device), pooled=pooled).cpu().numpy() for x, _, _, by in parts]
    )
    labels = np.concatenate([y for _, y, _, _ in parts])
    own = np.concatenate([np.full(len(y), mine) for _, y, mine, _ in parts])
    agreement = nearest_own_agreement(points, labels, own)
    if own_models:
        title = (
            f"{run.config.algorithm.name} on {fed.dataset}: each client's own model on its own "
            f"training data,\n{fed.clients[client].name} ({int(own.sum())} points) and "
            f"{other_label} ({int((~own).sum())})"
        )
    else:
        title = (
            f"{run.config.algorithm.name} on {fed.dataset}: {fed.clients[client].name}'s "
            f"personalized {'pooled encoder outputs' if pooled else 'embeddings'}\nof its own "
            f"test data ({int(own.sum())} points) and "
            f"{others_said} data ({int((~own).sum())})"
        )
    if np.isfinite(agreement):
        title += f";\nthe others' nearest own point is of their class for {100 * agreement:.0f} %"
    return EmbeddingMap(
        tsne(points, seed), labels, own, fed.class_names, other_label, title, agreement
    )


def _class_handles(classes: np.ndarray, class_names: list[str], colours: np.ndarray) -> list[Any]:
    """A legend square per class present (none where there are too many to read)."""
    from matplotlib.lines import Line2D

    present = np.unique(classes)
    if len(present) > MAX_CLASSES_IN_LEGEND:
        return []
    return [
        Line2D([], [], marker="s", ls="", color=colours[k], label=class_names[k]) for k in present
    ]


def _map_figure(style: Style, handles: list[Any], title: str) -> tuple[Figure, Axes]:
    """The figure of a t-SNE map: 7.2 x 5.4 in on screen; on paper the style's width, tall
    enough for the map, the legend below it and `title`'s lines."""
    if not style.paper:
        return new_figure(7.2, 5.4, style=style)
    import matplotlib as mpl

    width = float(style.width or 3.3)
    labels = [h.get_label() for h in handles]
    rows = -(-len(labels) // legend_columns(width, labels, float(mpl.rcParams["legend.fontsize"])))
    lines = title.count("\n") + 1 if title else 0
    height = min(0.8 * width, 4.0) + 0.5 + 0.16 * rows + 0.16 * lines
    return new_figure(width, height, layout="constrained", style=style)


def _map_title(style: Style, title: str | None, default: str) -> str:
    """The title drawn: `title` as given ("" none), else the default, on paper re-wrapped to
    the style's width."""
    if title is not None:
        return title
    if not style.paper:
        return default
    import matplotlib as mpl

    size = float(mpl.rcParams["axes.titlesize"])
    return wrap_text(" ".join(default.split("\n")), float(style.width or 3.3), size)


def _finish_map(fig: Figure, ax: Axes, style: Style, handles: list[Any], title: str) -> None:
    """Axis labels, the title, and the legend: right of the map on screen, below on paper."""
    ax.set_xlabel("t-SNE 1")
    ax.set_ylabel("t-SNE 2")
    set_title(ax, title, "")
    if style.paper:
        legend_below(fig, handles, [h.get_label() for h in handles])
        return
    ax.title.set_fontsize(10)
    ax.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False
    )


def draw_embedding(
    m: EmbeddingMap, *, style: str | Style = "screen", title: str | None = None
) -> Figure:
    """colour = class, filled circle = own data, cross = the others'. `style`: `screen`,
    `paper` or `paper-wide`; `title`: None `m.title`, "" none."""
    from matplotlib.lines import Line2D

    chosen = get_style(style)
    colours = np.asarray(_class_colours(len(m.class_names)))
    xy, y, mine = m.xy, m.labels, m.own
    dot = 0.5 if chosen.paper else 1.0  # marker areas: smaller on a smaller figure
    with style_context(chosen):
        handles = [
            Line2D(
                [], [], marker="o", ls="", color="grey", markeredgecolor="black", label="own data"
            ),
            Line2D([], [], marker="x", ls="", color="grey", label=m.other_label),
            *_class_handles(y, m.class_names, colours),
        ]
        text = _map_title(chosen, title, m.title)
        fig, ax = _map_figure(chosen, handles, text)
        theirs = xy[~mine]
        ax.scatter(
            theirs[:, 0],
            theirs[:, 1],
            c=colours[y[~mine]],
            marker="x",
            s=14 * dot,
            linewidths=0.8,
            alpha=0.6,
        )
        ax.scatter(
            xy[mine][:, 0],
            xy[mine][:, 1],
            c=colours[y[mine]],
            marker="o",
            s=16 * dot,
            edgecolors="black",
            linewidths=0.3,
        )
        _finish_map(fig, ax, chosen, handles, text)
    return fig


def embedding_figure(
    run: Run | str | Path,
    client: int,
    *,
    style: str | Style = "screen",
    title: str | None = None,
    **options: Any,
) -> Figure:
    """`embedding_map(run, client, **options)` drawn (`draw_embedding`) in `style`."""
    chosen = get_style(style)  # a bad style fails before the t-SNE
    return draw_embedding(embedding_map(run, client, **options), style=chosen, title=title)


@dataclass
class PrototypeMap:
    """Every kept prototype, mapped by t-SNE, with what each point is."""

    xy: np.ndarray  # (N, 2)
    classes: np.ndarray  # each point's class index
    rounds: np.ndarray  # each point's kept round
    owners: np.ndarray  # each point's index into `names`
    names: list[str]  # the kept sets: "global" first, then the clients in order
    class_names: list[str]
    kept_rounds: list[int]  # in order

    @property
    def clients(self) -> list[str]:
        return [n for n in self.names if n != "global"]


def prototype_map(run: Run) -> PrototypeMap:
    """The t-SNE map of the prototypes `run` kept; a one-line error where there are none or
    the files do not fit together."""
    cfg = run.config
    if cfg.eval.keep_prototypes_every > 0 and not (run.path / "prototypes").is_dir():
        raise ConfigError(
            f"{run.path} kept no prototypes: {cfg.algorithm.name} has no class prototypes"
        )
    kept = read_kept(run.path)  # the one-line error first, before anything heavy
    part = run.dir.read_json(PARTITION)
    with reading(run.path / PARTITION):
        class_names = part.get("class_names") or [str(k) for k in range(int(part["num_classes"]))]
    names = sorted({n for s in kept.values() for n in s}, key=_set_order)
    rows, classes, rounds, owners = [], [], [], []
    for r, sets in kept.items():
        for name, (means, ids) in sets.items():
            if means.dtype.kind not in "iuf" or not np.isfinite(means).all():
                raise ConfigError(
                    f"{run.path / 'prototypes'}: round {r}'s {name} prototypes are not all "
                    "finite numbers; nothing to draw"
                )
            rows.append(means)
            classes.append(ids)
            rounds.append(np.full(len(ids), r))
            owners.append(np.full(len(ids), names.index(name)))
    if not rows or sum(len(c) for c in classes) == 0:
        raise ConfigError(f"{run.path}: the kept prototype files hold no prototype")
    widths = {r.shape[1] for r in rows if r.ndim == 2}
    if len(widths) != 1 or any(r.ndim != 2 for r in rows):
        raise ConfigError(
            f"{run.path / 'prototypes'}: the kept prototypes differ in width ({sorted(widths)}); "
            "the files come from different runs"
        )
    return PrototypeMap(
        tsne(np.concatenate(rows), cfg.seed),
        np.concatenate(classes),
        np.concatenate(rounds),
        np.concatenate(owners),
        names,
        class_names,
        sorted(kept),
    )


def _set_markers(m: PrototypeMap) -> dict[str, str]:
    """A star for the global set; one marker per client while they last, else dots."""
    clients = m.clients
    marker = {
        n: "o" if len(clients) > len(CLIENT_MARKERS) else CLIENT_MARKERS[j]
        for j, n in enumerate(clients)
    }
    marker["global"] = "*"
    return marker


def _round_alpha(m: PrototypeMap) -> dict[int, float]:
    """Each kept round's opacity: fainter = earlier."""
    order = m.kept_rounds
    return {r: 0.25 + 0.75 * (j + 1) / len(order) for j, r in enumerate(order)}


def _prototype_legend(
    m: PrototypeMap, marker: dict[str, str], alpha: dict[int, float], colours: np.ndarray
) -> list[Line2D]:
    """The legend's handles: the sets (global, clients), a few rounds, the classes."""
    from matplotlib.lines import Line2D

    order, clients = m.kept_rounds, m.clients
    handles = []
    if "global" in m.names:
        handles.append(
            Line2D(
                [],
                [],
                marker="*",
                ls="",
                ms=11,
                color="grey",
                markeredgecolor="black",
                label="global",
            )
        )
    if len(clients) > len(CLIENT_MARKERS):
        handles.append(Line2D([], [], marker="o", ls="", color="grey", label="client (local)"))
    else:
        handles += [Line2D([], [], marker=marker[n], ls="", color="grey", label=n) for n in clients]
    handles += [
        Line2D([], [], marker="o", ls="", color="grey", alpha=alpha[r], label=f"round {r}")
        for r in (order if len(order) <= 6 else [order[0], order[len(order) // 2], order[-1]])
    ]
    return handles + _class_handles(m.classes, m.class_names, colours)


def draw_prototypes(
    m: PrototypeMap, algorithm: str, *, style: str | Style = "screen", title: str | None = None
) -> Figure:
    """`m` drawn: colour = class, star = global, a marker per client; fainter = earlier.
    `style`: `screen`, `paper` or `paper-wide`; `title`: None the default, "" none."""
    order, clients = m.kept_rounds, m.clients
    chosen = get_style(style)
    alpha = _round_alpha(m)
    colours = np.asarray(_class_colours(len(m.class_names)))
    marker = _set_markers(m)
    dot = 0.5 if chosen.paper else 1.0  # marker areas: smaller on a smaller figure
    default = (
        f"{algorithm}: class prototypes over rounds {order[0]}-{order[-1]}\n"
        f"({'global and ' if 'global' in m.names else ''}{len(clients)} clients' local, "
        f"{len(order)} kept rounds)"
    )
    with style_context(chosen):
        handles = _prototype_legend(m, marker, alpha, colours)
        text = _map_title(chosen, title, default)
        fig, ax = _map_figure(chosen, handles, text)
        for r in order:
            for j, name in enumerate(m.names):
                pick = (m.rounds == r) & (m.owners == j)
                if pick.any():
                    is_g = name == "global"
                    ax.scatter(
                        m.xy[pick, 0],
                        m.xy[pick, 1],
                        c=colours[m.classes[pick]],
                        marker=marker[name],
                        s=(120 if is_g else 16) * dot,
                        alpha=alpha[r],
                        edgecolors="black" if is_g else "none",
                        linewidths=0.5,
                    )
        _finish_map(fig, ax, chosen, handles, text)
    return fig


def prototype_figure(
    run: Run | str | Path, *, style: str | Style = "screen", title: str | None = None
) -> Figure:
    """t-SNE of every kept prototype (`prototype_map`), drawn (`draw_prototypes`) in `style`:
    colour = class, star = global, dot = a client's; fainter = earlier round."""
    chosen = get_style(style)  # a bad style fails before the t-SNE
    run = run if isinstance(run, Run) else Run(run)
    return draw_prototypes(prototype_map(run), run.config.algorithm.name, style=chosen, title=title)
