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
