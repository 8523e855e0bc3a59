"""APFL: a personal model mixed with the global one by a per-client learned alpha (docs/algorithms/apfl.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from torch.func import functional_call

from protofed.algorithms.base import Algorithm, Hyperparams
from protofed.core.types import MODEL, Arrays, FitResult, Records
from protofed.training.client import Client

PERSONAL = "personal"  # client state: v's parameters
BUFFERS = "buffers"  # client state: v's buffers (BatchNorm statistics; none: absent or empty)
ALPHA = "alpha"  # client state: {"alpha": the mixing weight, a 0-d tensor}


def mixture(personal: Arrays, global_: Arrays, alpha: float | torch.Tensor) -> Arrays:
    """alpha * v + (1 - alpha) * w, parameter by parameter (the keys of `personal`)."""
    return {n: alpha * v + (1 - alpha) * global_[n] for n, v in personal.items()}


class APFL(Algorithm):
    name = "apfl"
    summary = "Personal model mixed with the global one by a per-client, adaptively learned alpha."
    reference = "Deng, Kamani & Mahdavi, Adaptive Personalized Federated Learning, arXiv 2020"

    class Params(Hyperparams):
        alpha: float = Field(
            0.5,
            ge=0,
            le=1,
            description="Initial mixing weight of the personal model "
            "(authors' code: 0.5; the paper's fixed runs: 0.25, 0.5, 0.75).",
        )
        adaptive: bool = Field(True, description="Learn alpha per client (the paper's APFL).")
        alpha_lr: float | None = Field(
            None,
            gt=0,
            description="Step size of alpha; None: train.lr (the paper's one step size).",
        )

    params: Params

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(message[MODEL])
        model = client.model
        w = dict(model.named_parameters())
        start = (
            {**state[PERSONAL], **state.get(BUFFERS, {})} if PERSONAL in state else message[MODEL]
        )
        device = next(iter(w.values())).device
        v = {n: start[n].detach().clone().to(device).requires_grad_(True) for n in w}
        buffers = {n: b.detach().clone().to(device) for n, b in start.items() if n not in w}
        initial = float(state[ALPHA][ALPHA]) if ALPHA in state else self.params.alpha
        alpha = torch.tensor(initial, device=device, requires_grad=self.params.adaptive)
        alpha_lr = self.params.alpha_lr or client.train.lr

        def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            global_loss = F.cross_entropy(model(x), y)
            mixed = {n: alpha * v[n] + (1 - alpha) * w[n].detach() for n in w}
            personal_loss = F.cross_entropy(functional_call(model, {**mixed, **buffers}, (x,)), y)
            return global_loss + personal_loss  # the reported loss: the sum of the two

        def update_alpha() -> None:
            if alpha.grad is not None:
                with torch.no_grad():
                    alpha.sub_(alpha_lr * alpha.grad).clamp_(0.0, 1.0)
                alpha.grad = None

        metrics = client.train_model(
            loss_fn=loss,
            parameters=[*w.values(), *v.values()],
            after_step=update_alpha if self.params.adaptive else None,
        )
        metrics["alpha"] = float(alpha.detach())
        new_state = {
            PERSONAL: {n: t.detach().clone() for n, t in v.items()},
            BUFFERS: buffers,
            ALPHA: {ALPHA: alpha.detach().clone()},
        }
        return FitResult({MODEL: client.weights()}, metrics, new_state)

    def client_model(self, message: Records, state: Records) -> Arrays:
        if PERSONAL not in state:
            return message[MODEL]
        global_ = message[MODEL]
        mixed = mixture(state[PERSONAL], global_, state[ALPHA][ALPHA])
        return {**global_, **state.get(BUFFERS, {}), **mixed}
