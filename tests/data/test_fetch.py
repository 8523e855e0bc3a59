"""`protofed data fetch`: download (file:// only, no network), checksums, resume, converters.

Each test writes a miniature archive in the data set's raw public format, often from rows of
the converted shared copy, serves it through a file:// URL, and checks that fetch + convert
gives back the same arrays (shapes, dtypes, label order, normalisation) and that the result
loads and runs.
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import hashlib
import io
import json
import pickle
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from protofed.cli import app
from protofed.config import DataConfig, load_config
from protofed.data import catalog, load_dataset, load_plugins
from protofed.data.convert import UCI_CHANNELS, safe_unpickle
from protofed.data.download import CHECKSUMS, Remote, ResumableDownloader, fetch_file
from protofed.errors import ConfigError

runner = CliRunner()


def _serve(monkeypatch, name: str, files: dict[str, Path], hashes: dict[str, str] | None = None):
    """Point data set `name`'s downloads at local files (file:// URLs)."""
    spec = catalog.SOURCES[name]
    hashes = hashes or {}
    remotes = tuple(
        Remote(r.filename, (files[r.filename].as_uri(),), hashes.get(r.filename), r.size)
        for r in spec.files
    )
    monkeypatch.setitem(catalog.SOURCES, name, dataclasses.replace(spec, files=remotes))


def _md5(path: Path) -> str:
    return "md5:" + hashlib.md5(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- download mechanics


def test_resume_continues_a_partial_download(tmp_path):
    blob = np.random.default_rng(0).bytes(3_000_000)
    source = tmp_path / "src" / "blob.bin"
    source.parent.mkdir()
    source.write_bytes(blob)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "blob.bin.part").write_bytes(blob[:1_000_000])  # an interrupted earlier download
    logs: list[str] = []
    remote = Remote("blob.bin", (source.as_uri(),), "sha256:" + hashlib.sha256(blob).hexdigest())
    path = fetch_file(remote, dest, log=logs.append, progress=False)
    assert path.read_bytes() == blob
    assert any("resuming blob.bin at 1.0 MB" in line for line in logs)
    assert not (dest / "blob.bin.part").exists()


def test_resume_reads_only_the_missing_bytes(tmp_path):
    source = tmp_path / "a.bin"
    source.write_bytes(b"x" * 5000)
    part = tmp_path / "out" / "a.bin.part"
    part.parent.mkdir()
    part.write_bytes(b"x" * 3000)
    downloader = ResumableDownloader(part, log=lambda _: None, progress=False)
    target = tmp_path / "out" / "tmp"
    downloader(source.as_uri(), str(target))
    assert downloader.resumed_at == 3000 and downloader.transferred == 2000
    assert target.read_bytes() == b"x" * 5000


def test_wrong_checksum_is_refused_and_removed(tmp_path):
    source = tmp_path / "a.bin"
    source.write_bytes(b"payload")
    remote = Remote("a.bin", (source.as_uri(),), "md5:" + "0" * 32)
    with pytest.raises(ConfigError, match="checksum mismatch") as err:
        fetch_file(remote, tmp_path / "dest", log=lambda _: None, progress=False)
    assert "\n" not in str(err.value)
    assert not any((tmp_path / "dest").iterdir())  # nothing half-written, no .part left


def test_first_download_records_sha256_and_later_checks_it(tmp_path):
    source = tmp_path / "a.bin"
    source.write_bytes(b"version 1")
    dest = tmp_path / "dest"
    remote = Remote("a.bin", (source.as_uri(),), None)
    fetch_file(remote, dest, log=lambda _: None, progress=False)
    recorded = json.loads((dest / CHECKSUMS).read_text())
    assert recorded == {"a.bin": "sha256:" + hashlib.sha256(b"version 1").hexdigest()}
    (dest / "a.bin").unlink()
    source.write_bytes(b"version 2: the upstream file changed")
    with pytest.raises(ConfigError, match="checksum mismatch"):
        fetch_file(remote, dest, log=lambda _: None, progress=False)
    (dest / "a.bin").write_bytes(b"tampered")  # a local copy that no longer matches
    with pytest.raises(ConfigError, match="sha256 checksum mismatch"):
        fetch_file(remote, dest, log=lambda _: None, progress=False)


