"""The worker pool (`protofed.runtime.parallel`): how many workers a run takes, their
signals, a killed worker, exceptions, a map's shared value and the parent's threads."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch


@pytest.mark.parametrize(
    ("train", "omp", "cores", "clients", "expected"),
    [
        ({"workers": 1}, None, 16, 10, 1),  # explicit: serial
        ({"workers": 3}, None, 1, 2, 3),  # explicit: as asked
        ({}, None, 4, 10, 4),  # one per core this process may use
        ({}, None, 4, 3, 3),  # at most the round's clients
        ({}, None, 64, 100, 8),  # at most 8
        ({}, "3", 16, 10, 3),  # OMP_NUM_THREADS (a sweep's share)
        ({}, "junk", 5, 10, 5),  # an unreadable OMP_NUM_THREADS is ignored
        ({"threads": 2}, "6", 16, 10, 2),  # train.threads first
        ({"threads": 1}, None, 16, 10, 1),  # one thread: serial
        ({"device": "cuda"}, None, 16, 10, 1),  # a GPU: one process
    ],
)
def test_unset_workers_follow_the_cores(monkeypatch, train, omp, cores, clients, expected):
    from protofed.config import TrainConfig
    from protofed.runtime import parallel

    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    monkeypatch.setattr(parallel, "usable_cores", lambda: cores)
    assert parallel.resolve_workers(TrainConfig(**train), clients) == expected


def _signal_handlers(_inherited: object) -> tuple:
    return signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(signum)  # what ray.init installs


@pytest.mark.integration
def test_pool_workers_take_the_default_sigterm_whatever_the_parent_had():
    """After `ray.init` the parent's SIGTERM handler raises SystemExit: a worker that kept it
    would run the parent's exit hooks when the pool closes instead of dying."""
    from protofed.runtime.parallel import WorkerPool

    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        pool = WorkerPool(None, 2)
        try:
            got = list(pool.map(_signal_handlers, [(), (), ()]))
        finally:
            pool.close()  # terminates the workers: with the parent's handler, a hang
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert got == [(signal.SIG_DFL, signal.SIG_IGN)] * 3


@pytest.mark.integration
def test_a_sigterm_before_a_worker_reset_its_handlers_still_stops_it(monkeypatch):
    """A worker terminated while still starting (a loaded machine forks slowly) must die of
    the SIGTERM: had it reached the handler the worker inherited, Python would drop it and
    the worker would live on."""
    from protofed.runtime import parallel

    real = parallel._init_worker

    def slow(parent: int) -> None:
        time.sleep(1.0)  # the SIGTERM of pool.close() arrives before the worker's reset
        real(parent)

    monkeypatch.setattr(parallel, "_init_worker", slow)
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        pool = parallel.WorkerPool(None, 2)
        workers = list(pool.processes)
        closing = threading.Thread(target=pool.close, daemon=True)
        closing.start()
        closing.join(timeout=60)
        hung = closing.is_alive()
        for w in workers:  # never leave a worker behind, whatever happened
            if w.exitcode is None:
                os.kill(w.pid, signal.SIGKILL)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not hung, "pool.close() hung on a worker that ignored its SIGTERM"
    assert [w.exitcode for w in workers] == [-signal.SIGTERM] * 2


def _square_after(_inherited: object, value: int, seconds: float) -> int:
    time.sleep(seconds)
    return value * value


def _fail_on(_inherited: object, value: int) -> int:
    if value == 2:
        raise ValueError("client 2 is bad")
    return value


def _closes_within(pool, seconds: float) -> bool:
    closing = threading.Thread(target=pool.close, daemon=True)
    closing.start()
    closing.join(timeout=seconds)
    return not closing.is_alive()


@pytest.mark.integration
def test_a_pool_closes_after_its_workers_got_the_groups_sigterm():
    """`timeout` or a batch scheduler signals the whole process group: workers die while
    waiting for a task. With `multiprocessing.Pool` one of them held the task queue's lock
    and `terminate()` waited for it forever."""
    from protofed.runtime.parallel import WorkerPool

    pool = WorkerPool(None, 2)
    workers = list(pool.processes)
    try:
        assert list(pool.map(_square_after, [(i, 0.0) for i in range(5)])) == [0, 1, 4, 9, 16]
        for w in workers:  # idle, each waiting for its next task
            os.kill(w.pid, signal.SIGTERM)
        for w in workers:
            w.join(timeout=30)
        closed = _closes_within(pool, 30)
    finally:
        for w in workers:
            if w.exitcode is None:
                os.kill(w.pid, signal.SIGKILL)
    assert closed, "pool.close() hung after its workers were killed"


@pytest.mark.integration
def test_a_worker_killed_mid_task_stops_the_run_in_one_line():
    """The out-of-memory killer's SIGKILL: a clear RunStopped, not a round that never ends."""
    from protofed.errors import RunStopped
    from protofed.runtime.parallel import WorkerPool

    pool = WorkerPool(None, 2)
    try:
        replies = pool.map(_square_after, [(i, 30.0) for i in range(4)])
        threading.Timer(2.0, os.kill, (pool.processes[0].pid, signal.SIGKILL)).start()
        with pytest.raises(RunStopped, match="killed by SIGKILL"):
            list(replies)
    finally:
        assert _closes_within(pool, 30)


