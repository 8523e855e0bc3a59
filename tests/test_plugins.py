"""Extending protofed: the register decorators, and an installed plugin distribution whose
algorithm, model and data set appear in `protofed list` and run from the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import protofed
from protofed import plugins
from protofed.errors import ConfigError

BIN = Path(sys.executable).parent

PLUGIN = '''
"""A tiny protofed plugin: one algorithm, one model, one data set."""

import numpy as np
from torch import nn

import protofed
from protofed.algorithms.base import MODEL, Algorithm, FitResult
from protofed.data.types import Dataset
from protofed.models.base import FedModel


@protofed.register_algorithm
class HalfStep(Algorithm):
    name = "halfstep"
    summary = "Local SGD with the learning rate halved; the weighted mean."

    def fit(self, client, message, state):
        client.load(message[MODEL])
        metrics = client.train_model(lr=client.train.lr / 2)
        return FitResult({MODEL: client.weights()}, metrics)


class Linear(FedModel):
    def __init__(self, inputs, classes):
        super().__init__()
        self.features = nn.Flatten()
        self.head = nn.Linear(inputs, classes)


@protofed.register_model("tinylinear", "a linear classifier on the flattened input")
def build(cfg, input_shape, num_classes):
    return Linear(int(np.prod(input_shape)), num_classes)


@protofed.register_dataset("stripes", "four noisy classes of 8 features (generated)")
def load(cfg):
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(4), 60)
    X = (rng.normal(size=(240, 8)) + 3 * np.eye(4, 8)[y]).astype(np.float32)
    return Dataset(name="stripes", X=X, y=y, num_classes=4, class_names=["a", "b", "c", "d"])
'''

PYPROJECT = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "protofed-stripes"
version = "0.0.1"

[tool.setuptools]
py-modules = ["protofed_stripes"]

[project.entry-points."protofed.algorithms"]
halfstep = "protofed_stripes"

[project.entry-points."protofed.models"]
tinylinear = "protofed_stripes"

[project.entry-points."protofed.datasets"]
stripes = "protofed_stripes"
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The plugin built and installed (no network, no build isolation) into its own path."""
    root = tmp_path_factory.mktemp("plugin")
    source, site = root / "src", root / "site"
    source.mkdir()
    (source / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT))
    (source / "protofed_stripes.py").write_text(textwrap.dedent(PLUGIN))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return site


def _protofed(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site), "FLWR_TELEMETRY_ENABLED": "0", "COLUMNS": "200"}
    return subprocess.run(
        [str(BIN / "protofed"), *args],
        env=env,
        cwd=cwd,
        text=True,
        capture_output=True,
        timeout=300,
    )


