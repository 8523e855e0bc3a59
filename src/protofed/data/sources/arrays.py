"""`arrays`: the user's own data, from an .npz (X, y, optional group) or a .csv / .parquet
table (a label column, an optional group column, numeric features)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from protofed.config import DataConfig
from protofed.core.files import first_line
from protofed.data.sources.reading import encode, load_npz, note_read, require_finite, resize
from protofed.data.types import Dataset
from protofed.errors import ConfigError


def _kind_for(X: np.ndarray, path: Path) -> str:
    kinds = {2: "tabular", 3: "sensor", 4: "image"}
    if X.ndim not in kinds:
        raise ConfigError(
            f"{path}: X has shape {X.shape}; expected (N, features), (N, C, T) or (N, C, H, W)"
        )
    return kinds[X.ndim]


def _arrays_from_npz(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, str | None]:
    """X, y and group from an .npz, each checked against X's shape; and the group prefix."""
    d = load_npz(path, "X", "y")
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
    require_finite(X.astype(np.float64, copy=False), f"{path}: array 'X'")
    if group is not None and group.dtype.kind in "fc" and not np.isfinite(group).all():
        bad = int((~np.isfinite(group)).sum())
        raise ConfigError(
            f"{path}: array 'group' has {bad} NaN or infinite value(s); give every sample a "
            "group (or leave 'group' out)"
        )
    return X, y, group, "group" if group is not None else None


def _arrays_from_table(
    cfg: DataConfig, path: Path
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, str | None]:
    """X, y and group from a .csv / .parquet table's columns; and the group column's name."""
    import pandas as pd  # here: pandas is slow to import (`protofed list`)

    try:
        is_csv = path.suffix.lower() == ".csv"
        frame = pd.read_csv(note_read(path)) if is_csv else pd.read_parquet(note_read(path))
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


def load_arrays(cfg: DataConfig) -> Dataset:
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
    codes, class_names = encode(y)
    groups, group_names = (None, None) if group is None else encode(group, group_label)
    with np.errstate(over="ignore"):  # an overflow becomes inf: refused by load_dataset
        X = np.ascontiguousarray(X, dtype=np.float32)
    if kind == "image":
        X = resize(X, cfg.image_size)
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
