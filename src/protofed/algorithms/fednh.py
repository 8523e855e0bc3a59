"""FedNH: a cosine head of uniformly spread class prototypes, moved by the server with momentum (docs/algorithms/fednh.md)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal, cast

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from protofed.algorithms.base import Algorithm, Hyperparams
from protofed.algorithms.common.split import body_names, body_parameters
from protofed.core.types import MODEL, AggregateResult, Arrays, FitResult, Records, Reply
from protofed.prototypes import (
    PROTOS,
    class_means,
    embed,
    merge_means,
    pack_prototypes,
    unpack_prototypes,
)
from protofed.training.client import Client

if TYPE_CHECKING:
    from protofed.models.base import FedModel

SCALE = "scale"  # the record of the cosine logits' scale s: {"scale": (1,)}


def uniform_prototypes(
    num_classes: int, dim: int, steps: int = 2000, seed: int = 0
) -> torch.Tensor:
    """(C, D) unit vectors whose largest pairwise cosine is (near) the smallest possible.

    C <= D: the regular simplex, exactly (pairwise cosine -1/(C-1)). C > D: projected gradient
    descent on a smooth maximum of the pairwise cosines, from a start drawn with `seed`.
    """
    if num_classes == 1:
        return F.one_hot(torch.zeros(1, dtype=torch.long), dim).float()
    if num_classes <= dim:
        simplex = torch.eye(num_classes) - 1.0 / num_classes
        return F.normalize(F.pad(simplex, (0, dim - num_classes)), dim=1)
    points = torch.randn(num_classes, dim, generator=torch.Generator().manual_seed(seed))
    points = F.normalize(points, dim=1).requires_grad_(True)
    optimizer = torch.optim.SGD([points], lr=0.1)
    off = ~torch.eye(num_classes, dtype=torch.bool)
    temperature = 0.01  # t * logsumexp(cos / t) is within t * log(C^2) of the largest cosine
    for _ in range(steps):
        unit = F.normalize(points, dim=1)
        loss = temperature * torch.logsumexp((unit @ unit.T)[off] / temperature, dim=0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            points.copy_(F.normalize(points, dim=1))
    return F.normalize(points.detach(), dim=1)


def orthogonal_prototypes(num_classes: int, dim: int) -> torch.Tensor:
    """(C, D) orthonormal rows (the authors' choice); needs C <= D."""
    if num_classes > dim:
        raise ValueError(f"orthogonal prototypes need classes ({num_classes}) <= dim ({dim})")
    return torch.eye(num_classes, dim)


def smooth_update(
    prototypes: torch.Tensor, means: torch.Tensor, counts: torch.Tensor, rho: float
) -> torch.Tensor:
    """FedNH's server step: P <- normalize(rho P + (1 - rho) normalize(count-weighted mean)).

    means (M, C, D) the clients' normalised class means, counts (M, C). A class with no count
    keeps its prototype (its merged mean is zero, so the update only renormalises P).
    """
    merged, _ = merge_means(means, counts)
    return F.normalize(rho * prototypes + (1 - rho) * F.normalize(merged, dim=1), dim=1)


def cosine_logits(
    model: FedModel, x: torch.Tensor, prototypes: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """s * cos(f(x), p_c) for every class c."""
    return scale * F.normalize(model.features(x), dim=1) @ F.normalize(prototypes, dim=1).T


class FedNH(Algorithm):
    name = "fednh"
    summary = "Cosine head of uniformly spread prototypes, fixed locally, moved by the server with momentum."
    reference = "Dai et al., Tackling Data Heterogeneity in Federated Learning with Class Prototypes, AAAI 2023"

    class Params(Hyperparams):
        rho: float = Field(
            0.9, ge=0, le=1, description="Smoothing of the server's prototype update (paper: 0.9)."
        )
        scale: float = Field(
            1.0, gt=0, description="Initial scaling s of the cosine logits (authors' CNNs: 1)."
        )
        learn_scale: bool = Field(
            True, description="Train s with the body (authors' default); false keeps it fixed."
        )
        init: Literal["uniform", "orthogonal"] = Field(
            "uniform",
            description="Prototype initialisation: uniform = minimal largest cosine (paper), "
            "orthogonal = orthonormal rows (authors' code).",
        )

    params: Params

    def init_server(self) -> Records:
        server = dict(self.setting.init_model)
        weight = server["head.weight"]
        num_classes, dim = weight.shape
        if self.params.init == "uniform":
            prototypes = uniform_prototypes(num_classes, dim, seed=self.setting.seed)
        else:
            prototypes = orthogonal_prototypes(num_classes, dim)
        server["head.weight"] = prototypes.to(weight)
        if "head.bias" in server:
            server["head.bias"] = torch.zeros_like(server["head.bias"])
        scale = torch.tensor([self.params.scale], dtype=weight.dtype, device=weight.device)
        return {MODEL: server, SCALE: {"scale": scale}}

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        model = message[MODEL]
        client.load(model)
        device = model["head.weight"].device
        scale = nn.Parameter(message[SCALE]["scale"].detach().clone().to(device))
        prototypes = model["head.weight"].detach()

        def loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            model = cast("FedModel", module)  # a LossFn takes any module; ours are FedModels
            return F.cross_entropy(cosine_logits(model, x, prototypes, scale), y)

        trained = body_parameters(client.model) + ([scale] if self.params.learn_scale else [])
        metrics = client.train_model(loss_fn=loss, parameters=trained)
        features = F.normalize(embed(client.model, client.data.train_x), dim=1)
        means, counts = class_means(features, client.data.train_y, self.setting.num_classes)
        weights = client.weights()
        body = {k: weights[k] for k in body_names(weights)}
        metrics["scale"] = float(scale.detach())
        reply = {
            MODEL: body,
            SCALE: {"scale": scale.detach().clone()},
            PROTOS: pack_prototypes(F.normalize(means, dim=1), counts),
        }
        return FitResult(reply, metrics, {MODEL: weights})

    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        mean, seen, metrics = self.average(replies, records=[MODEL, SCALE], reference=server)
        dense = [unpack_prototypes(r.records[PROTOS], self.setting.num_classes) for r in seen]
        head = server[MODEL]["head.weight"]
        prototypes = smooth_update(
            head,
            torch.stack([m for m, _ in dense]).to(head),
            torch.stack([c for _, c in dense]).to(head),
            self.params.rho,
        )
        model = {**server[MODEL], **mean[MODEL], "head.weight": prototypes}
        return AggregateResult({MODEL: model, SCALE: mean[SCALE]}, metrics)

    def prototypes(self, server: Records) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The head's rows are the global prototypes (unit vectors), every class present."""
        head = server[MODEL]["head.weight"]
        return {"global": (head, torch.ones(len(head)))}

    def client_model(self, message: Records, state: Records) -> Arrays:
        return state[MODEL] if state else message[MODEL]
