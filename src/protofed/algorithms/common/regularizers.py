"""The proximal term of FedProx and Ditto, mu / 2 * ||w - w_anchor||^2 over the model's
parameters (not buffers), pulling the trained weights towards a detached snapshot.

FedProx adds it to the local loss (`proximal_loss`), so the optimizer minimizes both
together. Ditto applies its gradient as its Algorithm 1 does, beside the optimizer's step and
not through its momentum or Adam state (`ProximalStep`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from protofed.algorithms.base import Arrays
from protofed.training.loop import cross_entropy

if TYPE_CHECKING:
    from protofed.training.loop import LossFn


def parameter_snapshot(model: nn.Module) -> Arrays:
    """Detached copies of the model's parameters (on the model's device): an anchor."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def squared_distance(model: nn.Module, anchor: Arrays) -> torch.Tensor:
    """sum ||p - anchor[p]||^2 over the trainable parameters that the anchor names.

    Frozen parameters are skipped: their term is a constant with no gradient.
    """
    terms = [
        (p - anchor[name]).pow(2).sum()
        for name, p in model.named_parameters()
        if p.requires_grad and name in anchor
    ]
    if not terms:
        return torch.zeros((), device=next(model.parameters()).device)
    return torch.stack(terms).sum()


def proximal_loss(anchor: Arrays, mu: float, base: LossFn | None = None) -> LossFn:
    """A `LossFn`: `base` (cross-entropy by default) plus mu/2 * ||w - anchor||^2.

    With mu == 0 this is `base` itself, so the term costs nothing when it is switched off.
    """
    base_fn = cross_entropy if base is None else base
    if mu == 0:
        return base_fn
    half_mu = 0.5 * float(mu)

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return base_fn(model, x, y) + half_mu * squared_distance(model, anchor)

    return loss


class ProximalStep:
    """An `after_step` hook: after each optimizer step, w <- w - rate * (w_before - anchor),
    w_before being the weights the step's gradient was taken at (`rate`: lr * mu).

    With plain SGD the two together are Ditto's step w - lr * (grad f(w) + mu * (w - anchor))
    (Algorithm 1 of Li et al. 2021, as in its official code); with momentum or Adam only
    grad f goes through the optimizer's state. Through momentum beta the pull toward the
    anchor is underdamped (it swings w past the anchor, by up to sqrt(beta)^t of the
    distance) and, with mu = 1 on UCI-HAR, flung a personal model further off round after
    round until it overflowed (docs/algorithms/ditto.md).
    """

    def __init__(self, model: nn.Module, anchor: Arrays, rate: float) -> None:
        self.pairs = [
            (p, anchor[name])
            for name, p in model.named_parameters()
            if p.requires_grad and name in anchor
        ]
        self.rate = float(rate)
        with torch.no_grad():
            self.before = [p.detach().clone() for p, _ in self.pairs]

    @torch.no_grad()
    def __call__(self) -> None:
        for (p, a), b in zip(self.pairs, self.before, strict=True):
            p.add_(b - a, alpha=-self.rate)
            b.copy_(p)
