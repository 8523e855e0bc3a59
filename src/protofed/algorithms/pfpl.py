"""PFPL: personalized prototypes from distance-weighted neighbours; only prototypes travel (docs/algorithms/pfpl.md)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal, cast

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from protofed.algorithms.base import AggregateResult, Hyperparams, Records, Reply
from protofed.algorithms.common.prototype_losses import Reduction, Target
from protofed.algorithms.fedproto import FedProto
from protofed.errors import ConfigError
from protofed.prototypes import PROTOS, class_means, pack_prototypes, unpack_prototypes
from protofed.training.loop import LossFn

if TYPE_CHECKING:
    from protofed.models.base import FedModel

Weighting = Literal["inverse", "softmax", "literal"]
Distance = Literal["squared", "unsquared"]
BANK = "bank"  # the server's record: every client's latest local prototypes, (M, C, D) and (M, C)


def neighbour_weights(
    distances: torch.Tensor, mode: Weighting = "inverse", temperature: float | None = None
) -> torch.Tensor:
    """PFPL's k_im over the other clients, from their distances d_im (sum to 1): squared or
    unsquared L2, as the caller computed them (`pair_distances`).

    "inverse" and "softmax" fall with distance; "literal" is the paper's printed d / sum(d),
    which rises with it. Ties at distance 0 (or all distances equal to 0) share equally.
    """
    d = distances.double()
    if len(d) == 0:
        return d.float()
    if mode == "literal":
        w = d if d.sum() > 0 else torch.ones_like(d)
    elif mode == "inverse":
        nearest = d.min()
        w = (d == 0).double() if nearest == 0 else nearest / d
    elif mode == "softmax":
        t = float(d.mean()) if temperature is None else temperature
        w = torch.softmax(-d / t, 0) if t > 0 else torch.ones_like(d)
    else:
        raise ValueError(f"unknown PFPL weighting '{mode}'")
    return (w / w.sum()).to(distances.dtype)


def pair_distances(
    a: torch.Tensor, b: torch.Tensor, distance: Distance = "squared"
) -> torch.Tensor:
    """Row-wise L2 distances between a and b (..., D): squared (the sum of squares, the
    paper's written-out formula and protofed's default) or unsquared (the norm ||a - b||_2
    its notation writes)."""
    squared = ((a - b) ** 2).sum(-1)
    if distance == "squared":
        return squared
    if distance == "unsquared":
        return squared.sqrt()
    raise ValueError(f"unknown PFPL distance '{distance}'")


def personalized_prototypes(
    means: torch.Tensor,
    counts: torch.Tensor,
    client: int,
    alpha: float,
    mode: Weighting = "inverse",
    temperature: float | None = None,
    distance: Distance = "squared",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 4 for one client: (C, D) personalized prototypes and the (C,) mask of its classes.

    means (M, C, D), counts (M, C) are all clients' latest local prototypes (count 0: absent);
    `distance` is the d_im the weights are computed from (squared or unsquared L2).
    """
    present = counts[client] > 0
    out = torch.zeros_like(means[client])
    for k in torch.nonzero(present).flatten().tolist():
        own = means[client, k]
        others = counts[:, k] > 0
        others[client] = False
        if not bool(others.any()):
            out[k] = own
            continue
        theirs = means[others, k]
        w = neighbour_weights(pair_distances(theirs, own, distance), mode, temperature)
        out[k] = alpha * own + (1 - alpha) * (w.unsqueeze(1) * theirs).sum(0)
    return out, present


def unsquared_prototype_distance(
    features: torch.Tensor,
    labels: torch.Tensor,
    prototypes: torch.Tensor,
    present: torch.Tensor,
    reduction: Reduction = "mean",
    target: Target = "sample",
) -> torch.Tensor:
    """PFPL's eq. 7 with the unsquared norm: ||row - P[y]||_2 averaged over the rows (each
    embedding, or the batch's class means with `target="class_mean"`), rows of classes
    without a prototype left out. `reduction="mean"` divides each distance by sqrt(D) (the
    root of the per-dimension mean, as "mean" is the per-dimension mean of the squared
    distance); "squared_l2" keeps the whole distance (the paper's ||., .||_2)."""
    if target == "class_mean":
        rows, counts = class_means(features, labels, len(prototypes))
        keep, targets = (counts > 0) & present.bool(), prototypes
    else:
        rows, keep, targets = features, present.bool()[labels], prototypes[labels]
    if not bool(keep.any()):
        return features.new_zeros(())
    diff = rows[keep] - targets[keep].detach()
    # sqrt of the sum of squares, with a zero gradient where a row sits on its prototype
    squared = diff.pow(2).sum(-1)
    norms = torch.where(squared > 0, squared.clamp_min(1e-30).sqrt(), squared)
    if reduction == "mean":
        norms = norms / diff.shape[-1] ** 0.5
    elif reduction != "squared_l2":
        raise ValueError(
            f"PFPL's unsquared distance takes reduction mean or squared_l2, not {reduction!r}"
        )
    return norms.mean()