def test_mirrors_are_tried_in_order(tmp_path):
    source = tmp_path / "a.bin"
    source.write_bytes(b"ok")
    missing = (tmp_path / "nowhere.bin").as_uri()
    remote = Remote("a.bin", (missing, source.as_uri()), None)
    assert (
        fetch_file(remote, tmp_path / "d", log=lambda _: None, progress=False).read_bytes() == b"ok"
    )
    gone = Remote("b.bin", (missing,), None)
    with pytest.raises(ConfigError, match="could not download b.bin"):
        fetch_file(gone, tmp_path / "d", log=lambda _: None, progress=False)


# --------------------------------------------------------------------------- safe unpickling


def test_safe_unpickle_reads_arrays_and_refuses_code(tmp_path):
    record = {"signal": {"wrist": {"EDA": np.arange(6.0).reshape(6, 1)}}, "label": np.ones(3)}
    data = safe_unpickle(io.BytesIO(pickle.dumps(record, protocol=2)), "S2.pkl")
    np.testing.assert_array_equal(data["signal"]["wrist"]["EDA"], record["signal"]["wrist"]["EDA"])

    class Exploit:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.raises(ConfigError, match="refused global builtins.print"):
        safe_unpickle(io.BytesIO(pickle.dumps(Exploit())), "evil.pkl")


# --------------------------------------------------------------------------- converters vs shared copies


