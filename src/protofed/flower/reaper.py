"""Kills what a Flower simulation started when the process that started it dies.

Ray's raylet, GCS server and workers outlive a SIGKILLed driver for minutes (they are
re-parented to init, and nothing tells them). `run_simulations` starts this watchdog as a
script of its own (`python reaper.py PID`; it imports psutil only, so it starts in
~0.1 s): it keeps the set of PID's descendants, and when PID is gone it kills them and
their own children. A normal end stops the watchdog first (`Reaper.stop`), so it never
touches what the driver's own clean-up handles. A Ray cluster the driver attached to
(`flower.ray_address`) runs in processes `ray start` spawned, never the driver's
descendants: the watchdog never kills them (tests/flower/test_ray_cluster.py).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil

POLL_S = 0.5


class Reaper:
    """The watchdog process of one simulation session (a context manager)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Reaper:
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__)), str(psutil.Process().pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to the terminal's group leaves it to its job
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None


def _kill_all(procs: dict[tuple[int, float], psutil.Process]) -> None:
    """Kill the recorded processes and whatever they started since (same PID, same birth)."""
    targets: list[psutil.Process] = []
    for proc in procs.values():
        try:
            if proc.is_running():  # compares the creation time: a reused PID is not ours
                targets.append(proc)
                targets.extend(proc.children(recursive=True))
        except psutil.Error:
            continue
    for proc in targets:
        try:
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(targets, timeout=5)


def watch(parent_pid: int) -> None:
    """Record `parent_pid`'s descendants until it dies, then kill them."""
    me = psutil.Process().pid
    try:
        parent = psutil.Process(parent_pid)
    except psutil.NoSuchProcess:
        return
    seen: dict[tuple[int, float], psutil.Process] = {}
    while True:
        try:
            if not parent.is_running() or parent.status() == psutil.STATUS_ZOMBIE:
                break
            for child in parent.children(recursive=True):
                if child.pid != me:
                    seen.setdefault((child.pid, child.create_time()), child)
        except psutil.NoSuchProcess:
            break
        except psutil.Error:
            pass
        time.sleep(POLL_S)
    _kill_all(seen)


if __name__ == "__main__":
    watch(int(sys.argv[1]))
