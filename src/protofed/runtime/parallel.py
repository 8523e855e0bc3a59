"""Client training in worker processes: the built-in engine's parallelism.

Clients of a round are independent, so `train.workers = N` trains them in N processes, each
single-threaded. On a small CPU this beats intra-op threads by a wide margin: the per-step
kernels of federated models are too small for two threads to share, while two processes each
keep one client's weights hot in their own cache.

Workers are forked after `prepare`, so they inherit the data, the model and the algorithm
and receive per task only what changes: the server state, the client's state, the round.
Tensors cross through shared memory (torch.multiprocessing), never through files. The
results come back in the order the clients were sampled, so aggregation sums in the same
order as the serial engine.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.multiprocessing  # noqa: F401  (registers shared-memory reductions for tensors)

from protofed.training.client import Client
from protofed.runtime.dynamic import client_data
from protofed.core.seeding import CLIENT_TRAIN, derive_seed, torch_generator

if TYPE_CHECKING:
    from protofed.algorithms.base import Algorithm, Arrays, Metrics
    from protofed.config import ExperimentConfig
    from protofed.data.federated import ClientData
    from protofed.models.base import FedModel
    from protofed.runtime.simulation import Prepared

_WORKER: tuple[Prepared, ClientData | None] | None = None


def nbytes(arrays: Arrays) -> int:
    """Bytes on the wire for a message: the tensors' payload."""
    return sum(t.numel() * t.element_size() for t in arrays.values())


def fit_client(
    prepared: Prepared, pooled: ClientData | None, server: Arrays, cid: int, round: int, state: Arrays
) -> tuple[Arrays, Metrics, Arrays, int]:
    """One client's part of a round: configure, seed, fit. The same code in every engine."""
    message = prepared.algorithm.configure(server, cid, round)
    data = pooled if cid < 0 else client_data(prepared.fed, prepared.dynamic, cid, round)
    arrays, metrics, new_state = fit_message(
        prepared.algorithm, prepared.model, prepared.cfg, data, message, cid, round, state
    )
    return arrays, metrics, new_state, nbytes(message)


def fit_message(
    algorithm: Algorithm, model: FedModel, cfg: ExperimentConfig, data: ClientData,
    message: Arrays, cid: int, round: int, state: Arrays,
) -> tuple[Arrays, Metrics, Arrays]:
    """The client's side of a round once the message is there: seed, then `fit`.

    Shared by the built-in engine and the Flower ClientApp, so a client draws the same
    batches and dropout masks wherever it runs (streams keyed by seed, round and client).
    """
    seed = cfg.seed
    torch.manual_seed(derive_seed(seed, CLIENT_TRAIN, round, cid + 1, 1))  # dropout masks
    client = Client(
        id=cid,
        data=data,
        model=model,
        train=cfg.train,
        round=round,
        generator=torch_generator(seed, CLIENT_TRAIN, round, cid + 1),
    )
    return algorithm.fit(client, message, state)


def _init_worker() -> None:
    torch.set_num_threads(1)


def _task(args: tuple) -> tuple:
    assert _WORKER is not None, "worker started without a prepared experiment"
    prepared, pooled = _WORKER
    t0 = time.perf_counter()
    result = fit_client(prepared, pooled, *args)
    return (*result, time.perf_counter() - t0)


class WorkerPool:
    """A pool of forked, single-threaded training processes for one simulation."""

    def __init__(self, prepared: Prepared, pooled: ClientData | None, workers: int) -> None:
        global _WORKER
        if "fork" not in mp.get_all_start_methods():
            raise RuntimeError("train.workers > 1 needs the 'fork' start method (Linux, macOS)")
        _WORKER = (prepared, pooled)  # inherited by the forked children
        self._pool = mp.get_context("fork").Pool(workers, initializer=_init_worker)

    def run(self, server: Arrays, round: int, jobs: list[tuple[int, Arrays]]) -> Iterator[tuple]:
        """Results of `fit_client` for each (client, state), in the order given."""
        return self._pool.imap(_task, [(server, cid, round, state) for cid, state in jobs])

    def close(self) -> None:
        global _WORKER
        self._pool.terminate()
        self._pool.join()
        _WORKER = None
