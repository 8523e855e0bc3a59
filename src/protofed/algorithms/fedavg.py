"""FedAvg: local SGD, then the sample-weighted mean of the models (docs/algorithms/fedavg.md)."""

from __future__ import annotations

from protofed.algorithms.base import MODEL, Algorithm, Client, FitResult, Records


class FedAvg(Algorithm):
    name = "fedavg"
    summary = "Federated averaging: local SGD, sample-weighted mean of the models."
    reference = "McMahan et al., Communication-Efficient Learning of Deep Networks from Decentralized Data, AISTATS 2017"
    ala_local = "reply"  # ALA plug-in: the local model is the one the client trained last

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(message[MODEL])
        metrics = client.train_model()
        return FitResult({MODEL: client.weights()}, metrics)
