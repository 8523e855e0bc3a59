"""No committed file carries a path of the machine that made it: a legend, a table label or a
figure's metadata that reads a run folder of the machine that drew it says nothing to a reader
and leaks a folder layout. Scanned: every committed text file (md, yaml, json, csv, svg, txt), the text
drawn in every committed PDF (matplotlib writes a legend's text into the PDF's content
streams) and the text chunks of every committed PNG.

The rule: a path under a machine's work, root or home folder (`MACHINE_FOLDERS`) or a Windows
user folder never appears. `/tmp/`
never appears in a file a program wrote (csv, json, svg, the figures' folder, PDF, PNG); in a
page a person wrote (md, yaml, txt) it may follow a command's option (`--out /tmp/x`,
`-o /tmp/x`): a scratch folder a reader is told to use, not a trace of a machine.
"""

from __future__ import annotations

import re
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT = (".md", ".yaml", ".yml", ".json", ".csv", ".svg", ".txt")
WRITTEN = (".json", ".csv", ".svg")  # files a program writes: no /tmp/ either
MACHINE_FOLDERS = ("work", "root", "home")
"""Top-level folders of the machines this project runs on: never in a committed file (the
patterns are built from the names, so this file does not name such a path itself)."""
ALWAYS = re.compile(
    "|".join(f"/{folder}/" for folder in MACHINE_FOLDERS)
    + r"|\b[A-Za-z]:\\(?:Users|Documents|work)\b"
)
A_MACHINE_PATH = "/".join(("", MACHINE_FOLDERS[0], "main", "runs", "a.safetensors"))
"""An example of what the rule refuses, for the tests of the rule itself."""
TMP = re.compile(r"/tmp/")
TMP_OPTION = re.compile(r"(?:^|\s)-{1,2}[\w-]+[ =]/tmp/")  # --out /tmp/x, -o /tmp/x
FIGURES = "experiments/results/figures/"


def committed(*suffixes: str) -> list[Path]:
    """The committed files (git's index) with these suffixes; skip outside a git checkout."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of committed files")
    names = [n for n in listed.decode().split("\0") if n.lower().endswith(suffixes)]
    return [ROOT / n for n in names if (ROOT / n).is_file()]


def machine_paths(text: str, strict: bool) -> list[str]:
    """The lines of `text` that hold a machine's path; `strict`: any `/tmp/` too."""
    hits = []
    for line in text.splitlines():
        if (
            ALWAYS.search(line)
            or TMP.search(line)
            and (strict or len(TMP.findall(line)) > len(TMP_OPTION.findall(line)))
        ):
            hits.append(line.strip())
    return hits


def _unescape(raw: bytes) -> bytes:
    """A PDF literal string's bytes: `\\(`, `\\)`, `\\\\`, `\\n` and octal escapes undone."""
    named = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"b": b"\b", b"f": b"\f"}

    def one(m: re.Match[bytes]) -> bytes:
        tail = m.group(1)
        if tail[:1].isdigit():
            return bytes([int(tail, 8) & 0xFF])
        return named.get(tail, tail)

    return re.sub(rb"\\([0-7]{1,3}|.)", one, raw, flags=re.S)


def _decode(raw: bytes) -> str:
    """A shown string: UTF-16BE (TrueType fonts, matplotlib's pdf.fonttype 42) when its
    even bytes are zero, else one byte a character (Type 3 fonts)."""
    if len(raw) % 2 == 0 and raw and all(b == 0 for b in raw[::2]):
        return raw.decode("utf-16-be", "replace")
    return raw.decode("latin-1")


def pdf_text(data: bytes) -> str:
    """The text a PDF shows (each `[...] TJ` or `(...) Tj` one line), from its compressed
    and uncompressed content streams, and its raw bytes as well (the document info)."""
    bodies = [data]
    for m in re.finditer(rb"stream\r?\n(.*?)\r?\nendstream", data, re.S):
        try:
            bodies.append(zlib.decompress(m.group(1)))
        except zlib.error:
            continue
    lines = []
    string = rb"\(((?:[^()\\]|\\.)*)\)"
    for body in bodies:
        for arr, single in re.findall(rb"\[((?:[^\]\\]|\\.)*)\]\s*TJ|" + string + rb"\s*Tj", body):
            parts = re.findall(string, arr) if arr else [single]
            lines.append("".join(_decode(_unescape(p)) for p in parts))
    return "\n".join(lines) + "\n" + data.decode("latin-1")


def png_text(data: bytes) -> str:
    """The text chunks (tEXt, zTXt, iTXt) of a PNG, one a line."""
    out, pos = [], 8
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"tEXt":
            out.append(chunk.decode("latin-1"))
        elif kind == b"zTXt":
            key, _, rest = chunk.partition(b"\0")
            out.append(key.decode("latin-1") + " " + zlib.decompress(rest[1:]).decode("latin-1"))
        elif kind == b"iTXt":
            out.append(chunk.decode("utf-8", "replace"))
        pos += 12 + length
    return "\n".join(out)


@pytest.mark.integration
def test_pdf_text_reads_what_matplotlib_draws(tmp_path):
    """The scanner finds a path in a legend in both of matplotlib's PDF font types."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    for fonttype in (3, 42):
        with plt.rc_context({"pdf.fonttype": fonttype}):
            fig, ax = plt.subplots()
            ax.plot([0, 1], label=f"init={A_MACHINE_PATH} (n=2)")
            ax.legend()
            fig.savefig(tmp_path / f"f{fonttype}.pdf")
            plt.close(fig)
        text = pdf_text((tmp_path / f"f{fonttype}.pdf").read_bytes())
        assert machine_paths(text, strict=True), fonttype


def test_the_rule_keeps_a_commands_scratch_folder():
    assert machine_paths("protofed run --out /tmp/b_run", strict=False) == []
    assert machine_paths("x -o /tmp/fig4; done", strict=False) == []
    assert machine_paths("saved in /tmp/pytest-of-root/x", strict=False)
    assert machine_paths("--out /tmp/b_run", strict=True)
    assert machine_paths(f"model.init={A_MACHINE_PATH}", strict=False)
    assert machine_paths(r"C:\Users\me\runs", strict=False)


def test_no_committed_text_file_holds_a_machines_path():
    found = []
    for path in committed(*TEXT):
        rel = path.relative_to(ROOT).as_posix()
        strict = path.suffix.lower() in WRITTEN or rel.startswith(FIGURES)
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [f"{rel}: {line[:160]}" for line in machine_paths(text, strict)]
    assert not found, "machine paths in committed files:\n" + "\n".join(found)


def test_no_committed_figure_holds_a_machines_path():
    found = []
    for path in committed(".pdf", ".png"):
        data = path.read_bytes()
        text = pdf_text(data) if path.suffix.lower() == ".pdf" else png_text(data)
        found += [
            f"{path.relative_to(ROOT).as_posix()}: {line[:160]}"
            for line in machine_paths(text, strict=True)
        ]
    assert not found, "machine paths in committed figures:\n" + "\n".join(found)
