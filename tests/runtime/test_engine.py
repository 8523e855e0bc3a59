"""The runtime's contracts: determinism, resume, sampling, byte counting, summary shape."""

from __future__ import annotations

import json
import os

import pytest
import torch

from conftest import uci_har_slice
from protofed.algorithms import ALGORITHMS
from protofed.config import load_config
from protofed.core.results import Summary
from protofed.core.seeding import sample_clients
from protofed.runtime import prepare, resume, simulate, start
from protofed.runtime.fingerprint import states_fault

BASE = [
    "data.name=digits",
    "data.partition=dirichlet",
    "data.num_clients=6",
    "data.alpha=1.0",
    "model.name=mlp",
    "model.hidden=[32]",
    "train.rounds=4",
    "train.batch_size=32",
    "train.lr=0.1",
    "eval.every=1",
]


def _cfg(*extra: str):
    return load_config(None, [*BASE, *extra])


def _numbers(summary: Summary) -> dict:
    return {k: v for k, v in summary.to_json().items() if k != "time"}


@pytest.mark.integration
def test_the_round_record_names_the_generalization_sample(tmp_path):
    cfg = _cfg("train.rounds=1", "train.workers=1", "eval.generalization_samples=50")
    start(cfg, tmp_path / "run").run()
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert record["samples"]["generalization"] == 50 and record["samples"]["test"] > 50


def test_checkpoints_from_before_generalization_samples_still_resume():
    """Unset, the key is left out of the fingerprint, as it was before it existed."""
    from protofed.runtime.fingerprint import fingerprint

    assert "generalization_samples" not in fingerprint(prepare(_cfg()))["config"]
    assert (
        '"eval.generalization_samples": 50'
        in fingerprint(prepare(_cfg("eval.generalization_samples=50")))["config"]
    )


def test_summary_has_the_contracted_keys(tmp_path):
    summary = start(_cfg(), tmp_path / "run").run()
    assert summary.rounds == 4
    for reported in (summary.final, summary.selected):
        assert reported is not None
        for scores in (reported.personalization, reported.generalization):
            assert scores is not None and set(scores.to_json()) >= {"acc", "f1", "f1_std"}
        assert reported.global_ is not None
        assert set(reported.global_.to_json()) >= {"acc", "f1", "f1_std"}
    assert isinstance(summary.selected.round, int)
    assert summary.comm.up_bytes > 0 and summary.comm.down_bytes > 0
    assert summary.time.total_s > 0
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["final"] == summary.final.to_json()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [1, 2, 3, 4]
    assert len(json.loads(lines[0])["clients"]["pers_f1"]) == 6
    for name in ("config.yaml", "partition.json", "partition.txt", "checkpoint.pt"):
        assert (tmp_path / "run" / name).is_file()


@pytest.mark.integration
def test_same_config_and_seed_give_identical_numbers():
    a = simulate(prepare(_cfg("train.client_fraction=0.5"))).run()
    b = simulate(prepare(_cfg("train.client_fraction=0.5"))).run()
    assert _numbers(a) == _numbers(b)
    c = simulate(prepare(_cfg("train.client_fraction=0.5", "seed=1"))).run()
    assert _numbers(a) != _numbers(c)


@pytest.mark.integration
@pytest.mark.parametrize("client_model", ["received", "trained"])
def test_killed_run_resumes_to_the_same_summary(tmp_path, client_model):
    """Under `trained` the kept models are checkpointed: clients not sampled after the kill
    are scored with the models they trained before it."""
    cfg = _cfg(
        "train.client_fraction=0.5",
        "train.rounds=5",
        "eval.every=2",
        f"eval.client_model={client_model}",
    )
    whole = start(cfg, tmp_path / "whole").run()

    class Killed(Exception):
        pass

    def kill_after_round_3(r, info, record):
        if r == 3:
            raise Killed

    sim = start(cfg, tmp_path / "killed")
    with pytest.raises(Killed):
        sim.run(on_round=kill_after_round_3)
    # a line for a round past the checkpoint, as a kill between two writes could leave
    with open(tmp_path / "killed" / "metrics.jsonl", "a") as f:
        f.write('{"round": 4, "partial')
    resumed = resume(tmp_path / "killed").run()
    assert _numbers(resumed) == _numbers(whole)
    rounds = [
        json.loads(x)["round"]
        for x in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
    ]
    assert rounds == [2, 4, 5]