class PFPL(FedProto):
    """FedProto's client step (own model, prototype-regularised loss, prototypes up, the
    personal head or the nearest prototype at inference) with PFPL's server: personalized
    prototypes per client instead of one global set."""

    name = "pfpl"
    summary = "Personalized prototypes from distance-weighted neighbours; only prototypes travel."
    reference = "Zeng et al., Personalized federated prototype learning in mixed heterogeneous data scenarios (PFPL)"
    reply_counts = False  # the server weighs clients by distance, not by class counts

    class Params(Hyperparams):
        alpha: float = Field(
            0.3,
            ge=0,
            le=1,
            description="Weight of the client's own prototype in eq. 4 (paper: 0.3 Digits, "
            "0.5, 0.6 on its other data sets).",
        )
        lam: float = Field(
            1.0, ge=0, description="Weight of the prototype consistency loss (eq. 5)."
        )
        weights: Weighting = Field(
            "inverse",
            description="k_im: 'inverse' (1/d), 'softmax' (exp(-d/T)), both falling with "
            "distance, or 'literal' (the printed d/sum(d), rising with it).",
        )
        temperature: float | None = Field(
            None, gt=0, description="softmax weights: T; None = the mean distance of that client."
        )
        align: Literal["sample", "class_mean"] = Field(
            "sample",
            description="Consistency loss between each embedding and its prototype, or between "
            "the batch's class means and the prototypes (eq. 5 literally).",
        )
        reg_reduction: Literal["mean", "squared_l2"] = Field(
            "mean",
            description="Consistency loss per dimension (MSE, lam/D per squared distance) or "
            "the squared L2 distance itself (the paper's sum of squares; D times larger).",
        )
        distance: Distance = Field(
            "squared",
            description="d_im of the weights and the consistency loss's distance: the squared "
            "L2 (sum of squares, the paper's written-out formula) or the unsquared norm "
            "||.||_2 (the paper's notation; with weights='literal', the literal setting).",
        )
        inference: Literal["head", "prototype"] = Field(
            "head",
            description="Evaluate the personal model's head, or the nearest personalized prototype.",
        )

    @property
    def pfpl_params(self) -> PFPL.Params:
        """`params` as PFPL's own class: FedProto, which PFPL extends, types it as its own."""
        return cast("PFPL.Params", self.params)

    def init_server(self) -> Records:
        m, c = self.setting.num_clients, self.setting.num_classes
        dim = self.setting.init_model["head.weight"].shape[1]
        return {BANK: {"means": torch.zeros(m, c, dim), "counts": torch.zeros(m, c)}}

    def configure(self, server: Records, client: int, server_round: int) -> Records:
        bank = server[BANK]
        if not bool((bank["counts"][client] > 0).any()):
            return {}  # nothing uploaded yet: nothing to personalize
        p = self.pfpl_params
        protos, present = personalized_prototypes(
            bank["means"], bank["counts"], client, p.alpha, p.weights, p.temperature, p.distance
        )
        return {PROTOS: pack_prototypes(protos, present.to(protos.dtype), with_counts=False)}

    def prototypes(self, server: Records) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Every client's latest local prototypes, as the server's bank holds them (PFPL has
        no global set: each client's personalized ones are built from these)."""
        bank = server[BANK]
        return {
            f"client_{i}": (bank["means"][i], bank["counts"][i])
            for i in range(len(bank["counts"]))
            if bool((bank["counts"][i] > 0).any())
        }

    def regularizer(self) -> tuple[float, Target, Reduction]:
        """lam times the consistency loss (eq. 5) to the client's own personalized prototypes,
        per sample or between the batch's class means and them (squared distance: the form
        the per-client loss and the stacked round share)."""
        p = self.pfpl_params
        if p.distance != "squared":
            raise ConfigError(
                "algorithm.distance=unsquared: PFPL's unsquared consistency loss has no stacked "
                "form (the stacked round's prototype term is squared); set train.stacked=false"
            )
        return p.lam, p.align, p.reg_reduction

    def local_loss(self, prototypes: torch.Tensor, present: torch.Tensor) -> LossFn:
        """CE + lam * the consistency loss; with `distance="unsquared"` the loss's distance
        is the unsquared norm (`unsquared_prototype_distance`), else FedProto's squared one."""
        p = self.pfpl_params
        if p.distance == "squared":
            return super().local_loss(prototypes, present)
        lam, target, reduction = p.lam, p.align, p.reg_reduction

        def loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            model = cast("FedModel", module)
            features = model.features(x)
            ce = F.cross_entropy(model.head(features), y)
            if lam == 0 or not bool(present.any()):
                return ce
            features = features.reshape(len(x), -1)
            return ce + lam * unsquared_prototype_distance(
                features, y, prototypes, present, reduction, target
            )

        return loss

    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        means, counts = server[BANK]["means"].clone(), server[BANK]["counts"].clone()
        for reply in replies:
            m, c = unpack_prototypes(reply.records.get(PROTOS), self.setting.num_classes)
            means[reply.client], counts[reply.client] = m, c
        return AggregateResult({BANK: {"means": means, "counts": counts}})
