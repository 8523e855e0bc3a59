"""FedBABU: train and share only the body under a fixed head; fine-tune to personalize (docs/algorithms/fedbabu.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from protofed.algorithms.base import Algorithm, Hyperparams
from protofed.algorithms.common.split import (
    body_parameters,
    head_parameters,
    split_arrays,
)
from protofed.core.types import MODEL, Arrays, FitResult, Records
from protofed.training.client import Client

PERSONAL = "personal"  # client state: the fine-tuned model


class FedBABU(Algorithm):
    name = "fedbabu"
    summary = "Head fixed at init, body trained and averaged; personalize by fine-tuning."
    reference = "Oh, Kim & Yun, FedBABU: Toward Enhanced Representation for Federated Image Classification, ICLR 2022"

    class Params(Hyperparams):
        finetune_epochs: int = Field(
            5, ge=0, description="Fine-tuning epochs of the personalized model (paper tau_f: 5)."
        )
        finetune: Literal["full", "head", "body"] = Field(
            "full",
            description="What fine-tuning trains: 'full' (paper's experiments), 'head' or 'body'.",
        )

    params: Params

    def fixed_head(self) -> Arrays:
        """The head every client uses during federated training: the initial one."""
        return split_arrays(self.setting.init_model)[1]

    def init_server(self) -> Records:
        return {MODEL: dict(split_arrays(self.setting.init_model)[0])}

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        model = client.model
        head = self.fixed_head()
        client.load(message[MODEL])
        client.load(head)
        metrics = client.train_model(parameters=body_parameters(model))
        body, _ = split_arrays(client.weights())
        kept: Records = {}
        if self.params.finetune_epochs > 0:
            client.load(message[MODEL])
            client.load(head)
            part = self.params.finetune
            parameters = (
                None
                if part == "full"
                else (head_parameters(model) if part == "head" else body_parameters(model))
            )
            tuned = client.train_model(epochs=self.params.finetune_epochs, parameters=parameters)
            metrics["finetune_loss"] = tuned["loss"]
            kept = {PERSONAL: client.weights()}
        return FitResult({MODEL: body}, metrics, kept)

    def client_model(self, message: Records, state: Records) -> Arrays:
        return state[PERSONAL] if PERSONAL in state else {**message[MODEL], **self.fixed_head()}

    def global_model(self, server: Records) -> Arrays:
        return {**server[MODEL], **self.fixed_head()}