def test_sampling_is_a_fixed_stream_per_round():
    picks = [sample_clients(7, r, 100, 10) for r in range(1, 6)]
    assert picks == [sample_clients(7, r, 100, 10) for r in range(1, 6)]
    assert all(len(set(p)) == 10 and p == sorted(p) for p in picks)
    assert len({tuple(p) for p in picks}) == 5
    assert sample_clients(7, 1, 5, 10) == [0, 1, 2, 3, 4]


def test_bytes_counted_from_the_real_messages():
    sim = simulate(prepare(_cfg("train.rounds=1", "train.clients_per_round=3")))
    sim.run()
    model_bytes = sum(
        t.numel() * t.element_size() for t in sim.prepared.model.state_dict().values()
    )
    assert sim.progress.down_bytes == 3 * model_bytes
    assert sim.progress.up_bytes == 3 * model_bytes


def test_local_sends_nothing_and_keeps_one_model_per_trained_client():
    sim = simulate(prepare(_cfg("algorithm.name=local", "train.rounds=2")))
    summary = sim.run()
    assert summary.comm.up_bytes == 0 and summary.comm.down_bytes == 0
    assert summary.final is not None and summary.final.global_ is None
    assert len(sim.transport.states) == 6


def test_fedavg_keeps_no_per_client_state():
    sim = simulate(prepare(_cfg("train.rounds=2")))
    sim.run()
    assert sim.transport.states == {}


def test_threads_setting_is_applied():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)  # not what either run asks for: a no-op cannot pass
        prepare(_cfg("train.threads=1"))
        assert torch.get_num_threads() == 1
        prepare(_cfg("train.threads=2"))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("algorithm", "client_model"),
    [
        ("fedavg", "received"),
        ("local", "received"),
        ("fedrep", "received"),
        ("fedavg", "trained"),
        ("ditto", "received"),
    ],
)
def test_worker_processes_give_the_serial_numbers(monkeypatch, algorithm, client_model):
    """Training and scoring in workers: the serial numbers. Every distinct client model is
    scored in a worker, but models that share a body (FedRep's), scored here on its
    embeddings."""
    from protofed.runtime import scoring

    in_workers: list[int] = []
    real = scoring.predict_in

    def counting(pool):
        many = real(pool)
        return lambda jobs: in_workers.append(len(jobs)) or many(jobs)

    monkeypatch.setattr(scoring, "predict_in", counting)
    settings = (
        f"algorithm.name={algorithm}",
        f"eval.client_model={client_model}",
        "train.threads=1",
        "train.rounds=2",
        "train.client_fraction=0.5",
    )
    serial = simulate(prepare(_cfg(*settings))).run()
    assert not in_workers
    parallel = simulate(prepare(_cfg(*settings, "train.workers=2"))).run()
    assert _numbers(serial) == _numbers(parallel)
    assert (sum(in_workers) > 0) == (algorithm != "fedrep"), in_workers


