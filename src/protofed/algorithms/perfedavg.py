"""Per-FedAvg: FedAvg on a MAML objective (docs/algorithms/perfedavg.md)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from protofed.algorithms.base import Algorithm, Hyperparams
from protofed.core.types import MODEL, Arrays, FitResult, Metrics, Records
from protofed.training.client import Client
from protofed.training.loop import batches, cross_entropy, make_optimizer

PERSONAL = "personal"  # client state: the adapted model

Batch = tuple[torch.Tensor, torch.Tensor]


def gradient(
    model: nn.Module, params: list[nn.Parameter], batch: Batch
) -> tuple[list[torch.Tensor], float]:
    """(grad, value) of the mean cross-entropy on `batch` w.r.t. `params`, at the model's
    current weights."""
    loss = cross_entropy(model, *batch)
    return list(torch.autograd.grad(loss, params)), loss.item()


@torch.no_grad()
def _set(params: list[nn.Parameter], values: list[torch.Tensor]) -> None:
    for p, v in zip(params, values, strict=True):
        p.copy_(v)


def meta_gradient(
    model: nn.Module,
    params: list[nn.Parameter],
    group: list[Batch],
    alpha: float,
    variant: Literal["hf", "fo"] = "hf",
    delta: float = 1e-3,
) -> tuple[list[torch.Tensor], float]:
    """Per-FedAvg's estimate of grad F(w) at the model's current weights w (left unchanged),
    and the meta loss f(w_tilde; D') it is the gradient of.

    FO: grad f(w - alpha grad f(w; D); D').  HF: that minus alpha times the finite-difference
    Hessian-vector product on D''.
    """
    w = [p.detach().clone() for p in params]
    inner, _ = gradient(model, params, group[0])
    _set(params, [wi - alpha * g for wi, g in zip(w, inner, strict=True)])
    outer, meta_loss = gradient(model, params, group[1])
    if variant == "hf":
        _set(params, [wi + delta * g for wi, g in zip(w, outer, strict=True)])
        plus, _ = gradient(model, params, group[2])
        _set(params, [wi - delta * g for wi, g in zip(w, outer, strict=True)])
        minus, _ = gradient(model, params, group[2])
        outer = [
            g - alpha * (gp - gm) / (2 * delta)
            for g, gp, gm in zip(outer, plus, minus, strict=True)
        ]
    _set(params, w)
    return outer, meta_loss


def batch_groups(
    n: int, batch_size: int, size: int, epochs: int, generator: torch.Generator
) -> Iterator[list[torch.Tensor]]:
    """Index batches in groups of `size`, one group per step, epochs * ceil(n / batch_size)
    steps in all; the batches come from consecutive shuffles of the data."""
    if n == 0:
        return
    per_epoch = math.ceil(n / batch_size)

    def stream() -> Iterator[torch.Tensor]:
        while True:
            yield from batches(n, batch_size, generator)

    source = stream()
    for _ in range(epochs * per_epoch):
        yield [next(source) for _ in range(size)]


class PerFedAvg(Algorithm):
    name = "perfedavg"
    summary = "FedAvg on a MAML objective: a start that one local gradient step personalizes."
    reference = (
        "Fallah, Mokhtari & Ozdaglar, Personalized Federated Learning with Theoretical "
        "Guarantees: A Model-Agnostic Meta-Learning Approach, NeurIPS 2020"
    )
    ala_local = "reply"  # ALA plug-in: the local model is the one the client trained last

    class Params(Hyperparams):
        alpha: float = Field(
            0.01,
            gt=0,
            description="Inner (and personalization) step size alpha; the meta step size beta is train.lr.",
        )
        variant: Literal["hf", "fo"] = Field(
            "hf",
            description="'hf': Hessian-free (finite-difference Hessian-vector product), "
            "'fo': first-order (no Hessian term).",
        )
        delta: float = Field(
            1e-3, gt=0, description="Finite-difference step of the HF variant (paper: 0.001)."
        )

    params: Params

    def personalize(self, client: Client, message: Arrays) -> Arrays:
        """The received model after one SGD step of size alpha on one batch of the client."""
        client.load(message)
        model = client.model
        params = list(model.parameters())
        idx = batches(client.num_examples, client.train.batch_size, client.generator)[0]
        model.train()
        step, _ = gradient(model, params, (client.data.train_x[idx], client.data.train_y[idx]))
        with torch.no_grad():
            for p, g in zip(params, step, strict=True):
                p.sub_(self.params.alpha * g)
        return client.weights()

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        kept = {PERSONAL: self.personalize(client, message[MODEL])} if client.num_examples else {}
        client.load(message[MODEL])
        model = client.model
        params = list(model.parameters())
        optimizer = make_optimizer(params, client.train)
        x, y = client.data.train_x, client.data.train_y
        size = 3 if self.params.variant == "hf" else 2
        model.train()
        total, steps = 0.0, 0
        for group in batch_groups(
            len(x), client.train.batch_size, size, client.train.local_epochs, client.generator
        ):
            data = [(x[idx], y[idx]) for idx in group]
            meta, meta_loss = meta_gradient(
                model, params, data, self.params.alpha, self.params.variant, self.params.delta
            )
            for p, g in zip(params, meta, strict=True):
                p.grad = g
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            total += meta_loss
            steps += 1
        metrics: Metrics = {
            "loss": total / max(steps, 1),  # the meta loss f(w_tilde; D'), before each step
            "steps": float(steps),
        }
        return FitResult({MODEL: client.weights()}, metrics, kept)

    def client_model(self, message: Records, state: Records) -> Arrays:
        return state[PERSONAL] if PERSONAL in state else message[MODEL]