@pytest.mark.integration
def test_an_installed_plugin_is_listed_and_runs(installed, tmp_path) -> None:
    listed = _protofed(installed, "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    for name in ("halfstep", "tinylinear", "stripes"):
        line = next(x for x in listed.stdout.splitlines() if x.strip().startswith(name))
        assert "plugin: protofed-stripes" in line
    run = _protofed(
        installed,
        "run",
        "-s",
        "algorithm.name=halfstep",
        "-s",
        "model.name=tinylinear",
        "-s",
        "data.name=stripes",
        "-s",
        "data.num_clients=3",
        "-s",
        "train.rounds=2",
        "-s",
        "train.lr=0.5",
        "-s",
        "train.local_epochs=3",
        "--out",
        "r",
        "--quiet",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["algorithm"] == "halfstep" and summary["dataset"] == "stripes"
    assert summary["model"] == "tinylinear" and summary["rounds"] == 2
    assert summary["final"]["personalization"]["acc"] > 0.5  # four separable classes


@pytest.mark.integration
def test_without_the_plugin_its_names_are_unknown(tmp_path) -> None:
    run = subprocess.run(
        [str(BIN / "protofed"), "run", "-s", "algorithm.name=halfstep", "--out", "r"],
        cwd=tmp_path,
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert run.returncode == 2 and "unknown algorithm.name 'halfstep'" in run.stderr
    assert not (tmp_path / "r").exists()


def test_the_decorators_refuse_duplicates_and_wrong_types() -> None:
    from protofed.algorithms.fedavg import FedAvg

    with pytest.raises(ConfigError, match="already registered"):
        protofed.register_algorithm(type("Other", (FedAvg,), {"name": "fedavg"}))
    with pytest.raises(ConfigError, match="Algorithm subclass"):
        protofed.register_algorithm(object)
    with pytest.raises(ConfigError, match="already registered"):
        protofed.register_model("mlp", "another mlp")(lambda cfg, shape, classes: None)
    with pytest.raises(ConfigError, match="already registered"):
        protofed.register_dataset("digits", "other digits")(lambda cfg: None)
    assert protofed.register_algorithm(FedAvg) is FedAvg  # registering the same class is a no-op


def test_a_cell_run_twice_replaces_its_registration() -> None:
    """A notebook cell (or a reloaded module) that defines and registers an algorithm, a
    model and a data set again replaces them; another definition of the name is refused."""
    from protofed.algorithms import ALGORITHMS
    from protofed.data import DATASETS
    from protofed.models import MODELS

    cell = """
import protofed
from protofed.algorithms.fedavg import FedAvg

@protofed.register_algorithm
class TwiceRun(FedAvg):
    name = "twice_run"
    summary = "defined twice"

@protofed.register_model("twice_run", "defined twice")
def twice_model(cfg, shape, classes):
    return None

@protofed.register_dataset("twice_run", "defined twice")
def twice_data(cfg):
    return None
"""
    first: dict = {"__name__": "notebook_cell"}
    second: dict = {"__name__": "notebook_cell"}
    try:
        exec(cell, first)  # noqa: S102 - our own code
        exec(cell, second)  # noqa: S102
        assert first["TwiceRun"] is not second["TwiceRun"]
        assert ALGORITHMS["twice_run"] is second["TwiceRun"]
        assert MODELS["twice_run"].build is second["twice_model"]
        assert DATASETS["twice_run"].loader is second["twice_data"]
        elsewhere: dict = {"__name__": "another_module"}
        with pytest.raises(ConfigError, match="an algorithm named 'twice_run' is already"):
            exec(cell, elsewhere)  # noqa: S102
    finally:  # leave the registries as the other tests expect them
        for table in (ALGORITHMS, MODELS, DATASETS):
            table.pop("twice_run", None)


@pytest.mark.integration
def test_a_part_this_process_registered_stops_a_sweep_and_flower_before_they_start(tmp_path):
    """An algorithm a script registers is known to this process only: a sweep's runs and
    Flower's nodes, new processes, could not load it, so both refuse it up front and write
    nothing, while `protofed.run` here runs it."""
    import yaml

    from protofed.algorithms import ALGORITHMS
    from protofed.algorithms.fedavg import FedAvg
    from protofed.sweep import load_spec, run_sweep

    protofed.register_algorithm(
        type("MyStep", (FedAvg,), {"name": "my_step", "summary": "s", "__module__": "__main__"})
    )
    try:
        assert plugins.registered_here_only("algorithms", "my_step") == "__main__"
        assert plugins.registered_here_only("algorithms", "fedavg") is None  # protofed's own
        assert plugins.registered_here_only("models", "mlp") is None
        spec = tmp_path / "spec.yaml"
        base = {"data": {"name": "digits"}, "algorithm": {"name": "my_step"}}
        spec.write_text(yaml.safe_dump({"base": base, "seeds": [0]}))
        with pytest.raises(ConfigError, match="algorithm 'my_step' is registered by this process"):
            run_sweep(load_spec(spec), tmp_path / "sweep")
        with pytest.raises(ConfigError, match="Flower's nodes run in new processes"):
            protofed.run(base, tmp_path / "flower", engine="flower")
        assert not (tmp_path / "sweep").exists() and not (tmp_path / "flower").exists()
        assert protofed.run(base, tmp_path / "here", **{"train.rounds": 1}).summary.rounds == 1
    finally:
        ALGORITHMS.pop("my_step")


@pytest.mark.integration
def test_an_installed_plugin_imported_by_hand_is_visible_elsewhere(installed, monkeypatch):
    """A plugin's module imported directly (not through its entry point) still reaches new
    processes: the check asks a fresh interpreter rather than guessing from names."""
    from protofed.algorithms import ALGORITHMS
    from protofed.data import DATASETS
    from protofed.models import MODELS

    monkeypatch.syspath_prepend(str(installed))
    monkeypatch.setenv("PYTHONPATH", str(installed))
    monkeypatch.delitem(sys.modules, "protofed_stripes", raising=False)
    try:
        __import__("protofed_stripes")
        for kind, name in [("algorithms", "halfstep"), ("models", "tinylinear")]:
            assert plugins.DEFINITIONS[(kind, name)][0] == "protofed_stripes"
            assert plugins.registered_here_only(kind, name) is None
    finally:
        for table, name in [(ALGORITHMS, "halfstep"), (MODELS, "tinylinear")]:
            table.pop(name, None)
        DATASETS.pop("stripes", None)
        sys.modules.pop("protofed_stripes", None)
