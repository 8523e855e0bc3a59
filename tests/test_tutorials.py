"""docs/tutorials/*.py run as plain Python with their small settings (PROTOFED_TUTORIAL_SMALL=1),
on the real data sets beside the repo, writing only under tmp_path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "docs" / "tutorials"

# each script -> what it says it writes, under $PROTOFED_TUTORIAL_OUT/<script name>/
WRITES = {
    "fedali_vs_fedavg_vs_local": [
        "report.md",
        "report.csv",
        "figure-pers_gen.png",
        "figure-pers_gen.pdf",
        "runs/fedali/summary.json",
        "runs/fedavg/summary.json",
        "runs/local/summary.json",
    ],
    "own_csv": ["my_wisdm.csv", "run/summary.json", "predictions.txt"],
    "own_algorithm": ["fedavg/summary.json", "server_momentum/summary.json", "comparison.txt"],
    "flower_simulation": ["builtin/summary.json", "flower/summary.json", "comparison.txt"],
}


def test_every_tutorial_is_tested_and_has_a_page() -> None:
    scripts = {p.stem for p in TUTORIALS.glob("*.py")}
    assert scripts == set(WRITES)
    index = (TUTORIALS / "index.md").read_text()
    for name in scripts:
        page = TUTORIALS / f"{name}.md"
        assert f'--8<-- "tutorials/{name}.py"' in page.read_text(), page
        assert f"({name}.md)" in index


@pytest.mark.integration
@pytest.mark.parametrize("name", list(WRITES))
def test_tutorial_runs_small(name: str, shared_data: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PROTOFED_TUTORIAL_SMALL": "1",
        "PROTOFED_TUTORIAL_OUT": str(tmp_path / "out"),
        "PROTOFED_DATA": str(shared_data),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "MPLBACKEND": "Agg",
    }
    script = TUTORIALS / f"{name}.py"
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,  # nothing may land in the repository
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "out" / name
    for relative in WRITES[name]:
        assert (out / relative).is_file() and (out / relative).stat().st_size > 0, relative
    if name == "fedali_vs_fedavg_vs_local":
        table = (out / "report.md").read_text()
        assert all(f"algorithm.name={a}" in table for a in ("fedali", "fedavg", "local"))
    assert not (tmp_path / "runs").exists()
