"""FedRoD (Chen & Chao, ICLR 2022): a generic model trained with a balanced loss, plus a
personal head on top of it.

H.-Y. Chen, W.-L. Chao. On Bridging Generic and Personalized Federated Learning for Image
Classification. ICLR 2022.

Two predictors share one body f:
- the generic model, body f plus generic head h_G, is trained by every client with the
  balanced softmax loss (Ren et al. 2020): cross-entropy on h_G(f(x)) + log p_i, with p_i the
  client's class prior (its training label distribution). Shifting the logits by the log prior
  makes each client's objective an estimate of the class-balanced risk, the same for every
  client whatever its label skew, so averaging the generic models is consistent. It is sent
  and averaged by sample count, as FedAvg, and is the global model.
- the personal head h_P stays with the client and is trained on the empirical risk of the
  combined output, cross-entropy on h_G(z) + h_P(z), with the body and the generic head fixed
  for it (gradients are stopped at z and at h_G(z)). The personalized prediction is
  h_G(z) + h_P(z).

Both losses are minimised in the same steps (their gradients touch disjoint parameters).

Decisions:
- The personal head is linear, the same shape as the generic head ("FedRoD (linear)"; the
  paper's hypernetwork variant is not implemented). Two linear heads on the same z sum to one
  linear head, so the client's model is the body with head weights W_G + W_P and bias
  b_G + b_P: an ordinary model the evaluation can load.
- The personal head (the client state's record `"head"`, under the model's head names)
  starts at zero, so that before its first training the personalized model is the generic one.
- A class absent from the client's training data has prior 0, so its balanced logit is -inf:
  it gets no probability and no gradient from that client (as log of a zero count in the
  balanced softmax); the generic head learns those classes from the clients that have them.
- No hyperparameters: the linear variant has none beyond the training config.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import nn

from protofed.algorithms.base import Algorithm, Hyperparams, Setting
from protofed.algorithms.common.split import HEAD, head_names
from protofed.core.types import MODEL, Arrays, Client, FitResult, Records
from protofed.errors import ConfigError

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
        model = cast("FedModel", client.model)
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
