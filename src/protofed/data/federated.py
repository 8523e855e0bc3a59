"""Per-client tensors: load, partition, then split every client into train/val/test.

The papers split each client's own samples (not the source's published train/test), so that
is what happens here; the predefined split of a source is ignored. All randomness derives from
one integer seed through explicit generators: partitioning draws from SeedSequence([seed, 1])
and client i's split from SeedSequence([seed, 2, i]), so changing the split of one client or
adding a client never changes the partition, and the same seed gives identical tensors.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from protofed.config import DataConfig
from protofed.core.seeding import NATURAL_CLIENTS, numpy_generator
from protofed.data.partition import partition, pick_groups
from protofed.data.sources import load_dataset
from protofed.data.types import Dataset
from protofed.errors import ConfigError

SPLITS = ("train", "val", "test")


@dataclass
class ClientData:
    """One client's samples, already split; tensors are contiguous float32 / int64."""

    name: str
    group: int | None
    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    def sizes(self) -> dict[str, int]:
        return {s: len(getattr(self, f"{s}_y")) for s in SPLITS}

    def to(self, device: torch.device | str) -> ClientData:
        """The same client with its tensors on `device` (moved once, before training)."""
        moved = {
            f"{s}_{k}": getattr(self, f"{s}_{k}").to(device) for s in SPLITS for k in ("x", "y")
        }
        return ClientData(name=self.name, group=self.group, **moved)


@dataclass
class FederatedData:
    """All clients of one experiment plus what a report needs to describe them."""

    dataset: str
    num_classes: int
    class_names: list[str]
    input_shape: tuple[int, ...]
    kind: str
    clients: list[ClientData]
    counts: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def counts_by_split(self) -> dict[str, np.ndarray]:
        """(clients, classes) sample counts for each of train / val / test."""
        return {
            s: np.stack(
                [
                    np.bincount(getattr(c, f"{s}_y").cpu().numpy(), minlength=self.num_classes)
                    for c in self.clients
                ]
            ).astype(np.int64)
            for s in SPLITS
        }

    def fingerprint(self) -> str:
        """sha256 of every client's split tensors: the data a run saw, wherever its files are.

        A resumed run compares it with its checkpoint's, so changed files (or a changed
        partition) cannot continue a run silently. About 1 s per GB of features.
        """
        digest = hashlib.sha256(f"{self.dataset}/{self.num_classes}".encode())
        for c in self.clients:
            digest.update(c.name.encode())
            for s in SPLITS:
                for k in ("x", "y"):
                    tensor = getattr(c, f"{s}_{k}").detach().cpu().contiguous()
                    digest.update(f"{s}_{k}{tuple(tensor.shape)}{tensor.dtype}".encode())
                    digest.update(tensor.numpy().reshape(-1).view(np.uint8))
        return digest.hexdigest()

    def summary(self) -> dict[str, Any]:
        """JSON-able description: sizes per client and split, and the class-count matrix."""
        return {
            "dataset": self.dataset,
            "kind": self.kind,
            "num_clients": len(self.clients),
            "num_classes": self.num_classes,
            "class_names": list(self.class_names),
            "input_shape": list(self.input_shape),
            "clients": [{"name": c.name, "group": c.group, **c.sizes()} for c in self.clients],
            "counts": self.counts.tolist(),
            "meta": self.meta,
        }

    def counts_table(self) -> str:
        """Clients x classes counts (all splits together) as aligned plain text."""
        names = [c.name for c in self.clients]
        rows = [[*map(int, r), int(r.sum())] for r in self.counts]
        header = [str(i) for i in range(self.num_classes)] + ["total"]
        widths = [
            max(len(h), *(len(str(r[j])) for r in rows)) if rows else len(h)
            for j, h in enumerate(header)
        ]
        lead = max([len("client"), *map(len, names)])
        lines = []
        if self.num_classes <= 20:
            legend = ", ".join(f"{i}={n}" for i, n in enumerate(self.class_names))
            lines.append(f"classes: {legend}")

        def fmt(first: str, cells: list[Any]) -> str:
            body = " ".join(str(v).rjust(w) for v, w in zip(cells, widths, strict=True))
            return f"{first.ljust(lead)}  {body}"

        lines.append(fmt("client", header))
        lines.extend(fmt(name, r) for name, r in zip(names, rows, strict=True))
        return "\n".join(lines)


