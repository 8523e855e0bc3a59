"""pFedMe: personalized models as proximal points (Moreau envelopes) of a shared model (docs/algorithms/pfedme.md)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from pydantic import Field
from torch import nn

from protofed.algorithms.base import Algorithm, Hyperparams, Metrics
from protofed.core.types import MODEL, AggregateResult, Arrays, FitResult, Records, Reply
from protofed.training.client import Client
from protofed.training.loop import batches, cross_entropy

PERSONAL = "personal"  # client state: theta, the personalized model


def proximal_steps(
    model: nn.Module,
    params: list[nn.Parameter],
    anchor: list[torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    lam: float,
    lr: float,
    steps: int,
) -> float:
    """`steps` gradient steps of size `lr` on  f(theta; x, y) + lam/2 ||theta - anchor||^2,
    in place on the model's `params` (theta); returns the last step's f."""
    value = 0.0
    for _ in range(steps):
        loss = cross_entropy(model, x, y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g, a in zip(params, grads, anchor, strict=True):
                p.sub_(lr * (g + lam * (p - a)))
        value = loss.item()
    return value


def server_mix(server: Arrays, mean: Arrays, beta: float) -> Arrays:
    """(1 - beta) * w + beta * mean on floating tensors; integer buffers from the mean."""
    if beta == 1:
        return mean
    return {
        n: torch.lerp(server[n], m, beta) if m.is_floating_point() else m for n, m in mean.items()
    }


class PFedMe(Algorithm):
    name = "pfedme"
    summary = "Personal models as proximal points (Moreau envelopes) of a shared model."
    reference = "T. Dinh, Tran & Nguyen, Personalized Federated Learning with Moreau Envelopes, NeurIPS 2020"
    ala_local = "reply"  # ALA plug-in: the local model is the w the client trained last

    class Params(Hyperparams):
        lam: float = Field(
            15.0, gt=0, description="Regularization lambda tying theta to w (paper: 15)."
        )
        inner_steps: int = Field(
            5, ge=1, description="K: gradient steps solving for theta per batch (paper: 5)."
        )
        personal_lr: float = Field(
            0.09, gt=0, description="Step size of the K steps on theta (paper, MNIST DNN: 0.09)."
        )
        beta: float = Field(
            1.0,
            gt=0,
            description="Server mixing weight of the clients' mean (paper: 1; 2 accelerates).",
        )

    params: Params

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(message[MODEL])
        model = client.model
        params = list(model.parameters())
        local = [p.detach().clone() for p in params]  # w
        lam, lr = self.params.lam, client.train.lr
        x, y = client.data.train_x, client.data.train_y
        model.train()
        total, steps = 0.0, 0
        for _ in range(client.train.local_epochs):
            for idx in batches(len(x), client.train.batch_size, client.generator, x.device):
                total += proximal_steps(
                    model,
                    params,
                    local,
                    x[idx],
                    y[idx],
                    lam,
                    self.params.personal_lr,
                    self.params.inner_steps,
                )
                with torch.no_grad():
                    for w, personal in zip(local, params, strict=True):
                        w.sub_(lr * lam * (w - personal))
                steps += 1
        theta = client.weights()  # with the running statistics
        names = [n for n, _ in model.named_parameters()]
        reply = {**theta, **dict(zip(names, local, strict=True))}
        kept = {PERSONAL: theta} if steps else {}
        metrics: Metrics = {
            "loss": total / max(steps, 1),  # f(theta; D) at the last inner step of each batch
            "steps": float(steps),
        }
        return FitResult({MODEL: reply}, metrics, kept)

    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        mean, _, metrics = self.average(replies, reference=server)
        mixed = server_mix(server[MODEL], mean[MODEL], self.params.beta)
        return AggregateResult({MODEL: mixed}, metrics)

    def client_model(self, message: Records, state: Records) -> Arrays:
        return state[PERSONAL] if PERSONAL in state else message[MODEL]
