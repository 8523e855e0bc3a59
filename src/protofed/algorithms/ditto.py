"""Ditto: a FedAvg global model plus per-client models pulled toward it (docs/algorithms/ditto.md)."""

from __future__ import annotations

from pydantic import Field

from protofed.algorithms.base import Algorithm, Hyperparams
from protofed.algorithms.common.ala import PERSONAL
from protofed.algorithms.common.regularizers import ProximalStep, parameter_snapshot
from protofed.core.types import MODEL, Arrays, FitResult, Records
from protofed.training.client import Client


class Ditto(Algorithm):
    name = "ditto"
    summary = "FedAvg global model plus per-client models pulled toward it by lam/2*||v - w||^2."
    reference = (
        "Li et al., Ditto: Fair and Robust Federated Learning Through Personalization, ICML 2021"
    )
    ala_local = "state"  # ALA plug-in: the local model is the personal model v ("personal")

    class Params(Hyperparams):
        lam: float = Field(
            0.1,
            ge=0,
            description="Ditto's lambda: pull of the personal model to the global one "
            "(paper grid {0.01, 0.1, 1, 2}); 0 is local training of v.",
        )
        personal_epochs: int | None = Field(
            None,
            ge=1,
            description="Epochs on the personal model per round; None: train.local_epochs.",
        )

    params: Params

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        # (1) the global model, as FedAvg
        client.load(message[MODEL])
        anchor = parameter_snapshot(client.model)  # w^t, as received
        metrics = client.train_model()
        reply = client.weights()
        # (2) the personal model, regularized toward w^t
        client.load(state[PERSONAL] if PERSONAL in state else message[MODEL])
        lam = self.params.lam
        pull = ProximalStep(client.model, anchor, client.train.lr * lam) if lam else None
        personal = client.train_model(epochs=self.params.personal_epochs, after_step=pull)
        metrics["personal_loss"] = personal["loss"]
        metrics["personal_steps"] = personal["steps"]
        return FitResult({MODEL: reply}, metrics, {PERSONAL: client.weights()})

    def client_model(self, message: Records, state: Records) -> Arrays:
        """The personal model v, or the global model before the client's first round."""
        return state[PERSONAL] if PERSONAL in state else message[MODEL]
