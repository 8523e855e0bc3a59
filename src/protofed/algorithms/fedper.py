"""FedPer: federated base layers, personalized head (docs/algorithms/fedper.md)."""

from __future__ import annotations

from protofed.algorithms.base import MODEL, Arrays, Client, FitResult, Hyperparams, Metrics, Records
from protofed.algorithms.common.split import HEAD, HeadLocalAlgorithm, split_arrays
from protofed.training.stacked import StackedTask, Term


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

    # the same step stacked (train.stacked): the received body and its own head, trained whole
    def stacked_task(self, client: Client, message: Records, state: Records) -> StackedTask:
        return StackedTask({**message[MODEL], **self.local_head(state)})

    def stacked_term(self) -> Term | None:
        return None

    def stacked_result(
        self, message: Records, state: Records, weights: Arrays, metrics: Metrics
    ) -> FitResult:
        body, head = split_arrays(weights)
        return FitResult({MODEL: body}, metrics, {HEAD: head})
