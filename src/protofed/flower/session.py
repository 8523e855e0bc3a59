"""The process side of a Flower simulation session: Ray, signals, what is left behind.

Ray is started here rather than by Flower so that this process keeps its own SIGINT and
SIGTERM handlers (`request_stop`), which end the ServerApp's waits instead of interrupting
Flower mid-call; every process the session started is waited for, and killed if it stays
(`end_processes`); the `Reaper` watchdog covers a driver that is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import psutil

from protofed.config import FlowerConfig
from protofed.core.process_owner import cli_owns_process
from protofed.flower.transport import STOP

FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}
"""Set before anything of Flower runs: no telemetry, no update check, no `uv sync`."""

if TYPE_CHECKING:  # the module of Flower's types moves between versions
    from flwr.app.typing import ConfigRecordValues

    # Flower's `backend_config` of `run_simulation`: client resources and Ray's init args
    BackendConfig = dict[str, dict[str, ConfigRecordValues]]


def backend_config(flower: FlowerConfig) -> BackendConfig:
    """Ray's resources per ClientApp and its start-up arguments, from `flower.*`.

    Without `flower.ray_address` the session starts its own Ray (`local`), never one it
    found (RAY_ADDRESS, the last `ray start`)."""
    return {
        "client_resources": {"num_cpus": flower.client_cpus, "num_gpus": flower.client_gpus},
        "init_args": {
            "logging_level": "ERROR",
            "log_to_driver": False,
            "address": flower.ray_address or "local",
        },
    }


AT_ONCE = [False]
"""Set by a second Ctrl-C or SIGTERM, which interrupts the session at once (a plain flag: a
signal handler takes no lock)."""

SIGNALLED = [False]
"""Set by the first Ctrl-C or SIGTERM (`STOP` is also set by an error, which `StopDeadline`
leaves alone)."""


class SilentOnceInterrupted(logging.Filter):
    """Drops Flower's records once a signal stopped the session: a second signal (or
    `StopDeadline`) shuts Ray down under the calls in flight, as asked, and a SIGTERM to the
    process group ends Ray's actors with the driver; Flower's worker threads then log each
    call's `ActorDiedError` or `ActorUnavailableError` with its traceback. The run's one
    line says what happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (AT_ONCE[0] or SIGNALLED[0])


@contextlib.contextmanager
def quiet_flower_logs() -> Iterator[None]:
    """Flower's own log at WARNING while the block runs (its INFO lines narrate each round),
    and none at all after a signal (`SilentOnceInterrupted`: kept on the logger, since
    Flower's threads may still log while the process exits)."""
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(logging.WARNING)
    AT_ONCE[0] = SIGNALLED[0] = False
    if not any(isinstance(f, SilentOnceInterrupted) for f in flwr_logger.filters):
        flwr_logger.addFilter(SilentOnceInterrupted())
    try:
        yield
    finally:
        flwr_logger.setLevel(level)


@contextlib.contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """Give back the SIGTERM and SIGINT handlers found on entry when the block ends.

    `ray.init` installs a SIGTERM handler that raises SystemExit and never restores the one
    it replaced; processes forked later (the built-in engine's worker pool) would inherit it.
    Only the main thread can set handlers, so elsewhere this does nothing.
    """
    main = threading.current_thread() is threading.main_thread()
    found = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        yield
    finally:
        for signum, handler in found.items():
            if handler is not None:  # None: set outside Python, cannot be set back from here
                signal.signal(signum, handler)


STOP_GRACE_S = 2.0
"""After the first Ctrl-C or SIGTERM, how long the session may take to stop cleanly (the
clients in training reply, Flower shuts Ray down) before it is interrupted at once, as a
second signal would (`StopDeadline`)."""

GIVE_UP_S = 8.0
"""After the first signal, the session has ended by then, or its processes are killed by
PID and this process exits with 130 (`StopDeadline`); the interpreter's exit then takes at
most `exit_once_interrupted`'s 3 s more."""


