"""FedAli's HAR federations (Ek et al., section 5.1): RealWorld HAR 2016 with one client per
subject x body position (`realworld`, 105 clients), HHAR with one client per user x phone
model (`hhar_paper`, 36 clients) and the two together (`fedali_combined`, 141 clients).

The converters follow the paper's preprocessing: each recording brought to 50 Hz (an
anti-aliasing low-pass first where the device samples faster), z-scored per channel for each
device, then cut into 128-sample windows (2.56 s) with 50 % overlap (step 64) that never
cross a change of recording or a gap. Accelerometer only (x, y, z), as protofed's other HHAR
set; the paper adds the gyroscope. docs/data.md, "FedAli's federations", says why and how.
"""

from __future__ import annotations

import contextlib
import io
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from protofed.config import DataConfig
from protofed.data.harmonize import COMBINED_CHANNELS, combined
from protofed.data.sources.reading import as_labels, load_npz, require
from protofed.data.types import Dataset
from protofed.errors import ConfigError

HZ = 50
WINDOW = 128
STEP = 64  # 50 % overlap
GAP_S = 1.0  # a pause longer than this between two samples ends a recording's segment
TRAIN_FRACTION = 0.8  # the paper's per-client 80/20 split (kept as the predefined split)
CHANNELS = ["acc_x", "acc_y", "acc_z"]

# RealWorld's activities (file names) -> protofed's canonical names (harmonize.canonical_activity)
REALWORLD_ACTIVITIES = {
    "climbingdown": "stairs_down",
    "climbingup": "stairs_up",
    "jumping": "jump",
    "lying": "lie",
    "standing": "stand",
    "sitting": "sit",
    "running": "run",
    "walking": "walk",
}
REALWORLD_POSITIONS = ["chest", "forearm", "head", "shin", "thigh", "upperarm", "waist"]
REALWORLD_SUBJECTS = 15
_RW_CLASSES = list(REALWORLD_ACTIVITIES.values())
_RW_OUTER = re.compile(r"proband(\d+)/data/acc_([a-z]+)_csv\.zip$")
_RW_CSV = re.compile(r"acc_([a-z]+)(?:_\d+)?_([a-z]+)\.csv$")

# HHAR: the `gt` values kept, in the order of protofed's `hhar` set (its class names)
HHAR_CLASSES = ["bike", "sit", "stand", "walk", "stairs_up", "stairs_down"]
_HHAR_RAW = ["bike", "sit", "stand", "walk", "stairsup", "stairsdown"]
HHAR_USERS = list("abcdefghi")
HHAR_MODELS = ["nexus4", "s3", "s3mini", "samsungold"]


# --------------------------------------------------------------------------- signal helpers


def resample_50hz(t: np.ndarray, signal: np.ndarray) -> Iterator[np.ndarray]:
    """One recording (`t` seconds, `signal` (T, C)) -> its segments on a 50 Hz grid.

    Samples are ordered by time (repeated times dropped), the recording is cut where two
    samples lie more than `GAP_S` apart, a segment sampled faster than 50 Hz is low-passed at
    20 Hz (4th-order Butterworth, forward and backward, where long enough) against aliasing,
    and each channel is interpolated linearly onto the grid t0, t0 + 20 ms, ...
    """
    order = np.argsort(t, kind="stable")
    t, signal = t[order], signal[order].astype(np.float64)
    keep = np.concatenate([[True], np.diff(t) > 0])
    t, signal = t[keep], signal[keep]
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(t) > GAP_S) + 1, [len(t)]])
    for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        ts, seg = t[start:stop], signal[start:stop]
        if len(ts) < 2:
            continue
        rate = 1.0 / float(np.median(np.diff(ts)))
        if rate > HZ * 1.1:
            from scipy.signal import butter, sosfiltfilt

            sos = butter(4, 20.0, btype="low", fs=rate, output="sos")
            # shorter than the filter's padding: too short to window anyway
            with contextlib.suppress(ValueError):
                seg = sosfiltfilt(sos, seg, axis=0)
        grid = np.arange(ts[0], ts[-1] + 1e-9, 1.0 / HZ)
        yield np.stack([np.interp(grid, ts, seg[:, c]) for c in range(seg.shape[1])], axis=1)


def sliding_windows(signal: np.ndarray) -> np.ndarray:
    """(T, C) at 50 Hz -> (n, C, 128) windows with step 64; a tail shorter than a step is lost."""
    if len(signal) < WINDOW:
        return np.zeros((0, signal.shape[1], WINDOW), dtype=np.float32)
    n = (len(signal) - WINDOW) // STEP + 1
    index = np.arange(n)[:, None] * STEP + np.arange(WINDOW)[None, :]
    return signal[index].transpose(0, 2, 1).astype(np.float32)


def _zscore(segments: list[np.ndarray]) -> list[np.ndarray]:
    """One device's segments z-scored per channel over all of its samples."""
    stacked = np.concatenate(segments)
    mean, std = stacked.mean(axis=0), stacked.std(axis=0)
    return [(s - mean) / np.where(std > 0, std, 1.0) for s in segments]


