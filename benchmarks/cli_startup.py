"""How long the CLI takes to start: `protofed --help` and `protofed list`, and what they import.

`protofed list` keeps its lines in the user cache folder (keyed by the installation): it is
timed with that listing kept (every later run) and without (the first run after an install
or an edit; each run is given an empty XDG_CACHE_HOME). Each command runs as a subprocess
(`python -m protofed ...`, so PYTHONPATH picks the source: `PYTHONPATH=/other/src python
benchmarks/cli_startup.py` times another checkout with this interpreter), `--repeat` times
(default 5); the best wall-clock time is reported (the others wait on a busy machine, not on
protofed). Then `python -X importtime` of each command's imports lists the slowest top-level
packages (cumulative seconds, what a package imports included: `protofed` contains whatever
protofed's modules import), and which of the heavy ones (scikit-learn, scipy, pandas,
matplotlib, flwr, torch) are imported at all.

Usage: python benchmarks/cli_startup.py [--repeat 5] [--top 8]
Prints seconds per command and the top imports; not a test (timings vary by machine).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

COMMANDS = {
    "protofed --help": ["--help"],
    "protofed list": ["list"],
    "protofed list, first time": ["list"],  # no listing cached: every registry imported
}
IMPORTS = {  # what each command imports, for -X importtime (its output is not needed)
    "protofed --help": "import protofed.cli",
    "protofed list": "from protofed.cli import catalog; catalog.list_()",
    "protofed list, first time": "from protofed.cli import catalog; catalog._build_catalog()",
}
HEAVY = ("sklearn", "scipy", "pandas", "matplotlib", "flwr", "torch")
ENV = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "COLUMNS": "100"}


def best_of(args: list[str], repeat: int, cold: bool = False) -> float:
    """The fastest of `repeat` runs of `python -m protofed ARGS`, in seconds (`cold`: each
    with an empty cache folder, so `protofed list` finds no listing kept)."""
    times = []
    for _ in range(repeat):
        env = {**ENV, "XDG_CACHE_HOME": tempfile.mkdtemp()} if cold else ENV
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "protofed", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        times.append(time.perf_counter() - start)
    return min(times)


def top_imports(code: str, top: int) -> list[tuple[str, float]]:
    """The top-level packages `code` imports, slowest first: (name, cumulative seconds)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=True,
    )
    roots: dict[str, float] = {}
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or line.count("|") != 2:
            continue
        _, cumulative, name = line.split("|")
        if not cumulative.strip().isdigit():
            continue  # the header
        package = name.strip().split(".")[0]  # its outermost import has the largest total
        roots[package] = max(roots.get(package, 0.0), int(cumulative) / 1e6)
    return sorted(roots.items(), key=lambda kv: -kv[1])[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    for label, argv in COMMANDS.items():
        seconds = best_of(argv, args.repeat, cold="first time" in label)
        imports = top_imports(IMPORTS[label], args.top)
        heavy = sorted({name for name, _ in top_imports(IMPORTS[label], 10_000)} & set(HEAVY))
        print(f"{label}: {seconds:.2f} s (best of {args.repeat})")
        print(f"  heavy packages imported: {', '.join(heavy) or 'none'}")
        for name, s in imports:
            print(f"  {s:6.3f} s  {name}")


if __name__ == "__main__":
    main()