def _uci_zip(path: Path, windows: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
    """A miniature of UCI's nested download: outer zip holding 'UCI HAR Dataset.zip'."""
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        for part, (X, y, subject) in windows.items():
            base = f"UCI HAR Dataset/{part}"
            for c, channel in enumerate(UCI_CHANNELS):
                text = "\n".join(" ".join(f"{v: .7e}" for v in row) for row in X[:, c])
                z.writestr(f"{base}/Inertial Signals/{channel}_{part}.txt", text + "\n")
            z.writestr(f"{base}/y_{part}.txt", "\n".join(str(v + 1) for v in y) + "\n")
            z.writestr(f"{base}/subject_{part}.txt", "\n".join(map(str, subject)) + "\n")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("UCI HAR Dataset.zip", inner.getvalue())
        z.writestr("UCI HAR Dataset.names", "names")


@pytest.mark.integration
def test_uci_har_fetch_matches_the_shared_conversion_and_runs(shared_data, tmp_path, monkeypatch):
    with np.load(shared_data / "har" / "uci_har.npz") as d:
        X, y, subject = d["X"], d["y"].astype(int), d["subject"].astype(int)
        channels, classes = list(d["channels"]), list(d["class_names"])
    rows = {"train": np.flatnonzero(subject <= 2)[:60], "test": np.flatnonzero(subject == 3)[:30]}
    archive = tmp_path / "serve" / "uci.zip"
    archive.parent.mkdir()
    _uci_zip(archive, {p: (X[r], y[r], subject[r]) for p, r in rows.items()})
    _serve(monkeypatch, "uci_har", {catalog.SOURCES["uci_har"].files[0].filename: archive})
    root = tmp_path / "root"
    result = runner.invoke(app, ["data", "fetch", "uci_har", "--data-dir", str(root)])
    assert result.exit_code == 0, result.output
    order = np.concatenate([rows["train"], rows["test"]])
    with np.load(root / "har" / "uci_har.npz", allow_pickle=False) as got:
        assert got["X"].shape == (90, 9, 128) and got["X"].dtype == np.float32
        np.testing.assert_allclose(got["X"], X[order], rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(got["y"], y[order])
        np.testing.assert_array_equal(got["subject"], subject[order])
        np.testing.assert_array_equal(got["split"], np.repeat([0, 1], [60, 30]))
        assert list(got["channels"]) == channels and list(got["class_names"]) == classes
    # the sha256 of this first download is recorded for later checks
    assert (root / "raw" / "uci_har" / CHECKSUMS).is_file()
    # fetched data then run, from a config that names the root
    cfg = load_config(
        None,
        [
            "data.name=uci_har",
            f"data.dir={root}",
            "data.partition=natural",
            "data.split=[0.6,0.2,0.2]",
            "train.rounds=1",
        ],
    )
    ds = load_dataset(cfg.data)
    assert ds.X.shape == (90, 6, 128) and ds.meta["predefined_split"].startswith("UCI-HAR")
    from protofed.runtime import simulate
    from protofed.runtime.prepare import prepare

    summary = simulate(prepare(cfg)).run()
    assert summary.num_clients == len(set(subject[order].tolist()))
    assert summary.final is not None and summary.final.personalization.acc > 0


def _idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_mnist_from_idx_files_with_published_md5(shared_data, tmp_path, monkeypatch):
    with np.load(shared_data / "digits" / "mnist.npz") as d:
        ref = {k: d[k][:50] for k in ("x_train", "y_train", "x_test", "y_test")}
    serve = tmp_path / "serve"
    serve.mkdir()
    files = {}
    for key, name in (
        ("x_train", "train-images-idx3-ubyte.gz"),
        ("y_train", "train-labels-idx1-ubyte.gz"),
        ("x_test", "t10k-images-idx3-ubyte.gz"),
        ("y_test", "t10k-labels-idx1-ubyte.gz"),
    ):
        _idx(serve / name, ref[key])
        files[name] = serve / name
    _serve(monkeypatch, "mnist", files, {n: _md5(p) for n, p in files.items()})
    root = tmp_path / "root"
    catalog.fetch("mnist", root, log=lambda _: None, progress=False)
    with np.load(root / "digits" / "mnist.npz", allow_pickle=False) as got:
        for key, value in ref.items():
            assert got[key].dtype == np.uint8
            np.testing.assert_array_equal(got[key], value)


def test_a_wrong_published_checksum_exits_2_with_one_line(tmp_path, monkeypatch):
    serve = tmp_path / "serve"
    serve.mkdir()
    files = {}
    for r in catalog.SOURCES["usps"].files:
        (serve / r.filename).write_bytes(bz2.compress(b"1 1:0.5\n"))
        files[r.filename] = serve / r.filename
    _serve(monkeypatch, "usps", files, {n: "md5:" + "f" * 32 for n in files})
    root = tmp_path / "root"
    result = runner.invoke(app, ["data", "fetch", "usps", "--data-dir", str(root)])
    assert result.exit_code == 2
    error = [line for line in result.output.splitlines() if "error" in line]
    assert len(error) == 1 and "checksum mismatch" in error[0]
    assert not (root / "digits").exists()


@pytest.mark.parametrize(
    ("name", "files"),
    [
        ("uci_har", ["junk.zip"]),
        ("wisdm", ["junk.tar.gz"]),
        (
            "office_caltech",
            [f"{d}_SURF_L10.mat" for d in ("amazon", "Caltech10", "dslr", "webcam")],
        ),
    ],
)
def test_damaged_raw_files_exit_2_with_one_line(tmp_path, name, files):
    raw = tmp_path / "raw"
    raw.mkdir()
    for file in files:
        (raw / file).write_bytes(b"not an archive\n")
    root = tmp_path / "root"
    result = runner.invoke(app, ["data", "fetch", name, "--raw", str(raw), "--data-dir", str(root)])
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("error")]
    assert len(error) == 1 and str(raw) in error[0], result.output
    assert "Traceback" not in result.output
    assert not list(root.rglob("*.npz"))


def test_usps_from_libsvm_bz2(shared_data, tmp_path, monkeypatch):
    with np.load(shared_data / "digits" / "usps.npz") as d:
        ref = {k: d[k][:40] for k in ("x_train", "y_train", "x_test", "y_test")}
    serve = tmp_path / "serve"
    serve.mkdir()
    files = {}
    for part, name in (("train", "usps.bz2"), ("test", "usps.t.bz2")):
        lines = []
        for x, label in zip(ref[f"x_{part}"], ref[f"y_{part}"], strict=True):
            pixels = " ".join(f"{i + 1}:{2 * v - 1:.6f}" for i, v in enumerate(x.reshape(-1)))
            lines.append(f"{label + 1} {pixels}")
        (serve / name).write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))
        files[name] = serve / name
    _serve(monkeypatch, "usps", files, {n: _md5(p) for n, p in files.items()})
    root = tmp_path / "root"
    catalog.fetch("usps", root, log=lambda _: None, progress=False)
    with np.load(root / "digits" / "usps.npz", allow_pickle=False) as got:
        for key, value in ref.items():
            assert got[key].dtype == value.dtype
            np.testing.assert_allclose(got[key], value, atol=1e-6)


