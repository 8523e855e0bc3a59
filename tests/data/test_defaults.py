"""Defaults a first run can trust: per-data-set recipes, data.standardize, the chance-level
warning, and a data root that travels with a run (absolute in config.yaml, --data-dir on
resume)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from sklearn.datasets import load_wine
from typer.testing import CliRunner

from protofed.cli import app
from protofed.config import DATASET_DEFAULTS, load_config
from protofed.runtime import simulate, start
from protofed.runtime.prepare import prepare

runner = CliRunner()


def test_dataset_defaults_fill_only_unset_keys(tmp_path):
    cfg = load_config(None, ["data.name=uci_har"])
    assert (cfg.model.name, cfg.train.momentum, cfg.train.local_epochs) == ("cnn1d", 0.9, 2)
    cfg = load_config(None, ["data.name=uci_har", "train.momentum=0", "model.name=harcnn"])
    assert (cfg.model.name, cfg.train.momentum, cfg.train.local_epochs) == ("harcnn", 0.0, 2)
    path = tmp_path / "exp.yaml"
    path.write_text("data: {name: cifar10}\ntrain: {lr: 0.1}\n")
    cfg = load_config(path)
    assert (cfg.model.name, cfg.train.lr, cfg.train.momentum) == ("cnn", 0.1, 0.9)
    assert load_config(None, []).model.name == "mlp"  # digits keeps the generic defaults
    assert set(DATASET_DEFAULTS) >= {"uci_har", "wisdm", "hhar", "cifar10", "wesad"}


def _wine_csv(tmp_path, standardized: bool):
    bunch = load_wine(as_frame=True)
    frame = bunch.data
    if standardized:
        frame = (frame - frame.mean()) / frame.std(ddof=0)
    frame = frame.assign(label=bunch.target)
    path = tmp_path / ("wine_z.csv" if standardized else "wine.csv")
    frame.to_csv(path, index=False)
    return path


def _run_wine(path, *extra: str) -> dict:
    cfg = load_config(
        None,
        [
            "data.name=arrays",
            f"data.path={path}",
            "data.partition=iid",
            "data.num_clients=3",
            "train.rounds=10",
            "train.threads=1",
            "model.hidden=[32]",
            *extra,
        ],
    )
    return simulate(prepare(cfg)).run()


@pytest.mark.integration
def test_raw_csv_on_mixed_scales_trains_like_its_standardised_copy(tmp_path):
    raw = _wine_csv(tmp_path, standardized=False)
    default = _run_wine(raw)
    reference = _run_wine(_wine_csv(tmp_path, standardized=True))
    off = _run_wine(raw, "data.standardize=false")
    acc = {
        name: s.final.personalization.acc
        for name, s in (("default", default), ("reference", reference), ("off", off))
    }
    assert acc["default"] >= acc["reference"] - 0.03 and acc["default"] > 0.9, acc
    assert acc["off"] < 0.6, acc  # proline (~1000) swamps the other features
    assert not default.warnings
    assert any("never beat chance" in w for w in off.warnings), off.warnings


def test_standardisation_uses_training_rows_only(tmp_path):
    frame = pd.DataFrame({"a": np.arange(40.0) * 1000, "label": [0, 1] * 20})
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    cfg = load_config(
        None,
        ["data.name=arrays", f"data.path={path}", "data.partition=iid", "data.num_clients=1"],
    )
    fed = prepare(cfg).fed
    client = fed.clients[0]
    assert fed.meta["standardized"] is True
    assert (
        abs(float(client.train_x.mean())) < 1e-5
        and abs(float(client.train_x.std(unbiased=False)) - 1) < 1e-5
    )
    assert abs(float(client.test_x.mean())) > 1e-3  # test rows did not inform the statistics


@pytest.fixture
def office_root(shared_data, tmp_path):
    root = tmp_path / "root_a"
    (root / "features").mkdir(parents=True)
    shutil.copy(shared_data / "features" / "office_caltech10_surf.npz", root / "features")
    return root


def _office(*extra: str):
    return load_config(
        None,
        [
            "data.name=office_caltech",
            "data.partition=natural",
            "train.rounds=2",
            "train.threads=1",
            "model.hidden=[16]",
            *extra,
        ],
    )


def test_config_yaml_stores_the_data_root_absolute(office_root, tmp_path, monkeypatch):
    monkeypatch.chdir(office_root.parent)
    loop = start(_office("data.dir=root_a"), tmp_path / "run1")
    stored = yaml.safe_load((tmp_path / "run1" / "config.yaml").read_text())
    assert stored["data"]["dir"] == str(office_root)
    assert loop.cfg.data.dir == str(office_root)
    monkeypatch.setenv("PROTOFED_DATA", str(office_root))  # no data.dir: the root read is pinned
    start(_office(), tmp_path / "run2")
    stored = yaml.safe_load((tmp_path / "run2" / "config.yaml").read_text())
    assert stored["data"]["dir"] == str(office_root)


@pytest.mark.integration
def test_resume_reads_data_from_data_dir_when_the_root_moved(office_root, tmp_path, monkeypatch):
    monkeypatch.delenv("PROTOFED_DATA", raising=False)
    out = tmp_path / "run"
    start(_office(f"data.dir={office_root}"), out).run()
    (out / "summary.json").unlink()  # as if killed after its last checkpoint
    moved = tmp_path / "root_b"
    office_root.rename(moved)
    lost = runner.invoke(app, ["run", "--resume", str(out)])
    assert lost.exit_code == 2 and str(office_root) in lost.output
    found = runner.invoke(app, ["run", "--resume", str(out), "--data-dir", str(moved)])
    assert found.exit_code == 0, found.output
    assert (out / "summary.json").is_file()
    (out / "summary.json").unlink()
    monkeypatch.setenv("PROTOFED_DATA", str(moved))
    assert runner.invoke(app, ["run", "--resume", str(out)]).exit_code == 0


PAPER_CONFIGS = sorted(
    p
    for p in (Path(__file__).resolve().parents[2] / "configs").glob("*.yaml")
    if p.name.split("_")[0] in ("fedala", "fedali", "feddpa", "fedsub", "pfpl", "baselines")
)


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_a_papers_config_sets_every_key_the_data_set_defaults_would_fill(path):
    """A paper's recipe is the config's own: the data-set defaults (momentum 0.9 and more)
    must never change it. They once did: FedSub's plain SGD silently trained with momentum."""
    from protofed.config import load_raw, with_dataset_defaults

    raw = load_raw(path)
    filled = with_dataset_defaults(raw)
    assert filled == raw, f"{path.name} leaves unset what the data set's defaults fill"
