"""Loaders: one function per data set name, all returning a `Dataset`.

Every loader reads its files once per call and caches nothing, so tests and runs never see
each other's data. Files are found under a data root (`data.dir`, else `$PROTOFED_DATA`, else
the user cache dir) with the same layout as the project's shared data folder; a missing file
is a `ConfigError` that names the full expected path and where the data set can be obtained.

Conventions every loader follows, so partitioners and models never special-case a source:
`X` float32 with samples on the first axis; `y` int64 in 0..C-1; `groups` int64 in 0..G-1 with
`group_names[g]` naming group g (subject, user, writer, domain) where the source has them.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from protofed import plugins
from protofed.config import DataConfig
from protofed.core.files import first_line, npz_fault
from protofed.data.harmonize import COMBINED_CHANNELS, HAR_WINDOWS, combined
from protofed.data.types import Dataset
from protofed.errors import ConfigError

# --------------------------------------------------------------------------- shared helpers


def data_root(cfg: DataConfig) -> Path:
    """The folder data files are read from: data.dir, else $PROTOFED_DATA, else a cache dir."""
    if cfg.dir:
        return Path(cfg.dir).expanduser()
    env = os.environ.get("PROTOFED_DATA")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("protofed"))


_READS: ContextVar[list[Path] | None] = ContextVar("protofed_data_reads", default=None)


@contextlib.contextmanager
def recording_reads() -> Iterator[list[Path]]:
    """The data files protofed's loaders open inside the block, in order (each once): what a
    run's provenance.json hashes. Plugin loaders are not seen."""
    files: list[Path] = []
    token = _READS.set(files)
    try:
        yield files
    finally:
        _READS.reset(token)


def _reading(path: Path) -> Path:
    """`path`, noted as read where `recording_reads` is active (every loader's file opens)."""
    files = _READS.get()
    if files is not None and path.absolute() not in files:
        files.append(path.absolute())
    return path


def _missing(name: str, path: Path, source: str, also: str = "") -> ConfigError:
    """The one error for an absent data file: full path, how to fetch it, how to point at it."""
    alt = f" (or {also})" if also else ""
    return ConfigError(
        f"data set '{name}': file not found: {path}{alt}; run `protofed data fetch {name} "
        f"--data-dir {path.parent.parent}` (source: {source}), or set data.dir / PROTOFED_DATA "
        "to the folder that holds it"
    )


def _require(cfg: DataConfig, name: str, relpath: str) -> Path:
    path = data_root(cfg) / relpath
    if not path.is_file():
        raise _missing(name, path, DATASETS[name].source)
    return path


def _first_present(cfg: DataConfig, name: str, *relpaths: str) -> Path:
    """The first of `relpaths` present under the data root (the fetched full file comes first)."""
    root = data_root(cfg)
    for rel in relpaths:
        if (root / rel).is_file():
            return root / rel
    raise _missing(name, root / relpaths[0], DATASETS[name].source, also=str(root / relpaths[-1]))


