"""ProtoHAR: a global body aligned to global prototypes, and a personal classifier (docs/algorithms/protohar.md)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from protofed.algorithms.base import Algorithm
from protofed.algorithms.common.decoupled import (
    DecoupledParams,
    body_without_prototypes,
    global_prototypes,
    head_then_aligned_body,
)
from protofed.algorithms.common.split import split_arrays
from protofed.core.types import MODEL, AggregateResult, Arrays, FitResult, Records, Reply
from protofed.prototypes import (
    PROTOS,
    embedding_means,
    merge_means,
    pack_prototypes,
    unpack_prototypes,
)
from protofed.training.client import Client

HEAD = "head"  # a client's state: its personal head


def client_mean_prototypes(
    means: torch.Tensor, counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ProtoHAR's server merge: per class, the plain mean over the clients that have the class.

    means (M, C, D), counts (M, C) -> prototypes (C, D), number of clients per class (C,).
    """
    return merge_means(means, (counts > 0).to(means.dtype))


class ProtoHAR(Algorithm):
    name = "protohar"
    summary = (
        "Global body aligned to global prototypes (CE + lam*MSE), personal head trained first."
    )
    reference = (
        "Cheng et al., ProtoHAR: Prototype Guided Personalized Federated Learning for Human "
        "Activity Recognition, IEEE JBHI 2023"
    )
    has_global_model = False

    Params = DecoupledParams

    params: DecoupledParams

    def init_server(self) -> Records:
        return body_without_prototypes(self.setting)

    def local_head(self, state: Records) -> Arrays:
        return state[HEAD] if state else split_arrays(self.setting.init_model)[1]

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(message[MODEL])
        client.load(self.local_head(state))
        metrics = head_then_aligned_body(
            client, message[PROTOS], self.params, self.setting.num_classes
        )
        means, counts = embedding_means(
            client.model, client.data.train_x, client.data.train_y, self.setting.num_classes
        )
        body, head = split_arrays(client.weights())
        return FitResult(
            {MODEL: body, PROTOS: pack_prototypes(means, counts)}, metrics, {HEAD: head}
        )

    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        mean, seen, metrics = self.average(replies, records=[MODEL], reference=server)
        dense = [unpack_prototypes(r.records[PROTOS], self.setting.num_classes) for r in seen]
        means, clients = client_mean_prototypes(
            torch.stack([m for m, _ in dense]), torch.stack([c for _, c in dense])
        )
        return AggregateResult(
            {MODEL: mean[MODEL], PROTOS: pack_prototypes(means, clients, with_counts=False)},
            metrics,
        )

    def prototypes(self, server: Records) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return global_prototypes(server, self.setting.num_classes)

    def client_model(self, message: Records, state: Records) -> Arrays:
        return {**message[MODEL], **self.local_head(state)}
