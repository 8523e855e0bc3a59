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
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn

import torch
import torch.multiprocessing  # noqa: F401  (registers shared-memory reductions for tensors)

from protofed.config import TrainConfig
from protofed.errors import RunStopped

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
    simulation) the parent's SIGTERM handler raises SystemExit, so closing the pool would
    make a worker run the parent's exit hooks instead of dying. SIGTERM is given back to the
    default (die at once); SIGINT is ignored, as Ctrl-C reaches the whole process group and
    the parent stops the pool itself. Both were blocked while the worker was forked
    (`WorkerPool`), so one that came before this reset waited, and is delivered now under
    the new handling: a SIGTERM that reached the inherited handler first would otherwise be
    dropped by Python ("ignored due to race condition") and leave the worker running. On Linux a worker also dies
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


class WorkerTraceback(Exception):
    """The traceback of an exception raised in a worker (set as its `__cause__`)."""


def _serve(connection: Connection, parent: int) -> None:
    """A worker's life: tasks in, `(ok, value, traceback)` out, until None or the parent
    hangs up."""
    _init_worker(parent)
    held: tuple[Any, ...] = ()  # the open map's shared value, sent once (see `WorkerPool.map`)
    while True:
        try:
            task = connection.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        function, args, shares, fresh, value = task
        if fresh:
            held = (value,)
        elif not shares:
            held = ()
        try:
            reply = (True, function(_INHERITED, *held, *args), "")
        except Exception as error:
            reply = (False, error, traceback.format_exc())
        try:
            connection.send(reply)
        except Exception as error:  # an unpicklable result or exception
            connection.send(
                (False, RuntimeError(f"a worker's reply could not be sent: {error!r}"), "")
            )
        # waiting for the next task, hold neither this one nor its reply: their tensors are
        # shared-memory segments (a model) the parent has let go of. The map's shared value
        # (a round's server state) stays until a task of another map replaces it.
        del task, function, args, value, reply


def _death(process: BaseProcess) -> str:
    process.join(timeout=1.0)
    code = process.exitcode
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        return f"killed by {name}" + (" (the out-of-memory killer?)" if name == "SIGKILL" else "")
    return f"exit code {code}"


