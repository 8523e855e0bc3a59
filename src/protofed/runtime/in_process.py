"""The in-process transport: clients trained in this process or in its worker pool.

A transport is how a round's messages reach the clients and their replies come back
(`runtime.loop.Transport`). This one trains the clients itself, so it owns their states:
they live in `states`, and the round loop checkpoints them. With `eval.client_model=trained`
it also keeps, in `trained`, the model each client held right after its last local training
(`Algorithm.trained_model`), checkpointed beside the states. Clients are trained lazily, as
the aggregation consumes the replies, so a weighted mean over 1,000 clients never holds
1,000 models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from protofed.algorithms import Algorithm
from protofed.config import ExperimentConfig
from protofed.core.seeding import CLIENT_TRAIN, derive_seed, torch_generator
from protofed.core.types import (
    Arrays,
    Checked,
    Delivery,
    FitResult,
    Records,
    Reply,
    check_result,
    clone,
    nbytes,
)
from protofed.data.federated import ClientData
from protofed.models.base import FedModel
from protofed.privacy import released_examples
from protofed.runtime.nonfinite import checked
from protofed.runtime.parallel import WorkerPool
from protofed.runtime.prepare import Prepared
from protofed.runtime.stacking import adapter_for, stack_reason
from protofed.runtime.stacking import stacked_reason as stacked_reason  # importable here too
from protofed.training.client import Client
from protofed.training.stacked import StackedTrainer

unstackable = stack_reason  # the name `protofed list` imports it by (cli/catalog.py)

STACK_GROUP = 100
"""The most clients trained stacked at once: a round of more trains in groups of this many,
so memory grows with the group, not with the round."""


def client_context(
    cfg: ExperimentConfig,
    model: FedModel,
    data: ClientData,
    client: int,
    server_round: int,
    streams: tuple[int, ...] | None = None,
) -> Client:
    """What `fit` is handed for `client` this round, its streams seeded from (seed, round,
    client): its generator (batch order) and torch's global one (dropout masks). `streams`:
    the keys that replace (CLIENT_TRAIN, round) before the client's (an unseen client's
    fine-tuning, runtime/unseen.py)."""
    seed = cfg.seed
    keys = (CLIENT_TRAIN, server_round) if streams is None else streams
    torch.manual_seed(derive_seed(seed, *keys, client + 1, 1))  # dropout
    return Client(
        id=client,
        data=data,
        model=model,
        train=cfg.train,
        server_round=server_round,
        generator=torch_generator(seed, *keys, client + 1),
    )


def run_fit(
    algorithm: Algorithm,
    model: FedModel,
    cfg: ExperimentConfig,
    data: ClientData,
    message: Records,
    client: int,
    server_round: int,
    state: Records,
    streams: tuple[int, ...] | None = None,
) -> FitResult:
    """The client's side of a round once the message is there: seed, then `fit`.

    Shared by every engine (the Flower ClientApp too), so a client draws the same batches
    and dropout masks wherever it runs (streams keyed by seed, round and client; `streams`,
    see `client_context`).
    """
    context = client_context(cfg, model, data, client, server_round, streams)
    result = algorithm.fit(context, message, state)
    check_result(result, "fit", type(algorithm).__name__)
    return result


def keeps_trained(cfg: ExperimentConfig) -> bool:
    """Whether clients are scored with the model they trained (`eval.client_model`)."""
    return cfg.eval.client_model == "trained"


def fit_client(
    prepared: Prepared, server: Records, client: int, server_round: int, state: Records
) -> FitResult:
    """One client's part of a round in this process: configure, then `run_fit`."""
    return fit_and_count(prepared, server, client, server_round, state)[0]


def fit_and_count(
    prepared: Prepared,
    server: Records,
    client: int,
    server_round: int,
    state: Records,
    data: ClientData | None = None,
) -> tuple[FitResult, int, Arrays | None]:
    """`fit_client`, the bytes of the message the client was sent, and the model it holds
    after training where the run keeps it (else None). Built here, where the message is
    (in a worker too: its tensors shared with the reply and the state come back once).
    `data`: what the client trains on (default: its own split of the round)."""
    algorithm = prepared.algorithm
    message = algorithm.configure(server, client, server_round)
    if data is None:
        data = prepared.client_data(client, server_round)
    result = run_fit(
        algorithm, prepared.model, prepared.cfg, data, message, client, server_round, state
    )
    trained = algorithm.trained_model(message, result) if keeps_trained(prepared.cfg) else None
    return result, nbytes(message), trained


def fit_and_check(
    prepared: Prepared, server: Records, client: int, server_round: int, state: Records
) -> tuple[FitResult, int, Arrays | None, Checked]:
    """`fit_and_count` and the reply's non-finite check, run where the client trained (in a
    worker, on its own core, while the reply is still in that core's cache)."""
    result, down, trained = fit_and_count(prepared, server, client, server_round, state)
    return result, down, trained, checked(result.reply)


def fit_stacked(
    prepared: Prepared,
    server: Records,
    clients: list[int],
    server_round: int,
    states: list[Records],
) -> list[tuple[FitResult, int, Arrays | None]]:
    """`fit_and_count` for every client in `clients`, trained stacked (training/stacked.py,
    through the algorithm's registered round, runtime/stacking): each client's reply, the
    bytes of its message and the model it keeps, in order."""
    algorithm, cfg = prepared.algorithm, prepared.cfg
    stacked_fit = adapter_for(algorithm)
    messages = [algorithm.configure(server, c, server_round) for c in clients]
    contexts = [
        client_context(cfg, prepared.model, prepared.client_data(c, server_round), c, server_round)
        for c in clients
    ]
    trained = stacked_fit(
        algorithm, contexts, messages, states, StackedTrainer(prepared.model, contexts)
    )
    if len(trained) != len(clients):
        raise TypeError(f"{type(algorithm).__name__}'s stacked round: one result per client")
    out = []
    for message, result in zip(messages, trained, strict=True):
        check_result(result, "fit", type(algorithm).__name__)
        kept = algorithm.trained_model(message, result) if keeps_trained(cfg) else None
        out.append((result, nbytes(message), kept))
    return out


