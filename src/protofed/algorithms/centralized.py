"""Centralized training: one model on all clients' pooled training data.

The upper reference for a global model (no federation, no heterogeneity): as in the
"centralized" rows of FedAvg (McMahan et al., AISTATS 2017) and most pFL papers. With
`pools_data` set, the runtime presents one pooled client per round, whose training set is
the union of every client's; evaluation is still per client, with the one model.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

from protofed.algorithms._aggregate import weighted_mean
from protofed.algorithms.base import Algorithm, Arrays, Hyperparams, Metrics, Reply

if TYPE_CHECKING:
    from protofed.runtime.client import Client


class Centralized(Algorithm):
    name = "centralized"
    summary = "One model trained on all clients' pooled data (upper reference, no federation)."
    reference = (
        "Centralized training on pooled data (reference baseline, cf. McMahan et al., AISTATS 2017)"
    )
    has_global_model = True
    pools_data: ClassVar[bool] = True  # the runtime trains one pooled client per round

    class Params(Hyperparams):
        """No hyperparameters: a round is `train.local_epochs` epochs over the pooled data."""

    def fit(self, client: Client, message: Arrays, state: Arrays) -> tuple[Arrays, Metrics, Arrays]:
        client.load(message)
        metrics = client.train_model()
        metrics["num_examples"] = float(client.num_examples)
        return client.weights(), metrics, {}

    def aggregate(self, server: Arrays, replies: Iterable[Reply], round: int) -> Arrays:
        model, _ = weighted_mean(replies)  # one pooled reply: its weights
        return model
