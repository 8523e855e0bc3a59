"""Unseen users (`eval.unseen_clients`, `eval.finetune_epochs`): clients held out of training,
scored every evaluated round with the global model and with the model the algorithm's own
client procedure gives them (docs/protocol.md, Unseen users)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from protofed.config import load_config
from protofed.core.results import ReportedRound, RoundRecord
from protofed.core.types import clone
from protofed.errors import ConfigError
from protofed.report import run_row, to_markdown
from protofed.runtime import prepare, simulate, start
from protofed.runtime.holdout import held_out, unseen_count

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: conftest
from conftest import har_slice_config, uci_har_slice  # noqa: E402

OLD_RUN = Path(__file__).resolve().parents[1] / "data" / "run_before_typed_records"  # no summary

BASE = [
    "data.name=digits",
    "data.partition=dirichlet",
    "data.num_clients=6",
    "data.alpha=1.0",
    "model.name=mlp",
    "model.hidden=[32]",
    "train.batch_size=32",
    "train.lr=0.1",
    "train.threads=1",
    "train.workers=1",
    "seed=3",
]


def _cfg(*extra: str):
    return load_config(None, [*BASE, *extra])


def test_the_held_out_clients_come_from_the_seed_alone() -> None:
    cfg = _cfg("eval.unseen_clients=2")
    assert held_out(cfg, 6) == held_out(cfg, 6)
    assert len(held_out(cfg, 6)) == 2 and list(held_out(cfg, 6)) == sorted(held_out(cfg, 6))
    draws = {held_out(_cfg("eval.unseen_clients=2", f"seed={s}"), 30) for s in range(8)}
    assert len(draws) > 1  # another seed, other clients
    assert held_out(_cfg(), 6) == ()  # off by default
    assert unseen_count(0.25, 30) == 8 and unseen_count(0.01, 30) == 1 and unseen_count(3, 30) == 3


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["eval.unseen_clients=6"], "eval.unseen_clients=6 holds out 6 of the federation's 6"),
        (["eval.unseen_clients=0.99"], "eval.unseen_clients=0.99 holds out 6"),
        (["eval.finetune_epochs=1"], "eval.finetune_epochs applies to the unseen clients only"),
    ],
)
def test_too_many_unseen_clients_is_a_one_line_error(overrides, message) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        prepare(_cfg(*overrides))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["-1", "1.0", "1.5", "true", "many"])
def test_bad_values_name_the_key(value) -> None:
    with pytest.raises(ConfigError, match="eval.unseen_clients") as err:
        _cfg(f"eval.unseen_clients={value}")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="eval.finetune_epochs"):
        _cfg("eval.unseen_clients=1", "eval.finetune_epochs=-1")


def test_a_deployment_refuses_unseen_clients_in_one_line() -> None:
    pytest.importorskip("flwr")
    from protofed.flower.deployment import deploy

    with pytest.raises(ConfigError, match="eval.unseen_clients is not supported in a deployment"):
        deploy(_cfg("eval.unseen_clients=1"), None, 1, 0.0)  # type: ignore[arg-type]


def test_records_and_summaries_without_unseen_scores_still_load() -> None:
    """Old runs (the fixture predates the typed records) load with no unseen score, and a
    record or reported round without one writes no `unseen` key: files stay as they were."""
    line = (OLD_RUN / "metrics.jsonl").read_text().splitlines()[0]
    old = json.loads(line)
    record = RoundRecord.from_json(old)
    assert record.unseen is None and "unseen" not in record.to_json()
    assert list(record.to_json()) == list(old)
    final = {k: old[k] for k in ("round", "personalization", "generalization", "global")}
    reported = ReportedRound.from_json({**final, "server": {}})
    assert reported.unseen is None and "unseen" not in reported.to_json()


def test_fine_tuning_touches_neither_the_server_nor_the_clients_nor_the_streams() -> None:
    """Scoring the unseen clients (fine-tuned 2 epochs) leaves the server state, every
    training client's state and torch's global RNG exactly as they were."""
    cfg = _cfg(
        "algorithm.name=ditto", "eval.unseen_clients=2", "eval.finetune_epochs=2", "train.rounds=2"
    )
    loop = simulate(prepare(cfg))
    try:
        loop.run_round(1)
        server = {name: clone(arrays) for name, arrays in loop.server.items()}
        states = {
            c: {name: clone(arrays) for name, arrays in s.items()}
            for c, s in loop.transport.states.items()
        }
        rng = torch.get_rng_state()
        scores = loop.evaluation.evaluate(loop.server, 1)
        assert torch.equal(torch.get_rng_state(), rng)
        assert scores.unseen is not None and scores.unseen.clients == list(loop.prepared.unseen)
        for name, arrays in server.items():
            for key, value in arrays.items():
                assert torch.equal(loop.server[name][key], value), (name, key)
        assert loop.transport.states.keys() == states.keys()
        for c, s in states.items():
            for name, arrays in s.items():
                for key, value in arrays.items():
                    assert torch.equal(loop.transport.states[c][name][key], value), (c, key)
    finally:
        loop.transport.close()


@pytest.mark.integration
def test_unseen_clients_never_train_and_fine_tuning_changes_no_training_score() -> None:
    """Over rounds of half the federation, no held-out client is ever sampled nor keeps a
    state; and the training clients' scores are the same whether the unseen ones are
    fine-tuned or not (the fine-tuning draws from streams of its own)."""
    runs = {}
    for epochs in (0, 2):
        cfg = _cfg(
            "algorithm.name=fedrep",
            "data.num_clients=8",
            "eval.unseen_clients=0.25",
            f"eval.finetune_epochs={epochs}",
            "train.rounds=5",
            "train.client_fraction=0.5",
        )
        sampled: list[int] = []
        prepared = prepare(cfg)
        loop = simulate(prepared)
        loop.run(lambda r, info, rec, into=sampled: into.extend(info.clients))
        unseen = set(prepared.unseen)
        assert len(unseen) == 2 and not unseen & set(sampled)
        assert not unseen & set(loop.transport.states)
        assert set(sampled) <= set(prepared.training)
        runs[epochs] = loop.history
    for a, b in zip(runs[0], runs[2], strict=True):
        assert a.personalization == b.personalization and a.val == b.val
        assert a.clients.client_ids == sorted(set(range(8)) - set(a.unseen.clients))
        assert a.unseen.finetune_epochs == 0 and b.unseen.finetune_epochs == 2
        assert a.unseen.personalized != b.unseen.personalized  # FedRep's head was trained


@pytest.mark.integration
def test_the_unseen_score_is_in_metrics_summary_and_report(tmp_path) -> None:
    cfg = _cfg("algorithm.name=fedavg", "eval.unseen_clients=2", "eval.finetune_epochs=1")
    cfg.train.rounds = 3
    loop = start(cfg, tmp_path / "run")
    loop.run()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert all(set(r["unseen"]) >= {"clients", "personalized", "global"} for r in records)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    for when in ("final", "selected"):
        unseen = summary[when]["unseen"]
        assert len(unseen["clients"]) == 2 and unseen["finetune_epochs"] == 1
        assert 0 <= unseen["global"]["acc"] <= 1 and unseen["personalized"]["f1_std"] is not None
    assert summary["scoring"]["eval.unseen_clients"] == {"value": 2, "default": 0}
    row = run_row(tmp_path / "run")
    assert row["unseen_f1"] == pytest.approx(
        100 * summary["selected"]["unseen"]["personalized"]["f1"]
    )
    assert row["unseen_global_acc"] == pytest.approx(
        100 * summary["selected"]["unseen"]["global"]["acc"]
    )
    assert "unseen_f1" in to_markdown([row])
    from protofed.api import load_run

    run = load_run(tmp_path / "run")
    assert run.summary.selected is not None and run.summary.selected.unseen is not None
    assert set(run.history["client"]) == set(range(6)) - set(run.summary.final.unseen.clients)
    assert run.history["unseen_f1"].notna().all()


@pytest.mark.integration
def test_fedavg_serves_unseen_users_well_above_chance(shared_data, tmp_path) -> None:
    """A small UCI-HAR slice (10 subjects, natural clients), 3 held out: FedAvg's global
    model is scored on people it never trained on, well above chance (6 classes: 17 %)."""
    path = uci_har_slice(tmp_path / "har.npz", [1, 3, 5, 6, 7, 8, 11, 14, 15, 16], every=4)
    cfg = har_slice_config(
        path,
        "model.name=mlp",
        "model.hidden=[64]",
        "algorithm.name=fedavg",
        "train.rounds=8",
        "train.momentum=0.9",
        "eval.every=8",
        "eval.unseen_clients=3",
    )
    summary = simulate(prepare(cfg)).run()
    assert summary.final is not None and summary.final.unseen is not None
    unseen = summary.final.unseen
    assert unseen.global_ is not None and unseen.global_.acc is not None
    assert unseen.global_.acc > 0.5, unseen
    assert unseen.personalized == unseen.global_  # FedAvg's client model is the global one
