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

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from protofed.prototypes import class_means
from protofed.training.loop import LossFn


def prototype_distance(
    features: torch.Tensor,
    labels: torch.Tensor,
    prototypes: torch.Tensor,
    present: torch.Tensor,
    reduction: Literal["mean", "sum"] = "mean",
) -> torch.Tensor:
    """Mean squared error between each embedding and its class prototype (present classes).

    `reduction="sum"`: the sum of squared Euclidean distances instead (see `_reduce`).
    """
    keep = present.bool()[labels]
    if not bool(keep.any()):
        return features.new_zeros(())
    return _reduce(features[keep], prototypes[labels[keep]].detach(), reduction)


def class_mean_distance(
    features: torch.Tensor,
    labels: torch.Tensor,
    prototypes: torch.Tensor,
    present: torch.Tensor,
    reduction: Literal["mean", "sum"] = "mean",
) -> torch.Tensor:
    """Mean squared error between the batch's class means and the prototypes of those classes.

    Only classes both in the batch and with a prototype count; gradients flow through the means.
    `reduction="sum"`: sum_i ||mean_i - P_i||^2 over those classes (FedDPA's eq. 3 literally).
    """
    means, counts = class_means(features, labels, len(prototypes))
    keep = (counts > 0) & present.bool()
    if not bool(keep.any()):
        return features.new_zeros(())
    return _reduce(means[keep], prototypes[keep].detach(), reduction)


def _reduce(a: torch.Tensor, b: torch.Tensor, reduction: Literal["mean", "sum"]) -> torch.Tensor:
    """mean: squared error averaged over rows and dimensions (MSE, lam per dimension);
    sum: squared Euclidean distances summed over rows (rows x dimensions times the MSE)."""
    return F.mse_loss(a, b) if reduction == "mean" else (a - b).pow(2).sum()


def prototype_regularized_loss(
    prototypes: torch.Tensor,
    present: torch.Tensor,
    lam: float,
    target: Literal["sample", "class_mean"] = "sample",
    reduction: Literal["mean", "sum"] = "mean",
) -> LossFn:
    """A `LossFn`: cross-entropy plus lam times the distance to the prototypes (one forward).

    `target="sample"`: each embedding to its class's prototype (`prototype_distance`);
    `"class_mean"`: the batch's class means to the prototypes (`class_mean_distance`).
    `reduction`: "mean" (MSE) or "sum" (summed squared Euclidean distances).
    """
    distance = prototype_distance if target == "sample" else class_mean_distance

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        features = model.features(x)
        ce = F.cross_entropy(model.head(features), y)
        if lam == 0 or not bool(present.any()):
            return ce
        features = features.reshape(len(x), -1)
        return ce + lam * distance(features, y, prototypes, present, reduction)

    return loss