def request_stop(signum: int, frame: object) -> None:
    """The first Ctrl-C or SIGTERM asks the session to stop; the next one interrupts at once.

    Interrupting the main thread inside Flower's Simulation Runtime makes it shut Ray down
    while its worker threads may still wait on an actor's reply; the process then hung with
    every thread in a futex wait (seen in 4 of 5 suite runs, tests/test_reliability.py).
    Asking instead ends the ServerApp's waits (`STOP`), so Flower stops its workers once the
    clients in training reply, then shuts Ray down with no call in flight. A client that
    trains long would hold that up: `StopDeadline` interrupts at once after `STOP_GRACE_S`.
    """
    if STOP.is_set():
        AT_ONCE[0] = True
        raise KeyboardInterrupt
    SIGNALLED[0] = True
    STOP.set()
    with contextlib.suppress(OSError):  # a handler may not take logging's locks
        os.write(2, b"stopping the Flower session (again: stop at once)\n")


class StopDeadline:
    """Bounds the time from the first Ctrl-C or SIGTERM to the session's end.

    A thread watches for the first signal (`SIGNALLED`, polled every 0.25 s): the session
    then has `STOP_GRACE_S` to stop cleanly, then the main thread is interrupted as by a
    second signal (`request_stop`, Flower's own path, tests/test_reliability.py); if the
    session has still not ended `GIVE_UP_S` after the signal (the main thread stuck in
    Ray's shutdown on a loaded machine), every process it started is killed by PID, one
    line says so, and under protofed's command line this process exits with 130 (under
    the Python API it is the caller's, and goes on: `core/process_owner.py`). Watches in the
    main thread's sessions only, where `request_stop` handles the signals. `running()` wraps the simulation; leaving the
    `with` block marks the session's end, once its processes were ended.
    """

    def __init__(self, spared: int | None = None) -> None:
        """`spared`: a child process to leave alone (the `Reaper`)."""
        self.spared = spared
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._inside = False  # the main thread is in the simulation: an interrupt lands there
        self._thread = threading.Thread(target=self._watch, name="stop-deadline", daemon=True)
        self._before: set[int] = set()  # the processes that were there before the session

    def __enter__(self) -> StopDeadline:
        self._before = {p.pid for p in psutil.Process().children(recursive=True)}
        if threading.current_thread() is threading.main_thread():  # where signals are handled
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ended.set()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The block where the deadline may interrupt the main thread, and nowhere else: an
        interrupt asked for as the block ends is taken before the clean-up after it."""
        with self._lock:
            self._inside = True
        try:
            yield
        finally:
            with self._lock:
                self._inside = False
            with contextlib.suppress(KeyboardInterrupt):
                _take_pending_signals()

    def _watch(self) -> None:
        while not SIGNALLED[0]:  # polled: a signal handler sets no event it could block on
            if self._ended.wait(0.25):
                return
        if self._ended.wait(STOP_GRACE_S):
            return
        with self._lock:
            if self._inside and not AT_ONCE[0]:
                # as a second Ctrl-C (request_stop): a real signal, to the main thread, so
                # that a wait there (joining Flower's workers) is interrupted too, which
                # `_thread.interrupt_main` does not do
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        if self._ended.wait(GIVE_UP_S - STOP_GRACE_S):
            return
        self._give_up()

    def _give_up(self) -> None:
        """Kill what the session started (never a process that was there before it), say so
        in one line, and, where protofed's command line owns the process, exit with 130;
        under the Python API the caller's process goes on (`core/process_owner.py`)."""
        AT_ONCE[0] = True  # Flower's threads log nothing more
        started = [
            p
            for p in psutil.Process().children(recursive=True)
            if p.pid != self.spared and p.pid not in self._before
        ]
        for process in started:  # SIGKILL is final: no wait (3.4 s under load, measured)
            with contextlib.suppress(psutil.Error):
                process.kill()
        with contextlib.suppress(OSError):
            os.write(
                2,
                f"interrupted: Flower's simulation did not stop within {GIVE_UP_S:.0f} s, so "
                "its processes were killed; a Flower run cannot resume; start it again with "
                "--force\n".encode(),
            )
        if cli_owns_process():
            os._exit(130)  # the CLI's exit code for an interrupted run (docs/reliability.md)


def _take_pending_signals() -> None:
    """Nothing: a Python call, where the interpreter runs a signal handler whose signal has
    come (`StopDeadline`'s), so that its KeyboardInterrupt is raised here."""


