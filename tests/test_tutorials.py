"""docs/tutorials/*.py run as plain Python with their small settings (PROTOFED_TUTORIAL_SMALL=1),
on the real data sets beside the repo, writing only under tmp_path; and their notebooks
(docs/tutorials/*.ipynb, the site's pages, `make notebooks`) hold the scripts' cells, executed,
with clean outputs."""

from __future__ import annotations

import json
import os
import re
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


NOTE_TAG = "protofed-generated"  # docs/tutorials/_notebooks.py: the one cell not the script's
# a machine's folder, a temporary folder, a Windows user folder; an ANSI escape
MACHINE = re.compile("|".join(f"/{d}/" for d in ("work", "root", "home", "tmp")) + r"|:\\Users\b")


def test_every_tutorial_is_tested_and_has_a_page() -> None:
    scripts = {p.stem for p in TUTORIALS.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(WRITES)
    index = (TUTORIALS / "index.md").read_text()
    nav = (ROOT / "mkdocs.yml").read_text()
    for name in scripts:
        assert (TUTORIALS / f"{name}.ipynb").is_file(), f"{name}.ipynb: run `make notebooks`"
        assert not (TUTORIALS / f"{name}.md").exists(), f"{name}.md would hide the notebook"
        assert f"({name}.ipynb)" in index
        assert f"tutorials/{name}.ipynb" in nav


def _source(cell: dict) -> str:
    source = cell["source"]
    return "".join(source) if isinstance(source, list) else source


@pytest.mark.parametrize("name", list(WRITES))
def test_notebook_is_its_script_executed(name: str) -> None:
    """The notebook's cells are the script's (jupytext's reading of it) plus one generated
    note, every code cell ran without an error, and no output holds a machine's path, an
    ANSI escape, stderr or a long stream: else `make notebooks` has to run again."""
    jupytext = pytest.importorskip("jupytext")
    script = jupytext.read(TUTORIALS / f"{name}.py")
    notebook = json.loads((TUTORIALS / f"{name}.ipynb").read_text(encoding="utf-8"))
    cells = notebook["cells"]
    notes = [c for c in cells if NOTE_TAG in c.get("metadata", {}).get("tags", [])]
    assert len(notes) == 1 and cells[1] is notes[0], "one generated note, the second cell"
    assert "**small** setting" in _source(notes[0]) or "**full** setting" in _source(notes[0])
    ours = [c for c in cells if c is not notes[0]]
    expected = [(c.cell_type, c.source) for c in script.cells]
    found = [(c["cell_type"], _source(c)) for c in ours]
    assert found == expected, f"{name}.ipynb is not {name}.py: run `make notebooks`"
    code = [c for c in ours if c["cell_type"] == "code"]
    assert all(c["execution_count"] for c in code), "a code cell that never ran"
    for i, cell in enumerate(code):
        for output in cell["outputs"]:
            assert output["output_type"] != "error", (i, output.get("ename"))
            assert output.get("name") != "stderr", (i, "stderr is left out of the notebooks")
            texts = [_source({"source": output.get("text", "")})]
            texts += [
                _source({"source": v})
                for k, v in output.get("data", {}).items()
                if k.startswith("text/")
            ]
            for text in texts:
                assert not MACHINE.search(text), (i, MACHINE.search(text))
                assert "\x1b" not in text, (i, "an ANSI escape")
                assert text.count("\n") <= 60, (i, "a long output")


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
