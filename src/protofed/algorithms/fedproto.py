"""FedProto: clients exchange class prototypes, never model weights (docs/algorithms/fedproto.md)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Literal

import torch
from pydantic import Field

from protofed.algorithms.base import Algorithm, Hyperparams
from protofed.algorithms.common.prototype_losses import (
    Reduction,
    Target,
    prototype_regularized_loss,
)
from protofed.core.types import MODEL, AggregateResult, Arrays, FitResult, Records, Reply
from protofed.prototypes import (
    PROTOS,
    embedding_means,
    merge_means,
    pack_prototypes,
    unpack_prototypes,
    with_prototype_head,
)
from protofed.training.client import Client
from protofed.training.loop import LossFn


class FedProto(Algorithm):
    name = "fedproto"
    summary = "Prototype exchange only: CE + lam*||f(x) - global prototype||^2; nearest-prototype inference."
    reference = (
        "Tan et al., FedProto: Federated Prototype Learning across Heterogeneous Clients, AAAI 2022"
    )
    has_global_model = False
    reply_counts: ClassVar[bool] = True  # class counts go up: eq. 6 weights the mean by them

    class Params(Hyperparams):
        lam: float = Field(
            1.0,
            ge=0,
            description="Weight of the prototype distance (FedProto's lambda; official default 1).",
        )
        weighting: Literal["count", "uniform"] = Field(
            "count",
            description="Global prototype = count-weighted mean (eq. 6) or the plain mean over "
            "clients (the official code).",
        )
        inference: Literal["prototype", "head"] = Field(
            "prototype",
            description="Classify by the nearest global prototype (the paper) or by the personal model's own head.",
        )

    params: Params

    def init_server(self) -> Records:
        return {}  # no global prototypes before the first round

    def configure(self, server: Records, client: int, server_round: int) -> Records:
        if not server:
            return {}
        dense = server[PROTOS]  # every class's global prototype and its total count
        return {PROTOS: pack_prototypes(dense["means"], dense["counts"], with_counts=False)}

    def own_model(self, state: Records) -> Arrays:
        """The client's personal model: its state, or the initial weights before round 1."""
        return state[MODEL] if state else self.setting.init_model

    def regularizer(self) -> tuple[float, Target, Reduction]:
        """The prototype term's weight lam, target and reduction (eq. 8: each embedding's mean
        squared distance to its class's prototype): one source for the per-client loss and
        the stacked round's term (runtime/stacking), which PFPL's overrides."""
        return self.params.lam, "sample", "mean"

    def local_loss(self, prototypes: torch.Tensor, present: torch.Tensor) -> LossFn:
        """The client's training loss given the prototypes it received (eq. 8: CE + lam * dist)."""
        lam, target, reduction = self.regularizer()
        return prototype_regularized_loss(prototypes, present, lam, target, reduction)

    def received(self, message: Records) -> tuple[torch.Tensor, torch.Tensor]:
        """The prototypes a client was sent, dense (C, D), and the mask of the classes sent."""
        protos, counts = unpack_prototypes(message.get(PROTOS), self.setting.num_classes)
        return protos, counts > 0

    def local_prototypes(self, client: Client) -> Records:
        """The reply: the class means of the workspace model's embeddings of the client's data."""
        means, class_counts = embedding_means(
            client.model, client.data.train_x, client.data.train_y, self.setting.num_classes
        )
        reply = pack_prototypes(means.cpu(), class_counts.cpu(), with_counts=self.reply_counts)
        return {PROTOS: reply}

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(self.own_model(state))
        protos, present = self.received(message)
        device = client.data.train_x.device
        metrics = client.train_model(loss_fn=self.local_loss(protos.to(device), present.to(device)))
        return FitResult(self.local_prototypes(client), metrics, {MODEL: client.weights()})

    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        num_classes = self.setting.num_classes
        means, counts = [], []
        for reply in replies:
            m, c = unpack_prototypes(reply.records.get(PROTOS), num_classes)
            means.append(m)
            counts.append(c if self.params.weighting == "count" else (c > 0).to(c.dtype))
        if not means:
            return AggregateResult(server)
        merged, total = merge_means(torch.stack(means), torch.stack(counts))
        return AggregateResult({PROTOS: {"means": merged, "counts": total}})

    def prototypes(self, server: Records) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The global prototypes (eq. 6), none before round 1."""
        if PROTOS not in server:
            return {}
        return {"global": (server[PROTOS]["means"], server[PROTOS]["counts"])}

    def client_model(self, message: Records, state: Records) -> Arrays:
        weights = self.own_model(state)
        if self.params.inference == "head" or PROTOS not in message:
            return weights
        protos, counts = unpack_prototypes(message[PROTOS], self.setting.num_classes)
        return with_prototype_head(weights, protos, counts > 0)
