"""Every command of the README runs: its fenced bash blocks and its Python example.

Each `protofed` line of a ```bash block runs as written, in a scratch folder that sees the
repository's configs, with small settings: `protofed run` gets `-s train.rounds=1`, and the
data root is the converted data sets (`PROTOFED_DATA`, the README's alternative to `protofed
data fetch`). A command that downloads (`protofed data fetch`) only has to parse: it runs with
`--help`. `make` lines are not run (they are `make test` itself), nor the venv's activation.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DATA = Path(os.environ.get("PROTOFED_TEST_DATA", ROOT.parent / "shared" / "data")).resolve()
PROTOFED = Path(sys.executable).with_name("protofed")
DOWNLOADS = (("data", "fetch"),)  # run with --help only: they reach the internet
NOT_RUN = ("make", "source")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def readme_commands() -> list[list[str]]:
    """The README's shell commands, one argv each (continuations joined, comments dropped)."""
    commands = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                commands.append(argv)
    return commands


def _small(argv: list[str]) -> list[str]:
    """The command as the test runs it."""
    assert argv[0] == "protofed", f"a README command this test does not know: {argv}"
    if tuple(argv[1:3]) in DOWNLOADS:
        return [*argv, "--help"]
    if argv[1] == "run":
        return [*argv, "-s", "train.rounds=1"]
    return argv


def _own_csv(path: Path) -> None:
    """A small table like the README's own-data example: a user column, a label, features."""
    rng = np.random.default_rng(0)
    rows = ["user,label,f0,f1,f2,f3"]
    for user in range(5):
        for i in range(60):
            label = i % 3
            x = rng.normal(label, 1.0, 4) + user * 0.1
            rows.append(f"u{user},{label}," + ",".join(f"{v:.4f}" for v in x))
    path.write_text("\n".join(rows) + "\n")


def test_the_readme_is_short_and_speaks_of_no_machine_of_ours() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 210
    assert "shared/data" not in text and "project's machines" not in text
    assert "--data-dir" in text and "PROTOFED_DATA" in text
    for target in re.findall(r"\]\(((?!https?:|#)[^)#]+)", text):  # relative links resolve
        assert (ROOT / target).exists(), target
    for target in re.findall(r'src="([^"]+)"', text):
        assert (ROOT / target).exists(), target


@pytest.mark.integration
def test_every_readme_command_runs(tmp_path: Path) -> None:
    commands = readme_commands()
    run = [argv for argv in commands if argv[0] not in NOT_RUN]
    assert any(argv[:2] == ["protofed", "run"] for argv in run)
    if not (DATA / "har" / "uci_har.npz").exists():
        pytest.skip(f"the converted data sets are not in {DATA} (set PROTOFED_TEST_DATA)")
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    _own_csv(tmp_path / "my_data.csv")
    env = {**os.environ, "PROTOFED_DATA": str(DATA), "OMP_NUM_THREADS": "1"}
    env.pop("PROTOFED_ONEDNN", None)
    for argv in run:
        small = _small(argv)
        done = subprocess.run(
            [str(PROTOFED), *small[1:]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (
            f"{shlex.join(small)}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
    assert (tmp_path / "runs" / "har" / "report.md").exists()


@pytest.mark.integration
def test_the_readme_python_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import protofed

    (tmp_path / "configs").symlink_to(ROOT / "configs")
    monkeypatch.chdir(tmp_path)
    (example,) = _blocks("python")
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    run = namespace["run"]
    assert isinstance(run, protofed.Run)
    assert 0.0 <= namespace["final"].personalization.f1 <= 1.0
    assert run.summary.rounds == 5
