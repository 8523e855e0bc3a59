"""Server-side evaluation: every client's model scored where all the data is (simulation).

The round loop asks an evaluation mode for a round's scores. This one holds every client's
splits (`protofed.evaluation.Evaluator`), so it reports personalization, generalization and
the global score; a deployment scores on the clients instead (`protofed.flower.deployment`).
With `data.dynamic`, a round is scored on the clients' views of that round's data. With
`eval.unseen_clients`, those three scores (and the validation score that selects rounds)
cover the training clients only, and the held-out ones get their own, `unseen`
(runtime/unseen.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Protocol

import numpy as np
import torch

from protofed.core.results import RoundScores
from protofed.core.types import Arrays, Records
from protofed.data.federated import FederatedData
from protofed.evaluation import Evaluator, PredictMany, Spec
from protofed.runtime.holdout import subset
from protofed.runtime.parallel import WorkerPool
from protofed.runtime.prepare import Prepared
from protofed.runtime.unseen import UnseenScoring


class ClientModels(Protocol):
    def client_models(self, server: Records, server_round: int) -> Callable[[int], Arrays]: ...


def build_evaluator(prepared: Prepared, fed: FederatedData | None = None) -> Evaluator:
    """The run's evaluator (of `fed`, by default the whole data; its training clients only,
    `Prepared.training`, where some are unseen), with its eval settings."""
    cfg = prepared.cfg
    e = cfg.eval
    return Evaluator(
        subset(fed if fed is not None else prepared.fed, prepared.training),
        prepared.model,
        e.batch_size,
        e.generalization,
        generalization_samples=e.generalization_samples,
        seed=cfg.seed,
        f1_labels=e.f1_labels,
        stacked_models=e.stacked_models,
    )


_WORKER_EVALUATOR: tuple[int, Evaluator] | None = None
"""A worker's own evaluator, built on its first task from its fork of the run: each worker
holds its own copy of the test and validation unions (the pool is forked before the
evaluator exists), e.g. 4,000 CIFAR-10 test images, about 50 MB, per worker."""


def _predict_in_worker(
    prepared: Prepared, weights: dict[str, np.ndarray], specs: list[Spec]
) -> list[np.ndarray]:
    global _WORKER_EVALUATOR
    if _WORKER_EVALUATOR is None or _WORKER_EVALUATOR[0] != id(prepared):
        _WORKER_EVALUATOR = (id(prepared), build_evaluator(prepared))
    evaluator = _WORKER_EVALUATOR[1]
    model = {k: torch.from_numpy(v) for k, v in weights.items()}
    return [evaluator.predict_on(model, *spec) for spec in specs]


def predict_in(pool: WorkerPool) -> PredictMany:
    """`Evaluator.evaluate`'s `predict_many` on the run's worker processes: each worker
    scores whole models (single-threaded, as it trains), so a round's distinct client models
    are scored `pool.workers` at a time. The weights travel as numpy arrays, copied: as
    tensors they would be moved to shared memory in place, and every kept model (Local's,
    `eval.client_model=trained`) would hold a file descriptor per tensor from then on."""

    def predict_many(jobs: list[tuple[Arrays, list[Spec]]]) -> Iterable[list[np.ndarray]]:
        plain = [({k: v.detach().cpu().numpy() for k, v in w.items()}, specs) for w, specs in jobs]
        return pool.map(_predict_in_worker, plain)

    return predict_many


class ServerSideEvaluation:
    """Scores the client models a transport obtains (built here from the states it keeps,
    or fetched from the clients) and the global model, on the server's copy of the data."""

    def __init__(
        self, prepared: Prepared, transport: ClientModels, pool: WorkerPool | None = None
    ) -> None:
        """`pool`: the engine's worker processes, which score the models where given."""
        self.prepared = prepared
        self.transport = transport
        self.pool = pool
        self.evaluator = self._evaluator(prepared.fed)
        self._staged: tuple[int, Evaluator] | None = None
        self.unseen = UnseenScoring(prepared, prepared.unseen) if prepared.unseen else None

    def _evaluator(self, fed: FederatedData) -> Evaluator:
        return build_evaluator(self.prepared, fed)

    def evaluator_for(self, server_round: int) -> Evaluator:
        """The evaluator of `server_round`'s data: with data.dynamic, the clients' views that
        round (rebuilt when the schedule gives classes back), else the whole data."""
        dyn = self.prepared.dynamic
        if dyn is None:
            return self.evaluator
        stage = dyn.stage(server_round)
        if self._staged is None or self._staged[0] != stage:
            self._staged = (stage, self._evaluator(dyn.federated(self.prepared.fed, server_round)))
        return self._staged[1]

    def evaluate(self, server: Records, server_round: int) -> RoundScores:
        """The scores of the models after `server_round` (see `Evaluator.evaluate`), on the
        engine's worker processes where it gave them (not with data.dynamic: a worker holds
        the whole data only; not where models predict stacked, `eval.stacked_models` > 1)."""
        pool = self.pool
        evaluator = self.evaluator_for(server_round)
        use_pool = pool is not None and self.prepared.dynamic is None
        alone = evaluator.stacked_models == 1
        many = predict_in(pool) if pool is not None and use_pool and alone else None
        models = self.transport.client_models(server, server_round)
        global_model = self.prepared.algorithm.global_model(server)
        training = self.prepared.training
        scores = evaluator.evaluate(
            (lambda i: models(training[i])) if self.unseen is not None else models,
            global_model,
            predict_many=many,
            workers=pool.workers if many is not None and pool is not None else 1,
        )
        if self.unseen is None:
            return scores
        return replace(
            scores,
            clients=replace(scores.clients, client_ids=list(training)),
            unseen=self.unseen.score(server, server_round, global_model),
        )
