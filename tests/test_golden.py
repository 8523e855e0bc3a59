"""Golden numbers: short runs whose scores must not move when the code is restructured.

`tests/golden/*.json` hold the final and selected scores of a handful of short runs, recorded
from the built-in engine. Every engine must reproduce them: in-process, with a worker pool,
and on Flower's simulation engine (flower/test_flower.py; four clients at most, as its fault
injection hits clients 4 and 5). A change that is meant to change numbers regenerates them
on purpose (`python tests/test_golden.py`) and says why in its commit.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from conftest import uci_har_slice
from protofed.core.results import Summary

# whole runs, against recorded numbers
pytestmark = pytest.mark.integration

GOLDEN = Path(__file__).parent / "golden"
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

DIGITS = [
    "data.name=digits",
    "data.num_clients=4",
    "data.alpha=0.5",
    "model.name=mlp",
    "model.hidden=[32]",
]
# The golden numbers predate the data set defaults: the keys those would set are pinned here.
HAR = [
    "data.name=arrays",
    "data.path={har}",
    "data.partition=natural",
    "data.standardize=false",
    "train.momentum=0",
    "train.local_epochs=1",
]
HART_ALP = [
    "model.name=hart",
    "model.alp.enabled=true",
    "model.alp.prototypes=[8,8,4,4,4,4]",
    "train.optimizer=adam",
    "train.lr=0.002",
]
COMMON = [
    "seed=3",
    "train.rounds=3",
    "train.threads=1",
    "eval.batch_size=256",
    "train.batch_size=16",
]

# name -> config overrides; `{har}` is a slice of the real UCI-HAR windows (`har_slice`)
RUNS: dict[str, list[str]] = {
    "fedavg_digits": [*DIGITS, "algorithm.name=fedavg", "train.momentum=0.5"],
    "ditto_digits": [*DIGITS, "algorithm.name=ditto"],
    "pfpl_digits": [*DIGITS, "algorithm.name=pfpl"],
    "fedala_digits": [*DIGITS, "algorithm.name=fedala"],
    "feddpa_digits": [*DIGITS, "algorithm.name=feddpa", "eval.selection=best_test"],
    "fedsub_digits": [*DIGITS, "algorithm.name=fedsub", "algorithm.max_clusters=3"],
    "fedavg_har": [
        *HAR,
        "model.name=cnn1d",
        "algorithm.name=fedavg",
        "train.momentum=0.9",
        "train.local_epochs=3",
    ],
    "fedsub_har": [
        *HAR,
        "model.name=mlp",
        "model.hidden=[64]",
        "algorithm.name=fedsub",
        "algorithm.max_clusters=3",
    ],
    "fedali_har": [*HAR, *HART_ALP, "algorithm.name=fedali", "algorithm.kmeans_iters=5"],
}


def har_slice(path: Path) -> Path:
    """UCI-HAR windows of four subjects: the golden runs' data."""
    return uci_har_slice(path, [1, 3, 5, 6], every=6)


def config_of(name: str, har: Path, *extra: str):
    from protofed.config import load_config

    return load_config(None, [o.format(har=har) for o in [*COMMON, *RUNS[name], *extra]])


def scores(summary: Summary) -> dict:
    """The numbers that must not move: final and selected scores, their rounds, the bytes
    (as summary.json holds them, the golden files' shape)."""
    keep = ("personalization", "generalization", "global")
    data = summary.to_json()
    return {
        "final": {k: data["final"][k] for k in ("round", *keep)},
        "selected": {k: data["selected"][k] for k in ("round", *keep)},
        "comm": {k: data["comm"][k] for k in ("up_bytes", "down_bytes")},
    }


def assert_same(got: dict, want: dict, where: str = "", tol: float = 1e-6) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), (where, got, want)
        for key in want:
            assert_same(got[key], want[key], f"{where}.{key}", tol)
    elif isinstance(want, float):
        assert isinstance(got, (int, float)), (where, got)
        assert math.isclose(got, want, abs_tol=tol) or (math.isnan(got) and math.isnan(want)), (
            where,
            got,
            want,
        )
    else:
        assert got == want, (where, got, want)


def golden(name: str) -> dict:
    return json.loads((GOLDEN / f"{name}.json").read_text())


def run_builtin(cfg) -> Summary:
    from protofed.runtime import prepare, simulate

    return simulate(prepare(cfg)).run()


@pytest.fixture(scope="module")
def har(shared_data, tmp_path_factory) -> Path:
    return har_slice(tmp_path_factory.mktemp("golden") / "har4.npz")


@pytest.mark.parametrize("name", sorted(RUNS))
def test_builtin_engine_reproduces_the_golden_numbers(har, name) -> None:
    assert_same(scores(run_builtin(config_of(name, har))), golden(name))


@pytest.mark.parametrize("name", ["fedavg_har", "ditto_digits", "fedali_har", "fedsub_har"])
def test_worker_pool_reproduces_the_golden_numbers(har, name) -> None:
    assert_same(scores(run_builtin(config_of(name, har, "train.workers=2"))), golden(name))


if __name__ == "__main__":  # regenerate: only for a change meant to move the numbers
    import tempfile

    names = sys.argv[1:] or sorted(RUNS)
    GOLDEN.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = har_slice(Path(tmp) / "har4.npz")
        for name in names:
            result = scores(run_builtin(config_of(name, path)))
            (GOLDEN / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
            print(name, result["final"]["personalization"])
