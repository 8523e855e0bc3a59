"""Every `protofed run` of the README and the docs, at its documented size, to a trained result.

The tests run the README's commands at a tiny size (tests/test_readme.py), where a run that
diverges at round 17 does not show. Before a release, this script runs each `protofed run`
line of the README's and docs' ```bash blocks as written (only `--out` is moved into a
scratch folder, and `--force` added), records its wall time, status and final
personalization F1, and fails (exit 1) where a run diverged, stopped or ended within 5
points of chance (uniform guessing over the data set's classes).

    python benchmarks/docs_commands.py --data-dir DIR --out benchmarks/out/docs_commands.md
    python benchmarks/docs_commands.py --only README.md          # one file
    python benchmarks/docs_commands.py --match privacy --list    # what would run

Each command's result is appended to the table as it finishes, so a killed sitting keeps
what it measured; `--skip-done` skips the commands the table already has.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PROTOFED = Path(sys.executable).with_name("protofed")
HEADER = "| file | command | status | rounds | pers F1 | chance | wall s |\n|---|---|---|---|---|---|---|\n"


def commands(page: Path) -> list[list[str]]:
    """The `protofed run` lines of a page's bash blocks, one argv each."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            try:
                argv = shlex.split(line, comments=True)
            except ValueError:
                continue
            while argv and "=" in argv[0] and not argv[0].startswith("-"):
                argv = argv[1:]  # an environment assignment (PROTOFED_DATA=DIR)
            if argv[:2] == ["protofed", "run"] and "--resume" not in argv:
                out.append(argv)
    return out


# what a command needs that this script does not make; such a line is listed, not run
NEEDS = {
    "http://": "a tracking server on another host (never reached from here)",
    "ray_address=": "a Ray cluster",
    "model.init=": "a pre-trained encoder (docs/pretraining.md makes it first)",
    "data.path=my_data.csv": "the reader's own CSV",
}


def needs(line: str) -> str | None:
    return next((why for text, why in NEEDS.items() if text in line), None)


def scratch(argv: list[str], folder: Path, data_dir: Path | None) -> list[str]:
    """The command with its --out in `folder`, --force added, and the docs' placeholder
    `--data-dir DIR` made the real data root."""
    argv = list(argv)
    if data_dir is not None and "--data-dir" in argv:
        i = argv.index("--data-dir")
        if argv[i + 1 : i + 2] == ["DIR"]:
            argv[i + 1] = str(data_dir.resolve())
    for flag in ("--out", "-o"):
        if flag in argv:
            i = argv.index(flag)
            del argv[i : i + 2]
    return [str(PROTOFED), *argv[1:], "--out", str(folder), "--force"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "out" / "docs_commands.md"
    )
    parser.add_argument("--only", action="append", default=[], help="a page (path from the root)")
    parser.add_argument("--match", default=None, help="only commands containing this text")
    parser.add_argument("--list", action="store_true", help="list the commands; run nothing")
    parser.add_argument("--skip-done", action="store_true")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.data_dir is not None:
        env["PROTOFED_DATA"] = str(args.data_dir.resolve())
    todo = []
    for page in PAGES:
        name = str(page.relative_to(ROOT))
        if args.only and name not in args.only:
            continue
        for argv in commands(page):
            line = shlex.join(argv)
            seen = any(line == other for _, other, _ in todo)
            if (args.match is None or args.match in line) and not seen:
                todo.append((name, line, argv))
    if args.list:
        for name, line, _ in todo:
            why = needs(line)
            print(f"{name}: {line}" + (f"  [not run: needs {why}]" if why else ""))
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if not args.out.exists():
        args.out.write_text(HEADER)
    done = args.out.read_text()
    failed = 0
    for name, line, argv in todo:
        if args.skip_done and f"`{line}`" in done:
            continue
        if (why := needs(line)) is not None:
            print(f"{name}: not run, needs {why}: {line}")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            t0 = time.perf_counter()
            proc = subprocess.run(
                scratch(argv, run_dir, args.data_dir),
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
            )
            wall = time.perf_counter() - t0
            summary_file = run_dir / "summary.json"
            if summary_file.exists():
                summary = json.loads(summary_file.read_text())
                final = summary.get("final") or {}
                f1 = (final.get("personalization") or {}).get("f1")
                classes = json.loads((run_dir / "partition.json").read_text()).get("num_classes")
                chance = 1.0 / classes if classes else None
                status, rounds = summary["status"], summary["rounds"]
            else:
                f1 = chance = None
                status, rounds = f"exit {proc.returncode}", "-"
        trained = f1 is not None and chance is not None and f1 > chance + 0.05
        ok = proc.returncode == 0 and status == "complete" and trained
        failed += not ok
        row = (
            f"| {name} | `{line}` | {status} | {rounds} | "
            f"{'-' if f1 is None else f'{100 * f1:.2f}'} | "
            f"{'-' if chance is None else f'{100 * chance:.1f}'} | {wall:.0f} |\n"
        )
        with args.out.open("a") as table:
            table.write(row)
        print(row, end="", flush=True)
        if not ok:
            print(proc.stderr[-2000:], file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