class WorkerPool:
    """A pool of forked, single-threaded processes that share `inherited` with the parent.

    Each worker has its own pipe and the parent hands out tasks itself, so no lock is shared
    between processes. `multiprocessing.Pool`, used before, shares one: a worker waiting for
    a task holds its queue's lock, so a SIGTERM to the whole process group (`timeout`, a batch
    scheduler) killed it holding the lock and `Pool.terminate()` then waited forever; and a
    worker killed mid-task (the out-of-memory killer) made `imap` wait forever too. Here a
    dead worker is a one-line `RunStopped`, and closing only stops processes.
    """

    def __init__(self, inherited: Any, workers: int) -> None:
        global _INHERITED
        if "fork" not in mp.get_all_start_methods():
            raise RuntimeError("train.workers > 1 needs the 'fork' start method (Linux, macOS)")
        _INHERITED = inherited  # inherited by the forked children
        self.workers = workers
        context = mp.get_context("fork")
        self.processes: list[BaseProcess] = []
        self._pipes: list[Connection] = []
        # the workers inherit this mask (see _init_worker); the parent's own is given back
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _RESET_SIGNALS)
        try:
            for _ in range(workers):
                ours, theirs = context.Pipe(duplex=True)
                process = context.Process(target=_serve, args=(theirs, os.getpid()), daemon=True)
                process.start()
                theirs.close()
                self.processes.append(process)
                self._pipes.append(ours)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self._idle = list(range(workers))
        self._stale: set[int] = set()  # workers still busy with an abandoned map's task
        self._open_maps = 0  # maps not yet exhausted or closed (see `map`: threads)
        self._threads = 0  # this process's torch threads before the first of them opened
        self._maps = 0  # maps opened so far: each map's shared value is known by its number
        self._holding: dict[int, int] = {}  # worker -> the map whose shared value it holds

    def map(
        self, function: Callable[..., Any], tasks: Iterable[tuple[Any, ...]], shared: Any = None
    ) -> Iterator[Any]:
        """`function(inherited, *args)` for each task's args, lazily, in the tasks' order;
        `function(inherited, shared, *args)` where `shared` is given.

        `function` must be a module-level function (it crosses to the workers by name). A
        worker gets its next task when its reply is read, before the caller sees the reply;
        a task's exception is raised in the tasks' order, as `Pool.imap` did. `shared` (a
        round's server state) crosses to each worker once per map, not with every task:
        every tensor crossing costs its file descriptor's hand-over, ~5 ms per harcnn model
        on a loaded machine, which each task paid before (docs/speed.md).

        While the map is open (the workers train, the caller checks and aggregates their
        replies) this process runs torch on one thread: the workers already hold every
        core, and a second OpenMP thread here spun in its wait between the aggregation's
        small operations, taking cycles from them (FedAvg's round on PFLlib's HAR work,
        2 workers, 2 cores: 5-12 % faster, docs/benchmarks.md).
        """
        self._maps += 1
        return self._replies(
            function, list(tasks), (self._maps, shared) if shared is not None else None
        )

    def _replies(
        self,
        function: Callable[..., Any],
        tasks: list[tuple[Any, ...]],
        shared: tuple[int, Any] | None,
    ) -> Iterator[Any]:
        busy: dict[int, int] = {}  # worker -> index of its task
        done: dict[int, tuple[bool, Any, str]] = {}
        sent = returned = 0
        if self._open_maps == 0:  # while the workers train (see `map`)
            self._threads = torch.get_num_threads()
            torch.set_num_threads(1)
        self._open_maps += 1
        try:
            while returned < len(tasks):
                while self._idle and sent < len(tasks):  # work first: no worker waits on us
                    self._send(self._idle.pop(), function, tasks[sent], shared, busy, sent)
                    sent += 1
                if returned in done:  # in the tasks' order, a task's error included
                    ok, value, trace = done.pop(returned)
                    returned += 1
                    if not ok:
                        raise value from WorkerTraceback(trace)
                    yield value
                    continue
                if not busy and not self._stale:  # every worker serves another open map
                    raise RuntimeError("WorkerPool.map: another map still holds every worker")
                for worker in self._ready(list(busy) + list(self._stale)):
                    reply = self._receive(worker)
                    if worker in self._stale:
                        self._stale.discard(worker)
                    else:
                        done[busy.pop(worker)] = reply
        finally:
            self._open_maps -= 1
            if self._open_maps == 0:
                torch.set_num_threads(self._threads)
            self._stale.update(busy)  # their replies are read, and dropped, by a later map

    def _send(
        self,
        worker: int,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        shared: tuple[int, Any] | None,
        busy: dict[int, int],
        index: int,
    ) -> None:
        fresh = shared is not None and self._holding.get(worker) != shared[0]
        value = shared[1] if fresh and shared is not None else None
        try:  # pickled whole before a byte is written
            self._pipes[worker].send((function, args, shared is not None, fresh, value))
        except OSError:
            self._dead(worker)
        except BaseException:
            self._idle.append(worker)  # unpicklable: nothing was written, the worker waits
            raise
        if shared is not None:
            self._holding[worker] = shared[0]
        else:  # the worker lets go of what it held
            self._holding.pop(worker, None)
        busy[worker] = index

    def _ready(self, workers: list[int]) -> list[int]:
        """The workers among `workers` with a reply to read; a dead one stops the run."""
        sentinels = {self.processes[w].sentinel: w for w in range(self.workers)}
        pipes = {self._pipes[w]: w for w in workers}
        ready = wait([*pipes, *sentinels])
        for item in ready:
            if item in sentinels:
                self._dead(sentinels[item])
        return [pipes[item] for item in ready if item in pipes]

    def _receive(self, worker: int) -> tuple[bool, Any, str]:
        """A worker's reply, read whole; the worker is idle again whatever it holds."""
        try:
            reply = self._pipes[worker].recv()
        except (EOFError, OSError):
            self._dead(worker)
        except Exception as error:  # read whole, but it does not unpickle here
            reply = (False, RuntimeError(f"a worker's reply could not be read: {error!r}"), "")
        self._idle.append(worker)
        return reply

    def _dead(self, worker: int) -> NoReturn:
        raise RunStopped(
            f"worker process {self.processes[worker].pid} died "
            f"({_death(self.processes[worker])}); the run keeps its last checkpoint "
            "(protofed run --resume DIR), or run with train.workers=1"
        )

    def close(self) -> None:
        """Stop every worker at once (a task in progress is abandoned)."""
        global _INHERITED
        for process in self.processes:
            if process.exitcode is None:
                process.terminate()
        for process in self.processes:
            process.join(timeout=10.0)
            if process.exitcode is None:
                process.kill()
                process.join()
        for pipe in self._pipes:
            pipe.close()
        self.processes, self._pipes, self._idle, self._stale = [], [], [], set()
        _INHERITED = None
