"""How long the CLI takes to start: `protofed --help` and `protofed list`, and what they import.

`protofed list` reads its built-in lines from `protofed/cli/catalog.json` (package data);
only with plugins installed does it import every registry (and torch), keeping the lines in
the user cache folder. Timed:

- `protofed --help`, and `protofed list` with the user cache as it is;
- `protofed list, first time`: the first run after an install. Each run is given an empty
  user cache folder (XDG_CACHE_HOME, a new temporary folder), after one untimed run that
  leaves `__pycache__` in place as pip's install does (it compiles the bytecode);
- `plugins installed, first time`: what a first `protofed list` costs where plugins are
  installed: every registry imported and listed (`catalog._build_catalog()`), empty cache.

Each command runs as a subprocess (`python -m protofed ...`, so PYTHONPATH picks the source:
`PYTHONPATH=/other/src python benchmarks/cli_startup.py` times another checkout with this
interpreter), `--repeat` times (default 5); the best wall-clock time is reported (the others
wait on a busy machine, not on protofed). Then `python -X importtime` of each command's
imports (in the same kind of cache folder) lists the slowest top-level packages (cumulative
seconds, what a package imports included: `protofed` contains whatever protofed's modules
import), and which of the heavy ones (scikit-learn, scipy, pandas, matplotlib, flwr, torch)
are imported at all.

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

BUILD = "from protofed.cli import catalog; catalog._build_catalog()"
# label: (the interpreter's arguments, each run with an empty user cache folder)
COMMANDS = {
    "protofed --help": (["-m", "protofed", "--help"], False),
    "protofed list": (["-m", "protofed", "list"], False),
    "protofed list, first time": (["-m", "protofed", "list"], True),
    "plugins installed, first time": (["-c", BUILD], True),
}
IMPORTS = {  # what each command imports, for -X importtime (its output is not needed)
    "protofed --help": "import protofed.cli",
    "protofed list": "from protofed.cli import catalog; catalog.list_()",
    "protofed list, first time": "from protofed.cli import catalog; catalog.list_()",
    "plugins installed, first time": BUILD,
}
HEAVY = ("sklearn", "scipy", "pandas", "matplotlib", "flwr", "torch")
ENV = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "COLUMNS": "100"}


def run_once(args: list[str], cold: bool, stderr: int = subprocess.DEVNULL) -> str:
    """`python ARGS` once (`cold`: with an empty user cache folder); its stderr if piped."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**ENV, "XDG_CACHE_HOME": cache} if cold else ENV
        done = subprocess.run(
            [sys.executable, *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
            check=True,
        )
    return done.stderr or ""


def best_of(args: list[str], repeat: int, cold: bool = False) -> float:
    """The fastest of `repeat` runs of `python ARGS`, in seconds, after one untimed run (the
    bytecode compiled, as after an install; `cold`: each with an empty cache folder)."""
    run_once(args, cold)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run_once(args, cold)
        times.append(time.perf_counter() - start)
    return min(times)


def top_imports(code: str, cold: bool) -> list[tuple[str, float]]:
    """The top-level packages `code` imports, slowest first: (name, cumulative seconds)."""
    stderr = run_once(["-X", "importtime", "-c", code], cold, stderr=subprocess.PIPE)
    roots: dict[str, float] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or line.count("|") != 2:
            continue
        _, cumulative, name = line.split("|")
        if not cumulative.strip().isdigit():
            continue  # the header
        package = name.strip().split(".")[0]  # its outermost import has the largest total
        roots[package] = max(roots.get(package, 0.0), int(cumulative) / 1e6)
    return sorted(roots.items(), key=lambda kv: -kv[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    for label, (argv, cold) in COMMANDS.items():
        seconds = best_of(argv, args.repeat, cold)
        imports = top_imports(IMPORTS[label], cold)
        heavy = sorted({name for name, _ in imports} & set(HEAVY))
        print(f"{label}: {seconds:.2f} s (best of {args.repeat})")
        print(f"  heavy packages imported: {', '.join(heavy) or 'none'}")
        for name, s in imports[: args.top]:
            print(f"  {s:6.3f} s  {name}")


if __name__ == "__main__":
    main()
