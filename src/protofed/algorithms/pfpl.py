"""PFPL: personalized prototypes from distance-weighted neighbours; only prototypes travel (docs/algorithms/pfpl.md)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, cast

import torch
from pydantic import Field

from protofed.algorithms.base import AggregateResult, Hyperparams, Records, Reply
from protofed.algorithms.common.prototype_losses import Reduction, Target
from protofed.algorithms.fedproto import FedProto
from protofed.prototypes import PROTOS, pack_prototypes, unpack_prototypes

Weighting = Literal["inverse", "softmax", "literal"]
BANK = "bank"  # the server's record: every client's latest local prototypes, (M, C, D) and (M, C)


def neighbour_weights(
    distances: torch.Tensor, mode: Weighting = "inverse", temperature: float | None = None
) -> torch.Tensor:
    """PFPL's k_im over the other clients, from their squared distances d_im (sum to 1).

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


def personalized_prototypes(
    means: torch.Tensor,
    counts: torch.Tensor,
    client: int,
    alpha: float,
    mode: Weighting = "inverse",
    temperature: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 4 for one client: (C, D) personalized prototypes and the (C,) mask of its classes.

    means (M, C, D), counts (M, C) are all clients' latest local prototypes (count 0: absent).
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
        w = neighbour_weights(((theirs - own) ** 2).sum(-1), mode, temperature)
        out[k] = alpha * own + (1 - alpha) * (w.unsqueeze(1) * theirs).sum(0)
    return out, present


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
            bank["means"], bank["counts"], client, p.alpha, p.weights, p.temperature
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
        per sample or between the batch's class means and them."""
        p = self.pfpl_params
        return p.lam, p.align, p.reg_reduction

    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        means, counts = server[BANK]["means"].clone(), server[BANK]["counts"].clone()
        for reply in replies:
            m, c = unpack_prototypes(reply.records.get(PROTOS), self.setting.num_classes)
            means[reply.client], counts[reply.client] = m, c
        return AggregateResult({BANK: {"means": means, "counts": counts}})
