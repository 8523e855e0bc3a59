"""What every loader shares: where data files live, which were read, and how they are read.

The data root, the record of files read (`recording_reads`, hashed into a run's
provenance.json), the one missing-file error, reading npz archives without pickle, and the
conversions that bring raw arrays to the `Dataset` conventions (labels, group codes,
z-scored tables, resized images).
"""

from __future__ import annotations

import contextlib
import os
import zipfile
import zlib
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from protofed.config import DataConfig
from protofed.core.files import npz_fault
from protofed.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

    from protofed.data.sources import DatasetInfo


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


def note_read(path: Path) -> Path:
    """`path`, noted as read where `recording_reads` is active (every loader's file opens)."""
    files = _READS.get()
    if files is not None and path.absolute() not in files:
        files.append(path.absolute())
    return path


def registered(name: str) -> DatasetInfo:
    """The registry's entry for data set `name`.

    Imported when called, not at the top: the registry (the package's `__init__`) imports
    every loader module, and the loaders import this one.
    """
    from protofed.data.sources import DATASETS

    return DATASETS[name]


def missing_file(name: str, path: Path, also: str = "") -> ConfigError:
    """The one error for an absent data file: full path, how to fetch it, how to point at it."""
    alt = f" (or {also})" if also else ""
    return ConfigError(
        f"data set '{name}': file not found: {path}{alt}; run `protofed data fetch {name} "
        f"--data-dir {path.parent.parent}` (source: {registered(name).source}), or set "
        "data.dir / PROTOFED_DATA to the folder that holds it"
    )


def require(cfg: DataConfig, name: str, relpath: str) -> Path:
    """The file `relpath` under the data root; absent, the missing-file error for `name`."""
    path = data_root(cfg) / relpath
    if not path.is_file():
        raise missing_file(name, path)
    return path


def require_first(cfg: DataConfig, name: str, *relpaths: str) -> Path:
    """The first of `relpaths` present under the data root (the fetched full file comes first)."""
    root = data_root(cfg)
    for rel in relpaths:
        if (root / rel).is_file():
            return root / rel
    raise missing_file(name, root / relpaths[0], also=str(root / relpaths[-1]))


def load_npz(path: Path, *keys: str) -> dict[str, np.ndarray]:
    """Read the named arrays from an npz without pickle; a missing array names array and file."""
    try:
        loaded = np.load(note_read(path), allow_pickle=False)
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


def require_columns(frame: pd.DataFrame, path: Path, *columns: str) -> None:
    """A table read from `path` has every one of `columns`; the first absent one is named."""
    for col in columns:
        if col not in frame.columns:
            raise ConfigError(f"{path}: column '{col}' not found")


def require_finite(X: np.ndarray, where: str) -> None:
    """No NaN or inf among the features: the error counts them and says `where`."""
    bad = ~np.isfinite(X)
    if bad.any():
        raise ConfigError(f"{where}: {int(bad.sum())} NaN or inf value(s) in the features")


def as_labels(y: np.ndarray) -> np.ndarray:
    """Class labels as contiguous int64, the `Dataset.y` convention."""
    return np.ascontiguousarray(y, dtype=np.int64)


def encode(values: Any, prefix: str | None = None) -> tuple[np.ndarray, list[str]]:
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


def zscore(X: np.ndarray, dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standardise columns over the whole data set; constant columns become 0, not NaN."""
    mean = X.mean(axis=0)
    std = X.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return ((X - mean) / std).astype(dtype), mean, std


def clean_table(
    frame: pd.DataFrame, *, drop_redundant: bool
) -> tuple[np.ndarray, list[str], dict[str, list[str]]]:
    """Numeric feature table -> z-scored float32 matrix, its kept columns, the dropped ones.

    Missing cells take the column median (robust to the heavy tails of peak/frequency
    features). With `drop_redundant`, constant columns and columns that duplicate an earlier
    one up to scale and offset (identical once z-scored) are removed: a copy only re-weights a
    feature and a constant carries nothing.
    """
    frame = frame.astype(np.float64)
    frame = frame.fillna(frame.median())
    X, _, std = zscore(frame.to_numpy(), dtype=np.float64)
    dropped: dict[str, list[str]] = {"constant": [], "duplicate": []}
    keep = np.ones(X.shape[1], dtype=bool)
    if drop_redundant:
        const = frame.to_numpy().std(axis=0) == 0
        import pandas as pd  # here: slow to import (`protofed list`)

        dup = pd.DataFrame(X.T.round(9)).duplicated().to_numpy() & ~const
        keep = ~(const | dup)
        names = [str(c) for c in frame.columns]
        dropped = {
            "constant": [n for n, f in zip(names, const, strict=True) if f],
            "duplicate": [n for n, f in zip(names, dup, strict=True) if f],
        }
    columns = [str(c) for c, k in zip(frame.columns, keep, strict=True) if k]
    return np.ascontiguousarray(X[:, keep], dtype=np.float32), columns, dropped


def resize(X: np.ndarray, size: int | None, chunk: int = 4096) -> np.ndarray:
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