class _Windows:
    """Windows gathered client by client, then written in one npz."""

    def __init__(self) -> None:
        self.xs: list[np.ndarray] = []
        self.ys: list[np.ndarray] = []
        self.clients: list[np.ndarray] = []

    def add_device(self, client: int, recordings: list[tuple[int, np.ndarray]]) -> None:
        """One device's (label, segment at 50 Hz) recordings: z-score, then window."""
        if not recordings:
            return
        labels = [label for label, _ in recordings]
        for label, seg in zip(labels, _zscore([s for _, s in recordings]), strict=True):
            w = sliding_windows(seg)
            self.xs.append(w)
            self.ys.append(np.full(len(w), label))
            self.clients.append(np.full(len(w), client))

    def save(
        self, path: Path, client_names: list[str], class_names: list[str], **extra: Any
    ) -> Path:
        from protofed.data.convert import save_npz, split_per_group

        if not self.xs or sum(len(x) for x in self.xs) == 0:
            raise ConfigError(f"{path.name}: no recording is long enough for one window")
        clients = np.concatenate(self.clients).astype(np.int16)
        return save_npz(
            path,
            X=np.concatenate(self.xs),
            y=np.concatenate(self.ys).astype(np.int8),
            client=clients,
            client_names=np.array(client_names),
            split=split_per_group(clients, TRAIN_FRACTION),
            channels=np.array(CHANNELS),
            class_names=np.array(class_names),
            window=np.array(f"{WINDOW} samples at {HZ} Hz, step {STEP} (50 % overlap)"),
            **extra,
        )


# --------------------------------------------------------------------------- RealWorld


def _realworld_tables(raw: Path) -> Iterator[tuple[int, str, IO[bytes]]]:
    """(subject, activity zip name, inner zip) for every proband<N>/data/acc_<act>_csv.zip,
    from realworld2016_dataset.zip in `raw` or from its unpacked folders."""
    zips = [p for p in sorted(raw.glob("*.zip")) if not _RW_OUTER.search(p.as_posix())]
    if zips:
        outer = zipfile.ZipFile(zips[0])
        for name in sorted(outer.namelist()):
            match = _RW_OUTER.search(name)
            if match and "__MACOSX" not in name:
                yield int(match.group(1)), match.group(2), io.BytesIO(outer.read(name))
        return
    for path in sorted(raw.rglob("acc_*_csv.zip")):
        match = _RW_OUTER.search(path.as_posix())
        if match:
            yield int(match.group(1)), match.group(2), io.BytesIO(path.read_bytes())


def _csv_members(archive: zipfile.ZipFile) -> Iterator[tuple[str, bytes]]:
    """(member name, bytes) of every CSV in `archive`, and in zips nested inside it."""
    for name in sorted(archive.namelist()):
        if "__MACOSX" in name:
            continue
        if name.endswith(".csv"):
            yield name, archive.read(name)
        elif name.endswith(".zip"):
            yield from _csv_members(zipfile.ZipFile(io.BytesIO(archive.read(name))))


def convert_realworld(raw: Path, root: Path) -> list[Path]:
    """realworld2016_dataset.zip's acc_<activity>_<position>.csv (id, attr_time ms, attr_x,
    attr_y, attr_z) -> X (N, 3, 128) at 50 Hz, 50 % overlap, z-scored per device; one client per
    subject x position (15 x 7 = 105); split: a seeded 80 % of each client's windows train."""
    import pandas as pd

    per_device: dict[tuple[int, str], list[tuple[int, np.ndarray]]] = {}
    found = False
    for subject, activity, blob in _realworld_tables(raw):
        if activity not in REALWORLD_ACTIVITIES:
            continue
        for member, data in _csv_members(zipfile.ZipFile(blob)):
            match = _RW_CSV.search(Path(member).name)
            if not match or match.group(2) not in REALWORLD_POSITIONS:
                continue
            found = True
            frame = pd.read_csv(
                io.BytesIO(data), usecols=["attr_time", "attr_x", "attr_y", "attr_z"]
            )
            t = frame["attr_time"].to_numpy(np.float64) / 1e3
            signal = frame[["attr_x", "attr_y", "attr_z"]].to_numpy(np.float64)
            label = _RW_CLASSES.index(REALWORLD_ACTIVITIES[activity])
            device = per_device.setdefault((subject, match.group(2)), [])
            device += [(label, seg) for seg in resample_50hz(t, signal)]
    if not found:
        raise ConfigError(
            f"realworld: no proband<N>/data/acc_<activity>_csv.zip in {raw} "
            "(realworld2016_dataset.zip or its unpacked folder)"
        )
    keys = sorted(per_device)
    out = _Windows()
    for client, key in enumerate(keys):
        out.add_device(client, per_device[key])
    names = [f"subject{s:02d}_{p}" for s, p in keys]
    return [out.save(root / "har" / "realworld.npz", names, _RW_CLASSES)]


# --------------------------------------------------------------------------- HHAR, user x model


