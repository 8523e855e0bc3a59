"""Worker processes: the built-in engine's parallelism, and nothing else.

Clients of a round are independent, so `train.workers = N` trains them in N processes, each
single-threaded. On a small CPU this beats intra-op threads by a wide margin: the per-step
kernels of federated models are too small for two threads to share, while two processes each
keep one client's weights hot in their own cache.

Workers are forked once, so they inherit what the pool was given (the data, the model, the
algorithm) and receive per task only what changes. Tensors cross through shared memory
(torch.multiprocessing), never through files. Results come back in the order of the tasks.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401  (registers shared-memory reductions for tensors)

_INHERITED: Any = None  # what the forked workers inherit (set before the fork)


def _init_worker() -> None:
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
        self._pool = mp.get_context("fork").Pool(workers, initializer=_init_worker)

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
