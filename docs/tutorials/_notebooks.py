"""Make the tutorials' notebooks: docs/tutorials/NAME.ipynb from NAME.py, executed.

`make notebooks` (all four) or `python docs/tutorials/_notebooks.py NAME ...`. The scripts
are the source: jupytext reads each into cells, nbclient runs them in a fresh kernel (in
docs/tutorials/, the folder Jupyter runs a notebook in; outputs under a temporary
PROTOFED_TUTORIAL_OUT), and the executed notebook is written beside its script with one
generated cell more, a note of the size it ran at. Outputs on stderr (the libraries' warnings
and logs: Ray's, Flower's, tqdm's) are left out of the notebook and printed here instead. The
site shows the notebooks as they are (mkdocs-jupyter, `execute: false`): `make docs` runs
nothing. tests/test_tutorials.py checks that every notebook's cells are its script's cells,
so a script edited without `make notebooks` fails the suite.

The data come from the data root, as for the scripts: `PROTOFED_DATA=DIR` or the user cache
(`protofed data fetch uci_har wisdm_features`). The temporary folders are written in outputs
as a reader would see them (`runs/tutorials/...`, `$PROTOFED_DATA`); a notebook whose outputs
still hold a machine's path, an ANSI escape or an error is not written.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# each tutorial -> the size its notebook is executed at: "full" (the script's own settings) or
# "small" (PROTOFED_TUTORIAL_SMALL=1, the test suite's settings)
SIZES = {
    "fedali_vs_fedavg_vs_local": "full",
    "own_csv": "full",
    "own_algorithm": "full",
    "flower_simulation": "full",
}
NOTE_TAG = "protofed-generated"
"""The tag of the one cell that is not the script's: the note of the size run."""
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
MACHINE = re.compile(r"/(?:work|root|home|tmp)/|[A-Za-z]:\\Users\b")


def note(name: str, size: str) -> str:
    """The generated cell: which size the outputs below come from."""
    if size == "small":
        how = (
            "the script's **small** setting (`PROTOFED_TUTORIAL_SMALL=1`, the test suite's "
            "tiny settings), so the numbers are a smoke test, not a result"
        )
    else:
        how = "the script's **full** setting (its own settings, as written)"
    return (
        f"> **The outputs on this page** are those of running this notebook at {how}, "
        f"on {os.cpu_count()} CPU cores; what the libraries wrote on stderr "
        "(warnings, logs) is left out. The source is the script `docs/tutorials/"
        f"{name}.py`; `make notebooks` executes it again into this notebook. Download: "
        f"[{name}.ipynb]({name}.ipynb).\n"
    )


def script_notebook(script: Path) -> nbformat.NotebookNode:
    """The script's cells, as jupytext reads them, with no metadata of jupytext's."""
    nb = jupytext.read(script)
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    }
    for cell in nb.cells:
        cell.metadata = {}
    return nb


def clean(text: str, replace: dict[str, str]) -> str:
    """An output's text with the temporary folders as a reader sees them, no ANSI escape."""
    for old, new in replace.items():
        text = text.replace(old, new)
    return ANSI.sub("", text)


def execute(name: str, size: str) -> nbformat.NotebookNode:
    nb = script_notebook(HERE / f"{name}.py")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "runs" / "tutorials"
        env = {
            "PROTOFED_TUTORIAL_OUT": str(out),
            "PROTOFED_TUTORIAL_SMALL": "1" if size == "small" else "0",
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "TQDM_DISABLE": "1",
            "NO_COLOR": "1",
            "TERM": "dumb",
        }
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # the kernel inherits this process's environment
        try:
            start = time.perf_counter()
            NotebookClient(
                nb,
                timeout=1800,
                kernel_name="python3",
                record_timing=False,
                resources={"metadata": {"path": str(HERE)}},
            ).execute()
            seconds = time.perf_counter() - start
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        replace = {str(out): "runs/tutorials", str(ROOT) + "/": ""}
        if os.environ.get("PROTOFED_DATA"):
            replace[str(Path(os.environ["PROTOFED_DATA"]).resolve())] = "$PROTOFED_DATA"
            replace[os.environ["PROTOFED_DATA"]] = "$PROTOFED_DATA"
        for cell in nb.cells:
            if "outputs" in cell:  # stderr: the libraries' warnings and logs (Ray's, Flower's)
                stderr = [o for o in cell.outputs if o.get("name") == "stderr"]
                for output in stderr:
                    print(f"  {name}, left out (stderr): {output.text[:300]!r}", flush=True)
                cell.outputs = [o for o in cell.outputs if o.get("name") != "stderr"]
            for output in cell.get("outputs", []):
                if "text" in output:
                    output.text = clean(output.text, replace)
                for kind, value in output.get("data", {}).items():
                    if kind.startswith("text/") and isinstance(value, str):
                        output.data[kind] = clean(value, replace)
    nb.metadata.pop("widgets", None)
    nb.cells.insert(
        1,
        nbformat.v4.new_markdown_cell(note(name, size), metadata={"tags": [NOTE_TAG]}),
    )
    for cell in nb.cells:
        cell.pop("id", None)
    nb.nbformat_minor = 4  # no cell ids: a regenerated notebook differs only where outputs do
    check(name, nb)
    print(f"{name}: {size}, {seconds:.0f} s", flush=True)
    return nb


def check(name: str, nb: nbformat.NotebookNode) -> None:
    """No machine path, ANSI escape or error in the outputs."""
    for i, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                sys.exit(f"{name}, cell {i}: {output.ename}: {output.evalue}")
            texts = [output.get("text", "")]
            texts += [v for k, v in output.get("data", {}).items() if k.startswith("text/")]
            for text in texts:
                if MACHINE.search(text) or "\x1b" in text:
                    sys.exit(f"{name}, cell {i}: a machine path or escape in\n{text[:2000]}")


def main(names: list[str]) -> None:
    for name in names or list(SIZES):
        if name not in SIZES:
            sys.exit(f"unknown tutorial {name!r}: one of {', '.join(SIZES)}")
        nb = execute(name, SIZES[name])
        nbformat.write(nb, HERE / f"{name}.ipynb")


if __name__ == "__main__":
    main(sys.argv[1:])
