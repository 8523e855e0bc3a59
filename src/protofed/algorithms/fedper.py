"""FedPer (Arivazhagan et al., 2019): federated base layers, personalized head.

Clients train the whole model locally, but only the base layers (here the `features` body)
are sent and averaged; each client keeps its classifier head. The client's model is the
received body plus its own head. There is no global model: the averaged feature extractor
alone cannot classify, and no head is shared to pair it with.
"""

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
