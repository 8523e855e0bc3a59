"""WESAD: wrist and chest window features labelled with three affect states, per subject."""

from __future__ import annotations

from protofed.config import DataConfig
from protofed.data.sources.reading import (
    as_labels,
    clean_table,
    encode,
    note_read,
    require,
    require_columns,
)
from protofed.data.types import Dataset
from protofed.errors import ConfigError

_WESAD_CLASSES = ["amusement", "baseline", "stress"]
_WESAD_DEMOGRAPHICS = ("age", "height", "weight")


def load_wesad(cfg: DataConfig) -> Dataset:
    """The feature table without demographics or redundant columns, median-imputed, z-scored."""
    path = require(cfg, "wesad", "wearable/wesad_features.csv")
    import pandas as pd  # here: slow to import (`protofed list`)

    frame = pd.read_csv(note_read(path))
    require_columns(frame, path, "subject", "label")
    y = as_labels(frame["label"].to_numpy())
    if y.min() < 0 or y.max() >= len(_WESAD_CLASSES):
        raise ConfigError(
            f"{path}: column 'label' must hold 0 (amusement), 1 (baseline), 2 (stress)"
        )
    groups, group_names = encode(frame["subject"], "subject")
    drop = [
        c
        for c in frame.columns
        if str(c).startswith("Unnamed")
        or c in ("subject", "label", *_WESAD_DEMOGRAPHICS)
        or str(c).endswith(("_YES", "_NO"))
    ]
    X, columns, dropped = clean_table(frame.drop(columns=drop), drop_redundant=True)
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