def test_cifar10_from_the_binary_version(shared_data, tmp_path, monkeypatch):
    with np.load(shared_data / "images" / "cifar10_20k.npz") as d:
        x, y = d["x"][:30], d["y"][:30]
    blobs = {}
    for i in range(1, 6):
        rows = slice(5 * (i - 1), 5 * i)
        planar = x[rows].transpose(0, 3, 1, 2).reshape(5, -1)
        blobs[f"data_batch_{i}.bin"] = np.concatenate([y[rows, None], planar], axis=1)
    planar = x[25:].transpose(0, 3, 1, 2).reshape(5, -1)
    blobs["test_batch.bin"] = np.concatenate([y[25:, None], planar], axis=1)
    archive = tmp_path / "cifar.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, rows in blobs.items():
            data = rows.astype(np.uint8).tobytes()
            info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    _serve(
        monkeypatch,
        "cifar10",
        {"cifar-10-binary.tar.gz": archive},
        {"cifar-10-binary.tar.gz": _md5(archive)},
    )
    root = tmp_path / "root"
    catalog.fetch("cifar10", root, log=lambda _: None, progress=False)
    with np.load(root / "images" / "cifar10.npz", allow_pickle=False) as got:
        np.testing.assert_array_equal(got["x_train"], x[:25])
        np.testing.assert_array_equal(got["y_train"], y[:25])
        np.testing.assert_array_equal(got["x_test"], x[25:])
    # the loader prefers the fetched file and keeps the published split
    ds = load_dataset(DataConfig(name="cifar10", dir=str(root)))
    assert ds.X.shape == (30, 3, 32, 32) and ds.predefined_split.tolist() == [0] * 25 + [1] * 5
    assert abs(float(ds.X.mean())) < 1e-5  # per-channel standardised, as the subset is


def test_femnist_from_leaf_json_matches_the_shared_conversion(shared_data, tmp_path):
    with np.load(shared_data / "images" / "femnist_partial.npz") as d:
        keep = np.isin(d["writer"], [0, 1])
        x, y, writer, split = d["x"][keep], d["y"][keep], d["writer"][keep], d["split"][keep]
        names = d["writer_names"]
    raw = tmp_path / "leaf"
    for code, part in enumerate(("train", "test")):
        (raw / part).mkdir(parents=True)
        blob = {"users": [], "num_samples": [], "user_data": {}}
        for w in (0, 1):
            rows = (writer == w) & (split == code)
            blob["users"].append(str(names[w]))
            blob["num_samples"].append(int(rows.sum()))
            blob["user_data"][str(names[w])] = {
                "x": (x[rows].reshape(-1, 784) / 255.0).tolist(),
                "y": y[rows].tolist(),
            }
        (raw / part / f"all_data_0_niid_05_keep_0_{part}_9.json").write_text(json.dumps(blob))
    root = tmp_path / "root"
    result = runner.invoke(
        app, ["data", "fetch", "femnist", "--data-dir", str(root), "--raw", str(raw)]
    )
    assert result.exit_code == 0, result.output
    with np.load(root / "images" / "femnist.npz", allow_pickle=False) as got:
        order = np.concatenate(
            [np.flatnonzero((split == c) & (writer == w)) for c in (0, 1) for w in (0, 1)]
        )
        np.testing.assert_array_equal(got["x"], x[order])
        np.testing.assert_array_equal(got["y"], y[order])
        assert list(got["writer_names"]) == [str(names[0]), str(names[1])]
        assert got["x"].dtype == np.uint8 and got["x"].mean() > 200  # LEAF: background 255


