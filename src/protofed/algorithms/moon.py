"""MOON: FedAvg plus a model-contrastive loss on representations (docs/algorithms/moon.md)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from protofed.algorithms.base import Algorithm, Hyperparams
from protofed.core.types import MODEL, Arrays, FitResult, Records
from protofed.training.client import Client

if TYPE_CHECKING:
    from protofed.models.base import FedModel
    from protofed.training.loop import LossFn

PREVIOUS = "previous"  # client state: the model the client trained last round


def model_contrastive_loss(
    z: torch.Tensor,
    z_global: torch.Tensor,
    z_previous: torch.Tensor,
    temperature: float,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """MOON's l_con, averaged over the batch: a 2-way softmax cross-entropy whose positive is
    the cosine similarity to the global representation and whose negative is the one to the
    previous local representation, both divided by the temperature. `weight`: each row's
    weight in the average instead (a stacked batch's, 0 for its padding)."""
    positive = F.cosine_similarity(z, z_global, dim=1)
    negative = F.cosine_similarity(z, z_previous, dim=1)
    logits = torch.stack([positive, negative], dim=1) / temperature
    target = torch.zeros(len(z), dtype=torch.long, device=z.device)
    if weight is None:
        return F.cross_entropy(logits, target)
    return (F.cross_entropy(logits, target, reduction="none") * weight).sum()


def frozen_copy(model: FedModel, weights: Arrays) -> FedModel:
    """A copy of `model` holding `weights` (a complete model), in eval mode, with no
    gradients: a fixed encoder."""
    twin = copy.deepcopy(model)
    twin.load_state_dict(weights)
    twin.eval()
    for p in twin.parameters():
        p.requires_grad_(False)
    return twin


def moon_loss(global_model: FedModel, previous_model: FedModel, mu: float, tau: float) -> LossFn:
    """The local objective CE + mu * l_con as a `LossFn` for `Client.train_model`."""

    def loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        model = cast("FedModel", module)  # a LossFn takes any module; ours are FedModels
        z = model.features(x)
        ce = F.cross_entropy(model.head(z), y)
        with torch.no_grad():
            z_global = global_model.features(x)
            z_previous = previous_model.features(x)
        return ce + mu * model_contrastive_loss(z, z_global, z_previous, tau)

    return loss


class MOON(Algorithm):
    name = "moon"
    summary = "FedAvg plus a contrastive loss pulling representations to the global model's."
    reference = "Li, He & Song, Model-Contrastive Federated Learning, CVPR 2021"

    class Params(Hyperparams):
        mu: float = Field(
            1.0,
            ge=0,
            description="Weight of the model-contrastive loss (paper grid {0.1, 1, 5, 10}; "
            "official default 1; best on CIFAR-10: 5); 0 is FedAvg.",
        )
        temperature: float = Field(0.5, gt=0, description="Temperature tau (paper: 0.5).")

    params: Params

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(message[MODEL])
        model = client.model
        if self.params.mu > 0 and PREVIOUS in state:
            loss = moon_loss(
                frozen_copy(model, message[MODEL]),
                frozen_copy(model, state[PREVIOUS]),
                self.params.mu,
                self.params.temperature,
            )
            metrics = client.train_model(loss_fn=loss)
        else:  # no previous model yet (or mu = 0): the contrastive term has no gradient
            metrics = client.train_model()
        trained = client.weights()  # the reply is also next round's previous model
        return FitResult({MODEL: trained}, metrics, {PREVIOUS: trained})
