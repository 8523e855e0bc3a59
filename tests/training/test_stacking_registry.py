"""Stacked training is a runtime strategy: algorithms opt in by one registration, and the
`Algorithm` interface and the algorithm modules know nothing of it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from protofed.algorithms import ALGORITHMS, Algorithm, algorithm_class
from protofed.algorithms.common.ala import with_ala
from protofed.algorithms.fedavg import FedAvg
from protofed.core.types import FitResult
from protofed.runtime import stacking
from protofed.runtime.stacking import ADAPTERS, NOT_WRITTEN, register_stacked, stack_reason

ALGORITHMS_DIR = Path(stacking.__file__).resolve().parents[2] / "algorithms"

STACKED = {
    "ditto",
    "fedavg",
    "fedbabu",
    "feddpa",
    "fedper",
    "fedproto",
    "fedprox",
    "fedrep",
    "local",
    "moon",
    "pfpl",
}


def test_the_algorithm_interface_has_no_stacking_members():
    members = {name for k in Algorithm.__mro__ for name in vars(k)}
    assert not {m for m in members if "stack" in m}


def test_no_algorithm_module_imports_the_stacking_code():
    found = []
    for path in sorted(ALGORITHMS_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found += [f"{path.name}: {n}" for n in names if "stack" in n]
    assert not found


def test_the_built_in_algorithms_that_train_stacked():
    """The same set as when each algorithm declared it (`protofed list` names them); other
    tests register algorithms of their own (subclasses inherit an adapter), left out here."""
    built_in = {n: c for n, c in ALGORITHMS.items() if c.__module__.startswith("protofed.")}
    assert {name for name, cls in built_in.items() if stack_reason(cls) is None} == STACKED


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("fedpac", NOT_WRITTEN),
        ("centralized", "it trains one client on every client's data"),
        ("fedala", "AdaptiveLocalAggregation.fit does more than the stacked step"),
    ],
)
def test_why_an_algorithm_does_not_train_stacked(name, says):
    assert stack_reason(algorithm_class(name)) == says


def test_a_mix_in_around_fit_is_not_stacked():
    assert stack_reason(with_ala(FedAvg)) is not None


def test_one_registration_opts_an_algorithm_in(monkeypatch):
    monkeypatch.setattr(stacking.registry, "ADAPTERS", dict(ADAPTERS))

    class Mine(Algorithm):
        name = "mine_for_this_test"
        summary = "a test's"

        def fit(self, client, message, state) -> FitResult:
            raise NotImplementedError

    class Sub(Mine):
        name = "sub_for_this_test"

    assert stack_reason(Mine) == NOT_WRITTEN

    @register_stacked(Mine)
    def mine(algorithm, clients, messages, states, train) -> list[FitResult]:
        return []

    assert stack_reason(Mine) is None and stack_reason(Sub) is None  # inherited

    class Own(Mine):
        name = "own_for_this_test"

        def fit(self, client, message, state) -> FitResult:  # its own fit: not the adapter's
            raise NotImplementedError

    assert stack_reason(Own) == "Own.fit does more than the stacked step"
    register_stacked("own_for_this_test")(mine)  # by the name it declares
    assert stack_reason(Own) is None
