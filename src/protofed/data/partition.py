"""Partitioners: which samples each simulated client holds.

Every partitioner takes the whole `Dataset` and a seeded generator and returns one sorted array
of sample indices per client; the arrays are disjoint. All randomness comes from the generator
passed in, so a partition is a pure function of (config, data set, seed).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from protofed.config import DataConfig
from protofed.data.types import Dataset
from protofed.errors import ConfigError

Partitioner = Callable[[DataConfig, Dataset, np.random.Generator], list[np.ndarray]]


def _finish(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _check_classes_per_client(cfg: DataConfig, present: np.ndarray, dataset: Dataset) -> None:
    if cfg.classes_per_client > len(present):
        raise ConfigError(
            f"data.classes_per_client={cfg.classes_per_client} exceeds the {len(present)} classes "
            f"present in {dataset.name} (num_classes={dataset.num_classes})"
        )


def _require_groups(dataset: Dataset, partition: str) -> np.ndarray:
    if dataset.groups is None:
        raise ConfigError(
            f"data set {dataset.name} has no natural groups; use iid/dirichlet/pathological "
            f"instead of data.partition={partition}"
        )
    return dataset.groups


def _count(cfg: DataConfig) -> int:
    """data.num_clients outside a natural partition (validated to 10 when unset)."""
    return 10 if cfg.num_clients is None else cfg.num_clients


def iid(cfg: DataConfig, dataset: Dataset, rng: np.random.Generator) -> list[np.ndarray]:
    """Uniform random split into num_clients near-equal parts (the homogeneous baseline)."""
    return _finish(np.array_split(rng.permutation(len(dataset)), _count(cfg)))


def dirichlet(cfg: DataConfig, dataset: Dataset, rng: np.random.Generator) -> list[np.ndarray]:
    """Label skew: each class is spread over clients with proportions ~ Dir(alpha).

    This is the NIID-Bench / PFLlib procedure the papers use: a client that already holds its
    1/num_clients share stops receiving samples (keeps sizes comparable), and the whole draw is
    repeated until every client has at least min_size samples, at most max_retries times.
    """
    n, k = len(dataset), _count(cfg)
    if k * cfg.min_size > n:
        raise _dirichlet_error(cfg, n, "cannot give")
    by_class = [np.flatnonzero(dataset.y == c) for c in np.unique(dataset.y)]
    cap = n / k
    for _ in range(cfg.max_retries):
        parts: list[list[np.ndarray]] = [[] for _ in range(k)]
        sizes = np.zeros(k)
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(k, cfg.alpha))
            p = p * (sizes < cap)
            p = p / p.sum() if p.sum() > 0 else np.full(k, 1.0 / k)
            cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].append(chunk)
                sizes[client] += len(chunk)
        if sizes.min() >= cfg.min_size:
            return _finish([np.concatenate(p) for p in parts])
    raise _dirichlet_error(cfg, n, "could not give")


def _dirichlet_error(cfg: DataConfig, n: int, what: str) -> ConfigError:
    why = (
        f"in data.max_retries={cfg.max_retries} draws"
        if what == "could not give"
        else "at any draw"
    )
    return ConfigError(
        f"dirichlet partition {what} each of data.num_clients={cfg.num_clients} clients "
        f"data.min_size={cfg.min_size} of the {n} samples with data.alpha={cfg.alpha} {why}; "
        "raise data.alpha or lower data.num_clients / data.min_size"
    )


def _shard_counts(sizes: np.ndarray, total: int, cap: int) -> np.ndarray:
    """Shards per class: proportional to class size (largest quotient), each class >= 1 shard
    when there are enough shards, and <= cap so one class need not repeat within a client."""
    counts = np.zeros(len(sizes), dtype=np.int64)
    if total >= len(sizes):
        counts[:] = 1
    limit = np.minimum(cap, sizes)
    for _ in range(total - int(counts.sum())):
        room = counts < limit
        if not room.any():  # distinct classes are impossible: relax the cap to the class size
            room = counts < sizes
            limit = sizes
        score = np.where(room, sizes / (counts + 1), -1.0)
        counts[int(np.argmax(score))] += 1
    return counts


def _repair_duplicates(cls: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Swap shards between clients until no client holds one class twice, where possible.

    A swap removes a duplicate from client i and creates none (the partner lacks the class it
    receives, and i lacks the one it gets back), so one pass over the clients suffices.
    Returns the permutation of shard slots (row-major over `cls`, which is updated in place).
    """
    k, s = cls.shape
    slots = np.arange(k * s).reshape(k, s)
    for i in range(k):
        while True:
            vals, counts = np.unique(cls[i], return_counts=True)
            if (counts <= 1).all():
                break
            ca = vals[np.argmax(counts > 1)]
            a = int(np.flatnonzero(cls[i] == ca)[1])
            ok = ~(cls == ca).any(axis=1)[:, None] & ~np.isin(cls, cls[i])
            cand = np.argwhere(ok)
            if len(cand) == 0:
                break  # no swap can help: this client keeps a repeated class
            j, b = cand[rng.integers(len(cand))]
            cls[i, a], cls[j, b] = cls[j, b], cls[i, a]
            slots[i, a], slots[j, b] = slots[j, b], slots[i, a]
    return slots.reshape(-1)


