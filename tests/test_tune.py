"""`protofed tune`: parameters chosen on validation scores only, then run with seeds."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from protofed.api import load_run, resolve_config
from protofed.cli import app
from protofed.core.results import RoundRecord
from protofed.errors import ConfigError
from protofed.tune import parse_space, tune

runner = CliRunner()
SMALL = {
    "data.name": "digits",
    "data.num_clients": 4,
    "model.hidden": [16],
    "train.rounds": 2,
    "train.threads": 1,
    "train.workers": 1,
    "eval.generalization": False,
}


def _best_val_f1(path) -> float:
    run = load_run(path)
    return max(RoundRecord.from_json(x).val.f1 for x in run.dir.history())


@pytest.mark.integration  # 6 small runs
def test_the_choice_is_the_best_validation_score_and_seeds_report_test(tmp_path) -> None:
    space = {"train.lr": [0.001, 0.1], "train.momentum": [0.0, 0.9]}
    result = tune(resolve_config(None, **SMALL), space, tmp_path / "t", seeds=2)
    assert len(result.trials) == 4  # the whole grid
    scores = {t.number: _best_val_f1(tmp_path / "t" / f"trial_{t.number}") for t in result.trials}
    assert {t.number: t.val_f1 for t in result.trials} == scores
    best = max(result.trials, key=lambda t: (t.val_f1, -t.number))
    assert result.chosen == best.params
    # the seeds: the chosen setting, seeds 0 and 1, scored at the validation-selected round
    for seed, f1 in zip(result.seeds, result.test_f1, strict=True):
        run = load_run(tmp_path / "t" / f"seed_{seed}")
        assert run.config.seed == seed and run.config.train.lr == result.chosen["train.lr"]
        assert run.summary.selected is not None and run.summary.selected.rule == "val"
        assert run.summary.selected.personalization.f1 == f1
    written = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert written["chosen"] == result.chosen and len(written["trials"]) == 4
    assert written["test_mean"] == pytest.approx(sum(result.test_f1) / 2)


@pytest.mark.parametrize(
    ("items", "says"),
    [
        ([], "--param: give at least one"),
        (["train.lr"], "expected KEY=V1,V2"),
        (["model.hidden=[4]"], "not a number, word or boolean"),
        (["train.lr=0.1", "train.lr=0.2"], "given twice"),
    ],
)
def test_a_bad_space_is_one_line(items, says) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_space(items)


def test_the_cli_refuses_a_bad_key_before_running_anything(tmp_path) -> None:
    args = ["tune", "configs/quickstart.yaml", "--out", str(tmp_path / "t")]
    result = runner.invoke(app, [*args, "-p", "train.lrr=0.1,0.2"])
    assert result.exit_code == 2 and "train.lrr" in result.output
    assert result.output.strip().count("\n") == 0
    assert not (tmp_path / "t").exists()  # nothing run, nothing written