def test_one_model_is_scored_on_every_worker_in_whole_batches(monkeypatch):
    """FedAvg's single model: its test union is cut into whole batches, one piece per worker,
    and the scores are the serial ones to the last digit (the same batches)."""
    from protofed.runtime import scoring

    pieces: list[list] = []
    real = scoring.predict_in

    def recording(pool):
        many = real(pool)
        return lambda jobs: pieces.append([specs for _, specs in jobs]) or many(jobs)

    monkeypatch.setattr(scoring, "predict_in", recording)
    settings = ("train.threads=1", "train.rounds=2", "eval.batch_size=40")
    serial = simulate(prepare(_cfg(*settings))).run()
    parallel = simulate(prepare(_cfg(*settings, "train.workers=2"))).run()
    assert _numbers(serial) == _numbers(parallel)
    assert pieces  # every round's evaluation went to the workers
    for call in pieces:
        assert all(len(specs) == 1 for specs in call)  # a task: one piece of one spec
        by_split: dict[str, list[tuple[int, int]]] = {}
        for ((split, lo, hi),) in call:
            by_split.setdefault(split, []).append((lo, hi))
        test = by_split["test"]
        assert len(test) == 2 and test[0][0] == 0 and test[0][1] == test[1][0]
        assert test[0][1] % 40 == 0 and test[1][1] > test[1][0]