def pathological(cfg: DataConfig, dataset: Dataset, rng: np.random.Generator) -> list[np.ndarray]:
    """McMahan et al.'s shards: each client gets classes_per_client shards of distinct classes.

    Shards are cut within a class (so a client sees exactly classes_per_client labels), their
    number per class is proportional to the class size, they are dealt at random, and clashes
    (two shards of one class on a client) are swapped away. If num_clients*classes_per_client
    is smaller than the number of classes, the classes left without a shard are not used.
    """
    k, per = _count(cfg), cfg.classes_per_client
    present = np.unique(dataset.y)
    _check_classes_per_client(cfg, present, dataset)
    order = rng.permutation(present)
    by_class = [rng.permutation(np.flatnonzero(dataset.y == c)) for c in order]
    sizes = np.array([len(i) for i in by_class])
    total = k * per
    if total > sizes.sum():
        raise ConfigError(
            f"pathological partition needs {total} shards (data.num_clients x "
            f"data.classes_per_client) but {dataset.name} has only {sizes.sum()} samples"
        )
    counts = _shard_counts(sizes, total, cap=k)
    shards, shard_cls = [], []
    for c, (idx, m) in enumerate(zip(by_class, counts, strict=True)):
        for chunk in np.array_split(idx, m) if m else []:
            shards.append(chunk)
            shard_cls.append(c)
    deal = rng.permutation(total)
    cls = np.asarray(shard_cls)[deal].reshape(k, per)
    slots = _repair_duplicates(cls, rng)
    dealt = deal[slots].reshape(k, per)
    return _finish([np.concatenate([shards[s] for s in row]) for row in dealt])


def natural(cfg: DataConfig, dataset: Dataset, rng: np.random.Generator) -> list[np.ndarray]:
    """One client per natural group (subject, user, writer, domain): every group here;
    `pick_groups` then keeps those data.num_clients or data.clients ask for.

    A group with a single sample cannot hold both a training and a test sample, so it is left
    out (FEMNIST has such writers); the run's partition notes count the unused samples.
    """
    groups = _require_groups(dataset, "natural")
    members = [np.flatnonzero(groups == g) for g in np.unique(groups)]
    return _finish([m for m in members if len(m) >= 2])


def group_name(dataset: Dataset, group: int) -> str:
    """A natural group's name, as its client is named (`group_<g>` where the source has none)."""
    names = dataset.group_names
    return names[group] if names is not None and group < len(names) else f"group_{group}"


