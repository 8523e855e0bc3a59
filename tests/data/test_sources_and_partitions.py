"""Data layer: loaders on the real data sets, bring-your-own files, partitioners, splits."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from protofed.config import DataConfig
from protofed.data import (
    DATASETS,
    PARTITIONERS,
    Dataset,
    build_federated,
    load_dataset,
    partition,
    stratified_split,
)
from protofed.data.harmonize import COMBINED_CHANNELS, canonical_activity, harmonized_windows
from protofed.errors import ConfigError

# name: (shape of X, num classes, number of groups or None, kind)
EXPECTED = {
    "uci_har": ((10299, 6, 128), 6, 30, "sensor"),
    "wisdm": ((7292, 3, 128), 6, 36, "sensor"),
    "hhar": ((4436, 3, 128), 6, 9, "sensor"),
    "har_combined": ((4436 + 7292, 3, 128), 7, 9 + 36, "sensor"),
    "wisdm_features": ((5418, 43), 6, 36, "tabular"),
    "wesad": (None, 3, 15, "tabular"),  # column count checked separately
    "mnist": ((70000, 1, 28, 28), 10, None, "image"),
    "usps": ((9298, 1, 16, 16), 10, None, "image"),
    "mnist_m": ((9001, 3, 32, 32), 10, None, "image"),
    "digits_domains": ((21000, 3, 32, 32), 10, 3, "image"),
    "cifar10": ((20000, 3, 32, 32), 10, None, "image"),
    "cifar100": ((10000, 3, 32, 32), 100, None, "image"),
    "femnist": ((18796, 1, 28, 28), 62, 184, "image"),
    "office_caltech": ((2533, 800), 10, 4, "tabular"),
    "synthetic": ((20000, 32), 10, None, "tabular"),
}
NO_FILES = {"digits", "arrays", "synthetic"}


@pytest.fixture(scope="module")
def real(shared_data: Path):
    """Load a real data set once per module (several tests reuse uci_har / digits_domains)."""
    cache: dict[tuple, Dataset] = {}

    def get(name: str, **kw) -> Dataset:
        key = (name, repr(sorted(kw.items())))
        if key not in cache:
            cache[key] = load_dataset(DataConfig(name=name, dir=str(shared_data), **kw))
        return cache[key]

    return get


def _check_conventions(ds: Dataset) -> None:
    assert ds.X.dtype == np.float32 and ds.y.dtype == np.int64
    assert ds.y.min() >= 0 and ds.y.max() < ds.num_classes
    assert len(ds.class_names) == ds.num_classes
    assert np.isfinite(ds.X).all()
    if ds.groups is not None:
        assert ds.groups.dtype == np.int64 and ds.groups.min() >= 0
        assert ds.group_names is not None and len(ds.group_names) > ds.groups.max()


# --------------------------------------------------------------------------- loaders


def test_every_registered_loader_is_covered():
    # FedAli's federations have no files in the shared data: their converters are tested on
    # miniature archives (test_paper_federations.py)
    paper = {"realworld", "hhar_paper", "fedali_combined"}
    assert set(DATASETS) == set(EXPECTED) | {"digits", "arrays"} | paper
    assert all(info.description and "\n" not in info.description for info in DATASETS.values())


@pytest.mark.integration
def test_digits_needs_no_data_root(tmp_path):
    ds = load_dataset(DataConfig(name="digits", dir=str(tmp_path / "nowhere")))
    assert ds.X.shape == (1797, 1, 8, 8) and ds.kind == "image" and ds.groups is None
    assert ds.X.min() == 0.0 and ds.X.max() == 1.0
    _check_conventions(ds)
    resized = load_dataset(DataConfig(name="digits", image_size=16))
    assert resized.X.shape == (1797, 1, 16, 16)


@pytest.mark.integration
@pytest.mark.shared_data
@pytest.mark.parametrize("name", sorted(set(EXPECTED) - NO_FILES))
def test_real_loader_shapes(real, name):
    _check_expected(name, real(name))


def test_synthetic_loader():
    ds = load_dataset(DataConfig(name="synthetic"))
    _check_expected("synthetic", ds)
    np.testing.assert_array_equal(ds.X, load_dataset(DataConfig(name="synthetic")).X)


def _check_expected(name: str, ds: Dataset) -> None:
    shape, classes, groups, kind = EXPECTED[name]
    _check_conventions(ds)
    if shape is not None:
        assert ds.X.shape == shape
    assert ds.num_classes == classes and len(np.unique(ds.y)) == classes
    assert ds.kind == kind
    if groups is None:
        assert ds.groups is None
    else:
        assert len(np.unique(ds.groups)) == groups


@pytest.mark.integration
@pytest.mark.shared_data
def test_uci_har_channels(real):
    ds = real("uci_har")
    assert ds.meta["channels"] == [
        "total_acc_x", "total_acc_y", "total_acc_z", "body_gyro_x", "body_gyro_y", "body_gyro_z"
    ]  # fmt: skip
    everything = real("uci_har", channels="all")
    assert everything.X.shape == (10299, 9, 128)
    np.testing.assert_array_equal(ds.X[:, 0], everything.X[:, 6])  # total_acc_x
    picked = real("uci_har", channels=["body_gyro_z", 0])
    np.testing.assert_array_equal(picked.X[:, 0], everything.X[:, 5])
    np.testing.assert_array_equal(picked.X[:, 1], everything.X[:, 0])
    assert ds.group_names[0] == "subject_1" and ds.predefined_split is not None
    assert np.bincount(ds.groups).min() >= 281


@pytest.mark.shared_data
@pytest.mark.parametrize("bad", [["body_acc_q"], [9], "acc"])
def test_bad_channel_is_a_config_error(real, bad):
    with pytest.raises(ConfigError, match="data.channels"):
        real("uci_har", channels=bad)
    with pytest.raises(ConfigError, match="acc_x"):  # lists the valid channels
        real("wisdm", channels=["gyro_x"])


@pytest.mark.integration
@pytest.mark.shared_data
def test_real_loader_preprocessing(real):
    cifar = real("cifar10")
    assert np.allclose(cifar.X.mean(axis=(0, 2, 3)), 0, atol=1e-3)
    assert np.allclose(cifar.X.std(axis=(0, 2, 3)), 1, atol=1e-3)
    femnist = real("femnist")
    assert femnist.X.mean() < 0.25  # background inverted to 0
    assert femnist.predefined_split is not None
    wesad = real("wesad")
    cols = wesad.meta["columns"]
    assert wesad.X.shape == (1178, len(cols)) and len(cols) <= 24
    assert not {"age", "height", "weight", "subject", "label"} & set(cols)
    assert not any(c.endswith(("_YES", "_NO")) or c.startswith("Unnamed") for c in cols)
    assert np.unique(wesad.X, axis=1).shape[1] == wesad.X.shape[1]  # no duplicated columns
    assert "ACC_z_std" in wesad.meta["dropped_duplicate"]  # = ACC_x_std up to scale
    for tab in (wesad, real("wisdm_features"), real("office_caltech")):
        assert np.allclose(tab.X.mean(axis=0), 0, atol=1e-4)
    dd = real("digits_domains")
    assert dd.group_names == ["mnist", "usps", "mnist_m"]
    assert np.bincount(dd.groups).tolist() == [7000, 7000, 7000]
    assert real("mnist_m", image_size=16).X.shape == (9001, 3, 16, 16)
    assert real("hhar").predefined_split is None


def test_missing_file_names_path_and_source(tmp_path, monkeypatch):
    with pytest.raises(ConfigError) as err:
        load_dataset(DataConfig(name="uci_har", dir=str(tmp_path)))
    msg = str(err.value)
    assert str(tmp_path / "har" / "uci_har.npz") in msg and "\n" not in msg
    assert "Human Activity Recognition Using Smartphones" in msg
    monkeypatch.setenv("PROTOFED_DATA", str(tmp_path / "env"))
    with pytest.raises(ConfigError, match="cifar10_20k.npz") as err:
        load_dataset(DataConfig(name="cifar10"))
    assert str(tmp_path / "env" / "images" / "cifar10_20k.npz") in str(err.value)


def test_unknown_name_suggests_close_match():
    with pytest.raises(ConfigError, match="did you mean 'uci_har'") as err:
        load_dataset(DataConfig(name="uci_hr"))
    assert "femnist" in str(err.value)  # lists the valid names


def _write_uci_folder(root: Path) -> None:
    """A tiny copy of the original 'UCI HAR Dataset/' layout: 2 + 1 subjects, 8 time steps."""
    channels = [f"{k}_{a}" for k in ("body_acc", "body_gyro", "total_acc") for a in "xyz"]
    base = root / "UCI HAR Dataset"
    for part, subjects, labels in (("train", [1, 1, 3, 3], [1, 2, 6, 1]), ("test", [2, 2], [4, 5])):
        signals = base / part / "Inertial Signals"
        signals.mkdir(parents=True)
        for c, ch in enumerate(channels):
            rows = [
                " ".join(f"{c * 100 + r + t / 10:.4e}" for t in range(8))
                for r in range(len(labels))
            ]
            (signals / f"{ch}_{part}.txt").write_text("\n".join("  " + r for r in rows) + "\n")
        (base / part / f"subject_{part}.txt").write_text("\n".join(map(str, subjects)) + "\n")
        (base / part / f"y_{part}.txt").write_text("\n".join(map(str, labels)) + "\n")


def test_uci_har_original_folder(tmp_path):
    _write_uci_folder(tmp_path)
    ds = load_dataset(DataConfig(name="uci_har", dir=str(tmp_path)))
    assert ds.X.shape == (6, 6, 8) and ds.X.dtype == np.float32
    np.testing.assert_allclose(ds.X[:, 0, 0], [600, 601, 602, 603, 600, 601])  # total_acc_x
    np.testing.assert_allclose(ds.X[:, 3, 0], [300, 301, 302, 303, 300, 301])  # body_gyro_x
    assert ds.y.tolist() == [0, 1, 5, 0, 3, 4]
    assert ds.group_names == ["subject_1", "subject_2", "subject_3"]
    assert ds.groups.tolist() == [0, 0, 2, 2, 1, 1]
    assert ds.predefined_split.tolist() == [0, 0, 0, 0, 1, 1]
    assert ds.num_classes == 6 and ds.class_names[5] == "LAYING"
    assert (
        load_dataset(DataConfig(name="uci_har", dir=str(tmp_path), channels="all")).X.shape[1] == 9
    )
    with pytest.raises(ConfigError, match="body_acc_q"):
        load_dataset(DataConfig(name="uci_har", dir=str(tmp_path), channels=["body_acc_q"]))


# --------------------------------------------------------------------------- arrays


def _arrays(path: Path, **kw) -> Dataset:
    return load_dataset(DataConfig(name="arrays", path=str(path), **kw))


def test_arrays_npz_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 4, 5)).astype(np.float64)
    y = np.array([9, 3, 5] * 10)
    group = np.repeat([10, 20, 30], 10)
    np.savez(tmp_path / "d.npz", X=X, y=y, group=group)
    ds = _arrays(tmp_path / "d.npz")
    np.testing.assert_allclose(ds.X, X.astype(np.float32))
    assert ds.kind == "sensor" and ds.X.dtype == np.float32
    assert ds.class_names == ["3", "5", "9"] and ds.y[:3].tolist() == [2, 0, 1]
    assert ds.groups.tolist() == np.repeat([0, 1, 2], 10).tolist()
    np.savez(tmp_path / "img.npz", X=np.zeros((4, 1, 6, 6)), y=np.array(["a", "b", "a", "b"]))
    img = _arrays(tmp_path / "img.npz", image_size=8)
    assert img.kind == "image" and img.X.shape == (4, 1, 8, 8) and img.groups is None


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_arrays_table_with_string_label_and_group(tmp_path, fmt):
    frame = pd.DataFrame(
        {
            "f1": [0.5, 1.5, 2.5, 3.5],
            "site": ["b", "a", "b", "a"],
            "f2": [1, 2, 3, 4],
            "activity": ["walk", "sit", "walk", "run"],
        }
    )
    path = tmp_path / f"t.{fmt}"
    if fmt == "csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path)
    ds = _arrays(path, label_column="activity", group_column="site")
    assert ds.kind == "tabular" and ds.X.shape == (4, 2)
    np.testing.assert_allclose(ds.X, [[0.5, 1], [1.5, 2], [2.5, 3], [3.5, 4]])
    assert ds.class_names == ["run", "sit", "walk"] and ds.y.tolist() == [2, 1, 2, 0]
    assert ds.group_names == ["a", "b"] and ds.groups.tolist() == [1, 0, 1, 0]


def test_arrays_errors(tmp_path):
    np.savez(tmp_path / "noy.npz", X=np.zeros((3, 2)))
    with pytest.raises(ConfigError, match="'y'.*noy.npz|noy.npz.*'y'"):
        _arrays(tmp_path / "noy.npz")
    np.savez(tmp_path / "short.npz", X=np.zeros((3, 2)), y=np.zeros(2))
    with pytest.raises(ConfigError, match=r"\(3, 2\).*\(2,\)"):
        _arrays(tmp_path / "short.npz")
    np.savez(tmp_path / "nan.npz", X=np.array([[0.0, np.nan], [1, 2]]), y=np.zeros(2))
    with pytest.raises(ConfigError, match="NaN"):
        _arrays(tmp_path / "nan.npz")
    pd.DataFrame({"a": [1.0, np.nan], "label": [0, 1]}).to_csv(tmp_path / "nan.csv", index=False)
    with pytest.raises(ConfigError, match="NaN.*'a'"):
        _arrays(tmp_path / "nan.csv")
    pd.DataFrame({"a": [1, 2], "colour": ["red", "blue"], "label": [0, 1]}).to_csv(
        tmp_path / "str.csv", index=False
    )
    with pytest.raises(ConfigError, match="'colour'"):
        _arrays(tmp_path / "str.csv")
    pd.DataFrame({"a": [1, 2], "label": [0, 1]}).to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(ConfigError, match="data.label_column.*'cls'"):
        _arrays(tmp_path / "t.csv", label_column="cls")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ConfigError, match="empty"):
        _arrays(tmp_path / "empty.csv")
    (tmp_path / "header.csv").write_text("a,label\n")
    with pytest.raises(ConfigError, match=r"no rows.*\(0, 2\)"):
        _arrays(tmp_path / "header.csv")
    with pytest.raises(ConfigError, match="data.path"):
        load_dataset(DataConfig(name="arrays"))
    with pytest.raises(ConfigError, match="file not found"):
        _arrays(tmp_path / "absent.npz")
    np.savez(tmp_path / "one.npz", X=np.zeros((3, 2)), y=np.ones(3))
    with pytest.raises(ConfigError, match="one.npz: 1 class"):
        _arrays(tmp_path / "one.npz")
    np.savez(tmp_path / "complex.npz", X=np.zeros((2, 2)), y=np.array([0, 1j]))
    with pytest.raises(ConfigError, match="complex"):
        _arrays(tmp_path / "complex.npz")


# --------------------------------------------------------------------------- partitioners


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset(DataConfig(name="digits"))


def _grouped(n_groups: int = 3, per: int = 200, classes: int = 5) -> Dataset:
    rng = np.random.default_rng(1)
    n = n_groups * per
    return Dataset(
        name="grouped",
        X=np.arange(n, dtype=np.float32)[:, None],  # X encodes the sample index
        y=rng.integers(0, classes, n).astype(np.int64),
        num_classes=classes,
        class_names=[str(i) for i in range(classes)],
        groups=np.repeat(np.arange(n_groups), per).astype(np.int64),
        group_names=[f"site_{g}" for g in range(n_groups)],
    )


def _parts(ds: Dataset, seed: int = 0, **kw) -> list[np.ndarray]:
    return partition(DataConfig(**kw), ds, np.random.default_rng(seed))


def _assert_disjoint(parts: list[np.ndarray], n: int, complete: bool) -> None:
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx) and allidx.max() < n
    assert all(np.all(np.diff(p) > 0) for p in parts)  # sorted
    if complete:
        assert len(allidx) == n


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "pathological"])
def test_partitions_cover_digits(digits, kind):
    parts = _parts(digits, partition=kind, num_clients=10)
    assert len(parts) == 10
    _assert_disjoint(parts, len(digits), complete=True)
    assert set(PARTITIONERS) >= {"iid", "dirichlet", "pathological", "natural", "mixed"}


def _classes_over_5pct(parts: list[np.ndarray], y: np.ndarray) -> float:
    return float(np.mean([(np.bincount(y[p], minlength=10) / len(p) > 0.05).sum() for p in parts]))


def test_dirichlet_small_alpha_is_skewed(digits):
    kw = {"partition": "dirichlet", "num_clients": 10, "min_size": 5}
    skewed = _classes_over_5pct(_parts(digits, alpha=0.1, **kw), digits.y)
    even = _classes_over_5pct(_parts(digits, alpha=100, **kw), digits.y)
    assert skewed < 5 < even


def test_dirichlet_impossible_settings_fail_fast(digits):
    start = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        _parts(digits, partition="dirichlet", num_clients=100, min_size=50)
    for word in ("alpha", "num_clients", "min_size"):
        assert word in str(err.value)
    with pytest.raises(ConfigError, match="raise data.alpha"):
        _parts(digits, partition="dirichlet", num_clients=50, min_size=35, alpha=0.01)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize(("clients", "per"), [(10, 2), (20, 3), (7, 1), (3, 10), (100, 2)])
def test_pathological_exact_classes(digits, clients, per):
    parts = _parts(digits, partition="pathological", num_clients=clients, classes_per_client=per)
    assert [len(np.unique(digits.y[p])) for p in parts] == [per] * clients
    # Fewer shards than classes (7 x 1 < 10) leaves the classes without a shard unused.
    _assert_disjoint(parts, len(digits), complete=clients * per >= digits.num_classes)


def test_partition_errors(digits):
    with pytest.raises(ConfigError, match="data.num_clients.*1797"):
        _parts(digits, partition="iid", num_clients=2000)
    with pytest.raises(ConfigError, match="classes_per_client"):
        _parts(digits, partition="pathological", classes_per_client=11)
    with pytest.raises(ConfigError, match="no natural groups"):
        _parts(digits, partition="natural")
    with pytest.raises(ConfigError, match="no natural groups"):
        _parts(digits, partition="mixed")


def test_natural_and_mixed_on_groups():
    ds = _grouped()
    parts = _parts(ds, partition="natural", num_clients=99)
    assert [np.unique(ds.groups[p]).tolist() for p in parts] == [[0], [1], [2]]
    _assert_disjoint(parts, len(ds), complete=True)
    parts = _parts(ds, partition="mixed", num_clients=7, classes_per_client=2)
    _assert_disjoint(parts, len(ds), complete=False)
    domains = [np.unique(ds.groups[p]) for p in parts]
    assert all(len(d) == 1 for d in domains)
    assert {int(d[0]) for d in domains} == {0, 1, 2}
    assert [len(np.unique(ds.y[p])) for p in parts] == [2] * 7


def test_natural_picks_num_clients_groups_from_the_seed():
    """data.num_clients under a natural partition draws that many groups from the seed (its
    own stream: the same groups for the same seed), in group order; unset, every group."""
    ds = _grouped(n_groups=8, per=20)

    def names(seed: int = 0, **kw) -> list[str]:
        fed = build_federated(DataConfig(partition="natural", **kw), seed, dataset=ds)
        return [c.name for c in fed.clients]

    assert names() == [f"site_{g}" for g in range(8)]
    three = names(num_clients=3)
    assert len(three) == 3 and three == sorted(three, key=lambda n: int(n[5:]))
    assert names(num_clients=3) == three and names(seed=0, num_clients=8) == names()
    assert any(names(seed=s, num_clients=3) != three for s in range(1, 6))
    assert names(clients="all", num_clients=3) == names()  # how runs before the key read it


def test_natural_refuses_more_groups_than_exist_and_unknown_names():
    ds = _grouped(n_groups=3)

    def fed(**kw):
        return build_federated(DataConfig(partition="natural", **kw), 0, dataset=ds)

    assert [c.name for c in fed(clients=["site_2", "site_0"]).clients] == [
        "site_0",
        "site_2",
    ]
    cases = [
        ({"num_clients": 4}, r"^data.num_clients=4 but grouped has 3 natural groups"),
        ({"clients": ["site_0", "site_7"]}, r"^data.clients: 'site_7' is not a group"),
        ({"clients": ["site_1", "site_1"]}, r"^data.clients names 'site_1' twice$"),
        ({"clients": ["site_1"], "num_clients": 2}, r"^data.num_clients=2 but data.clients"),
        ({"clients": []}, r"^data.clients is empty"),
    ]
    for kw, message in cases:
        with pytest.raises(ConfigError, match=message) as err:
            fed(**kw)
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"^data.clients names natural groups"):
        build_federated(DataConfig(partition="iid", clients=["site_0"]), 0, dataset=ds)


@pytest.mark.shared_data
def test_natural_on_uci_har(real):
    ds = real("uci_har")
    fed = build_federated(DataConfig(name="uci_har", partition="natural"), 0, dataset=ds)
    assert len(fed.clients) == 30
    assert [c.name for c in fed.clients[:2]] == ["subject_1", "subject_2"]
    assert [c.group for c in fed.clients] == list(range(30))
    assert int(fed.counts.sum()) == 10299 and not fed.meta["notes"]  # every group, every sample
    picked = build_federated(
        DataConfig(name="uci_har", partition="natural", num_clients=3), 0, dataset=ds
    )
    assert len(picked.clients) == 3 and "3 of 30 groups" in picked.meta["notes"][0]
    with pytest.raises(ConfigError, match=r"^data.num_clients=31 but uci_har has 30 natural"):
        build_federated(DataConfig(name="uci_har", partition="natural", num_clients=31), 0, ds)


@pytest.mark.integration
@pytest.mark.shared_data
def test_mixed_on_digits_domains(real):
    ds = real("digits_domains")
    parts = _parts(ds, partition="mixed", num_clients=9, classes_per_client=3)
    domains = [np.unique(ds.groups[p]).tolist() for p in parts]
    assert all(len(d) == 1 for d in domains) and {d[0] for d in domains} == {0, 1, 2}
    assert [len(np.unique(ds.y[p])) for p in parts] == [3] * 9


# --------------------------------------------------------------------------- per-client splits


def _fed(seed: int = 0, **kw):
    ds = kw.pop("dataset", None)
    return build_federated(DataConfig(**kw), seed, dataset=ds)


def test_split_is_stratified_and_respects_fractions(digits):
    fed = _fed(partition="dirichlet", num_clients=6, alpha=1.0)
    by = fed.counts_by_split()
    total = fed.counts
    for s, frac in zip(("train", "val", "test"), (0.7, 0.1, 0.2), strict=True):
        assert np.all(np.abs(by[s] - frac * total) <= 1)  # per client and class
        assert np.all(np.abs(by[s].sum(1) - frac * total.sum(1)) <= 1.5)  # per client
    assert int(total.sum()) == len(digits)
    for c in fed.clients:
        assert c.train_x.dtype == torch.float32 and c.train_y.dtype == torch.int64
        assert c.train_x.is_contiguous() and c.train_x.shape[1:] == (1, 8, 8)


def test_split_is_deterministic():
    kw = {"partition": "dirichlet", "num_clients": 5}
    a, b, c = _fed(3, **kw), _fed(3, **kw), _fed(4, **kw)
    for ca, cb in zip(a.clients, b.clients, strict=True):
        for f in ("train_x", "train_y", "val_x", "test_x", "test_y"):
            assert torch.equal(getattr(ca, f), getattr(cb, f))
    assert any(
        ca.train_y.shape != cc.train_y.shape or not torch.equal(ca.train_x, cc.train_x)
        for ca, cc in zip(a.clients, c.clients, strict=True)
    )


def test_every_sample_used_once():
    ds = _grouped()
    fed = _fed(dataset=ds, name="grouped", partition="iid", num_clients=4)
    seen = torch.cat([torch.cat([c.train_x, c.val_x, c.test_x]) for c in fed.clients]).flatten()
    assert sorted(seen.long().tolist()) == list(range(len(ds)))
    for c in fed.clients:  # labels travel with their samples
        for x, y in ((c.train_x, c.train_y), (c.test_x, c.test_y)):
            assert torch.equal(torch.from_numpy(ds.y)[x.flatten().long()], y)


def test_stratified_split_small_classes_and_zero_val():
    y = np.array([0, 1, 1, 2, 2, 2] + [3] * 20)
    tr, va, te = stratified_split(y, (0.7, 0.1, 0.2), np.random.default_rng(0))
    assert sorted(np.concatenate([tr, va, te]).tolist()) == list(range(len(y)))
    assert set(y[tr]) == {0, 1, 2, 3}  # no class lost from train
    assert {1, 2} <= set(y[te])
    tr, va, te = stratified_split(np.arange(6), (0.7, 0.1, 0.2), np.random.default_rng(0))
    assert len(te) == 1 and len(tr) == 5  # all classes singletons: test still gets one
    tr, va, te = stratified_split(y, (0.8, 0.0, 0.2), np.random.default_rng(0))
    assert len(va) == 0 and len(tr) + len(te) == len(y)
    fed = _fed(partition="iid", num_clients=3, split=(0.8, 0.0, 0.2))
    assert all(c.val_x.shape == (0, 1, 8, 8) and c.val_y.shape == (0,) for c in fed.clients)


def test_natural_leaves_out_a_group_too_small_to_split():
    ds = _grouped()
    ds.groups = ds.groups.copy()
    ds.groups[0] = 3  # a fourth group with a single sample
    ds.group_names = [*ds.group_names, "lonely"]
    fed = _fed(dataset=ds, name="grouped", partition="natural")
    assert "lonely" not in [c.name for c in fed.clients]
    assert any("1 of" in note and "unused" in note for note in fed.meta["notes"])


def test_client_without_test_sample_is_a_config_error(digits):
    with pytest.raises(ConfigError, match="client"):
        _fed(partition="iid", num_clients=len(digits))


def test_summary_and_table(digits):
    fed = _fed(partition="pathological", num_clients=4, classes_per_client=3)
    summary = json.loads(json.dumps(fed.summary()))
    assert summary["num_clients"] == 4 and summary["dataset"] == "digits"
    assert sum(c["train"] + c["val"] + c["test"] for c in summary["clients"]) == len(digits)
    assert np.array_equal(np.array(summary["counts"]), fed.counts)
    table = fed.counts_table().splitlines()
    assert sum(line.startswith("client_") for line in table) == 4


# --------------------------------------------------------------------------- combined HAR sets


def test_har_combined_joins_users_and_activities_by_meaning(real, shared_data: Path) -> None:
    hhar, wisdm, both = real("hhar"), real("wisdm"), real("har_combined")
    assert both.group_names[:9] == [f"hhar:{g}" for g in hhar.group_names]
    assert both.group_names[9:] == [f"wisdm:{g}" for g in wisdm.group_names]
    assert both.class_names == ["bike", "sit", "stand", "walk", "stairs_up", "stairs_down", "jog"]
    n = len(hhar)
    for part, own in ((slice(0, n), hhar), (slice(n, None), wisdm)):
        names = [both.class_names[c] for c in both.y[part]]  # every window keeps its activity
        assert names == [canonical_activity(own.class_names[c]) for c in own.y]
        x = both.X[part].astype(np.float64)  # each member z-scored per channel on its own
        np.testing.assert_allclose(x.mean(axis=(0, 2)), 0, atol=1e-4)
        np.testing.assert_allclose(x.std(axis=(0, 2)), 1, atol=1e-4)
    cfg = DataConfig(name="har_combined", partition="natural", dir=str(shared_data))
    fed = build_federated(cfg, seed=0)
    assert len(fed.clients) == 45 and fed.num_classes == 7


def test_har_combined_takes_uci_har_acceleration_and_refuses_bad_members(real) -> None:
    ds = real("har_combined", members=["uci_har", "hhar"])
    assert ds.X.shape == (10299 + 4436, 3, 128) and ds.meta["channels"] == COMBINED_CHANNELS
    uci = real("uci_har")
    first = harmonized_windows(uci, COMBINED_CHANNELS, 128)[:5]  # total_acc, z-scored
    np.testing.assert_array_equal(ds.X[:5], first)
    for members in (["hhar"], ["hhar", "hhar"], ["hhar", "mnist"]):
        with pytest.raises(ConfigError, match="data.members: two or more distinct"):
            real("har_combined", members=members)
