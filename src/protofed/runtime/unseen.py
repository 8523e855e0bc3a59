"""Unseen users (`eval.unseen_clients`): clients held out of training, scored every evaluated
round as a person who never took part would be served (docs/protocol.md, Unseen users).

`held_out` chooses them from the seed (a stream of its own, so nothing else shifts); the
round loop never samples them, the run's evaluator never sees their data (so neither does
`eval.selection`), and `UnseenScoring` scores them: the global model, and the model the
algorithm's own client procedure gives them (`finetuned_model`: `eval.finetune_epochs`
epochs of its `fit` on the client's training split, from an empty client state, through
`run_fit` as every engine trains a client). The fine-tuning runs on clones of the round's
message, under streams of their own (`UNSEEN_USERS`, keyed by round and client), inside a
forked torch RNG: the server state, the training clients' states and the training streams
stay exactly as without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from protofed.config import ExperimentConfig
from protofed.core.results import UnseenScores
from protofed.core.seeding import UNSEEN_USERS
from protofed.core.types import Arrays, Records, clone
from protofed.data.federated import FederatedData
from protofed.evaluation import Evaluator, per_segment_scores, summarize
from protofed.runtime.holdout import subset
from protofed.runtime.in_process import run_fit

if TYPE_CHECKING:
    from protofed.algorithms import Algorithm
    from protofed.models.base import FedModel
    from protofed.runtime.prepare import Prepared


def _records_copy(records: Records) -> Records:
    return {name: clone(arrays) for name, arrays in records.items()}


def finetuned_model(
    algorithm: Algorithm,
    model: FedModel,
    cfg: ExperimentConfig,
    fed: FederatedData,
    server: Records,
    client: int,
    server_round: int,
) -> Arrays:
    """The model unseen `client` would use after `server_round`: with `eval.finetune_epochs`
    E > 0, the algorithm's `fit` (through `run_fit`, E local epochs) on its training split
    from an empty state, on a copy of the message round `server_round` + 1 would send it,
    then the model it holds right after that fit (`trained_model`: a newcomer trains once
    and is served, no later round brings it a message); with E = 0, `client_model` with an
    empty state. Its streams are its own
    (`UNSEEN_USERS`, round, client) and the global torch RNG is restored afterwards."""
    epochs = cfg.eval.finetune_epochs
    following = server_round + 1
    if epochs == 0:
        return algorithm.client_model(algorithm.configure(server, client, following), {})
    tuned = cfg.model_copy(update={"train": cfg.train.model_copy(update={"local_epochs": epochs})})
    message = _records_copy(algorithm.configure(server, client, following))
    on_gpu = torch.device(cfg.train.device).type == "cuda"
    devices = [torch.cuda.current_device()] if on_gpu else []
    with torch.random.fork_rng(devices=devices):
        result = run_fit(
            algorithm,
            model,
            tuned,
            fed.clients[client],
            message,
            client,
            following,
            {},
            streams=(UNSEEN_USERS, server_round),
        )
    return algorithm.trained_model(message, result)


class UnseenScoring:
    """Scores the unseen clients of a run on their own test splits, each alone."""

    def __init__(self, prepared: Prepared, unseen: Sequence[int]) -> None:
        cfg = prepared.cfg
        self.prepared = prepared
        self.unseen = list(unseen)
        self.evaluator = Evaluator(
            subset(prepared.fed, self.unseen),
            prepared.model,
            cfg.eval.batch_size,
            generalization=False,
            seed=cfg.seed,
            f1_labels=cfg.eval.f1_labels,
        )

    def _scores(
        self, predict: Callable[[int, int, int], np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each unseen client's accuracy and macro-F1 of `predict(j, lo, hi)`'s predictions on
        its test split."""
        ev = self.evaluator
        pred = np.full(len(ev.test.y), -1, dtype=np.int64)
        for j, (lo, hi) in enumerate(ev.test.bounds):
            if hi > lo:
                pred[lo:hi] = predict(j, lo, hi)
        k, c = len(self.unseen), ev.fed.num_classes
        return per_segment_scores(ev.test.y, pred, ev.test.owner, k, c, ev.f1_labels)

    def score(
        self, server: Records, server_round: int, global_model: Arrays | None
    ) -> UnseenScores:
        """The round's unseen score: each unseen client's own model (fine-tuned as
        `finetuned_model` says) and the global model, on its test split."""
        p, ev = self.prepared, self.evaluator
        fed = p.fed

        def personalized(j: int, lo: int, hi: int) -> np.ndarray:
            weights = finetuned_model(
                p.algorithm, p.model, p.cfg, fed, server, self.unseen[j], server_round
            )
            return ev.predict_on(weights, "test", lo, hi)

        pers_acc, pers_f1 = self._scores(personalized)
        glob: tuple[np.ndarray, np.ndarray] | None = None
        if global_model is not None:
            glob = self._scores(lambda j, lo, hi: ev.predict_on(global_model, "test", lo, hi))
        return UnseenScores(
            clients=list(self.unseen),
            finetune_epochs=p.cfg.eval.finetune_epochs,
            personalized=summarize(pers_acc, pers_f1),
            global_=summarize(*glob) if glob is not None else None,
            pers_acc=_listed(pers_acc),
            pers_f1=_listed(pers_f1),
            global_acc=_listed(glob[0]) if glob is not None else [],
            global_f1=_listed(glob[1]) if glob is not None else [],
        )


def _listed(values: np.ndarray) -> list[float | None]:
    return [None if not np.isfinite(v) else float(v) for v in values.tolist()]
