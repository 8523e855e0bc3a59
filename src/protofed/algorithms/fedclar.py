"""FedCLAR: FedAvg, then clusters of similar clients, per-cluster FedAvg, local fine-tuning (docs/algorithms/fedclar.md)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from protofed.algorithms.base import (
    MODEL,
    AggregateResult,
    Algorithm,
    Arrays,
    Client,
    FitResult,
    Hyperparams,
    Metrics,
    Records,
    Reply,
)
from protofed.algorithms.common.split import head_names

ASSIGN = "assign"  # server state: {"assign": each client's group, a (num_clients,) tensor}
PERSONAL = "personal"  # client state: the fine-tuned model


def group_record(group: int) -> str:
    """The server-state record of group `group`'s model."""
    return f"group.{group}"


def cosine_distances(vectors: torch.Tensor) -> torch.Tensor:
    """(M, M) pairwise 1 - cosine similarity of the rows, in float64, exact zeros on the diagonal."""
    unit = F.normalize(vectors.double(), dim=1)
    dist = (1 - unit @ unit.T).clamp(min=0)
    dist.fill_diagonal_(0)
    return dist


def threshold_clusters(
    vectors: torch.Tensor, threshold: float, linkage: str = "average"
) -> torch.Tensor:
    """Cluster labels (M,) from agglomerative clustering of cosine distances cut at `threshold`."""
    if len(vectors) < 2:
        return torch.zeros(len(vectors), dtype=torch.long)
    dist = cosine_distances(vectors).cpu().numpy()
    from sklearn.cluster import AgglomerativeClustering  # slow to import: `protofed list`

    model = AgglomerativeClustering(
        n_clusters=None, distance_threshold=threshold, metric="precomputed", linkage=linkage
    )
    labels = model.fit_predict(dist)
    # number the clusters in order of their first member, so the result is stable
    _, first = np.unique(labels, return_index=True)
    order = {int(labels[i]): rank for rank, i in enumerate(sorted(first))}
    return torch.tensor([order[int(lab)] for lab in labels], dtype=torch.long)


class FedCLAR(Algorithm):
    name = "fedclar"
    summary = "FedAvg, then clusters of clients with similar heads, per-cluster FedAvg, local fine-tuning."
    reference = (
        "Presotto et al., FedCLAR: Federated Clustering for Personalized Sensor-Based Human "
        "Activity Recognition, PerCom 2022"
    )
    has_global_model = False

    class Params(Hyperparams):
        cluster_round: int | None = Field(
            None, ge=1, description="Round whose replies are clustered; None: half of train.rounds."
        )
        threshold: float = Field(
            1e-4,
            gt=0,
            description="Cosine-distance cut of the hierarchical clustering (FedSub's grid: 1e-4).",
        )
        linkage: Literal["average", "complete", "single"] = Field(
            "average", description="Linkage of the agglomerative clustering."
        )
        finetune_epochs: int = Field(
            1, ge=0, description="Local fine-tuning epochs of the personalized model (FedSub: 1)."
        )

    params: Params

    @property
    def clustering_round(self) -> int:
        given = self.params.cluster_round
        return given if given is not None else max(1, math.ceil(self.setting.train.rounds / 2))

    def init_server(self) -> Records:
        init = self.setting.init_model
        device = next(iter(init.values())).device
        assign = torch.zeros(self.setting.num_clients, dtype=torch.long, device=device)
        return {group_record(0): dict(init), ASSIGN: {ASSIGN: assign}}

    def configure(self, server: Records, client: int, server_round: int) -> Records:
        group = int(server[ASSIGN][ASSIGN][client]) if client >= 0 else 0
        return {MODEL: server[group_record(group)]}

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(message[MODEL])
        metrics = client.train_model()
        reply = client.weights()
        kept: Records = {}
        if self.params.finetune_epochs > 0:
            client.load(message[MODEL])
            tuned = client.train_model(epochs=self.params.finetune_epochs)
            metrics["finetune_loss"] = tuned["loss"]
            kept = {PERSONAL: client.weights()}
        return FitResult({MODEL: reply}, metrics, kept)

    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        assign = server[ASSIGN][ASSIGN].clone()
        if server_round == self.clustering_round:
            replies = list(replies)
            heads = head_names(self.setting.init_model)
            vectors = torch.stack(
                [
                    torch.cat([r.records[MODEL][n].reshape(-1).double() for n in heads])
                    for r in replies
                ]
            )
            labels = threshold_clusters(vectors, self.params.threshold, self.params.linkage)
            first = int(assign.max()) + 1
            for reply, label in zip(replies, labels.tolist(), strict=True):
                assign[reply.client] = first + label
        groups: dict[int, list[Reply]] = {}
        for reply in replies:
            groups.setdefault(int(assign[reply.client]), []).append(reply)
        sent = server[ASSIGN][ASSIGN]  # the group whose model each client was sent
        new = {k: v for k, v in server.items() if k != ASSIGN}
        metrics: Metrics = {}
        for group, members in groups.items():
            reference = {MODEL: server[group_record(int(sent[members[0].client]))]}
            mean, _, counts = self.average(members, reference=reference)
            new[group_record(group)] = mean[MODEL]
            for key, value in counts.items():  # per-group counts, summed over the round
                metrics[key] = metrics.get(key, 0.0) + value
        return AggregateResult({**new, ASSIGN: {ASSIGN: assign}}, metrics)

    def client_model(self, message: Records, state: Records) -> Arrays:
        return state[PERSONAL] if PERSONAL in state else message[MODEL]