def _allocate(counts: np.ndarray, fractions: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Integer (classes, 3) train/val/test sizes with each class's row summing to its count.

    Every cell is the floor or ceiling of count * fraction (so class proportions hold within
    one sample), a class's first sample goes to train and its second to test (so a rare class
    is never lost from training), and the leftover units go, class by class in `order`, to the
    split furthest below its overall target (so the client's fractions hold as a whole).
    """
    exact = counts[:, None] * fractions[None, :]
    alloc = np.floor(exact + 1e-9).astype(np.int64)
    ceil = np.ceil(exact - 1e-9).astype(np.int64)
    tr, va, te = 0, 1, 2
    for c, n in enumerate(counts):
        if n >= 1 and alloc[c, tr] == 0:
            alloc[c, tr] = ceil[c, tr] = 1
        if n >= 2 and alloc[c, te] == 0:
            alloc[c, te] = ceil[c, te] = 1
        while alloc[c].sum() > n:  # the minimums overdrew a tiny class: take back from val
            s = va if alloc[c, va] > 0 else (tr if alloc[c, tr] > 1 else te)
            alloc[c, s] -= 1
    target = counts.sum() * fractions
    for c in order:
        for _ in range(int(counts[c] - alloc[c].sum())):
            room = (alloc[c] < ceil[c]) & (fractions > 0)
            if not room.any():
                room = fractions > 0
            deficit = np.where(room, target - alloc.sum(axis=0), -np.inf)
            best = max((tr, te, va), key=lambda s: deficit[s])  # ties: train, then test
            alloc[c, best] += 1
    return _ensure_test_and_val(alloc, counts, fractions)


def _ensure_test_and_val(
    alloc: np.ndarray, counts: np.ndarray, fractions: np.ndarray
) -> np.ndarray:
    """Client-level guarantees the per-class rounding can miss when most classes are tiny.

    (A writer with six one-sample classes would otherwise put everything in train.) Test gets
    a sample whenever the client has two; val gets one when its expected size is >= 1 and a
    class can spare a second train sample.
    """
    n = int(counts.sum())
    for s, needed in ((2, n >= 2), (1, n * fractions[1] >= 1)):
        if not needed or alloc[:, s].sum() > 0:
            continue
        donor = int(np.argmax(alloc[:, 0]))
        if alloc[donor, 0] >= 2 or s == 2:
            alloc[donor, 0] -= 1
            alloc[donor, s] += 1
    return alloc


def stratified_split(
    y: np.ndarray, fractions: tuple[float, float, float], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions into `y` for train / val / test, stratified by class and sorted."""
    classes, inverse = np.unique(y, return_inverse=True)
    counts = np.bincount(inverse, minlength=len(classes))
    alloc = _allocate(
        counts, np.asarray(fractions, dtype=np.float64), rng.permutation(len(classes))
    )
    out: list[list[np.ndarray]] = [[], [], []]
    for c in range(len(classes)):
        members = rng.permutation(np.flatnonzero(inverse == c))
        cuts = np.cumsum(alloc[c])[:-1]
        for s, part in enumerate(np.split(members, cuts)):
            out[s].append(part)
    empty = np.empty(0, dtype=np.int64)
    tr, va, te = (np.sort(np.concatenate(parts)) if parts else empty for parts in out)
    return tr, va, te


def _tensors(X: np.ndarray, y: np.ndarray, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(np.ascontiguousarray(X[idx], dtype=np.float32))
    return x, torch.from_numpy(np.ascontiguousarray(y[idx], dtype=np.int64))


def _client_group(ds: Dataset, idx: np.ndarray) -> int | None:
    if ds.groups is None or len(idx) == 0:
        return None
    found = np.unique(ds.groups[idx])
    return int(found[0]) if len(found) == 1 else None


def _client_name(cfg: DataConfig, ds: Dataset, i: int, group: int | None) -> str:
    if cfg.partition == "natural" and group is not None:
        if ds.group_names is not None and group < len(ds.group_names):
            return ds.group_names[group]
        return f"group_{group}"
    return f"client_{i:03d}"


def _predefined_split(
    ds: Dataset, idx: np.ndarray, fractions: tuple[float, float, float], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The source's published train/test membership; val is carved from train (stratified).

    For reproducing a library's exact work (PFLlib's UCI-HAR is split 75/25 per subject).
    `fractions[1] / (fractions[0] + fractions[1])` of each client's training samples go to val.
    """
    assert ds.predefined_split is not None  # build_federated refuses a set without one
    published = ds.predefined_split[idx]
    train_pos, test_pos = np.flatnonzero(published == 0), np.flatnonzero(published == 1)
    val_share = fractions[1] / (fractions[0] + fractions[1])
    if val_share > 0 and len(train_pos) > 1:
        tr, va, rest = stratified_split(ds.y[idx[train_pos]], (1 - val_share, val_share, 0.0), rng)
        # the splitter keeps one sample for a third part even at fraction 0: it is training data
        return np.sort(train_pos[np.concatenate([tr, rest])]), train_pos[va], test_pos
    return train_pos, train_pos[:0], test_pos


def standardize_enabled(cfg: DataConfig, ds: Dataset) -> bool:
    """data.standardize, or its default: on for own tabular and sensor data only.

    Registered loaders normalise as their source needs (z-scored tables, per-channel
    standardised CIFAR, unscaled inertial signals that the 1-D CNNs expect); a file of one's
    own arrives as it was measured, often with features on scales apart by orders of magnitude.
    """
    if cfg.standardize is not None:
        return cfg.standardize
    return ds.name == "arrays" and ds.kind in ("tabular", "sensor")


def standardize(X: np.ndarray, train_rows: np.ndarray) -> np.ndarray:
    """Z-score each feature (each channel for sensor windows and images) with statistics of
    `train_rows` only, so validation and test data never inform the transform."""
    axes = (0,) if X.ndim == 2 else (0, *range(2, X.ndim))
    fit = X[train_rows].astype(np.float64)
    mean = fit.mean(axis=axes, keepdims=True)
    std = fit.std(axis=axes, keepdims=True)
    return ((X - mean) / np.where(std > 0, std, 1.0)).astype(np.float32)


def build_federated(cfg: DataConfig, seed: int, dataset: Dataset | None = None) -> FederatedData:
    """Load (unless `dataset` is given), partition, and split every client; see module doc."""
    ds = dataset if dataset is not None else load_dataset(cfg)
    if cfg.predefined_split and ds.predefined_split is None:
        raise ConfigError(
            f"data.predefined_split=true but data set '{ds.name}' publishes no train/test split"
        )
    parts = partition(cfg, ds, np.random.default_rng(np.random.SeedSequence([seed, 1])))
    notes: list[str] = []
    if cfg.partition == "natural":
        groups = len(parts)
        parts = pick_groups(cfg, ds, parts, numpy_generator(seed, NATURAL_CLIENTS))
        if len(parts) < groups:
            how = "named in data.clients" if cfg.clients is not None else "drawn from the seed"
            notes.append(f"natural partition: {len(parts)} of {groups} groups, {how}")
    used = sum(len(p) for p in parts)
    if used < len(ds):
        notes.append(f"{cfg.partition} partition: {len(ds) - used} of {len(ds)} samples unused")
    plans = []
    for i, idx in enumerate(parts):
        group = _client_group(ds, idx)
        name = _client_name(cfg, ds, i, group)
        rng = np.random.default_rng(np.random.SeedSequence([seed, 2, i]))
        if cfg.predefined_split:
            tr, va, te = _predefined_split(ds, idx, cfg.split, rng)
        else:
            tr, va, te = stratified_split(ds.y[idx], cfg.split, rng)
        if len(tr) == 0 or len(te) == 0:
            fix = (
                "this group is too small to split; remove it from the data or choose another data.partition"
                if cfg.partition == "natural"
                else "lower data.num_clients or use a less extreme data.partition"
            )
            raise ConfigError(
                f"client '{name}' has {len(idx)} sample(s) but needs at least one train and one test sample; {fix}"
            )
        plans.append((name, group, idx[tr], idx[va], idx[te]))
    X = ds.X
    standardized = standardize_enabled(cfg, ds)
    if standardized:
        X = standardize(ds.X, np.concatenate([plan[2] for plan in plans]))
        notes.append("features standardised with the clients' training data (data.standardize)")
    clients = []
    for name, group, *rows in plans:
        train, val, test = (_tensors(X, ds.y, r) for r in rows)
        clients.append(ClientData(name, group, *train, *val, *test))
    fed = FederatedData(
        dataset=ds.name,
        num_classes=ds.num_classes,
        class_names=list(ds.class_names),
        input_shape=tuple(ds.input_shape),
        kind=ds.kind,
        clients=clients,
        counts=np.zeros((len(clients), ds.num_classes), dtype=np.int64),
        meta={
            "partition": cfg.partition,
            "seed": seed,
            "split": list(cfg.split),
            "notes": notes,
            "group_names": None if ds.group_names is None else list(ds.group_names),
            "standardized": standardized,
            "source": _jsonable(ds.meta),
        },
    )
    fed.counts = np.sum(list(fed.counts_by_split().values()), axis=0)
    return fed


def _jsonable(value: Any) -> Any:
    """Data set meta may hold numpy scalars/arrays; make it safe for json.dumps."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
