"""Human activity recognition: UCI-HAR, WISDM and HHAR sensor windows, their combination
(`har_combined`), and WISDM's published feature table (`wisdm_features`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from protofed.config import DataConfig
from protofed.data.harmonize import COMBINED_CHANNELS, HAR_WINDOWS, combined
from protofed.data.sources.reading import (
    as_labels,
    clean_table,
    data_root,
    encode,
    load_npz,
    missing_file,
    note_read,
    registered,
    require,
    require_columns,
)
from protofed.data.types import Dataset
from protofed.errors import ConfigError

_UCI_CHANNELS = [
    f"{kind}_{axis}" for kind in ("body_acc", "body_gyro", "total_acc") for axis in "xyz"
]
# The papers feed a 3-axis accelerometer plus a 3-axis gyroscope: total (not gravity-removed)
# acceleration first, then angular velocity.
_UCI_DEFAULT = [
    "total_acc_x",
    "total_acc_y",
    "total_acc_z",
    "body_gyro_x",
    "body_gyro_y",
    "body_gyro_z",
]
_UCI_CLASSES = [
    "WALKING",
    "WALKING_UPSTAIRS",
    "WALKING_DOWNSTAIRS",
    "SITTING",
    "STANDING",
    "LAYING",
]
_UCI_FOLDER = "UCI HAR Dataset"


def select_channels(
    name: str, spec: str | list[int | str], available: Sequence[str], default: Sequence[str]
) -> list[int]:
    """Resolve data.channels ('default', 'all', or names/indices) to indices into `available`."""
    available = list(available)
    if isinstance(spec, str):
        if spec == "default":
            return [available.index(c) for c in default]
        if spec == "all":
            return list(range(len(available)))
        spec = [spec]
    if not spec:
        raise ConfigError(f"data.channels is empty; {name} has: {', '.join(available)}")
    picked: list[int] = []
    for item in spec:
        if isinstance(item, int) and not isinstance(item, bool):
            if not 0 <= item < len(available):
                raise ConfigError(
                    f"data.channels: index {item} out of range for {name} "
                    f"(0..{len(available) - 1}: {', '.join(available)})"
                )
            picked.append(item)
        elif isinstance(item, str) and item in available:
            picked.append(available.index(item))
        else:
            raise ConfigError(
                f"data.channels: unknown channel {item!r} for {name}; valid: "
                f"'default', 'all', or any of {', '.join(available)} (or indices)"
            )
    if len(set(picked)) != len(picked):
        raise ConfigError(f"data.channels: a channel is listed twice in {spec}")
    return picked


class _UciWindows(NamedTuple):
    """UCI-HAR as read from either of its two layouts, before the `Dataset` is built."""

    X: np.ndarray
    y: np.ndarray
    subject: np.ndarray
    split: np.ndarray | None
    class_names: list[str]
    split_source: str
    file: str


def _read_whitespace(path: Path) -> np.ndarray:
    if not path.is_file():
        raise ConfigError(
            f"uci_har: file not found: {path} (the '{_UCI_FOLDER}/' folder is incomplete)"
        )
    import pandas as pd  # here: slow to import (`protofed list`)

    return pd.read_csv(note_read(path), sep=r"\s+", header=None, dtype=np.float64).to_numpy()


def _load_uci_folder(folder: Path, chans: list[int]) -> _UciWindows:
    """The original UCI distribution: per split, one text file per inertial channel."""
    xs, ys, subjects, splits = [], [], [], []
    for code, part in enumerate(("train", "test")):
        signals = [
            _read_whitespace(folder / part / "Inertial Signals" / f"{_UCI_CHANNELS[c]}_{part}.txt")
            for c in chans
        ]
        y = _read_whitespace(folder / part / f"y_{part}.txt").reshape(-1).astype(np.int64) - 1
        subj = _read_whitespace(folder / part / f"subject_{part}.txt").reshape(-1).astype(np.int64)
        n = len(y)
        for c, sig in zip(chans, signals, strict=True):
            if sig.shape[0] != n:
                raise ConfigError(
                    f"uci_har: {_UCI_CHANNELS[c]}_{part}.txt has {sig.shape[0]} rows but y_{part}.txt has {n}"
                )
        xs.append(np.stack(signals, axis=1).astype(np.float32))
        ys.append(y)
        subjects.append(subj)
        splits.append(np.full(n, code, dtype=np.int64))
    names = _UCI_CLASSES
    labels_file = folder / "activity_labels.txt"
    if labels_file.is_file():
        text = note_read(labels_file).read_text()
        rows = [line.split() for line in text.splitlines() if line.strip()]
        names = [r[1] for r in sorted(rows, key=lambda r: int(r[0]))]
    return _UciWindows(
        X=np.concatenate(xs),
        y=np.concatenate(ys),
        subject=np.concatenate(subjects),
        split=np.concatenate(splits),
        class_names=names,
        split_source="UCI-HAR published split (21 train / 9 test subjects)",
        file=str(folder),
    )


def _load_uci_npz(path: Path, chans: list[int]) -> _UciWindows:
    """The PFLlib conversion: one npz, channels named or in `_UCI_CHANNELS` order."""
    d = load_npz(path, "X", "y", "subject")
    stored = [str(c) for c in d["channels"]] if "channels" in d else _UCI_CHANNELS
    X = np.ascontiguousarray(
        d["X"][:, [stored.index(_UCI_CHANNELS[c]) for c in chans]], dtype=np.float32
    )
    class_names = [str(c) for c in d.get("class_names", _UCI_CLASSES)]
    split_note = d.get("split_note", "per-subject 75/25 split of the PFLlib conversion")
    return _UciWindows(
        X=X,
        y=d["y"],
        subject=d["subject"],
        split=d.get("split"),
        class_names=class_names,
        split_source=str(split_note),
        file=str(path),
    )


def load_uci_har(cfg: DataConfig) -> Dataset:
    """UCI-HAR windows from the converted npz, else from the original UCI folder."""
    root = data_root(cfg)
    npz_path = root / "har" / "uci_har.npz"
    folder = root / _UCI_FOLDER
    chans = select_channels("uci_har", cfg.channels, _UCI_CHANNELS, _UCI_DEFAULT)
    if npz_path.is_file():
        raw = _load_uci_npz(npz_path, chans)
    elif folder.is_dir():
        raw = _load_uci_folder(folder, chans)
    else:
        raise missing_file("uci_har", npz_path, also=f"the folder {folder}")
    groups, group_names = encode(raw.subject, "subject")
    return Dataset(
        name="uci_har",
        X=raw.X,
        y=as_labels(raw.y),
        num_classes=len(raw.class_names),
        class_names=raw.class_names,
        groups=groups,
        group_names=group_names,
        predefined_split=None if raw.split is None else raw.split.astype(np.int64),
        kind="sensor",
        meta={
            "channels": [_UCI_CHANNELS[c] for c in chans],
            "sampling_hz": 50,
            "file": raw.file,
            "predefined_split": raw.split_source,
        },
    )


def _sensor_npz(
    cfg: DataConfig, name: str, relpath: str, hz: int | None, keep_split: bool
) -> Dataset:
    """WISDM / HHAR windows: X (N, C, T), y, user, channels, class_names."""
    path = require(cfg, name, relpath)
    d = load_npz(path, "X", "y", "user")
    available = [str(c) for c in d["channels"]] if "channels" in d else ["acc_x", "acc_y", "acc_z"]
    chans = select_channels(name, cfg.channels, available, available)
    groups, group_names = encode(d["user"], "user")
    class_names = [str(c) for c in d["class_names"]] if "class_names" in d else None
    y = as_labels(d["y"])
    if class_names is None:
        class_names = [str(i) for i in range(int(y.max()) + 1)]
    meta: dict[str, Any] = {
        "channels": [available[c] for c in chans],
        "sampling_hz": hz,
        "file": str(path),
    }
    split = d.get("split") if keep_split else None
    if not keep_split:
        meta["predefined_split"] = "none: the file holds only the published test windows"
    return Dataset(
        name=name,
        X=np.ascontiguousarray(d["X"][:, chans], dtype=np.float32),
        y=y,
        num_classes=len(class_names),
        class_names=class_names,
        groups=groups,
        group_names=group_names,
        predefined_split=None if split is None else split.astype(np.int64),
        kind="sensor",
        meta=meta,
    )


def load_wisdm(cfg: DataConfig) -> Dataset:
    """WISDM v1.1 accelerometer windows at 20 Hz, with the file's train/test split."""
    return _sensor_npz(cfg, "wisdm", "har/wisdm.npz", hz=20, keep_split=True)


