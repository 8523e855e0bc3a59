"""FedAvg: local SGD, then the sample-weighted mean of the models (docs/algorithms/fedavg.md)."""

from __future__ import annotations

from protofed.algorithms.base import MODEL, Algorithm, Arrays, Client, FitResult, Metrics, Records
from protofed.training.stacked import StackedTask, Term


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

    # the same step stacked (train.stacked): the sent model, cross-entropy, the weights back
    def stacked_task(self, client: Client, message: Records, state: Records) -> StackedTask:
        return StackedTask(message[MODEL])

    def stacked_term(self) -> Term | None:
        return None

    def stacked_result(
        self, message: Records, state: Records, weights: Arrays, metrics: Metrics
    ) -> FitResult:
        return FitResult({MODEL: weights}, metrics)
