"""Regularizers added to the local loss: the proximal term of FedProx and Ditto.

    loss(w) = base_loss(w) + mu / 2 * ||w - w_anchor||^2

over the model's parameters (not buffers). The anchor is a detached snapshot, so the term
pulls the trained weights towards it and no gradient flows into it.
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