def pick_groups(
    cfg: DataConfig, dataset: Dataset, parts: list[np.ndarray], rng: np.random.Generator
) -> list[np.ndarray]:
    """The natural partition's clients that data.clients names, or data.num_clients of them
    drawn with `rng` (kept in group order); all of them when neither is set or with
    data.clients=all. Asking for more groups than exist, or for one that does not exist, is a
    one-line error."""
    if cfg.clients == "all" or (cfg.clients is None and cfg.num_clients is None):
        return parts
    assert dataset.groups is not None  # natural() required them
    named = {group_name(dataset, int(dataset.groups[p[0]])): p for p in parts}
    if cfg.clients is None:
        count = int(cfg.num_clients or 0)
        if count > len(parts):
            raise ConfigError(
                f"data.num_clients={count} but {dataset.name} has {len(parts)} natural groups "
                "(subjects, users, ...) that can be clients; lower it, or leave it unset for all"
            )
        chosen = np.sort(rng.choice(len(parts), size=count, replace=False))
        return [parts[int(i)] for i in chosen]
    wanted = [str(c) for c in cfg.clients]
    if not wanted:
        raise ConfigError("data.clients is empty; name at least one group, or leave it unset")
    every = [group_name(dataset, int(g)) for g in np.unique(dataset.groups)]
    for name in wanted:
        if name not in named:
            why = "has fewer than 2 samples" if name in every else "is not a group"
            shown = ", ".join(every[:6]) + (", ..." if len(every) > 6 else "")
            raise ConfigError(
                f"data.clients: '{name}' {why} of {dataset.name} (its groups: {shown})"
            )
    if len(set(wanted)) != len(wanted):
        twice = next(n for n in wanted if wanted.count(n) > 1)
        raise ConfigError(f"data.clients names '{twice}' twice")
    if cfg.num_clients is not None and cfg.num_clients != len(wanted):
        raise ConfigError(
            f"data.num_clients={cfg.num_clients} but data.clients names {len(wanted)} groups; "
            "unset one of them"
        )
    return [p for name, p in named.items() if name in set(wanted)]


def mixed(cfg: DataConfig, dataset: Dataset, rng: np.random.Generator) -> list[np.ndarray]:
    """PFPL's mixed heterogeneity: one domain and classes_per_client classes per client.

    Domains are dealt round-robin in a seeded random order (every domain is used once there are
    at least as many clients as domains); each client then draws its classes among those its
    domain has, and the samples of each (domain, class) pair are split evenly among the clients
    that drew it. Pairs nobody drew are left out. With data.classes_spread = s > 0 a client's
    class count is drawn uniformly from n - s .. n + s (at least 1, at most its domain's
    classes), so n is the average, as in PFPL's (and FedProto's) n-way setting; s = 0 keeps
    the random stream of the exact-n partition.
    """
    groups = _require_groups(dataset, "mixed")
    _check_classes_per_client(cfg, np.unique(dataset.y), dataset)
    domains = rng.permutation(np.unique(groups))
    takers: dict[tuple[int, int], list[int]] = {}
    n, spread = cfg.classes_per_client, cfg.classes_spread
    for client in range(_count(cfg)):
        d = int(domains[client % len(domains)])
        have = np.unique(dataset.y[groups == d])
        ways = n if spread == 0 else int(rng.integers(max(1, n - spread), n + spread + 1))
        chosen = rng.choice(have, size=min(ways, len(have)), replace=False)
        for c in chosen:
            takers.setdefault((d, int(c)), []).append(client)
    parts: list[list[np.ndarray]] = [[] for _ in range(_count(cfg))]
    for (d, c), clients in sorted(takers.items()):
        idx = rng.permutation(np.flatnonzero((groups == d) & (dataset.y == c)))
        for client, chunk in zip(clients, np.array_split(idx, len(clients)), strict=True):
            parts[client].append(chunk)
    return _finish([np.concatenate(p) for p in parts])


PARTITIONERS: dict[str, tuple[str, Partitioner]] = {
    "iid": ("uniform random split, equal sizes", iid),
    "dirichlet": ("label skew: class proportions ~ Dir(data.alpha) per client", dirichlet),
    "pathological": ("data.classes_per_client label shards per client", pathological),
    "natural": ("one client per natural group (subject, user, writer, domain)", natural),
    "mixed": ("one domain + data.classes_per_client classes per client (PFPL)", mixed),
}


def partition(cfg: DataConfig, dataset: Dataset, rng: np.random.Generator) -> list[np.ndarray]:
    """Sample indices per client (sorted, disjoint) for data.partition."""
    if cfg.partition not in PARTITIONERS:
        raise ConfigError(
            f"data.partition: unknown partitioner '{cfg.partition}' (valid: {', '.join(PARTITIONERS)})"
        )
    if cfg.partition != "natural" and cfg.clients is not None:
        raise ConfigError(
            f"data.clients names natural groups, but data.partition={cfg.partition}; set "
            "data.partition=natural or unset data.clients"
        )
    if cfg.partition != "natural" and _count(cfg) > len(dataset):
        raise ConfigError(
            f"data.num_clients={_count(cfg)} exceeds the {len(dataset)} samples of {dataset.name}"
        )
    return PARTITIONERS[cfg.partition][1](cfg, dataset, rng)
