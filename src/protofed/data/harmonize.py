"""Windows of one HAR data set made comparable with another's: same channels, units, length
and activity names.

Two uses: MAE pre-training on the HAR sets other than the target (training/pretrain.py) and
FedAli's Fig. 4, a client's model embedding another data set's windows
(`protofed embed --other-data`). The rules, settled once here:
- channels by meaning: UCI-HAR's total (gravity-included) acceleration is what WISDM's and
  HHAR's phone accelerometers record, its body_gyro a gyroscope (`canonical_channel`);
- units: each set z-scored per channel over its own windows (sets differ in units, g against
  m/s^2, and in placement). A run's own windows: WISDM's and HHAR's files are z-scored
  already (AdaTime's preprocessing), UCI-HAR's loader keeps g units unless
  `data.standardize=true` (docs/pretraining.md);
- length: linear resampling to the target's window length where it differs;
- activities by meaning (`canonical_activity`): "WALKING_UPSTAIRS", "upstairs" and
  "stairs_up" are one activity.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from protofed.data.types import Dataset

HAR_WINDOWS = ("uci_har", "wisdm", "hhar")
"""The registered raw-window HAR sets."""

_ACTIVITIES = {
    "walking": "walk",
    "walk": "walk",
    "walking_upstairs": "stairs_up",
    "upstairs": "stairs_up",
    "stairs_up": "stairs_up",
    "walking_downstairs": "stairs_down",
    "downstairs": "stairs_down",
    "stairs_down": "stairs_down",
    "sitting": "sit",
    "sit": "sit",
    "standing": "stand",
    "stand": "stand",
    "laying": "lie",
    "lying": "lie",
    "jogging": "jog",
    "jog": "jog",
    "biking": "bike",
    "bike": "bike",
}


def canonical_channel(name: str) -> str:
    """A channel's meaning across data sets (see the module docstring)."""
    for prefix, kind in (("total_acc_", "acc_"), ("body_gyro_", "gyro_")):
        if name.startswith(prefix):
            return kind + name[len(prefix) :]
    return name


def canonical_activity(name: str) -> str:
    """An activity's meaning across data sets; unknown names stay themselves (lower case)."""
    key = name.strip().lower().replace(" ", "_").replace("-", "_")
    return _ACTIVITIES.get(key, key)


def channels_of(ds: Dataset) -> list[str]:
    return [canonical_channel(str(c)) for c in ds.meta.get("channels", [])]


def missing_channels(ds: Dataset, want: list[str]) -> list[str]:
    have = channels_of(ds)
    return [c for c in want if c not in have]


def harmonized_windows(
    ds: Dataset, want: list[str], length: int, rows: np.ndarray | None = None
) -> np.ndarray:
    """`ds`'s windows (those of `rows`, default all) as float32 (N, len(want), length): the
    channels `want` by meaning, z-scored per channel over the windows taken, resampled.
    The caller checks `missing_channels` first."""
    have = channels_of(ds)
    x = ds.X[:, [have.index(c) for c in want]].astype(np.float64)
    if rows is not None:
        x = x[rows]
    std = x.std(axis=(0, 2), keepdims=True)
    x = ((x - x.mean(axis=(0, 2), keepdims=True)) / np.where(std > 0, std, 1.0)).astype(np.float32)
    if x.shape[-1] == length:
        return x
    t = torch.from_numpy(x)
    return F.interpolate(t, size=length, mode="linear", align_corners=False).numpy()
