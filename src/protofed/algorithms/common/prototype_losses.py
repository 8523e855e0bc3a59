"""Local losses that pull embeddings toward class prototypes (FedProto, FedDPA, FedPAC, ...).

    loss = CE(head(f(x)), y) + lam * mean over samples whose class has a prototype of
           mse(f(x), P[y])

FedProto (Tan et al., AAAI 2022, eq. 8) regularises with the squared distance between a
sample's embedding and its class's global prototype; classes without a global prototype
contribute nothing. The prototypes are detached inputs, never trained by this loss.

`target="class_mean"` instead compares the batch's per-class mean embeddings (the local
prototypes of the batch) with the prototypes: PFPL's eq. 5 and 7 written literally, and the
form of FedDPA's ||P_i^k - P_i^g||^2.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from protofed.prototypes import class_means
from protofed.training.loop import LossFn

if TYPE_CHECKING:
    from protofed.models.base import FedModel

Target = Literal["sample", "class_mean"]
Reduction = Literal["mean", "sum", "squared_l2"]


def prototype_distance(
    features: torch.Tensor,
    labels: torch.Tensor,
    prototypes: torch.Tensor,
    present: torch.Tensor,
    reduction: Reduction = "mean",
    target: Target = "sample",
) -> torch.Tensor:
    """Mean squared error between embeddings and the prototypes of their classes.

    `target="sample"`: each embedding against its class prototype (classes with a prototype);
    `"class_mean"`: the batch's class means against the prototypes of those classes (classes
    both in the batch and with a prototype; gradients flow through the means).
    `reduction="sum"`: summed squared Euclidean distances instead (see `_reduce`; with
    class means, sum_i ||mean_i - P_i||^2: FedDPA's eq. 3 literally); `"squared_l2"`: their
    mean over rows (PFPL's and FedProto's squared L2 per sample, D times the MSE).
    """
    if target == "class_mean":
        rows, counts = class_means(features, labels, len(prototypes))
        keep, targets = (counts > 0) & present.bool(), prototypes
    else:
        rows, keep, targets = features, present.bool()[labels], prototypes[labels]
    if not bool(keep.any()):
        return features.new_zeros(())
    return _reduce(rows[keep], targets[keep].detach(), reduction)


class_mean_distance = functools.partial(prototype_distance, target="class_mean")
"""`prototype_distance` of the batch's class means (PFPL's eq. 5 and 7, FedDPA)."""


def _reduce(a: torch.Tensor, b: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    """mean: squared error averaged over rows and dimensions (MSE, lam per dimension);
    sum: squared Euclidean distances summed over rows (rows x dimensions times the MSE);
    squared_l2: squared Euclidean distances averaged over rows (dimensions times the MSE)."""
    if reduction == "mean":
        return F.mse_loss(a, b)
    squared = (a - b).pow(2)
    return squared.sum() if reduction == "sum" else squared.sum(-1).mean()


def prototype_regularized_loss(
    prototypes: torch.Tensor,
    present: torch.Tensor,
    lam: float,
    target: Target = "sample",
    reduction: Reduction = "mean",
) -> LossFn:
    """A `LossFn`: cross-entropy plus lam times the distance to the prototypes (one forward).

    `target="sample"`: each embedding to its class's prototype (`prototype_distance`);
    `"class_mean"`: the batch's class means to the prototypes (`class_mean_distance`).
    `reduction`: "mean" (MSE), "sum" (summed squared Euclidean distances) or "squared_l2"
    (their mean over rows).
    """

    def loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        model = cast("FedModel", module)  # a LossFn takes any module; ours are FedModels
        features = model.features(x)
        ce = F.cross_entropy(model.head(features), y)
        if lam == 0 or not bool(present.any()):
            return ce
        features = features.reshape(len(x), -1)
        return ce + lam * prototype_distance(features, y, prototypes, present, reduction, target)

    return loss


def masked_prototype_distance(
    features: torch.Tensor,
    labels: torch.Tensor,
    weight: torch.Tensor,
    prototypes: torch.Tensor,
    present: torch.Tensor,
    reduction: Reduction = "mean",
    target: Target = "sample",
) -> torch.Tensor:
    """`prototype_distance` over the rows with `weight` > 0 (a stacked batch's padding has 0),
    by masks instead of indexing: the same value, to rounding, in a form vmap maps over clients
    (no shape that depends on the data, no branch on it). Kept apart so that the per-client
    path's arithmetic, and with it every result recorded before, stays as it was."""
    features = features.reshape(len(features), -1)
    real = (weight > 0).to(features.dtype)
    if target == "class_mean":
        classes = torch.arange(len(prototypes), device=labels.device)
        members = (labels.unsqueeze(1) == classes).to(features.dtype) * real.unsqueeze(1)
        counts = members.sum(0)
        rows = members.T @ features / counts.clamp(min=1).unsqueeze(1)
        keep, targets = (counts > 0).to(features.dtype) * present, prototypes
    else:
        rows, keep, targets = features, present[labels] * real, prototypes[labels]
    squared = ((rows - targets.detach()).pow(2).sum(-1) * keep).sum()
    if reduction == "sum":
        return squared
    per_row = squared / keep.sum().clamp(min=1)
    return per_row / features.shape[1] if reduction == "mean" else per_row
