"""FedAvg: local SGD, then the sample-weighted mean of the models (docs/algorithms/fedavg.md)."""

from __future__ import annotations

from protofed.algorithms.base import MODEL, Algorithm, Client, FitResult, Records
from protofed.training.stacked import StackedTask, Trainer


class FedAvg(Algorithm):
    name = "fedavg"
    summary = "Federated averaging: local SGD, sample-weighted mean of the models."
    reference = "McMahan et al., Communication-Efficient Learning of Deep Networks from Decentralized Data, AISTATS 2017"
    ala_local = "reply"  # ALA plug-in: the local model is the one the client trained last
    stackable = True

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(message[MODEL])
        metrics = client.train_model()
        return FitResult({MODEL: client.weights()}, metrics)

    def stacked_fit(
        self, clients: list[Client], messages: list[Records], states: list[Records], train: Trainer
    ) -> list[FitResult]:
        """`fit` for a round's clients stacked: the sent model, cross-entropy, weights back."""
        trained = train([StackedTask(message[MODEL]) for message in messages])
        return [FitResult({MODEL: weights}, metrics) for weights, metrics in trained]
