"""When a run writes its checkpoint (`train.checkpoint_every`, runtime/loop.py
`checkpoint_due`): every N rounds, or by time (auto, the default), and a resume from
wherever the last one was gives the uninterrupted numbers."""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch

from protofed.config import load_config
from protofed.core.results import Summary
from protofed.runtime import loop, resume, start
from protofed.runtime.loop import CHECKPOINT_SHARE, checkpoint_due

SMALL = [
    "data.name=digits",
    "data.num_clients=6",
    "model.name=mlp",
    "model.hidden=[16]",
    "algorithm.name=fedper",  # client states: a resume must restore them exactly
    "train.rounds=4",
    "train.lr=0.1",
    "train.client_fraction=0.5",
    "train.threads=1",
]


def test_auto_writes_the_first_and_the_last_round_and_waits_49_writes_between():
    due = partial(checkpoint_due, "auto", rounds=100)
    assert due(1, since_s=0.01, last_write_s=None)  # the session's first measures the cost
    assert not due(2, since_s=48.9, last_write_s=1.0)
    assert due(3, since_s=49.0, last_write_s=1.0)
    assert due(100, since_s=0.0, last_write_s=1.0)  # the last round, whatever it costs
    assert due(4, since_s=0.5, last_write_s=0.01)  # a cheap write: every round of 0.5 s


@pytest.mark.parametrize(
    ("round_s", "write_s"), [(1.0, 0.5), (0.3, 2.0), (360.0, 3.6), (0.05, 0.0002)]
)
def test_auto_keeps_the_share_at_two_percent_and_bounds_the_work_a_kill_loses(round_s, write_s):
    """Fake costs, 2,000 rounds: each write after the first is at most 2 % of the time since
    the one before ended plus itself; at every round's end the work since the last write is
    under 49 writes plus one round (what a kill there loses, with the round in progress)."""
    rounds, now, last_end, last_cost, writes = 2000, 0.0, 0.0, None, []
    for r in range(1, rounds + 1):
        now += round_s
        lost = now - last_end
        if checkpoint_due("auto", r, rounds, lost, last_cost):
            writes.append((lost, write_s))
            now += write_s
            last_end, last_cost = now, write_s
        else:
            assert last_cost is not None
            assert lost < last_cost * (1 - CHECKPOINT_SHARE) / CHECKPOINT_SHARE + round_s
    shares = [cost / (since + cost) for since, cost in writes[1:-1]]
    assert shares and max(shares) <= CHECKPOINT_SHARE + 1e-12
    total_share = sum(cost for _, cost in writes) / now
    assert total_share <= CHECKPOINT_SHARE + 2 * write_s / now  # the first and last extra


def test_every_n_rounds_keeps_its_meaning():
    assert [r for r in range(1, 11) if checkpoint_due(3, r, 10, 0.0, 1.0)] == [3, 6, 9, 10]
    assert [r for r in range(1, 5) if checkpoint_due(1, r, 4, 0.0, 100.0)] == [1, 2, 3, 4]


def test_the_default_is_auto_and_an_old_number_still_reads():
    assert load_config(None, []).train.checkpoint_every == "auto"
    assert load_config(None, ["train.checkpoint_every=5"]).train.checkpoint_every == 5


def _numbers(summary: Summary) -> dict:
    return {k: v for k, v in summary.to_json().items() if k != "time"}


@pytest.mark.integration
def test_a_run_killed_rounds_after_its_last_checkpoint_resumes_to_the_uninterrupted_numbers(
    tmp_path, monkeypatch
):
    """With auto's share made tiny, only round 1 (the first) and round 4 (the last) are
    written: killed after round 3, the resume redoes rounds 2 and 3 from round 1's state."""
    cfg = load_config(None, SMALL)
    whole = start(cfg, tmp_path / "whole").run()
    assert whole.time.checkpoint_s > 0

    class Killed(Exception):
        pass

    def kill_after_round_3(r, info, record):
        if r == 3:
            raise Killed

    monkeypatch.setattr(loop, "CHECKPOINT_SHARE", 1e-12)
    with pytest.raises(Killed):
        start(cfg, tmp_path / "killed").run(on_round=kill_after_round_3)
    ckpt = torch.load(tmp_path / "killed" / "checkpoint.pt", weights_only=True)
    assert ckpt["progress"]["server_round"] == 1
    resumed = resume(tmp_path / "killed").run()
    assert _numbers(resumed) == _numbers(whole)
    lines = (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [1, 2, 3, 4]


def test_an_interrupt_says_from_which_round_a_resume_starts(tmp_path):
    """With a checkpoint every 3rd round, Ctrl-C after round 2 of a resumed run that was
    checkpointed after round 3 leaves round 3 as the resume point: the message says so."""
    import protofed
    from protofed.api import RunInterrupted, interrupted_after

    assert interrupted_after(4, 4) == "interrupted after round 4"
    assert interrupted_after(4, 0) == "interrupted after round 4 (no round checkpointed yet)"
    assert interrupted_after(5, 3) == "interrupted after round 5 (checkpointed after round 3)"

    def stop_after(last: int, server_round: int, info: object, record: object) -> None:
        if server_round == last:
            raise KeyboardInterrupt

    import yaml

    settings = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in SMALL)}
    settings.update({"train.rounds": 6, "train.checkpoint_every": 3})
    out = tmp_path / "run"
    with pytest.raises(RunInterrupted) as first:
        protofed.run(None, out, on_round=partial(stop_after, 2), **settings)
    assert (first.value.server_round, first.value.resumes_from) == (2, 0)
    with pytest.raises(RunInterrupted) as second:
        protofed.resume(out, on_round=partial(stop_after, 4))
    assert (second.value.server_round, second.value.resumes_from) == (4, 3)
    assert "(checkpointed after round 3)" in str(second.value)
