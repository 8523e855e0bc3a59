"""The process side of a Flower simulation session: Ray, signals, what is left behind.

Ray is started here rather than by Flower so that this process keeps its own SIGINT and
SIGTERM handlers (`request_stop`), which end the ServerApp's waits instead of interrupting
Flower mid-call; every process the session started is waited for, and killed if it stays
(`end_processes`); the `Reaper` watchdog covers a driver that is SIGKILLed.
"""

from __future__ import annotations

import contextlib
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


class SilentOnceInterrupted(logging.Filter):
    """Drops Flower's records once a second signal interrupted the session at once: Ray is
    then shut down under the calls in flight, as asked, and Flower's worker threads log each
    one's `ActorDiedError` with its traceback; the run's one line says what happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not AT_ONCE[0]


@contextlib.contextmanager
def quiet_flower_logs() -> Iterator[None]:
    """Flower's own log at WARNING while the block runs (its INFO lines narrate each round),
    and none at all after a second signal (`SilentOnceInterrupted`: kept on the logger, since
    Flower's threads may still log while the process exits)."""
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(logging.WARNING)
    AT_ONCE[0] = False
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


def request_stop(signum: int, frame: object) -> None:
    """The first Ctrl-C or SIGTERM asks the session to stop; the next one interrupts at once.

    Interrupting the main thread inside Flower's Simulation Runtime makes it shut Ray down
    while its worker threads may still wait on an actor's reply; the process then hung with
    every thread in a futex wait (seen in 4 of 5 suite runs, tests/test_reliability.py).
    Asking instead ends the ServerApp's waits (`STOP`), so Flower stops its workers once the
    clients in training reply, then shuts Ray down with no call in flight.
    """
    if STOP.is_set():
        AT_ONCE[0] = True
        raise KeyboardInterrupt
    STOP.set()
    with contextlib.suppress(OSError):  # a handler may not take logging's locks
        os.write(2, b"stopping once the clients in training reply (again: stop at once)\n")


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
    """At the interpreter's exit, after a second signal stopped a session at once: give the
    threads left `grace_s`, then end the process with exit code 130 (interrupted).

    The second signal interrupts Flower's Simulation Runtime, which shuts Ray down while its
    worker threads may wait in `ray.get` for a client's reply; such a call can then wait
    forever, and the interpreter hung on its way out, joining the thread (4 times in 8
    with the signals 0.05 to 0.2 s apart during training). Everything the session started
    has been ended by then (`end_processes`), and the run's line printed: only the exit is
    left. Called by `threading` before it joins the threads, never after a single signal.
    """
    if not AT_ONCE[0]:
        return
    deadline = time.monotonic() + grace_s
    left = [t for t in threading.enumerate() if t is not threading.current_thread()]
    for thread in (t for t in left if not t.daemon):
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() and not t.daemon for t in left):
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
