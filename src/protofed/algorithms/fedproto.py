"""FedProto (Tan et al., FedProto: Federated Prototype Learning across Heterogeneous Clients,
AAAI 2022): clients exchange class prototypes, never model weights.

Each round, client i
1. trains its own model (kept in its state; FedProto shares no weights) on
   CE + lam * mean over samples of ||f(x) - C_bar^(y)||^2 / D   (eq. 8; `_prototype_losses`),
   where C_bar are the global prototypes the server sent (classes without one add nothing;
   in round 1 there are none, so the loss is CE);
2. sends its local prototypes C_i^(j) = mean of f(x) over its class-j training samples
   (eq. 4), with the class counts, only for the classes it has.
The server's global prototype of class j is the count-weighted mean of the clients' class-j
prototypes (eq. 6) and goes down to every client. Inference (section "Inference"): the class
of the nearest global prototype to f(x), expressed as weights: the personal model with its
head replaced by the linear head W = 2C_bar, b = -||C_bar||^2 (`nearest_prototype_head`), so
the evaluation protocol runs it as any other model.

Ambiguities settled here (docs/results/pfpl.md lists them too):
- Eq. 6 prints (1/|N_j|) * sum_i (|D_ij| / N_j) C_i^(j), whose two normalisations shrink the
  prototype by |N_j|; read as the count-weighted mean (`weighting="count"`). The authors'
  code takes the unweighted mean over clients: `weighting="uniform"`.
- The distance is the mean squared error over the embedding's D dimensions (the official
  code's nn.MSELoss), so lam is per dimension; lam = 1 is the official default.
- Local prototypes are computed after local training, in eval mode, over the whole training
  split (eq. 4); the official code averages the training-mode embeddings of the last epoch.
- Inference compares with every class that has a global prototype (the official code's
  test with global prototypes); a class no client has is never predicted. `inference="head"`
  evaluates the personal model's own classifier instead (the official code reports both).
  Before the first aggregation there are no global prototypes and the own head is used.
- A client trains its personal model from the shared initial weights in its first round.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Literal

import torch
from pydantic import Field

from protofed.algorithms.base import Algorithm, Hyperparams
from protofed.algorithms.common.prototype_losses import prototype_regularized_loss
from protofed.core.types import MODEL, AggregateResult, Arrays, Client, FitResult, Records, Reply
from protofed.prototypes import (
    PROTOS,
    embedding_means,
    merge_means,
    pack_prototypes,
    unpack_prototypes,
    with_prototype_head,
)
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

    def local_loss(self, prototypes: torch.Tensor, present: torch.Tensor) -> LossFn:
        """The client's training loss given the prototypes it received (eq. 8: CE + lam * dist)."""
        return prototype_regularized_loss(prototypes, present, self.params.lam)

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        num_classes = self.setting.num_classes
        client.load(self.own_model(state))
        protos, counts = unpack_prototypes(message.get(PROTOS), num_classes)
        device = client.data.train_x.device
        metrics = client.train_model(
            loss_fn=self.local_loss(protos.to(device), (counts > 0).to(device))
        )
        means, class_counts = embedding_means(
            client.model, client.data.train_x, client.data.train_y, num_classes
        )
        reply = pack_prototypes(means.cpu(), class_counts.cpu(), with_counts=self.reply_counts)
        return FitResult({PROTOS: reply}, metrics, {MODEL: client.weights()})

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
