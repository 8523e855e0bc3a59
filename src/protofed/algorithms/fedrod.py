"""FedRoD: a generic model trained with balanced softmax plus a personal head (docs/algorithms/fedrod.md)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import nn

from protofed.algorithms.base import Algorithm, Hyperparams, Setting
from protofed.algorithms.common.split import HEAD, head_names
from protofed.core.types import MODEL, Arrays, FitResult, Records
from protofed.errors import ConfigError
from protofed.training.client import Client

if TYPE_CHECKING:
    from protofed.models.base import FedModel
    from protofed.training.loop import LossFn


def log_prior(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """log of the class distribution of `labels` (-inf for absent classes)."""
    counts = torch.bincount(labels, minlength=num_classes).to(torch.float32)
    return (counts / counts.sum().clamp(min=1)).log()


def balanced_softmax_loss(
    logits: torch.Tensor, y: torch.Tensor, prior_log: torch.Tensor
) -> torch.Tensor:
    """Balanced softmax: cross-entropy on the logits shifted by the log class prior."""
    return F.cross_entropy(logits + prior_log.to(logits.device), y)


def fedrod_loss(personal_head: nn.Module, prior_log: torch.Tensor) -> LossFn:
    """Generic model on the balanced softmax plus personal head on the combined output."""

    def loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        model = cast("FedModel", module)  # a LossFn takes any module; ours are FedModels
        z = model.features(x)
        generic = model.head(z)
        combined = generic.detach() + personal_head(z.detach())
        return balanced_softmax_loss(generic, y, prior_log) + F.cross_entropy(combined, y)

    return loss


class FedRoD(Algorithm):
    name = "fedrod"
    summary = "Generic model trained with balanced softmax (averaged) plus a local personal head."
    reference = "Chen & Chao, On Bridging Generic and Personalized Federated Learning for Image Classification, ICLR 2022"

    class Params(Hyperparams):
        """No hyperparameters (FedRoD with a linear personal head)."""

    def __init__(self, params: Hyperparams, setting: Setting) -> None:
        super().__init__(params, setting)
        self.head = head_names(setting.init_model)
        if sorted(n.rsplit(".", 1)[-1] for n in self.head) not in (["bias", "weight"], ["weight"]):
            raise ConfigError(
                f"algorithm 'fedrod' needs a linear head (head.weight, head.bias); the model's "
                f"head has {', '.join(self.head)}"
            )

    def personal_head(self, state: Records) -> Arrays:
        """The client's personal head under the model's head names (zeros before training)."""
        if HEAD in state:
            return state[HEAD]
        return {n: torch.zeros_like(self.setting.init_model[n]) for n in self.head}

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(message[MODEL])
        model = client.model
        personal = copy.deepcopy(model.head)
        prefix = f"{HEAD}."  # the head module's own names, without the model's prefix
        personal.load_state_dict(
            {n.removeprefix(prefix): t for n, t in self.personal_head(state).items()}
        )
        prior_log = log_prior(client.data.train_y, self.setting.num_classes)
        metrics = client.train_model(
            loss_fn=fedrod_loss(personal, prior_log),
            parameters=[*model.parameters(), *personal.parameters()],
        )
        new_head = {f"{prefix}{k}": v.detach().clone() for k, v in personal.state_dict().items()}
        return FitResult({MODEL: client.weights()}, metrics, {HEAD: new_head})

    def client_model(self, message: Records, state: Records) -> Arrays:
        """The body with head h_G + h_P: the sum of the two linear heads' weights."""
        generic = message[MODEL]
        if HEAD not in state:  # h_P = 0: the generic model itself (shared, so evaluated once)
            return generic
        personal = self.personal_head(state)
        return {**generic, **{n: generic[n] + personal[n] for n in self.head}}