def load_hhar(cfg: DataConfig) -> Dataset:
    """HHAR Samsung-phone windows (AdaTime's HHAR_SA), published test windows only."""
    return _sensor_npz(cfg, "hhar", "har/hhar_sa.npz", hz=None, keep_split=False)


def load_har_combined(cfg: DataConfig) -> Dataset:
    """Several HAR sets' users in one federation (FedAli's "Combined"; harmonize.combined)."""
    members = list(cfg.members)
    if len(members) < 2 or len(set(members)) != len(members) or set(members) - set(HAR_WINDOWS):
        raise ConfigError(
            f"data.members: two or more distinct of {', '.join(HAR_WINDOWS)}; got {members}"
        )
    picked = select_channels("har_combined", cfg.channels, COMBINED_CHANNELS, COMBINED_CHANNELS)
    loaded = [
        registered(m).loader(cfg.model_copy(update={"name": m, "channels": "default"}))
        for m in members
    ]
    length = loaded[0].X.shape[-1]
    return combined(loaded, [COMBINED_CHANNELS[i] for i in picked], length)


def load_wisdm_features(cfg: DataConfig) -> Dataset:
    """WISDM v1.1's transformed table: 43 features per 10 s window, median-imputed, z-scored."""
    path = require(cfg, "wisdm_features", "har/wisdm_features.csv")
    import pandas as pd

    frame = pd.read_csv(note_read(path), na_values="?")
    require_columns(frame, path, "user", "class")
    y, class_names = encode(frame["class"].astype(str))
    groups, group_names = encode(frame["user"], "user")
    features = frame.drop(columns=["UNIQUE_ID", "user", "class"], errors="ignore")
    # All 43 published features are kept (XAVG is constant 0 in this release: it z-scores to 0).
    X, columns, _ = clean_table(features, drop_redundant=False)
    return Dataset(
        name="wisdm_features",
        X=X,
        y=y,
        num_classes=len(class_names),
        class_names=class_names,
        groups=groups,
        group_names=group_names,
        kind="tabular",
        meta={"columns": columns, "file": str(path), "preprocessing": "median impute, z-score"},
    )