@pytest.mark.integration
def test_a_workers_exception_keeps_its_type_and_the_pool_goes_on():
    """A task's exception reaches the caller as raised (a ConfigError stays one line), with
    the worker's traceback as its cause; replies an abandoned map still owed are dropped."""
    from protofed.runtime.parallel import WorkerPool, WorkerTraceback

    pool = WorkerPool(None, 2)
    try:
        with pytest.raises(ValueError, match="client 2 is bad") as caught:
            list(pool.map(_fail_on, [(i,) for i in range(6)]))
        assert isinstance(caught.value.__cause__, WorkerTraceback)
        assert "_fail_on" in str(caught.value.__cause__)
        first = pool.map(_square_after, [(i, 0.3) for i in range(4)])
        assert next(first) == 0
        del first  # abandoned with a task still running
        assert list(pool.map(_square_after, [(i, 0.0) for i in range(7)])) == [
            i * i for i in range(7)
        ]
        # a task that cannot be pickled loses no worker
        for _ in range(3):
            with pytest.raises(AttributeError, match="pickle"):
                list(pool.map(_square_after, [(lambda: 0, 0.0)]))
        assert list(pool.map(_square_after, [(i, 0.0) for i in range(4)])) == [0, 1, 4, 9]
        # every worker is idle, or owes a dropped reply of the abandoned map (a slow task)
        assert sorted([*pool._idle, *pool._stale]) == [0, 1]
    finally:
        pool.close()


_UNPICKLED = [0]  # in each worker: how many `Factor`s it has unpickled


def _rebuild_factor(value: int) -> Factor:
    _UNPICKLED[0] += 1
    return Factor(value)


class Factor:
    """A shared value that counts, where it is unpickled, how often it crossed."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self):
        return _rebuild_factor, (self.value,)


def _shared_times(_inherited: object, shared: Factor, value: int) -> tuple[int, int]:
    """The value times the map's shared factor, and how many factors this worker received."""
    return value * shared.value, _UNPICKLED[0]


@pytest.mark.integration
def test_a_maps_shared_value_crosses_once_to_each_worker():
    """`map(..., shared=...)`: the shared value reaches each worker once per map, a task
    without one gets none, and a second map's value replaces the first's."""
    from protofed.runtime.parallel import WorkerPool

    pool = WorkerPool(None, 2)
    try:
        got = list(pool.map(_shared_times, [(i,) for i in range(8)], shared=Factor(3)))
        assert [v for v, _ in got] == [3 * i for i in range(8)]
        assert {crossed for _, crossed in got} <= {1}  # once to each worker, not per task
        assert list(pool.map(_square_after, [(i, 0.0) for i in range(4)])) == [0, 1, 4, 9]
        got = list(pool.map(_shared_times, [(i,) for i in range(6)], shared=Factor(5)))
        assert [v for v, _ in got] == [5 * i for i in range(6)]
        assert {crossed for _, crossed in got} <= {1, 2}
        # an empty shared value is still one (a round's server state may be empty)
        assert list(pool.map(_shared_len, [(1,), (2,)], shared={})) == [1, 2]
    finally:
        pool.close()


def _shared_len(_inherited: object, shared: dict, value: int) -> int:
    return len(shared) + value


@pytest.mark.integration
def test_a_map_that_finds_every_worker_taken_says_so():
    """Two maps open at once, the first holding both workers: an error, not a wait forever."""
    from protofed.runtime.parallel import WorkerPool

    pool = WorkerPool(None, 2)
    try:
        first = pool.map(_square_after, [(i, 0.2) for i in range(4)])
        assert next(first) == 0  # its next two tasks went out before this reply came back
        with pytest.raises(RuntimeError, match="another map"):
            list(pool.map(_square_after, [(5, 0.0)]))
        assert list(first) == [1, 4, 9]
    finally:
        pool.close()


@pytest.mark.integration
def test_a_worker_killed_between_rounds_is_named_on_the_next_one():
    """The out-of-memory killer strikes an idle worker: the next map says so in one line."""
    from protofed.errors import RunStopped
    from protofed.runtime.parallel import WorkerPool

    pool = WorkerPool(None, 2)
    try:
        assert list(pool.map(_square_after, [(3, 0.0)])) == [9]
        pool.processes[1].kill()
        pool.processes[1].join(timeout=30)
        with pytest.raises(RunStopped, match="SIGKILL"):
            list(pool.map(_square_after, [(i, 0.0) for i in range(4)]))
    finally:
        assert _closes_within(pool, 30)


def _threads(_inherited: object) -> int:
    return torch.get_num_threads()


@pytest.mark.integration
def test_the_parent_runs_one_thread_while_a_map_is_open_and_gets_its_own_back():
    """While workers train, a second OpenMP thread in the parent only takes their cycles; the
    parent's count comes back when the last open map ends, however maps interleave."""
    from protofed.runtime.parallel import WorkerPool

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    pool = WorkerPool(None, 2)
    try:
        first = pool.map(_square_after, [(1, 0.0), (2, 0.0)])
        assert next(first) == 1 and torch.get_num_threads() == 1
        second = pool.map(_threads, [(), ()])
        assert next(second) == 1  # the workers' own: single-threaded
        assert list(first) == [4] and torch.get_num_threads() == 1  # `second` is still open
        assert list(second) == [1] and torch.get_num_threads() == 2
    finally:
        pool.close()
        torch.set_num_threads(before)
