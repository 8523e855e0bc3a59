"""A round's time, split honestly (runtime/loop.py `run_round`, core/results.py `RoundTime`):
waiting for the replies is training, checking them is the guard's, and only the algorithm's
own work is aggregation, although the replies are a lazy stream that `aggregate` consumes."""

from __future__ import annotations

import json
import time

import pytest

from protofed.config import load_config
from protofed.runtime import loop as round_loop
from protofed.runtime import nonfinite as guard
from protofed.runtime import prepare, simulate, start

DIGITS = [
    "data.name=digits",
    "data.num_clients=4",
    "model.name=mlp",
    "model.hidden=[16]",
    "train.rounds=2",
    "train.lr=0.1",
    "train.workers=1",
    "train.threads=1",
]


@pytest.mark.integration
def test_each_phase_gets_its_own_time_however_aggregate_consumes_the_replies(monkeypatch):
    """Slowed by known amounts: each reply 0.1 s later (training), each check 0.05 s (the
    guard: four replies, checked where they were trained, and the aggregate), the
    aggregation 0.3 s before it reads a reply."""
    loop = simulate(prepare(load_config(None, DIGITS)))
    fit, aggregate, nonfinite = loop.transport.fit, loop.algorithm.aggregate, round_loop.nonfinite

    def slow_fit(server, server_round, clients):
        for delivery in fit(server, server_round, clients):
            time.sleep(0.1)
            yield delivery

    def slow_aggregate(server, replies, server_round):
        time.sleep(0.3)
        return aggregate(server, replies, server_round)

    def slow_check(records):
        time.sleep(0.05)
        return nonfinite(records)

    monkeypatch.setattr(loop.transport, "fit", slow_fit)
    monkeypatch.setattr(loop.algorithm, "aggregate", slow_aggregate)
    monkeypatch.setattr(round_loop, "nonfinite", slow_check)
    monkeypatch.setattr(guard, "nonfinite", slow_check)
    t0 = time.perf_counter()
    info = loop.run_round(1)
    wall = time.perf_counter() - t0
    assert info.train_s >= 0.4
    assert 0.25 <= info.guard_s < 0.25 + 0.15
    assert 0.3 <= info.aggregate_s < 0.3 + 0.15
    assert abs(info.train_s + info.guard_s + info.aggregate_s - wall) < 0.05
    assert loop.progress.guard_s == info.guard_s


def test_the_split_reaches_metrics_jsonl_and_the_summary(tmp_path):
    summary = start(load_config(None, DIGITS), tmp_path / "run").run()
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        time_ = json.loads(line)["time"]
        assert list(time_) == ["train_s", "guard_s", "aggregate_s", "eval_s"]
        assert all(v > 0 for v in time_.values())
    written = json.loads((tmp_path / "run" / "summary.json").read_text())["time"]
    assert written["guard_s"] == summary.time.guard_s > 0
    assert written["checkpoint_s"] == summary.time.checkpoint_s > 0
    phases = ("train_s", "guard_s", "aggregate_s", "eval_s", "checkpoint_s")
    assert sum(written[k] for k in phases) <= written["total_s"]
