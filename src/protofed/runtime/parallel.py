"""Worker processes: the built-in engine's parallelism, and nothing else.

Clients of a round are independent, so `train.workers = N` trains them in N processes, each
single-threaded (unset: one per usable core, `resolve_workers`). On a small CPU this beats intra-op threads by a wide margin: the per-step
kernels of federated models are too small for two threads to share, while two processes each
keep one client's weights hot in their own cache.

Workers are forked once, so they inherit what the pool was given (the data, the model, the
algorithm) and receive per task only what changes. Tensors cross through shared memory
(torch.multiprocessing), never through files. Results come back in the order of the tasks.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401  (registers shared-memory reductions for tensors)

from protofed.config import TrainConfig

MAX_AUTO_WORKERS = 8
"""The most workers an unset `train.workers` gives: past that the server's side of a round
(aggregation, evaluation, moving replies) dominates, and each worker holds its own workspace
model and optimizer state."""


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's, taskset's or a
    batch job's share), not the machine's: a run must not oversubscribe what it was given."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS)
        return os.cpu_count() or 1


def _omp_threads() -> int | None:
    """OMP_NUM_THREADS as a positive count (its first level when nested), else None."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else None


def resolve_workers(train: TrainConfig, clients: int) -> int:
    """How many worker processes train a round's `clients`: `train.workers` when set.

    Unset, a CPU run gets one single-threaded worker per core it may use, because small
    federated models train far faster in N one-thread processes than in one N-thread process
    (and give the numbers of `train.threads=1`, serial). The cores are `train.threads` if
    set, else OMP_NUM_THREADS (a sweep sets it to share the machine among its runs), else the
    CPU affinity, and never more than the affinity; at most the round's clients (more would
    idle) and `MAX_AUTO_WORKERS`. A GPU run gets 1: the device, not the cores, is what the
    clients share; so does a platform without fork (Windows). 1 means serial.
    """
    if train.workers is not None:
        return train.workers
    if torch.device(train.device).type != "cpu" or "fork" not in mp.get_all_start_methods():
        return 1  # a GPU, or no fork (Windows): the serial engine
    cores = min(train.threads or _omp_threads() or usable_cores(), usable_cores())
    return max(1, min(cores, clients, MAX_AUTO_WORKERS))


_INHERITED: Any = None  # what the forked workers inherit (set before the fork)


_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies (Linux)


_RESET_SIGNALS = {signal.SIGTERM, signal.SIGINT}
"""What a worker handles its own way (`_init_worker`); blocked while workers are forked."""


def _init_worker(parent: int) -> None:
    """One thread; the default signal handling; gone when the parent is.

    A fork inherits the parent's Python signal handlers: after `ray.init` (Flower's
    simulation) the parent's SIGTERM handler raises SystemExit, so `Pool.terminate()` would
    make a worker run the parent's exit hooks and deadlock on a multiprocessing lock. SIGTERM
    is given back to the default (die at once); SIGINT is ignored, as Ctrl-C reaches the
    whole process group and the parent stops the pool itself. Both were blocked while the
    worker was forked (`WorkerPool`), so one that came before this reset waited, and is
    delivered now under the new handling: a SIGTERM that reached the inherited handler first
    would otherwise be dropped by Python ("ignored due to race condition") and leave
    `Pool.terminate()` waiting for a worker that never dies. On Linux a worker also dies
    with its parent, so a SIGKILLed run does not leave workers holding its run directory's
    lock (a forked flock) while they finish a client.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _RESET_SIGNALS)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(0)
    torch.set_num_threads(1)


def _call(task: tuple[Callable[..., Any], tuple]) -> Any:
    function, args = task
    return function(_INHERITED, *args)


class WorkerPool:
    """A pool of forked, single-threaded processes that share `inherited` with the parent."""

    def __init__(self, inherited: Any, workers: int) -> None:
        global _INHERITED
        if "fork" not in mp.get_all_start_methods():
            raise RuntimeError("train.workers > 1 needs the 'fork' start method (Linux, macOS)")
        _INHERITED = inherited  # inherited by the forked children
        self.workers = workers
        # the workers inherit this mask (and so do the pool's threads, which fork any
        # replacement worker): see _init_worker; the parent's own is given back at once
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _RESET_SIGNALS)
        try:
            self._pool = mp.get_context("fork").Pool(
                workers, initializer=_init_worker, initargs=(os.getpid(),)
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def map(self, function: Callable[..., Any], tasks: Iterable[tuple]) -> Iterator[Any]:
        """`function(inherited, *args)` for each task's args, lazily, in the tasks' order.

        `function` must be a module-level function (it crosses to the workers by name).
        """
        return self._pool.imap(_call, [(function, args) for args in tasks])

    def close(self) -> None:
        global _INHERITED
        self._pool.terminate()
        self._pool.join()
        _INHERITED = None
