"""FedPer: federated base layers, personalized head (docs/algorithms/fedper.md)."""

from __future__ import annotations

from protofed.algorithms.base import MODEL, Client, FitResult, Hyperparams, Records
from protofed.algorithms.common.split import HEAD, HeadLocalAlgorithm, split_arrays
from protofed.training.stacked import StackedTask, Trainer


class FedPer(HeadLocalAlgorithm):
    name = "fedper"
    summary = "Shared feature extractor averaged as FedAvg; each client keeps its own head."
    reference = (
        "Arivazhagan et al., Federated Learning with Personalization Layers, arXiv:1912.00818, 2019"
    )
    has_global_model = False
    stackable = True

    class Params(Hyperparams):
        """No hyperparameters: the personalization layers are the model's `head`."""

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        self.start(client, message, state)
        metrics = client.train_model()
        reply, kept = self.finish(client)
        return FitResult(reply, metrics, kept)

    def stacked_fit(
        self, clients: list[Client], messages: list[Records], states: list[Records], train: Trainer
    ) -> list[FitResult]:
        """`fit` stacked: the received body and the client's own head, trained whole."""
        tasks = [
            StackedTask({**m[MODEL], **self.local_head(s)})
            for m, s in zip(messages, states, strict=True)
        ]
        results = []
        for weights, metrics in train(tasks):
            body, head = split_arrays(weights)
            results.append(FitResult({MODEL: body}, metrics, {HEAD: head}))
        return results
