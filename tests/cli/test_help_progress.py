"""Issue 57 item 6: help text wrapped on words, and progress lines without a terminal."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from protofed.cli import app

runner = CliRunner()
COMMANDS = [
    ["run"],
    ["pretrain"],
    ["list"],
    ["info"],
    ["report"],
    ["sweep"],
    ["partition"],
    ["embed"],
    ["data"],
    ["data", "fetch"],
    ["flower"],
]


@pytest.mark.parametrize("width", [60, 80, 200])
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_prose_wraps_on_words_at_the_terminal_width(command: list[str], width: int) -> None:
    """Every line of a command's description is filled before it breaks: the next line's first
    word would not have fit (no break where the docstring's source line ended)."""
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    prose = [
        line.strip()
        for line in result.output.splitlines()
        if not line.lstrip().startswith(("│", "╭", "╰", "Usage:"))
    ]
    assert any(prose), result.output
    for line, after in zip(prose, prose[1:], strict=False):
        if line and after:  # two lines of one paragraph
            assert len(line) + 1 + len(after.split()[0]) > width - 2, (line, after)


@pytest.mark.integration
def test_a_run_without_a_terminal_prints_a_line_from_round_one(tmp_path) -> None:
    """stdout and stderr pipes (a log file, a scheduler): round 1 gets a plain line though it
    is not evaluated, the evaluated rounds their lines with scores."""
    import os
    import subprocess
    import sys

    out = tmp_path / "run"
    args = ["run", "--out", str(out), "-s", "data.num_clients=4", "-s", "model.name=mlp"]
    args += ["-s", "model.hidden=[16]", "-s", "train.rounds=4", "-s", "eval.every=3"]
    env = {k: v for k, v in os.environ.items() if k != "PROTOFED_PROGRESS"}
    done = subprocess.run(
        [sys.executable, "-m", "protofed", *args], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("round ")]
    assert lines[0].startswith("round 1/4  loss ") and "F1" not in lines[0], lines
    assert "s/round  ETA " in lines[0]
    assert lines[1].startswith("round 3/4  loss ") and "pers F1" in lines[1], lines
    assert not any(line.startswith("round 2/4") for line in lines), lines  # under 10 s


def test_unevaluated_rounds_get_a_line_at_most_every_interval() -> None:
    """After round 1, a round not evaluated gets a line only once LINE_EVERY_S passed since
    the last line; an evaluated round's line (the tracking's) counts as the last line."""
    import io
    from types import SimpleNamespace

    from protofed.cli.run import RoundsDisplay

    display = RoundsDisplay(quiet=True)
    display.lines = io.StringIO()
    clock = SimpleNamespace(
        rounds=0, last=0.0, per_round=2.0, eta_s=lambda r, total: 2.0 * (total - r)
    )
    tracking = SimpleNamespace(clock=clock, loss=0.5)
    display.started = SimpleNamespace(tracking=tracking, rounds=100)  # type: ignore[assignment]

    def round_ends(server_round: int, at: float, evaluated: bool = False) -> None:
        clock.rounds, clock.last = clock.rounds + 1, at
        display.update(server_round, None, object() if evaluated else None)

    round_ends(1, 2.0)  # the first: a line
    round_ends(2, 4.0)
    round_ends(3, 12.5)  # 10.5 s after round 1's line: a line
    round_ends(4, 14.0, evaluated=True)  # the tracking's line
    round_ends(5, 20.0)  # 6 s after it: none
    printed = display.lines.getvalue().splitlines()
    assert [line.split("  ")[0] for line in printed] == ["round 1/100", "round 3/100"]
    assert printed[0] == "round 1/100  loss 0.5000  2.0 s/round  ETA 3m18s"


@pytest.mark.integration
def test_the_summary_names_a_scoring_protocol_away_from_the_default(tmp_path) -> None:
    """summary.json's `scoring` and the printed summary's line name the eval.* keys that
    change how the scores are computed; a run at the defaults has neither."""
    import json

    small = ["-s", "data.num_clients=4", "-s", "model.name=mlp", "-s", "model.hidden=[16]"]
    small += ["-s", "train.rounds=2", "-q"]
    out = tmp_path / "union"
    protocol = ["-s", "eval.f1_labels=union", "-s", "eval.selection=best_test"]
    result = runner.invoke(app, ["run", "--out", str(out), *small, *protocol])
    assert result.exit_code == 0, result.output
    scoring = json.loads((out / "summary.json").read_text())["scoring"]
    assert scoring == {
        "eval.selection": {"value": "best_test", "default": "val"},
        "eval.f1_labels": {"value": "union", "default": "true"},
    }
    printed = " ".join(result.stdout.split())  # as wrapped at the terminal's width
    line = "scoring: eval.selection=best_test (default val), eval.f1_labels=union (default true)"
    assert line in printed, result.stdout
    from protofed import Run
    from protofed.core.results import Summary

    assert Run(out).summary.scoring == scoring  # read back as written
    written = json.loads((out / "summary.json").read_text())
    assert Summary.from_json(written).to_json() == written

    plain = tmp_path / "default"
    result = runner.invoke(app, ["run", "--out", str(plain), *small])
    assert result.exit_code == 0, result.output
    assert "scoring" not in json.loads((plain / "summary.json").read_text())
    assert "scoring:" not in result.stdout
