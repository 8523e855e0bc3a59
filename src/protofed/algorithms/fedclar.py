"""FedCLAR (Presotto et al., PerCom 2022): FedAvg until the global model is stable, then clusters
of similar clients, one FedAvg model per cluster, and local fine-tuning.

R. Presotto, G. Civitarese, C. Bettini. FedCLAR: Federated Clustering for Personalized
Sensor-Based Human Activity Recognition. IEEE PerCom 2022, 227-236.

1. Rounds 1 .. `cluster_round`: FedAvg.
2. In `cluster_round` the server compares the clients it just received: the cosine distance
   between their last layer's weights (the classifier head, the part of a HAR model where users'
   ways of performing activities differ most), and groups them by hierarchical agglomerative
   clustering cut at the distance `threshold`.
3. From then on every cluster is its own federation: its members receive the cluster's model
   and the server replaces it with the sample-weighted mean of its members' replies.
4. Each client fine-tunes the model it receives on its own data for `finetune_epochs` (FedSub
   uses 1): that is its personalized model.

Decisions (record of what the papers leave open):
- `cluster_round` defaults to the middle of training (FedSub clusters at round 160 of 300 "when
  the global model is stable"); `threshold` = 1e-4 is the value FedSub's grid search chose, here
  a cosine distance between head weights (models one local epoch apart from the same global
  model have distances of that order).
- Linkage: average (`linkage` selects complete or single). Every cluster, a single client
  included, gets its own model. Clients not sampled in `cluster_round` stay in group 0, which
  keeps the global model and goes on training it by FedAvg among themselves.
- Fine-tuning happens every round in which a client trains, from the model it received, so the
  personalized model at any round is "what fine-tuning would give if training stopped now" (the
  paper fine-tunes once, at the end). It costs `finetune_epochs` more epochs per client.
- The server state holds one model per group, in the records `group.<g>`, and the
  client-to-group map, the record `assign`. There is no global model once clusters exist, so
  none is reported. A client keeps its fine-tuned model in its state (record `personal`).
- Under a robust `aggregation` rule each group is combined, and norm-checked against the model
  its members were sent, on its own; the server metrics sum the groups' counts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from sklearn.cluster import AgglomerativeClustering

from protofed.algorithms.base import Algorithm, Hyperparams
from protofed.algorithms.common.split import head_names
from protofed.core.types import (
    MODEL,
    AggregateResult,
    Arrays,
    Client,
    FitResult,
    Metrics,
    Records,
    Reply,
)

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