def convert_hhar_paper(raw: Path, root: Path) -> list[Path]:
    """Phones_accelerometer.csv, every phone -> X (N, 3, 128) at 50 Hz (anti-aliased), 50 %
    overlap, z-scored per device; one client per user x phone model, the two phones of a model
    one client (9 x 4 = 36); 'null' activity dropped; split: a seeded 80 % per client train."""
    import pandas as pd

    from protofed.data.convert import open_member

    zips = sorted(raw.glob("*.zip"))
    if not zips:
        raise ConfigError(f"hhar: no .zip in {raw}")
    outer = zipfile.ZipFile(zips[0])
    inner = [n for n in outer.namelist() if n.endswith(".zip") and "Activity" in n]
    archive = zipfile.ZipFile(io.BytesIO(outer.read(inner[0]))) if inner else outer
    with open_member(archive, "Phones_accelerometer.csv") as f:
        frame = pd.read_csv(
            f, usecols=["Creation_Time", "x", "y", "z", "User", "Model", "Device", "gt"]
        )
    frame = frame[frame["gt"].isin(_HHAR_RAW)]
    frame = frame.sort_values(["User", "Model", "Device", "Creation_Time"], kind="stable")
    per_client: dict[tuple[str, str], dict[str, list[tuple[int, np.ndarray]]]] = {}
    label = frame["gt"].map({n: i for i, n in enumerate(_HHAR_RAW)}).to_numpy()
    keys = frame[["User", "Model", "Device"]].astype(str).to_numpy()
    t = frame["Creation_Time"].to_numpy(np.float64) / 1e9  # nanoseconds
    signal = frame[["x", "y", "z"]].to_numpy(np.float64)
    codes = np.stack(
        [pd.factorize(frame[c])[0] for c in ("User", "Model", "Device")] + [label], axis=1
    )
    from protofed.data.convert import contiguous_runs

    for start, stop in contiguous_runs(codes):
        user, model, device = keys[start]
        recordings = per_client.setdefault((user, model), {}).setdefault(device, [])
        recordings += [
            (int(label[start]), s) for s in resample_50hz(t[start:stop], signal[start:stop])
        ]
    out = _Windows()
    names = sorted(per_client)
    for client, key in enumerate(names):
        for device in sorted(per_client[key]):
            out.add_device(client, per_client[key][device])
    return [out.save(root / "har" / "hhar_paper.npz", [f"{u}_{m}" for u, m in names], HHAR_CLASSES)]


# --------------------------------------------------------------------------- loaders


def _load(cfg: DataConfig, name: str, relpath: str) -> Dataset:
    from protofed.data.sources.har import select_channels

    path = require(cfg, name, relpath)
    d = load_npz(path, "X", "y", "client", "client_names", "class_names")
    available = [str(c) for c in d.get("channels", CHANNELS)]
    chans = select_channels(name, cfg.channels, available, available)
    names = [str(c) for c in d["client_names"]]
    present = np.unique(d["client"])  # a client without one full window has none
    remap = np.full(len(names), -1, dtype=np.int64)
    remap[present] = np.arange(len(present))
    class_names = [str(c) for c in d["class_names"]]
    split = d.get("split")
    return Dataset(
        name=name,
        X=np.ascontiguousarray(d["X"][:, chans], dtype=np.float32),
        y=as_labels(d["y"]),
        num_classes=len(class_names),
        class_names=class_names,
        groups=remap[d["client"].astype(np.int64)],
        group_names=[names[i] for i in present.tolist()],
        predefined_split=None if split is None else split.astype(np.int64),
        kind="sensor",
        meta={
            "channels": [available[c] for c in chans],
            "sampling_hz": HZ,
            "window": str(d.get("window", f"{WINDOW} samples, step {STEP}")),
            "file": str(path),
            "predefined_split": "a seeded 80 % of each client's windows (FedAli's 80/20)",
        },
    )


def load_realworld(cfg: DataConfig) -> Dataset:
    """RealWorld HAR 2016 windows, one group per subject x body position (FedAli: 105)."""
    return _load(cfg, "realworld", "har/realworld.npz")


def load_hhar_paper(cfg: DataConfig) -> Dataset:
    """HHAR windows of every phone, one group per user x phone model (FedAli: 36)."""
    return _load(cfg, "hhar_paper", "har/hhar_paper.npz")


def load_fedali_combined(cfg: DataConfig) -> Dataset:
    """FedAli's Combined: `hhar_paper`'s and `realworld`'s clients in one federation (141);
    activities matched by meaning (harmonize.canonical_activity), 9 in all."""
    from protofed.data.sources.har import select_channels

    picked = select_channels("fedali_combined", cfg.channels, CHANNELS, CHANNELS)
    members = [
        loader(cfg.model_copy(update={"channels": "default"}))
        for loader in (load_hhar_paper, load_realworld)
    ]
    merged = combined(members, [COMBINED_CHANNELS[i] for i in picked], WINDOW)
    merged.name = "fedali_combined"
    return merged
