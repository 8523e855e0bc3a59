"""FedAvg (McMahan et al., AISTATS 2017): local SGD, then the sample-weighted mean of models."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from protofed.algorithms.common.aggregation import weighted_mean
from protofed.algorithms.base import Algorithm, Arrays, Metrics, Reply

if TYPE_CHECKING:
    from protofed.training.client import Client


class FedAvg(Algorithm):
    name = "fedavg"
    summary = "Federated averaging: local SGD, sample-weighted mean of the models."
    reference = "McMahan et al., Communication-Efficient Learning of Deep Networks from Decentralized Data, AISTATS 2017"
    ala_local = "reply"  # ALA plug-in: the local model is the one the client trained last

    def fit(self, client: Client, message: Arrays, state: Arrays) -> tuple[Arrays, Metrics, Arrays]:
        client.load(message)
        metrics = client.train_model()
        metrics["num_examples"] = float(client.num_examples)
        return client.weights(), metrics, {}

    def aggregate(self, server: Arrays, replies: Iterable[Reply], round: int) -> Arrays:
        model, _ = weighted_mean(replies)
        return model