def test_office_caltech_from_mat_files(shared_data, tmp_path, monkeypatch):
    from scipy.io import savemat

    with np.load(shared_data / "features" / "office_caltech10_surf.npz") as d:
        X, y, domain, classes = d["X"], d["y"], d["domain"], list(d["class_names"])
    serve = tmp_path / "serve"
    serve.mkdir()
    files, picked = {}, []
    for code, stem in enumerate(("amazon", "Caltech10", "dslr", "webcam")):
        rows = np.flatnonzero(domain == code)[:7]
        picked.append(rows)
        savemat(
            serve / f"{stem}_SURF_L10.mat",
            {"fts": X[rows].astype(np.float64), "labels": y[rows, None] + 1},
        )
        files[f"{stem}_SURF_L10.mat"] = serve / f"{stem}_SURF_L10.mat"
    _serve(monkeypatch, "office_caltech", files)
    root = tmp_path / "root"
    catalog.fetch("office_caltech", root, log=lambda _: None, progress=False)
    with np.load(root / "features" / "office_caltech10_surf.npz", allow_pickle=False) as got:
        order = np.concatenate(picked)
        np.testing.assert_array_equal(got["X"], X[order])
        assert got["X"].dtype == np.uint8
        np.testing.assert_array_equal(got["y"], y[order])
        np.testing.assert_array_equal(got["domain"], domain[order])
        assert list(got["class_names"]) == classes


# --------------------------------------------------------------------------- raw-only formats


