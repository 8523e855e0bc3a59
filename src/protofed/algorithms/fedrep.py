"""FedRep: shared representation, local heads, trained in turn (docs/algorithms/fedrep.md)."""

from __future__ import annotations

from pydantic import Field

from protofed.algorithms.base import Client, FitResult, Hyperparams, Metrics, Records
from protofed.algorithms.common.split import (
    HeadLocalAlgorithm,
    body_parameters,
    head_parameters,
)


class FedRep(HeadLocalAlgorithm):
    name = "fedrep"
    summary = "Shared body, local heads: train the head (body frozen), then the body (head frozen)."
    reference = "Collins et al., Exploiting Shared Representations for Personalized Federated Learning, ICML 2021"
    has_global_model = False
    ala_local = "reply"  # ALA plug-in: the local model is the body the client trained last

    class Params(Hyperparams):
        head_epochs: int = Field(
            10, ge=0, description="Epochs training the local head, body frozen (paper: 10)."
        )
        body_epochs: int | None = Field(
            None,
            ge=0,
            description="Epochs training the shared body, head frozen; None: train.local_epochs.",
        )

    params: Params

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        self.start(client, message, state)
        model = client.model
        head_epochs = self.params.head_epochs
        body_epochs = self.params.body_epochs
        if body_epochs is None:
            body_epochs = client.train.local_epochs
        metrics: Metrics = {"steps": 0.0}
        if head_epochs > 0:
            m = client.train_model(epochs=head_epochs, parameters=head_parameters(model))
            metrics["head_loss"] = metrics["loss"] = m["loss"]
            metrics["steps"] += m["steps"]
        if body_epochs > 0:
            m = client.train_model(epochs=body_epochs, parameters=body_parameters(model))
            metrics["body_loss"] = metrics["loss"] = m["loss"]
            metrics["steps"] += m["steps"]
        reply, kept = self.finish(client)
        return FitResult(reply, metrics, kept)
