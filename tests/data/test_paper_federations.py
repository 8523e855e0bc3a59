"""FedAli's HAR federations: RealWorld (105 clients), HHAR user x model (36), Combined (141).

The real archives (3.5 GB and 1.1 GB) cannot be downloaded here: each test writes a miniature
archive in the real layout (every subject, position, user, phone model present, a few seconds
of signal each) and runs the catalog's fetch on it from a file:// URL or --raw folder.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from protofed.config import DataConfig
from protofed.data import catalog, load_dataset
from protofed.data.harmonize import canonical_activity
from protofed.data.partition import partition
from protofed.data.sources import fedali_har

RATES = {"nexus4": 200, "s3": 150, "s3mini": 100, "samsungold": 50}  # HHAR's phones, about


def _csv(frame: pd.DataFrame) -> bytes:
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False)
    return buffer.getvalue().encode()


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def realworld_archive(folder: Path, seconds: float = 4.0) -> Path:
    """realworld2016_dataset.zip in miniature: proband1..15/data/acc_<activity>_csv.zip, each
    holding acc_<activity>_<position>.csv for the 7 positions. Walking lasts `seconds` (one
    windows, as a natural client needs two); the other activities a few rows, and subject 1 jumps in two sessions."""
    rng = np.random.default_rng(0)
    members = {}
    for subject in range(1, fedali_har.REALWORLD_SUBJECTS + 1):
        for activity in fedali_har.REALWORLD_ACTIVITIES:
            long = activity == "walking" or (subject == 1 and activity == "jumping")
            n = int(seconds * 50) if long else 5
            inner = {}
            for position in fedali_har.REALWORLD_POSITIONS:
                frame = pd.DataFrame(
                    {
                        "id": np.arange(1, n + 1),
                        "attr_time": 1435000000000 + np.arange(n) * 20,  # ms, 50 Hz
                        "attr_x": rng.normal(size=n),
                        "attr_y": rng.normal(size=n),
                        "attr_z": rng.normal(9.8, 1, size=n),
                    }
                )
                inner[f"acc_{activity}_{position}.csv"] = _csv(frame)
                if subject == 1 and activity == "jumping":  # a second session: _2_
                    inner[f"acc_{activity}_2_{position}.csv"] = _csv(frame)
            members[f"proband{subject}/data/acc_{activity}_csv.zip"] = _zip(inner)
            members[f"proband{subject}/data/gyr_{activity}_csv.zip"] = _zip({})  # not read
    path = folder / "realworld2016_dataset.zip"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_zip(members))
    return path


def hhar_archive(folder: Path, seconds: float = 3.0) -> Path:
    """heterogeneity_activity_recognition.zip in miniature: the inner 'Activity recognition
    exp.zip' holding Phones_accelerometer.csv with users a-i, 8 phones (2 per model) at their
    own rates; each phone walks for `seconds`, bikes for a few rows, and records some 'null'."""
    rng = np.random.default_rng(1)
    rows = []
    for user in fedali_har.HHAR_USERS:
        for model, rate in RATES.items():
            for copy in (1, 2):
                t0 = 1424696633908000000
                for gt, n in (("walk", int(seconds * rate)), ("bike", 4), ("null", 30)):
                    times = t0 + (np.arange(n) * 1e9 / rate).astype(np.int64)
                    t0 = int(times[-1]) + 2_000_000_000  # 2 s apart: a new segment
                    for k in range(n):
                        rows.append(
                            (times[k], *rng.normal(size=3), user, model, f"{model}_{copy}", gt)
                        )
    frame = pd.DataFrame(
        rows, columns=["Creation_Time", "x", "y", "z", "User", "Model", "Device", "gt"]
    )
    frame.insert(0, "Arrival_Time", frame["Creation_Time"] // 1_000_000)
    frame.insert(0, "Index", np.arange(len(frame)))
    frame = frame[
        ["Index", "Arrival_Time", "Creation_Time", "x", "y", "z", "User", "Model", "Device", "gt"]
    ]
    inner = _zip({"Activity recognition exp/Phones_accelerometer.csv": _csv(frame)})
    path = folder / "heterogeneity_activity_recognition.zip"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_zip({"Activity recognition exp.zip": inner, "Still exp.zip": _zip({})}))
    return path


def _natural(name: str, root: Path) -> tuple[object, list[np.ndarray]]:
    cfg = DataConfig(name=name, dir=str(root), partition="natural")
    ds = load_dataset(cfg)
    return ds, partition(cfg, ds, np.random.default_rng(0))


def test_sliding_windows_are_128_samples_with_half_overlap():
    signal = np.arange(300, dtype=np.float64)[:, None].repeat(3, axis=1)
    w = fedali_har.sliding_windows(signal)
    assert w.shape == (3, 3, 128)  # starts 0, 64, 128; 192 + 128 > 300
    assert w[1, 0, 0] == 64 and w[2, 0, -1] == 255
    assert fedali_har.sliding_windows(signal[:127]).shape == (0, 3, 128)


def test_resampling_brings_a_fast_phone_to_50hz_and_splits_at_gaps():
    t = np.concatenate([np.arange(400) / 200.0, 10 + np.arange(100) / 200.0])
    signal = np.sin(2 * np.pi * 1.0 * t)[:, None].repeat(3, axis=1)
    segments = list(fedali_har.resample_50hz(t, signal))
    assert [len(s) for s in segments] == [100, 25]  # 2 s and 0.5 s at 50 Hz, apart
    grid = np.arange(100) / 50.0
    assert np.allclose(segments[0][10:-10, 0], np.sin(2 * np.pi * grid[10:-10]), atol=0.05)


def test_realworld_converts_to_105_subject_x_position_clients(tmp_path, monkeypatch):
    archive = realworld_archive(tmp_path / "serve")
    spec = catalog.SOURCES["realworld"]
    served = type(spec.files[0])(spec.files[0].filename, (archive.as_uri(),))
    monkeypatch.setitem(
        catalog.SOURCES, "realworld", type(spec)(**{**spec.__dict__, "files": (served,)})
    )
    root = tmp_path / "root"
    written = catalog.fetch("realworld", root, log=lambda _: None, progress=False)
    assert written == [root / "har" / "realworld.npz"]
    ds, parts = _natural("realworld", root)
    assert len(ds.group_names) == len(parts) == 105
    assert ds.group_names[0] == "subject01_chest" and ds.group_names[-1] == "subject15_waist"
    assert ds.X.shape[1:] == (3, 128) and ds.meta["sampling_hz"] == 50
    # 4 s of walking at 50 Hz: 200 samples, windows at 0 and 64; subject 1 also jumps twice
    assert np.bincount(ds.groups).tolist() == [6] * 7 + [2] * 98
    assert ds.class_names == [
        "stairs_down",
        "stairs_up",
        "jump",
        "lie",
        "stand",
        "sit",
        "run",
        "walk",
    ]
    assert set(np.unique(ds.y).tolist()) == {2, 7}


def test_hhar_paper_has_36_user_x_model_clients_and_hhar_stays_per_user(tmp_path):
    raw = tmp_path / "raw"
    hhar_archive(raw)
    root = tmp_path / "root"
    catalog.fetch("hhar_paper", root, raw_dir=raw, log=lambda _: None, progress=False)
    ds, parts = _natural("hhar_paper", root)
    assert len(ds.group_names) == len(parts) == 36
    assert ds.group_names[:4] == ["a_nexus4", "a_s3", "a_s3mini", "a_samsungold"]
    # two phones per model, each 3 s of walking at 50 Hz (150 samples): one window each;
    # the bike rows are too short, 'null' is dropped
    assert np.bincount(ds.groups).tolist() == [2] * 36
    assert ds.class_names == ["bike", "sit", "stand", "walk", "stairs_up", "stairs_down"]
    assert set(np.unique(ds.y).tolist()) == {3}
    # the per-user HHAR set is untouched: hhar still reads har/hhar_sa.npz
    assert catalog.SOURCES["hhar"].produces == ("har/hhar_sa.npz",)
    assert catalog.SOURCES["hhar_paper"].raw == "hhar"  # one download serves both


def test_fedali_combined_has_141_clients_and_shared_activities_matched(tmp_path):
    raw_rw, raw_hhar = tmp_path / "rw", tmp_path / "hhar"
    realworld_archive(raw_rw)
    hhar_archive(raw_hhar)
    root = tmp_path / "root"
    catalog.fetch("realworld", root, raw_dir=raw_rw, log=lambda _: None, progress=False)
    catalog.fetch("hhar_paper", root, raw_dir=raw_hhar, log=lambda _: None, progress=False)
    assert catalog.COMPOSITE["fedali_combined"] == ("hhar_paper", "realworld")
    assert catalog.status("fedali_combined", root)[0] == "yes"
    ds, parts = _natural("fedali_combined", root)
    assert len(ds.group_names) == len(parts) == 141
    assert ds.group_names[0] == "hhar_paper:a_nexus4"
    assert ds.group_names[-1] == "realworld:subject15_waist"
    # HHAR's 6 and RealWorld's 8 activities share 5 (sit, stand, walk, stairs up and down)
    assert ds.class_names == [
        "bike",
        "sit",
        "stand",
        "walk",
        "stairs_up",
        "stairs_down",
        "jump",
        "lie",
        "run",
    ]
    assert canonical_activity("walking") == "walk"
    walk = ds.class_names.index("walk")
    hhar_rows = ds.groups < 36
    assert set(np.unique(ds.y[hhar_rows]).tolist()) == {walk}
    assert walk in ds.y[~hhar_rows] and ds.class_names.index("jump") in ds.y[~hhar_rows]


def test_a_folder_without_the_realworld_layout_is_refused(tmp_path):
    from protofed.errors import ConfigError

    (tmp_path / "raw").mkdir()
    with pytest.raises(ConfigError, match="proband"):
        catalog.fetch("realworld", tmp_path / "root", raw_dir=tmp_path / "raw", log=lambda _: None)