def _tar_gz(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_wisdm_raw_text_windows_labels_and_normalisation(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    lines, expected = [], []
    for user in (1, 2):
        for activity, n in (("Walking", 300), ("Sitting", 140)):
            values = rng.normal(size=(n, 3))
            for k, v in enumerate(values):
                lines.append(f"{user},{activity},{1000 * k},{v[0]:.6f},{v[1]:.6f},{v[2]:.6f};")
            expected.append((user - 1, activity, n // 128))
    lines.insert(5, "33,Jogging,0,,;")  # malformed records are dropped
    lines[10] = lines[10] + lines[11]  # two records on one line, as in the release
    del lines[11]
    arff = "@relation x\n@attribute UNIQUE_ID numeric\n@attribute user numeric\n"
    arff += "@attribute X0 numeric\n@attribute class {Walking,Sitting}\n@data\n1,1,0.5,Walking\n2,2,?,Sitting\n"
    archive = tmp_path / "wisdm.tar.gz"
    _tar_gz(
        archive,
        {
            "WISDM_ar_v1.1/WISDM_ar_v1.1_raw.txt": "\n".join(lines).encode(),
            "WISDM_ar_v1.1/WISDM_ar_v1.1_transformed.arff": arff.encode(),
            "WISDM_ar_v1.1/readme.txt": b"readme",
        },
    )
    _serve(monkeypatch, "wisdm", {"WISDM_ar_latest.tar.gz": archive})
    _serve(monkeypatch, "wisdm_features", {"WISDM_ar_latest.tar.gz": archive})
    root = tmp_path / "root"
    catalog.fetch("wisdm", root, log=lambda _: None, progress=False)
    with np.load(root / "har" / "wisdm.npz", allow_pickle=False) as got:
        assert got["X"].shape == (2 * (2 + 1), 3, 128) and got["X"].dtype == np.float32
        np.testing.assert_allclose(got["X"].mean(axis=(0, 2)), 0, atol=1e-5)
        np.testing.assert_allclose(got["X"].std(axis=(0, 2)), 1, atol=1e-4)
        assert got["y"].tolist() == [0, 0, 2, 0, 0, 2]  # walk, walk, sit per user
        assert got["user"].tolist() == [0, 0, 0, 1, 1, 1]
        assert list(got["class_names"]) == ["walk", "jog", "sit", "stand", "upstairs", "downstairs"]
    catalog.fetch("wisdm_features", root, log=lambda _: None, progress=False)  # same archive
    table = pd.read_csv(root / "har" / "wisdm_features.csv")
    assert (
        list(table.columns) == ["UNIQUE_ID", "user", "X0", "class"]
        and table["X0"].isna().sum() == 1
    )
    assert (root / "har" / "wisdm_readme.txt").read_text() == "readme"


def test_wesad_pickles_become_window_features(tmp_path):
    rng = np.random.default_rng(0)
    seconds = {1: 65, 2: 40, 3: 31, 4: 20}  # baseline, stress, amusement, meditation (dropped)
    label = np.concatenate([np.full(s * 700, code) for code, s in seconds.items()])
    total = len(label) / 700
    wrist = {
        "ACC": rng.normal(size=(int(total * 32), 3)),
        "BVP": rng.normal(size=(int(total * 64), 1)),
        "EDA": rng.normal(size=(int(total * 4), 1)),
        "TEMP": rng.normal(size=(int(total * 4), 1)) + 33,
    }
    record = {"signal": {"wrist": wrist, "chest": {}}, "label": label, "subject": "S2"}
    raw = tmp_path / "WESAD" / "S2"
    raw.mkdir(parents=True)
    (raw / "S2.pkl").write_bytes(pickle.dumps(record, protocol=2))
    root = tmp_path / "root"
    catalog.fetch("wesad", root, raw_dir=tmp_path / "WESAD", log=lambda _: None)
    table = pd.read_csv(root / "wearable" / "wesad_features.csv")
    assert table["label"].tolist() == [1, 1, 2, 0]  # 2 baseline, 1 stress, 1 amusement window
    assert table["subject"].unique().tolist() == ["S2"]
    np.testing.assert_allclose(table["TEMP_mean"].iloc[0], wrist["TEMP"][:120].mean())
    ds = load_dataset(DataConfig(name="wesad", dir=str(root)))
    assert ds.class_names == ["amusement", "baseline", "stress"] and ds.X.shape[0] == 4


def test_unknown_name_exits_2_before_any_download(tmp_path):
    result = runner.invoke(app, ["data", "fetch", "mnist", "cifar11", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2 and "did you mean 'cifar10'" in result.output
    assert not any(tmp_path.iterdir())


def test_data_list_and_info_describe_the_catalog(shared_data):
    result = runner.invoke(app, ["data", "list", "--data-dir", str(shared_data)])
    assert result.exit_code == 0
    row = next(line for line in result.output.splitlines() if line.startswith("│ uci_har"))
    assert "yes" in row and "CC BY 4.0" in row
    assert any(
        line.startswith("│ cifar10 ") and "subset" in line for line in result.output.splitlines()
    )
    assert "…" not in result.output  # in 80 columns nothing is cut, names least of all
    names = {line.split("│")[1].strip() for line in result.output.splitlines()[4:-2]}
    assert set(load_plugins()) <= names
    info = runner.invoke(app, ["data", "info", "mnist", "--data-dir", str(shared_data)])
    assert info.exit_code == 0
    assert "md5:f68b3c2dcbeaaa9fbdd348bbdeb94873" in info.output
    assert "model.name=cnn" in info.output


def test_mnist_m_from_the_png_tarball(shared_data, tmp_path, monkeypatch):
    from PIL import Image

    with np.load(shared_data / "digits" / "mnist_m_test.npz") as d:
        x, y = d["x_test"][:12], d["y_test"][:12]
    members = {}
    for part, rows in (("train", range(0, 8)), ("test", range(8, 12))):
        labels = []
        for k in rows:
            buffer = io.BytesIO()
            Image.fromarray(x[k]).save(buffer, format="PNG")
            members[f"mnist_m/mnist_m_{part}/{k:08d}.png"] = buffer.getvalue()
            labels.append(f"{k:08d}.png {y[k]}")
        members[f"mnist_m/mnist_m_{part}_labels.txt"] = ("\n".join(labels) + "\n").encode()
    archive = tmp_path / "mnist_m.tar.gz"
    _tar_gz(archive, members)
    _serve(monkeypatch, "mnist_m", {"mnist_m.tar.gz": archive}, {"mnist_m.tar.gz": _md5(archive)})
    root = tmp_path / "root"
    catalog.fetch("mnist_m", root, log=lambda _: None, progress=False)
    with np.load(root / "digits" / "mnist_m.npz", allow_pickle=False) as got:
        np.testing.assert_array_equal(got["x_train"], x[:8])
        np.testing.assert_array_equal(got["x_test"], x[8:])
        np.testing.assert_array_equal(got["y_test"], y[8:])
        assert got["x_train"].dtype == np.uint8 and got["x_train"].shape[1:] == (32, 32, 3)
    ds = load_dataset(DataConfig(name="mnist_m", dir=str(root)))
    assert ds.predefined_split.tolist() == [0] * 8 + [1] * 4


def test_hhar_csv_keeps_galaxy_s3_windows(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    frames = []
    for user, device, model, gt, n in (
        ("a", "s3_1", "s3", "walk", 300),
        ("a", "s3_1", "s3", "null", 200),
        ("b", "s3_2", "s3", "bike", 260),
        ("b", "nexus4_1", "nexus4", "sit", 400),  # not a Galaxy S3: dropped
    ):
        frames.append(
            pd.DataFrame(
                {
                    "Index": 0,
                    "Arrival_Time": 0,
                    "Creation_Time": np.arange(n) * 10,
                    "x": rng.normal(size=n),
                    "y": rng.normal(size=n),
                    "z": rng.normal(size=n),
                    "User": user,
                    "Model": model,
                    "Device": device,
                    "gt": gt,
                }
            )
        )
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr(
            "Activity recognition exp/Phones_accelerometer.csv",
            pd.concat(frames).to_csv(index=False),
        )
    archive = tmp_path / "hhar.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("Activity recognition exp.zip", inner.getvalue())
    _serve(monkeypatch, "hhar", {catalog.SOURCES["hhar"].files[0].filename: archive})
    root = tmp_path / "root"
    catalog.fetch("hhar", root, log=lambda _: None, progress=False)
    with np.load(root / "har" / "hhar_sa.npz", allow_pickle=False) as got:
        assert got["X"].shape == (4, 3, 128)
        assert got["y"].tolist() == [3, 3, 0, 0] and got["user"].tolist() == [0, 0, 1, 1]
        assert list(got["class_names"])[:4] == ["bike", "sit", "stand", "walk"]


def test_femnist_from_flowers_parquet_takes_a_leaf_sample(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    from PIL import Image

    rng = np.random.default_rng(2)
    images, writers, chars = [], [], []
    for w in range(40):
        for _ in range(10):
            img = np.full((28, 28), 0, dtype=np.uint8)  # light ink on black, as in the parquet
            img[10:18, 10:18] = rng.integers(100, 255)
            buffer = io.BytesIO()
            Image.fromarray(img).save(buffer, format="PNG")
            images.append({"bytes": buffer.getvalue(), "path": None})
            writers.append(f"f{w:04d}_00")
            chars.append(int(rng.integers(0, 62)))
    table = pa.table(
        {"image": images, "writer_id": writers, "hsf_id": [0] * 400, "character": chars}
    )
    name = catalog.SOURCES["femnist"].files[0].filename
    pq.write_table(table, tmp_path / name)
    _serve(monkeypatch, "femnist", {name: tmp_path / name})
    root = tmp_path / "root"
    catalog.fetch("femnist", root, log=lambda _: None, progress=False)
    with np.load(root / "images" / "femnist.npz", allow_pickle=False) as got:
        assert len(got["writer_names"]) == 2  # 5 % of 400 samples = whole writers of 10
        assert len(got["x"]) == 20 and got["x"][:, 0, 0].tolist() == [255] * 20  # LEAF polarity
        assert got["split"].tolist().count(0) == 18  # 90 % of each writer's samples train
