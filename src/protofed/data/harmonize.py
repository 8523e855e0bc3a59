"""Windows of one HAR data set made comparable with another's: same channels, units, length
and activity names.

Three uses: MAE pre-training on the HAR sets other than the target (training/pretrain.py),
FedAli's Fig. 4, a client's model embedding another data set's windows
(`protofed embed --other-data`), and federations spanning several sets, as FedAli's
"Combined" setup (`combined`, `data.name=har_combined`). The rules, settled once here:
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


def own_sets(name: str, members: list[str]) -> list[str]:
    """The HAR sets a run's data come from: itself, or a combined federation's members."""
    return list(members) if name == "har_combined" else [name]


COMBINED_CHANNELS = ["acc_x", "acc_y", "acc_z"]
"""What every registered HAR set records: a phone's 3-axis accelerometer."""


def combined(members: list[Dataset], channels: list[str], length: int) -> Dataset:
    """One data set of several HAR sets' windows: each user of each set a group of its own
    ("hhar:user_0"), the activities the union of theirs by meaning (in the order first met),
    the windows harmonized as above. Published train/test splits are dropped: members that
    have one and members that do not would be split by different rules."""
    names: list[str] = []
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    groups: list[np.ndarray] = []
    group_names: list[str] = []
    counts: dict[str, int] = {}
    for ds in members:
        missing = missing_channels(ds, channels)
        if missing:
            raise ValueError(f"{ds.name} has no channel {missing[0]} (it has {channels_of(ds)})")
        classes = [canonical_activity(c) for c in ds.class_names]
        for c in classes:
            if c not in names:
                names.append(c)
        xs.append(harmonized_windows(ds, channels, length))
        ys.append(np.array([names.index(c) for c in classes], dtype=np.int64)[ds.y])
        if ds.groups is None:
            raise ValueError(f"{ds.name} has no users to make clients of")
        own = ds.group_names or [str(g) for g in range(int(ds.groups.max()) + 1)]
        groups.append(ds.groups + len(group_names))
        group_names += [f"{ds.name}:{g}" for g in own]
        counts[ds.name] = len(ds)
    return Dataset(
        name="+".join(ds.name for ds in members),
        X=np.concatenate(xs),
        y=np.concatenate(ys),
        num_classes=len(names),
        class_names=names,
        groups=np.concatenate(groups),
        group_names=group_names,
        kind="sensor",
        meta={
            "channels": list(channels),
            "members": counts,
            "window": length,
            "harmonized": "channels and activities by meaning, each set z-scored per channel",
        },
    )
