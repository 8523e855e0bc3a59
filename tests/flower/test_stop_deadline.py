"""The bound on a Flower session's stop (flower/session.py `StopDeadline`): after the first
Ctrl-C the session has `STOP_GRACE_S` to stop cleanly, then it is interrupted at once, and
if it has still not ended `GIVE_UP_S` after the signal, its processes are killed by PID and
the process exits with 130 after one line. Each case is a small process whose "simulation"
is a loop that stops, ignores the stop request, or ignores every interrupt (the main thread
stuck, as in Ray's shutdown on a loaded machine); the end-to-end run is in
tests/test_reliability.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

# Flower's simulation and deployment engines: Ray, subprocesses, whole runs
pytestmark = pytest.mark.integration

GRACE_S, GIVE_UP_S = 0.5, 2.0

SESSION = """
import subprocess, sys, time
from protofed.core.process_owner import claim_for_cli
from protofed.flower import session
if {cli}:
    claim_for_cli()
session.STOP_GRACE_S, session.GIVE_UP_S = {grace}, {give_up}
session.signal.signal(session.signal.SIGINT, session.request_stop)
sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # our pipes close with us
before = subprocess.Popen(sleep, **quiet)  # not the session's: never killed by it
with session.StopDeadline() as deadline:
    child = subprocess.Popen(sleep, **quiet)
    print(child.pid, before.pid, flush=True)
    try:
        with deadline.running():
            while not ({behaviour} == "stops" and session.STOP.is_set()):
                try:
                    time.sleep(0.02)
                except KeyboardInterrupt:
                    if {behaviour} != "stuck":
                        raise
        print("stopped cleanly", flush=True)
    except KeyboardInterrupt:
        print("interrupted at once", flush=True)
    child.kill()
    child.wait()
time.sleep(1.5)  # long after the session: the deadline must not act any more
print("went on", before.poll() is None, flush=True)
before.kill()
"""


def _session(behaviour: str, cli: bool = True) -> tuple[subprocess.Popen, int]:
    """The session in its own process, once it runs: (it, its child's PID); `cli`: the
    process is protofed's command line's (else a caller's, as under the Python API)."""
    code = SESSION.format(grace=GRACE_S, give_up=GIVE_UP_S, behaviour=repr(behaviour), cli=cli)
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0"},
    )
    assert proc.stdout is not None
    child, before = map(int, proc.stdout.readline().split())
    time.sleep(0.3)  # in the loop
    proc.before = before  # type: ignore[attr-defined]
    return proc, child


def _interrupt(proc: subprocess.Popen) -> tuple[int, float, str, str]:
    """One Ctrl-C: the exit code, the seconds until the session's end was printed (or the
    exit), stdout and stderr."""
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    assert proc.stdout is not None
    first = proc.stdout.readline()
    took = time.monotonic() - t0
    out, err = proc.communicate(timeout=30)
    return proc.returncode, took, first + out, err


@pytest.mark.parametrize(
    ("behaviour", "said", "within"),
    [
        ("stops", "stopped cleanly", (0.0, GRACE_S)),
        ("ignores the request", "interrupted at once", (GRACE_S, GRACE_S + 1.5)),
    ],
)
def test_a_session_that_stops_is_left_alone_one_that_does_not_is_interrupted(
    behaviour, said, within
):
    proc, child = _session(behaviour)
    code, took, out, err = _interrupt(proc)
    assert code == 0, err
    assert out.split() == [*said.split(), "went", "on", "True"], out
    assert within[0] <= took < within[1], took
    assert err.strip() == "stopping the Flower session (again: stop at once)", err
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"


def test_a_session_stuck_after_the_interrupt_is_killed_by_pid_and_exits_130():
    proc, child = _session("stuck")
    code, took, out, err = _interrupt(proc)
    assert code == 130, (out, err)
    assert GIVE_UP_S <= took < GIVE_UP_S + 1.5, took
    assert "went on" not in out
    left = psutil.Process(proc.before)  # it was there before the session: left alone
    assert left.status() != "zombie"
    left.kill()
    lines = err.strip().splitlines()
    assert lines[0] == "stopping the Flower session (again: stop at once)", err
    assert len(lines) == 2 and lines[1].startswith(
        "interrupted: Flower's simulation did not stop within 2 s, so its processes were killed"
    ), err
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"


def test_under_the_python_api_a_stuck_session_kills_its_processes_but_not_the_caller():
    """In a process protofed's command line does not own (a notebook's kernel), giving up
    kills only what the session started: the caller's own child and the caller go on."""
    proc, child = _session("stuck", cli=False)
    proc.send_signal(signal.SIGINT)
    time.sleep(GIVE_UP_S + 0.8)
    assert proc.poll() is None  # the caller's process is not ended
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"
    assert psutil.Process(proc.before).status() != "zombie"
    proc.kill()
    _, err = proc.communicate(timeout=30)
    psutil.Process(proc.before).kill()
    assert "its processes were killed" in err, err