def start_ray(init_args: dict[str, Any]) -> None:
    """Start Ray here, as Flower's Ray backend would, so `request_stop` can follow it.

    `ray.init` replaces the SIGTERM handler; started by Flower, it would do so inside
    `run_simulation`, where this thread can no longer set its own. Flower then finds Ray
    running and uses it (it ends it with the session). The ClientApps import protofed in
    Ray's workers, which need this process's `sys.path` (Flower passes it the same way).
    """
    import ray

    if ray.is_initialized():
        return
    paths = [*sys.path, *filter(None, [os.environ.get("PYTHONPATH")])]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    init_args = {"include_dashboard": False, **init_args}
    ray.init(runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}}, **init_args)


def stop_on_signals(init_args: dict[str, Any]) -> None:
    """In the main thread: Ray started here, then SIGINT and SIGTERM ask to stop
    (`request_stop`). Elsewhere no handler can be set, and Flower starts Ray itself."""
    if threading.current_thread() is threading.main_thread():
        start_ray(init_args)
        call_at_thread_shutdown(exit_once_interrupted)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, request_stop)


def shut_ray_down() -> None:
    """End Ray if it still runs: started here, but Flower failed before its backend (which
    ends Ray itself), so no call can be in flight."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def exit_once_interrupted(grace_s: float = 3.0) -> None:
    """At the interpreter's exit after a signal stopped a session: the objects alive are
    frozen out of the garbage collector (`gc.freeze`), and after a second signal (or
    `StopDeadline`'s interrupt) the threads left get `grace_s`, then the process ends with
    exit code 130 (interrupted).

    The interpreter's finalization collects every object of torch, Ray and Flower: on a
    loaded 2-core machine that took 10 s and more after the run's line was printed (the
    main thread in `Py_FinalizeEx`, `gc_collect_main`, read with gdb), about 0.5 s frozen.

    The second signal interrupts Flower's Simulation Runtime, which shuts Ray down while its
    worker threads may wait in `ray.get` for a client's reply; such a call can then wait
    forever, and the interpreter hung on its way out, joining the thread (4 times in 8
    with the signals 0.05 to 0.2 s apart during training). Everything the session started
    has been ended by then (`end_processes`), and the run's line printed: only the exit is
    left. Under protofed's command line the process then always ends here: finalizing the
    interpreter with Ray's and gRPC's native threads torn down mid-call crashed it once in a
    suite run on a loaded machine (SIGSEGV, exit -11, after the run's line). Under the Python
    API only when a thread is still stuck: the interpreter, and the caller's exit hooks, are
    theirs. Called by `threading` before it joins the threads.
    """
    if SIGNALLED[0] or AT_ONCE[0]:
        gc.freeze()
    if not AT_ONCE[0]:
        return
    deadline = time.monotonic() + grace_s
    left = [t for t in threading.enumerate() if t is not threading.current_thread()]
    for thread in (t for t in left if not t.daemon):
        thread.join(max(0.0, deadline - time.monotonic()))
    if cli_owns_process() or any(t.is_alive() and not t.daemon for t in left):
        logging.shutdown()  # the log files' last lines, as the interpreter's exit would
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(130)  # the CLI's exit code for an interrupted run (docs/reliability.md)


def call_at_thread_shutdown(callback: Callable[[], None]) -> None:
    """`callback` once, when the interpreter exits, before it joins the threads left (where
    `atexit` would be too late); nothing where this Python has no such hook."""
    register = getattr(threading, "_register_atexit", None)  # CPython 3.9+, as futures uses
    if register is not None and callback not in _AT_THREAD_SHUTDOWN:
        _AT_THREAD_SHUTDOWN.append(callback)
        with contextlib.suppress(RuntimeError):  # the interpreter is already shutting down
            register(callback)


_AT_THREAD_SHUTDOWN: list[Callable[[], None]] = []


def end_processes(processes: list[psutil.Process], at_once: bool) -> None:
    """Wait for `processes` to exit (30 s, or not at all when `at_once`), then kill the rest."""
    _, alive = psutil.wait_procs(processes, timeout=0 if at_once else 30)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=10)