class InProcessTransport:
    """Trains the sampled clients here, serially, in `workers` forked processes, or stacked
    (`stacked`: all of a round's clients at once, in this process; decided once per run from
    `train.stacked` by `runtime.stacking.use_stacked`, which the engine calls)."""

    name = "builtin"

    def __init__(self, prepared: Prepared, workers: int = 1, stacked: bool = False) -> None:
        self.prepared = prepared
        self.stacked = stacked
        self.states: dict[int, Records] = {}  # client id -> what its last `fit` kept
        # client id -> its model right after its last `fit` (eval.client_model=trained)
        self.trained: dict[int, Arrays] | None = {} if keeps_trained(prepared.cfg) else None
        parallel = workers > 1 and prepared.cfg.train.device == "cpu" and not self.stacked
        self.pool = WorkerPool(prepared, workers) if parallel else None
        self.workers = workers if parallel else 1  # processes training clients (1: serial)

    def state_of(self, client: int) -> Records:
        return self.states.get(client, {})

    def fit(self, server: Records, server_round: int, clients: list[int]) -> Iterator[Delivery]:
        """Each sampled client's reply and the bytes each way, lazily, in sampling order."""
        if self.stacked:
            yield from self.fit_stacked(server, server_round, clients)
            return
        p = self.prepared
        tasks = [(cid, server_round, self.state_of(cid)) for cid in clients]
        if self.pool is not None:
            results = self.pool.map(fit_and_check, tasks, shared=server)
        else:
            results = (fit_and_check(p, server, *task) for task in tasks)
        for cid, (result, down, trained, check) in zip(clients, results, strict=True):
            self.keep(cid, result, trained)
            yield self.delivery(cid, server_round, result, down, check)

    def fit_stacked(
        self, server: Records, server_round: int, clients: list[int]
    ) -> Iterator[Delivery]:
        """`fit` with the clients trained stacked, `STACK_GROUP` at a time."""
        for first in range(0, len(clients), STACK_GROUP):
            group = clients[first : first + STACK_GROUP]
            states = [self.state_of(cid) for cid in group]
            results = fit_stacked(self.prepared, server, group, server_round, states)
            for cid, (result, down, trained) in zip(group, results, strict=True):
                self.keep(cid, result, trained)
                yield self.delivery(cid, server_round, result, down, checked(result.reply))

    def delivery(
        self, client: int, server_round: int, result: FitResult, down: int, check: Checked
    ) -> Delivery:
        """A client's reply with its example count, the bytes each way, and its non-finite
        check (timed where it ran: its share of the wall clock is that time over the
        processes checking in parallel)."""
        examples = len(self.prepared.client_data(client, server_round).train_y)
        count = released_examples(self.prepared.cfg.privacy.enabled, examples)
        reply = Reply(client, result.reply, result.metrics, count)
        share = Checked(check.bad, check.wall_s / self.workers)
        return Delivery(reply, down, nbytes(result.reply), share)

    def keep(self, client: int, result: FitResult, trained: Arrays | None) -> None:
        """What the runtime keeps of a client's `fit`: its state, and its trained model."""
        if result.state:
            self.states[client] = result.state
        else:
            self.states.pop(client, None)
        if self.trained is not None and trained is not None:
            # from a worker, every tensor is a shared-memory segment holding a file
            # descriptor while it lives: a private copy keeps clients x tensors
            # descriptors from piling up (a FedAli run would pass a 1,024 limit)
            self.trained[client] = trained if self.pool is None else clone(trained)

    def client_models(self, server: Records, server_round: int) -> Callable[[int], Arrays]:
        """Client i's personalized weights after `server_round`, built here from its state
        (or the model it kept after training, `eval.client_model=trained`)."""
        algorithm = self.prepared.algorithm
        trained = self.trained or {}

        def client_model(i: int) -> Arrays:
            if i in trained:  # a client that never trained is scored with what it receives
                return trained[i]
            message = algorithm.configure(server, i, server_round + 1)
            return algorithm.client_model(message, self.state_of(i))

        return client_model

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


POOL = -1
"""The pooled client's id in its replies and state: outside every client population."""


class PooledTransport(InProcessTransport):
    """The centralized reference (`Algorithm.pools_data`): each round one client that holds
    every client's training data trains here, whichever clients were sampled; nothing
    crosses a network, so no bytes are counted. Clients are scored as usual, each with
    the model the algorithm gives it."""

    def __init__(self, prepared: Prepared) -> None:
        super().__init__(prepared, workers=1)
        if prepared.pooled is None:
            raise ValueError(f"'{prepared.algorithm.name}' does not pool its clients' data")
        self.data = prepared.pooled

    def fit(self, server: Records, server_round: int, clients: list[int]) -> Iterator[Delivery]:
        """The pooled client's reply (one per round; `clients` only say the round happens)."""
        p, state = self.prepared, self.state_of(POOL)
        result, _, trained = fit_and_count(p, server, POOL, server_round, state, self.data)
        self.keep(POOL, result, trained)
        examples = float(len(self.data.train_y))
        reply = Reply(POOL, result.reply, result.metrics, examples)
        yield Delivery(reply, 0, 0, checked(result.reply))