def _load_npz(path: Path, *keys: str) -> dict[str, np.ndarray]:
    """Read the named arrays from an npz without pickle; a missing array names array and file."""
    try:
        loaded = np.load(_reading(path), allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a .npy renamed .npz
            raise ConfigError(f"{path}: a single .npy array, not an .npz archive of named arrays")
        with loaded as npz:
            missing = [k for k in keys if k not in npz.files]
            if missing:
                raise ConfigError(
                    f"{path}: array '{missing[0]}' not found (the file has: {', '.join(npz.files)})"
                )
            return {k: npz[k] for k in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{path}: not a readable .npz file ({npz_fault(exc)})") from None


def _labels(y: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(y, dtype=np.int64)


def _encode(values: Any, prefix: str | None = None) -> tuple[np.ndarray, list[str]]:
    """Map arbitrary values to 0..K-1 by sorted unique value; names keep the originals.

    Numbers get `prefix_` in front (so subject 7 becomes 'subject_7'); strings stay as they are.
    """
    uniques, codes = np.unique(np.asarray(values), return_inverse=True)
    names = []
    for v in uniques.tolist():
        if isinstance(v, str) or prefix is None:
            names.append(str(v))
        else:
            names.append(f"{prefix}_{v}")
    return codes.astype(np.int64).reshape(-1), names


def _zscore(X: np.ndarray, dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standardise columns over the whole data set; constant columns become 0, not NaN."""
    mean = X.mean(axis=0)
    std = X.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return ((X - mean) / std).astype(dtype), mean, std


def _clean_table(
    frame: pd.DataFrame, *, drop_redundant: bool
) -> tuple[np.ndarray, list[str], dict[str, Any]]:
    """Numeric feature table -> z-scored float32 matrix.

    Missing cells take the column median (robust to the heavy tails of peak/frequency
    features). With `drop_redundant`, constant columns and columns that duplicate an earlier
    one up to scale and offset (identical once z-scored) are removed: a copy only re-weights a
    feature and a constant carries nothing.
    """
    frame = frame.astype(np.float64)
    frame = frame.fillna(frame.median())
    X, _, std = _zscore(frame.to_numpy(), dtype=np.float64)
    dropped: dict[str, list[str]] = {"constant": [], "duplicate": []}
    keep = np.ones(X.shape[1], dtype=bool)
    if drop_redundant:
        const = frame.to_numpy().std(axis=0) == 0
        dup = pd.DataFrame(X.T.round(9)).duplicated().to_numpy() & ~const
        keep = ~(const | dup)
        names = [str(c) for c in frame.columns]
        dropped = {
            "constant": [n for n, f in zip(names, const, strict=True) if f],
            "duplicate": [n for n, f in zip(names, dup, strict=True) if f],
        }
    columns = [str(c) for c, k in zip(frame.columns, keep, strict=True) if k]
    return np.ascontiguousarray(X[:, keep], dtype=np.float32), columns, dropped


def _to_chw(x: np.ndarray, *, channels_last: bool) -> np.ndarray:
    """Images -> float32 (N, C, H, W) in [0, 1]; uint8 is divided by 255, floats kept."""
    scale = 255.0 if x.dtype == np.uint8 else 1.0
    out = x.astype(np.float32)
    if scale != 1.0:
        out /= scale
    if out.ndim == 3:
        out = out[:, None]
    elif channels_last:
        out = out.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(out)


def _resize(X: np.ndarray, size: int | None, chunk: int = 4096) -> np.ndarray:
    """Bilinear resize of (N, C, H, W) to size x size, in chunks to bound peak memory."""
    if size is None or X.shape[-2:] == (size, size):
        return X
    import torch
    import torch.nn.functional as F

    out = np.empty((len(X), X.shape[1], size, size), dtype=np.float32)
    for start in range(0, len(X), chunk):
        block = torch.from_numpy(X[start : start + chunk])
        resized = F.interpolate(block, size=(size, size), mode="bilinear", align_corners=False)
        out[start : start + chunk] = resized.clamp_(0.0, 1.0).numpy()
    return out


def _normalise_channels(X: np.ndarray) -> tuple[np.ndarray, dict[str, list[float]]]:
    """Per-channel mean/std standardisation over the data set (the usual CIFAR transform)."""
    mean = X.mean(axis=(0, 2, 3), dtype=np.float64)
    std = X.std(axis=(0, 2, 3), dtype=np.float64)
    std = np.where(std > 0, std, 1.0)
    X -= mean.astype(np.float32)[None, :, None, None]
    X /= std.astype(np.float32)[None, :, None, None]
    return X, {"channel_mean": mean.tolist(), "channel_std": std.tolist()}


def _select_channels(
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


# --------------------------------------------------------------------------- sensor windows

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


def _read_whitespace(path: Path) -> np.ndarray:
    if not path.is_file():
        raise ConfigError(
            f"uci_har: file not found: {path} (the '{_UCI_FOLDER}/' folder is incomplete)"
        )
    return pd.read_csv(_reading(path), sep=r"\s+", header=None, dtype=np.float64).to_numpy()


def _load_uci_folder(folder: Path, chans: list[int]) -> dict[str, Any]:
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
        text = _reading(labels_file).read_text()
        rows = [line.split() for line in text.splitlines() if line.strip()]
        names = [r[1] for r in sorted(rows, key=lambda r: int(r[0]))]
    return {
        "X": np.concatenate(xs),
        "y": np.concatenate(ys),
        "subject": np.concatenate(subjects),
        "split": np.concatenate(splits),
        "class_names": names,
        "split_source": "UCI-HAR published split (21 train / 9 test subjects)",
        "file": str(folder),
    }


def _load_uci_har(cfg: DataConfig) -> Dataset:
    root = data_root(cfg)
    npz_path = root / "har" / "uci_har.npz"
    folder = root / _UCI_FOLDER
    chans = _select_channels("uci_har", cfg.channels, _UCI_CHANNELS, _UCI_DEFAULT)
    if npz_path.is_file():
        d = _load_npz(npz_path, "X", "y", "subject")
        stored = [str(c) for c in d["channels"]] if "channels" in d else _UCI_CHANNELS
        X = np.ascontiguousarray(
            d["X"][:, [stored.index(_UCI_CHANNELS[c]) for c in chans]], dtype=np.float32
        )
        raw = {
            "y": d["y"],
            "subject": d["subject"],
            "split": d.get("split"),
            "class_names": [str(c) for c in d.get("class_names", _UCI_CLASSES)],
            "split_source": str(
                d.get("split_note", "per-subject 75/25 split of the PFLlib conversion")
            ),
            "file": str(npz_path),
        }
    elif folder.is_dir():
        raw = _load_uci_folder(folder, chans)
        X = raw["X"]
    else:
        raise _missing("uci_har", npz_path, DATASETS["uci_har"].source, also=f"the folder {folder}")
    groups, group_names = _encode(raw["subject"], "subject")
    y = _labels(raw["y"])
    split = raw["split"]
    return Dataset(
        name="uci_har",
        X=X,
        y=y,
        num_classes=len(raw["class_names"]),
        class_names=raw["class_names"],
        groups=groups,
        group_names=group_names,
        predefined_split=None if split is None else split.astype(np.int64),
        kind="sensor",
        meta={
            "channels": [_UCI_CHANNELS[c] for c in chans],
            "sampling_hz": 50,
            "file": raw["file"],
            "predefined_split": raw["split_source"],
        },
    )


def _sensor_npz(
    cfg: DataConfig, name: str, relpath: str, hz: int | None, keep_split: bool
) -> Dataset:
    """WISDM / HHAR windows: X (N, C, T), y, user, channels, class_names."""
    path = _require(cfg, name, relpath)
    d = _load_npz(path, "X", "y", "user")
    available = [str(c) for c in d["channels"]] if "channels" in d else ["acc_x", "acc_y", "acc_z"]
    chans = _select_channels(name, cfg.channels, available, available)
    groups, group_names = _encode(d["user"], "user")
    class_names = [str(c) for c in d["class_names"]] if "class_names" in d else None
    y = _labels(d["y"])
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


def _load_wisdm(cfg: DataConfig) -> Dataset:
    return _sensor_npz(cfg, "wisdm", "har/wisdm.npz", hz=20, keep_split=True)


def _load_hhar(cfg: DataConfig) -> Dataset:
    return _sensor_npz(cfg, "hhar", "har/hhar_sa.npz", hz=None, keep_split=False)


def _load_har_combined(cfg: DataConfig) -> Dataset:
    """Several HAR sets' users in one federation (FedAli's "Combined"; harmonize.combined)."""
    members = list(cfg.members)
    if len(members) < 2 or len(set(members)) != len(members) or set(members) - set(HAR_WINDOWS):
        raise ConfigError(
            f"data.members: two or more distinct of {', '.join(HAR_WINDOWS)}; got {members}"
        )
    picked = _select_channels("har_combined", cfg.channels, COMBINED_CHANNELS, COMBINED_CHANNELS)
    loaded = [
        DATASETS[m].loader(cfg.model_copy(update={"name": m, "channels": "default"}))
        for m in members
    ]
    length = loaded[0].X.shape[-1]
    return combined(loaded, [COMBINED_CHANNELS[i] for i in picked], length)


# --------------------------------------------------------------------------- feature tables


def _require_columns(frame: pd.DataFrame, path: Path, *columns: str) -> None:
    for col in columns:
        if col not in frame.columns:
            raise ConfigError(f"{path}: column '{col}' not found")


def _load_wisdm_features(cfg: DataConfig) -> Dataset:
    path = _require(cfg, "wisdm_features", "har/wisdm_features.csv")
    frame = pd.read_csv(_reading(path), na_values="?")
    _require_columns(frame, path, "user", "class")
    y, class_names = _encode(frame["class"].astype(str))
    groups, group_names = _encode(frame["user"], "user")
    features = frame.drop(columns=["UNIQUE_ID", "user", "class"], errors="ignore")
    # All 43 published features are kept (XAVG is constant 0 in this release: it z-scores to 0).
    X, columns, _ = _clean_table(features, drop_redundant=False)
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


_WESAD_CLASSES = ["amusement", "baseline", "stress"]
_WESAD_DEMOGRAPHICS = ("age", "height", "weight")


def _load_wesad(cfg: DataConfig) -> Dataset:
    path = _require(cfg, "wesad", "wearable/wesad_features.csv")
    frame = pd.read_csv(_reading(path))
    _require_columns(frame, path, "subject", "label")
    y = _labels(frame["label"].to_numpy())
    if y.min() < 0 or y.max() >= len(_WESAD_CLASSES):
        raise ConfigError(
            f"{path}: column 'label' must hold 0 (amusement), 1 (baseline), 2 (stress)"
        )
    groups, group_names = _encode(frame["subject"], "subject")
    drop = [
        c
        for c in frame.columns
        if str(c).startswith("Unnamed")
        or c in ("subject", "label", *_WESAD_DEMOGRAPHICS)
        or str(c).endswith(("_YES", "_NO"))
    ]
    X, columns, dropped = _clean_table(frame.drop(columns=drop), drop_redundant=True)
    return Dataset(
        name="wesad",
        X=X,
        y=y,
        num_classes=len(_WESAD_CLASSES),
        class_names=list(_WESAD_CLASSES),
        groups=groups,
        group_names=group_names,
        kind="tabular",
        meta={
            "columns": columns,
            "dropped_constant": dropped["constant"],
            "dropped_duplicate": dropped["duplicate"],
            "file": str(path),
            "preprocessing": "drop demographics/constant/duplicate columns, median impute, z-score",
        },
    )


def _load_office_caltech(cfg: DataConfig) -> Dataset:
    path = _require(cfg, "office_caltech", "features/office_caltech10_surf.npz")
    d = _load_npz(path, "X", "y", "domain")
    counts = d["X"].astype(np.float32)
    # Images differ in size, so raw SURF word counts differ in scale: L1 turns each row into a
    # word histogram, then columns are z-scored so no single frequent word dominates.
    totals = counts.sum(axis=1, keepdims=True)
    hist = counts / np.where(totals > 0, totals, 1.0)
    X, _, _ = _zscore(hist)
    domains = [str(n) for n in d["domain_names"]] if "domain_names" in d else None
    groups = d["domain"].astype(np.int64)
    class_names = [str(c) for c in d["class_names"]] if "class_names" in d else None
    y = _labels(d["y"])
    return Dataset(
        name="office_caltech",
        X=X,
        y=y,
        num_classes=len(class_names) if class_names else int(y.max()) + 1,
        class_names=class_names or [str(i) for i in range(int(y.max()) + 1)],
        groups=groups,
        group_names=domains or [f"domain_{i}" for i in range(int(groups.max()) + 1)],
        kind="tabular",
        meta={"file": str(path), "preprocessing": "row L1 normalisation, then column z-score"},
    )


# --------------------------------------------------------------------------- images


def _image_dataset(name: str, X: np.ndarray, y: np.ndarray, **kw: Any) -> Dataset:
    num_classes = kw.pop("num_classes", None) or int(y.max()) + 1
    class_names = kw.pop("class_names", None) or [str(i) for i in range(num_classes)]
    return Dataset(
        name=name,
        X=X,
        y=_labels(y),
        num_classes=num_classes,
        class_names=class_names,
        kind="image",
        **kw,
    )


def _load_digits(cfg: DataConfig) -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    X = _resize(
        np.ascontiguousarray(bunch.images[:, None] / 16.0, dtype=np.float32), cfg.image_size
    )
    return _image_dataset("digits", X, bunch.target, meta={"source": "scikit-learn load_digits"})


def _train_test(
    cfg: DataConfig, name: str, relpath: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw train+test arrays concatenated, with split 0 train / 1 test."""
    d = _load_npz(_require(cfg, name, relpath), "x_train", "y_train", "x_test", "y_test")
    x = np.concatenate([d["x_train"], d["x_test"]])
    y = np.concatenate([d["y_train"], d["y_test"]])
    split = np.repeat([0, 1], [len(d["y_train"]), len(d["y_test"])]).astype(np.int64)
    return x, y, split


def _raw_mnist_m(cfg: DataConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The fetched train+test file when present, else the test split alone (split None)."""
    path = _first_present(cfg, "mnist_m", "digits/mnist_m.npz", "digits/mnist_m_test.npz")
    if path.name == "mnist_m.npz":
        return _train_test(cfg, "mnist_m", "digits/mnist_m.npz")
    d = _load_npz(path, "x_test", "y_test")
    return d["x_test"], d["y_test"], None


def _load_mnist(cfg: DataConfig) -> Dataset:
    x, y, split = _train_test(cfg, "mnist", "digits/mnist.npz")
    X = _resize(_to_chw(x, channels_last=False), cfg.image_size)
    return _image_dataset("mnist", X, y, predefined_split=split)


def _load_usps(cfg: DataConfig) -> Dataset:
    x, y, split = _train_test(cfg, "usps", "digits/usps.npz")
    X = _resize(_to_chw(x, channels_last=False), cfg.image_size)
    return _image_dataset("usps", X, y, predefined_split=split)


def _load_mnist_m(cfg: DataConfig) -> Dataset:
    x, y, split = _raw_mnist_m(cfg)
    X = _resize(_to_chw(x, channels_last=True), cfg.image_size)
    note = "MNIST-M test split only" if split is None else "MNIST-M train + test"
    return _image_dataset("mnist_m", X, y, predefined_split=split, meta={"note": note})


DIGITS_DOMAINS_SIZE = 32
DIGITS_DOMAINS_PER_DOMAIN = 7000
_DOMAIN_NAMES = ["mnist", "usps", "mnist_m"]


def _load_digits_domains(cfg: DataConfig) -> Dataset:
    """Three digit domains on one grid (3 x 32 x 32), at most 7000 samples each.

    The cap keeps MNIST from outweighing the others tenfold and bounds memory; the subsample is
    drawn with np.random.default_rng(0), so it is the same in every run regardless of data.seed.
    """
    size = cfg.image_size or DIGITS_DOMAINS_SIZE
    raw = [
        _train_test(cfg, "mnist", "digits/mnist.npz")[:2],
        _train_test(cfg, "usps", "digits/usps.npz")[:2],
        _raw_mnist_m(cfg)[:2],
    ]
    rng = np.random.default_rng(0)
    xs, ys, gs, sizes = [], [], [], {}
    for dom, (x, y) in enumerate(raw):
        keep = np.sort(rng.permutation(len(y))[:DIGITS_DOMAINS_PER_DOMAIN])
        img = _resize(_to_chw(x[keep], channels_last=x.ndim == 4), size)
        if img.shape[1] == 1:
            img = np.repeat(img, 3, axis=1)
        xs.append(img)
        ys.append(y[keep])
        gs.append(np.full(len(keep), dom, dtype=np.int64))
        sizes[_DOMAIN_NAMES[dom]] = len(keep)
    return _image_dataset(
        "digits_domains",
        np.concatenate(xs),
        np.concatenate(ys),
        groups=np.concatenate(gs),
        group_names=list(_DOMAIN_NAMES),
        meta={
            "domain_sizes": sizes,
            "note": f"at most {DIGITS_DOMAINS_PER_DOMAIN} samples per domain, drawn with "
            "np.random.default_rng(0) from train+test; greyscale repeated to 3 channels; "
            f"bilinear resize to {size}x{size}",
        },
    )


def _cifar(cfg: DataConfig, name: str, full: str, subset: str) -> Dataset:
    """The fetched 60000-image file when present, else the stratified subset."""
    path = _first_present(cfg, name, full, subset)
    if path.name == Path(full).name:
        x, y, split = _train_test(cfg, name, full)
        note = "all 60000 images (published train/test kept as the predefined split)"
    else:
        d = _load_npz(path, "x", "y")
        x, y, split = d["x"], d["y"], None
        note = "stratified subset"
    X = _resize(_to_chw(x, channels_last=True), cfg.image_size)
    X, stats = _normalise_channels(X)
    return _image_dataset(
        name,
        X,
        y,
        predefined_split=split,
        meta={**stats, "file": str(path), "note": f"{note}; per-channel standardised"},
    )


def _load_cifar10(cfg: DataConfig) -> Dataset:
    return _cifar(cfg, "cifar10", "images/cifar10.npz", "images/cifar10_20k.npz")


def _load_cifar100(cfg: DataConfig) -> Dataset:
    return _cifar(cfg, "cifar100", "images/cifar100.npz", "images/cifar100_10k.npz")


def _load_femnist(cfg: DataConfig) -> Dataset:
    path = _first_present(cfg, "femnist", "images/femnist.npz", "images/femnist_partial.npz")
    d = _load_npz(path, "x", "y", "writer")
    # LEAF stores ink dark on a 255 background; invert so background is 0 like MNIST.
    X = _resize(1.0 - _to_chw(d["x"], channels_last=False), cfg.image_size)
    writers = d["writer"].astype(np.int64)
    if "writer_names" in d:
        names = [str(n) for n in d["writer_names"]]
    else:
        names = [f"writer_{i}" for i in range(int(writers.max()) + 1)]
    split = d["split"].astype(np.int64) if "split" in d else None
    return _image_dataset(
        "femnist",
        X,
        d["y"],
        num_classes=62,
        groups=writers,
        group_names=names,
        predefined_split=split,
        meta={"file": str(path), "note": "LEAF niid 5% sample; inverted to 0 background"},
    )


# --------------------------------------------------------------------------- bring your own


def _finite(X: np.ndarray, where: str) -> None:
    bad = ~np.isfinite(X)
    if bad.any():
        raise ConfigError(f"{where}: {int(bad.sum())} NaN or inf value(s) in the features")


def _kind_for(X: np.ndarray, path: Path) -> str:
    kinds = {2: "tabular", 3: "sensor", 4: "image"}
    if X.ndim not in kinds:
        raise ConfigError(
            f"{path}: X has shape {X.shape}; expected (N, features), (N, C, T) or (N, C, H, W)"
        )
    return kinds[X.ndim]


def _arrays_from_npz(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, str | None]:
    d = _load_npz(path, "X", "y")
    X, y = d["X"], d["y"]
    group = d.get("group")
    _kind_for(X, path)
    if X.dtype.kind not in "biuf":
        raise ConfigError(f"{path}: array 'X' has non-numeric dtype {X.dtype}")
    if len(X) == 0:
        raise ConfigError(f"{path}: array 'X' is empty (shape {X.shape})")
    if y.ndim != 1 or len(y) != len(X):
        raise ConfigError(f"{path}: X has shape {X.shape} but y has shape {y.shape}")
    if group is not None and (group.ndim != 1 or len(group) != len(X)):
        raise ConfigError(f"{path}: X has shape {X.shape} but group has shape {group.shape}")
    _finite(X.astype(np.float64, copy=False), f"{path}: array 'X'")
    return X, y, group, "group" if group is not None else None


def _arrays_from_table(
    cfg: DataConfig, path: Path
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, str | None]:
    try:
        is_csv = path.suffix.lower() == ".csv"
        frame = pd.read_csv(_reading(path)) if is_csv else pd.read_parquet(_reading(path))
    except ImportError:
        raise ConfigError(
            f"{path}: reading parquet needs pyarrow (pip install 'protofed[parquet]')"
        ) from None
    except pd.errors.EmptyDataError:
        raise ConfigError(f"{path}: the file is empty (shape (0, 0))") from None
    except (ValueError, OSError) as exc:  # a ragged row, bytes that are not UTF-8, bad parquet
        raise ConfigError(f"{path}: not a readable table ({first_line(exc)})") from None
    if len(frame) == 0:
        raise ConfigError(f"{path}: the table has no rows (shape {frame.shape})")
    label, group_col = cfg.label_column, cfg.group_column
    for key, col in (("data.label_column", label), ("data.group_column", group_col)):
        if col is not None and col not in frame.columns:
            raise ConfigError(
                f"{key}: column '{col}' not in {path} (columns: {', '.join(map(str, frame.columns))})"
            )
    if frame[label].isna().any():
        raise ConfigError(f"{path}: label column '{label}' has missing values")
    if group_col is not None and frame[group_col].isna().any():
        raise ConfigError(f"{path}: group column '{group_col}' has missing values")
    features = frame.drop(columns=[c for c in (label, group_col) if c is not None])
    if features.shape[1] == 0:
        raise ConfigError(f"{path}: no feature columns besides '{label}' (shape {frame.shape})")
    for col in features.columns:
        dtype = features[col].dtype
        if not (pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype)):
            raise ConfigError(
                f"{path}: feature column '{col}' is not numeric (dtype {dtype}); drop or encode it"
            )
    X = features.to_numpy(dtype=np.float64)
    bad = ~np.isfinite(X)
    if bad.any():
        col = features.columns[int(np.argwhere(bad)[0, 1])]
        raise ConfigError(f"{path}: NaN or inf in feature column '{col}' ({int(bad.sum())} cells)")
    group = None if group_col is None else frame[group_col].to_numpy()
    y = frame[label].to_numpy()
    if y.dtype == object:
        y = y.astype(str)
    if group is not None and group.dtype == object:
        group = group.astype(str)
    return X, y, group, group_col


def _load_arrays(cfg: DataConfig) -> Dataset:
    """Bring-your-own data: .npz (X, y, optional group) or a .csv / .parquet table."""
    if not cfg.path:
        raise ConfigError("data.path is required for data.name=arrays (.npz, .csv or .parquet)")
    path = Path(cfg.path).expanduser()
    if not path.is_file():
        raise ConfigError(f"data.path: file not found: {path.resolve()}")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        X, y, group, group_label = _arrays_from_npz(path)
    elif suffix in (".csv", ".parquet", ".pq"):
        X, y, group, group_label = _arrays_from_table(cfg, path)
    else:
        raise ConfigError(f"data.path: {path} must end in .npz, .csv or .parquet")
    kind = _kind_for(X, path)
    if y.dtype.kind == "c":
        raise ConfigError(f"{path}: labels are complex numbers; class labels expected")
    if y.dtype.kind == "f" and not np.isfinite(y).all():
        raise ConfigError(f"{path}: labels contain NaN or inf")
    codes, class_names = _encode(y)
    groups, group_names = (None, None) if group is None else _encode(group, group_label)
    with np.errstate(over="ignore"):  # an overflow becomes inf: refused by load_dataset
        X = np.ascontiguousarray(X, dtype=np.float32)
    if kind == "image":
        X = _resize(X, cfg.image_size)
    return Dataset(
        name="arrays",
        X=X,
        y=codes,
        num_classes=len(class_names),
        class_names=class_names,
        groups=groups,
        group_names=group_names,
        kind=kind,
        meta={"file": str(path.resolve())},
    )


def _load_synthetic(cfg: DataConfig) -> Dataset:
    """20000 x 32 Gaussian blobs, 10 classes: fixed (rng 0) so benchmarks compare like with like."""
    rng = np.random.default_rng(0)
    n, d, c = 20000, 32, 10
    centers = rng.normal(0.0, 1.0, size=(c, d))
    y = rng.integers(0, c, size=n)
    X = (centers[y] + rng.normal(0.0, 1.0, size=(n, d))).astype(np.float32)
    return Dataset(
        name="synthetic",
        X=X,
        y=_labels(y),
        num_classes=c,
        class_names=[f"class_{i}" for i in range(c)],
        kind="tabular",
        meta={"note": "Gaussian blobs, centres N(0, I), noise N(0, I), seed 0"},
    )


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class DatasetInfo:
    """A registered data set: what it is (for `protofed list`), how to load it, where to get it."""

    description: str
    loader: Callable[[DataConfig], Dataset]
    source: str = ""
    needs_root: bool = True


_UCI = "UCI Machine Learning Repository"
DATASETS: dict[str, DatasetInfo] = {
    "digits": DatasetInfo(
        "scikit-learn 8x8 digits, 1797 images, 10 classes (bundled, no download)",
        _load_digits,
        "scikit-learn (bundled)",
        needs_root=False,
    ),
    "uci_har": DatasetInfo(
        "UCI-HAR smartphone windows (6 or 9 channels x 128), 6 activities, 30 subjects",
        _load_uci_har,
        f"{_UCI}: Human Activity Recognition Using Smartphones",
    ),
    "wisdm": DatasetInfo(
        "WISDM v1.1 phone accelerometer windows (3 x 128), 6 activities, 36 users",
        _load_wisdm,
        "WISDM Lab (Fordham) Activity Prediction v1.1, windowed as in AdaTime",
    ),
    "hhar": DatasetInfo(
        "HHAR Samsung-phone accelerometer windows (3 x 128), 6 activities, 9 users",
        _load_hhar,
        f"{_UCI}: Heterogeneity Activity Recognition (AdaTime HHAR_SA)",
    ),
    "har_combined": DatasetInfo(
        "users of several HAR sets (data.members; default hhar + wisdm: 45 users, 7 activities)",
        _load_har_combined,
        "the member sets (see those entries), harmonized",
    ),
    "wisdm_features": DatasetInfo(
        "WISDM v1.1 transformed features (43 per 10 s window), 6 activities, 36 users",
        _load_wisdm_features,
        "WISDM Lab (Fordham): WISDM_ar_v1.1_transformed.csv",
    ),
    "wesad": DatasetInfo(
        "WESAD wrist/chest window features, 3 affect states, 15 subjects",
        _load_wesad,
        f"{_UCI}: WESAD (Wearable Stress and Affect Detection), window features",
    ),
    "mnist": DatasetInfo(
        "MNIST 28x28 digits, train+test (70000)",
        _load_mnist,
        "MNIST (yann.lecun.com / torchvision)",
    ),
    "usps": DatasetInfo(
        "USPS 16x16 digits, train+test (9298)", _load_usps, "USPS (Hull 1994; the Kaggle usps.h5)"
    ),
    "mnist_m": DatasetInfo(
        "MNIST-M 32x32 colour digits: train+test once fetched, else the test split",
        _load_mnist_m,
        "MNIST-M (Ganin & Lempitsky 2015), test split",
    ),
    "digits_domains": DatasetInfo(
        "MNIST + USPS + MNIST-M at 3x32x32, <=7000 per domain, groups = domain",
        _load_digits_domains,
        "MNIST, USPS and MNIST-M (see those entries)",
    ),
    "cifar10": DatasetInfo(
        "CIFAR-10 3x32x32, 10 classes: all 60000 once fetched, else a 20k subset",
        _load_cifar10,
        "CIFAR-10 (Krizhevsky 2009)",
    ),
    "cifar100": DatasetInfo(
        "CIFAR-100 3x32x32, 100 classes: all 60000 once fetched, else a 10k subset",
        _load_cifar100,
        "CIFAR-100 (Krizhevsky 2009)",
    ),
    "femnist": DatasetInfo(
        "FEMNIST (LEAF niid 5% sample) 28x28, 62 classes, groups = writer",
        _load_femnist,
        "LEAF benchmark: FEMNIST (niid, 5% sample)",
    ),
    "office_caltech": DatasetInfo(
        "Office-Caltech10 SURF 800-d features, 10 classes, 4 domains",
        _load_office_caltech,
        "Office-Caltech10 SURF features (Gong et al. 2012 GFK release)",
    ),
    "arrays": DatasetInfo(
        "your own data: data.path = .npz (X, y, group) or .csv/.parquet table",
        _load_arrays,
        "your own file (data.path)",
        needs_root=False,
    ),
    "synthetic": DatasetInfo(
        "seeded Gaussian blobs, 20000 x 32, 10 classes (tests, benchmarks)",
        _load_synthetic,
        "generated",
        needs_root=False,
    ),
}


def register_dataset(
    name: str, description: str, source: str = "", needs_root: bool = False
) -> Callable[[Callable[[DataConfig], Dataset]], Callable[[DataConfig], Dataset]]:
    """Decorator for a loader `(cfg: DataConfig) -> Dataset`: makes `data.name=<name>` load it.

    `needs_root`: it reads files under the data root (`data.dir`); `source`: where to get them.
    """

    return plugins.registrar(
        "datasets", DATASETS, name, lambda load: DatasetInfo(description, load, source, needs_root)
    )


def load_plugins() -> dict[str, DatasetInfo]:
    """Every data set, installed plugins' included (their modules register with the decorator)."""
    plugins.load("datasets")
    return DATASETS


def load_dataset(cfg: DataConfig) -> Dataset:
    """Load the data set named by data.name; an unknown name suggests the closest valid one."""
    if cfg.name not in DATASETS:
        load_plugins()
    info = DATASETS.get(cfg.name)
    if info is None:
        close = difflib.get_close_matches(cfg.name, list(DATASETS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(
            f"data.name: unknown data set '{cfg.name}'{hint} (valid: {', '.join(DATASETS)})"
        )
    try:
        ds = info.loader(cfg)
    except ConfigError:
        raise
    except (OSError, EOFError, ValueError, IndexError, zipfile.BadZipFile, zlib.error) as exc:
        # a damaged file under the data root (truncated, bit-flipped, renamed, edited)
        where = f"{exc.filename}: " if isinstance(exc, OSError) and exc.filename else ""
        raise ConfigError(
            f"data.name={cfg.name}: {where}cannot read its files ({first_line(exc)}); "
            f"fetch them again with protofed data fetch {cfg.name} --force"
        ) from None
    _finite(ds.X, f"data.name={cfg.name}: the features after the cast to {ds.X.dtype}")
    if ds.num_classes < 2:
        where = cfg.path if cfg.name == "arrays" else f"data.name={cfg.name}"
        raise ConfigError(f"{where}: {ds.num_classes} class(es) in the labels; 2 at least")
    return ds
