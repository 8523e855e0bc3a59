"""The in-memory data set every loader returns and every partitioner reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Dataset:
    """A whole data set, before partitioning.

    `X` is float32 with one sample per row of the first axis: sensor windows as
    (channels, time), images as (channels, height, width), tabular rows as (features,).
    `groups` holds the natural client id (subject, user, writer, domain) when the source has one.
    `predefined_split` (0 train, 1 test) is kept when the source publishes one, so callers can
    honour it instead of re-splitting the original train and test sets together.
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    num_classes: int
    class_names: list[str]
    groups: np.ndarray | None = None
    group_names: list[str] | None = None
    predefined_split: np.ndarray | None = None
    kind: str = "tabular"  # "sensor" | "image" | "tabular"
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.X)
        if len(self.y) != n:
            raise ValueError(f"{self.name}: X has {n} rows but y has {len(self.y)}")
        if self.groups is not None and len(self.groups) != n:
            raise ValueError(f"{self.name}: X has {n} rows but groups has {len(self.groups)}")
        if self.y.size and (self.y.min() < 0 or self.y.max() >= self.num_classes):
            raise ValueError(
                f"{self.name}: labels run {self.y.min()}..{self.y.max()}, "
                f"outside 0..{self.num_classes - 1} ({self.num_classes} classes)"
            )

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.X.shape[1:])

    def __len__(self) -> int:
        return len(self.X)