@pytest.mark.integration
def test_the_default_engine_trains_in_workers_with_the_serial_numbers(monkeypatch):
    """Unset train.workers on a 3-core affinity: three workers, the numbers of serial."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    extra = ("train.rounds=2", "algorithm.name=ditto")
    sim = simulate(prepare(_cfg(*extra)))
    assert sim.prepared.cfg.train.workers is None and sim.transport.workers == 3
    parallel = sim.run()
    serial = simulate(prepare(_cfg(*extra, "train.workers=1", "train.threads=1")))
    assert serial.transport.workers == 1 and serial.transport.pool is None
    assert _numbers(serial.run()) == _numbers(parallel)


@pytest.mark.integration
def test_a_thousand_clients_do_not_hold_a_thousand_models():
    """Replies are aggregated as a stream and FedAvg keeps no per-client state."""
    import psutil

    cfg = load_config(
        None,
        [
            "data.name=synthetic",
            "data.partition=iid",
            "data.num_clients=1000",
            "model.name=mlp",
            "model.hidden=[200,200]",
            "train.rounds=1",
            "train.workers=1",  # this process's memory is what is measured
            "eval.generalization=false",
        ],
    )
    sim = simulate(prepare(cfg))
    model_bytes = sum(
        t.numel() * t.element_size() for t in sim.prepared.model.state_dict().values()
    )
    rss = psutil.Process().memory_info().rss
    sim.run()
    grown = psutil.Process().memory_info().rss - rss
    assert sim.transport.states == {} and sim.progress.client_updates == 1000
    assert grown < 0.25 * 1000 * model_bytes, f"RSS grew {grown / 2**20:.0f} MiB"


def test_without_validation_data_files_stay_strict_json(tmp_path):
    def no_constants(name):
        raise ValueError(f"non-JSON constant {name}")

    summary = start(_cfg("data.split=[0.8,0.0,0.2]", "train.rounds=2"), tmp_path / "r").run()
    assert summary.selected is not None
    assert summary.selected.round == 2  # no validation data: the last round
    for name in ("summary.json", "metrics.jsonl"):
        for line in (
            (tmp_path / "r" / name).read_text().splitlines()
            if name.endswith("l")
            else [(tmp_path / "r" / name).read_text()]
        ):
            json.loads(line, parse_constant=no_constants)


@pytest.mark.integration
def test_the_loop_is_composed_and_checkpoints_where_it_owns_the_states(tmp_path):
    from protofed.runtime import InProcessTransport, RoundLoop, ServerSideEvaluation

    prepared = prepare(_cfg("train.rounds=2"))
    transport = InProcessTransport(prepared)
    loop = RoundLoop(prepared, transport, ServerSideEvaluation(prepared, transport))
    assert loop.checkpoints and loop.run().engine == "builtin"

    other = InProcessTransport(prepared)
    other.states = None  # as a transport whose client states live elsewhere (Flower's)
    loop = RoundLoop(prepared, other, ServerSideEvaluation(prepared, other))
    assert not loop.checkpoints


def test_server_metrics_reach_the_metrics_file_and_the_summary(tmp_path):
    from protofed.algorithms.base import AggregateResult, Algorithm, FitResult
    from protofed.algorithms.common.aggregation import weighted_mean

    class Counting(Algorithm):  # FedAvg that reports how many replies it averaged
        name = "counting"
        summary = "test"

        def fit(self, client, message, state):
            client.load(message["model"])
            metrics = client.train_model()
            return FitResult({"model": client.weights()}, metrics)

        def aggregate(self, server, replies, server_round):
            mean, seen = weighted_mean(replies)
            return AggregateResult(mean, {"replies": float(len(seen)), "round": server_round})

    prepared = prepare(_cfg("train.rounds=2", "train.clients_per_round=4"))
    prepared.algorithm = Counting(prepared.algorithm.params, prepared.algorithm.setting)
    from protofed.runs import RunDir

    run = RunDir.create(tmp_path / "r", {}, {}, "")
    summary = simulate(prepared, run).run()
    assert summary.final is not None
    assert summary.final.server == {"replies": 4.0, "round": 2.0}
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [line["server"]["round"] for line in lines] == [1.0, 2.0]


def test_best_test_reports_the_global_models_own_best_round():
    sim = simulate(prepare(_cfg("eval.selection=best_test", "train.client_fraction=0.5")))
    summary = sim.run()
    best = max(sim.history, key=lambda h: h.global_.acc)
    chosen = summary.selected
    assert chosen is not None
    assert chosen.round == max(sim.history, key=lambda h: h.personalization.acc).round
    assert chosen.global_round == best.round != chosen.round  # here they differ
    assert chosen.global_ == best.global_
    by_val = simulate(prepare(_cfg("train.rounds=2"))).run().selected
    assert by_val is not None
    assert by_val.global_round == by_val.round  # other rules: the selected round's


# what `check_states` relies on, for every algorithm: starting records kept with their names,
# tensors named like a model weight in its shape (a model of the kind it needs where it does)
NEEDS = {
    "fedali": [
        "data.name=arrays",
        "data.path={har}",
        "model.name=hart",
        "model.alp.enabled=true",
        "model.alp.prototypes=[8,8,4,4,4,4]",
    ],
    "fedbn": ["model.name=cnnbn"],
    "fedhome": ["algorithm.finetune_rounds=1", "train.rounds=3"],
}


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithms_checkpoint_passes_the_resume_check(name, tmp_path, request):
    if name == "fedali":  # the only one on real windows: the others need no shared data
        request.getfixturevalue("shared_data")
        har = uci_har_slice(tmp_path / "har3.npz", [1, 3, 5], every=20)
    else:
        har = None
    cfg = load_config(
        None,
        [
            "data.name=digits",
            "data.num_clients=3",
            "model.name=mlp",
            "model.hidden=[16]",
            "train.rounds=2",
            "train.workers=1",
            "eval.every=2",
            "eval.client_model=trained",
            f"algorithm.name={name}",
            *(o.format(har=har) for o in NEEDS.get(name, [])),
        ],
    )
    loop = start(cfg, tmp_path / "run")
    initial = loop.algorithm.init_server()
    loop.run()
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert states_fault(ckpt, initial, loop.algorithm.setting.init_model) is None


@pytest.mark.integration
def test_an_algorithm_that_breaks_the_checkpoint_contract_fails_in_its_first_round(tmp_path):
    """Not at a resume hours later: a server record it starts with and then drops."""
    import protofed
    from protofed.algorithms.fedavg import FedAvg

    @protofed.register_algorithm
    class DropsARecord(FedAvg):
        name = "drops_a_record"

        def init_server(self):
            return {**super().init_server(), "extra": {"x": torch.zeros(1)}}

    try:
        loop = start(_cfg("algorithm.name=drops_a_record", "train.workers=1"), tmp_path / "r")
        with pytest.raises(TypeError, match="drops_a_record: .* server record 'extra' is missing"):
            loop.run()
    finally:
        ALGORITHMS.pop("drops_a_record")
