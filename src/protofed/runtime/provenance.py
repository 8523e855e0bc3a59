"""provenance.json: what produced a run directory, so a result can be traced back later.

The round loop writes it when a session (one process running the rounds: the start, or a
`--resume`) begins and updates it when the session ends. It holds, as of the first session:
protofed's version and git commit (when protofed runs from a git checkout), the versions of
Python and the libraries that decide the numbers, the machine (platform, CPU, cores, memory,
the training device's name; no host or user name), and the path, size and sha256 of every
data file the loader read; then the run's start and end (ISO 8601, UTC) and one entry per
session: its start, end, command line, engine and outcome, with whatever of the environment
differs from the first session (a resume on another machine, an upgraded torch).

Nothing here changes a number: the data files are hashed after they were loaded, each file
once per process (cached by path, size and modification time).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from protofed.core.results import Summary
from protofed.errors import ConfigError
from protofed.runs import CHECKPOINT, METRICS, PROVENANCE, RunDir, protofed_version

PACKAGES = ("torch", "numpy", "scikit-learn", "flwr")
"""The libraries whose versions are recorded (None where one is not installed)."""
ENVIRONMENT = ("protofed", "git", "python", "packages", "machine", "data")
"""The keys that describe where a session ran; a later session lists those that differ."""
GIT_TIMEOUT_S = 3.0
API = "python api"
"""The command recorded for a run started from Python (`protofed.run`, a script, a notebook)."""

_hashes: dict[tuple[str, int, int], str] = {}


def utc_now() -> str:
    """The current time as ISO 8601 in UTC, e.g. 2026-11-24T19:30:05Z."""
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return stamp.replace("+00:00", "Z")


def command_line(argv: Sequence[str] | None = None) -> str:
    """`protofed ...` as typed (the console script or `python -m protofed`), else "python api"."""
    argv = list(sys.argv if argv is None else argv)
    first = Path(argv[0]) if argv and argv[0] else Path()
    if first.name == "protofed" or (
        first.name == "__main__.py" and first.parent.name == "protofed"
    ):
        return shlex.join(["protofed", *argv[1:]])
    return API


def _git(folder: Path, *args: str) -> str | None:
    """A read-only git command's output, or None (no git, not a checkout, too slow)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},  # status never rewrites the index
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state() -> dict[str, Any] | None:
    """The commit of protofed's own source tree and whether tracked files differ from it, or
    None when protofed is not run from a git checkout of itself (an installed wheel)."""
    package = Path(__file__).resolve().parents[1]
    top = _git(package, "rev-parse", "--show-toplevel")
    if top is None or (Path(top) / "src" / "protofed").resolve() != package:
        return None  # not a checkout, or a checkout of another project that holds this one
    commit = _git(package, "rev-parse", "HEAD")
    if commit is None:
        return None
    status = _git(package, "status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return versions


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str) -> dict[str, Any]:
    """What the run ran on, without host or user names."""
    import psutil
    import torch

    dev = torch.device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else _cpu_name()
    return {
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "device": str(dev),
        "device_name": name,
    }


def file_sha256(path: Path) -> str:
    """sha256 of a file, read once per process while its size and modification time stay."""
    import pooch

    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _hashes:
        _hashes[key] = pooch.file_hash(str(path), alg="sha256")
    return _hashes[key]


def data_files(paths: Sequence[Path]) -> list[dict[str, Any]]:
    return [{"path": str(p), "bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in paths]


def environment(files: Sequence[Path], device: str) -> dict[str, Any]:
    """Everything of `ENVIRONMENT` for this process."""
    return {
        "protofed": protofed_version(),
        "git": git_state(),
        "python": platform.python_version(),
        "packages": package_versions(),
        "machine": machine(device),
        "data": data_files(files),
    }


def read_provenance(run_dir: RunDir) -> dict[str, Any] | None:
    """provenance.json as the sessions read it (None where the run has none): a damaged or
    edited one is a one-line error naming it. `engine.resume` calls it before it writes
    anything, so a refused resume leaves the run as it was."""
    if not (run_dir.path / PROVENANCE).is_file():
        return None
    doc = run_dir.read_json(PROVENANCE)
    if not all(isinstance(session, dict) for session in doc.get("sessions", [])):
        raise ConfigError(
            f"{run_dir.path / PROVENANCE}: not as protofed writes it (a session is not a JSON "
            "object); restore it, or delete it (the next session writes a new one)"
        )
    return doc


def begin_session(run_dir: RunDir, files: Sequence[Path], device: str, engine: str) -> None:
    """Record a session that starts (or resumes) the run's rounds in this process."""
    env = environment(files, device)
    session: dict[str, Any] = {
        "start": utc_now(),
        "end": None,
        "command": command_line(),
        "engine": engine,
        "outcome": "running",
    }
    found = read_provenance(run_dir)
    if found is None:
        doc = {**env, "command": session["command"], "start": session["start"], "end": None}
        doc["sessions"] = [session]
    else:
        doc = found
        changed = {k: v for k, v in env.items() if doc.get(k) != v}
        if changed:
            session["changed"] = changed
        doc["end"] = None
        doc["sessions"] = [*settled(run_dir, doc.get("sessions", [])), session]
    run_dir.write_json(PROVENANCE, doc)


def settled(run_dir: RunDir, sessions: list[Any]) -> list[Any]:
    """Earlier sessions as they ended: one still `running` was killed (SIGKILL, a power
    cut) before it could say so; its end is the last time it wrote the run's state."""
    for session in sessions:
        if isinstance(session, dict) and session.get("outcome") == "running":
            session["outcome"] = "killed"
            session["end"] = last_write(run_dir) or session.get("end")
    return sessions


def last_write(run_dir: RunDir) -> str | None:
    """When the run's state (metrics.jsonl, checkpoint.pt) was last written, as UTC."""
    times = []
    for name in (METRICS, CHECKPOINT):
        try:
            times.append((run_dir.path / name).stat().st_mtime)
        except OSError:
            continue
    if not times:
        return None
    stamp = dt.datetime.fromtimestamp(max(times), tz=dt.timezone.utc)
    return stamp.isoformat(timespec="seconds").replace("+00:00", "Z")


def close_session(run_dir: RunDir, summary: Summary) -> None:
    """End a session that a signal cut short after its summary was written: the run is
    complete, whatever the signal stopped (the session's own end, say)."""
    if not (run_dir.path / PROVENANCE).is_file():
        return
    sessions = run_dir.read_json(PROVENANCE).get("sessions") or [{}]
    last = sessions[-1]
    if not isinstance(last, dict) or last.get("outcome") in ("running", "stopped", None):
        end_session(run_dir, summary)


def end_session(run_dir: RunDir, summary: Summary | None) -> None:
    """The session's end and outcome; the run's end too when `summary` (it was written)."""
    doc = run_dir.read_json(PROVENANCE)
    end = utc_now()
    doc["sessions"][-1]["end"] = end
    doc["sessions"][-1]["outcome"] = "stopped" if summary is None else summary.status
    if summary is not None:
        doc["end"] = end
    run_dir.write_json(PROVENANCE, doc)
