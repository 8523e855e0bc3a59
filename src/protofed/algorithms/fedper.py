"""FedPer: federated base layers, personalized head (docs/algorithms/fedper.md)."""

from __future__ import annotations

from protofed.algorithms.base import Client, FitResult, Hyperparams, Records
from protofed.algorithms.common.split import HeadLocalAlgorithm


class FedPer(HeadLocalAlgorithm):
    name = "fedper"
    summary = "Shared feature extractor averaged as FedAvg; each client keeps its own head."
    reference = (
        "Arivazhagan et al., Federated Learning with Personalization Layers, arXiv:1912.00818, 2019"
    )
    has_global_model = False

    class Params(Hyperparams):
        """No hyperparameters: the personalization layers are the model's `head`."""

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        self.start(client, message, state)
        metrics = client.train_model()
        reply, kept = self.finish(client)
        return FitResult(reply, metrics, kept)
