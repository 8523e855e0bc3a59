"""FedDPA: a global model with adaptive prototype alignment, grouped (hierarchical) aggregation and margin-separated global prototypes (docs/algorithms/feddpa.md)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import torch
from pydantic import Field

from protofed.algorithms.base import Algorithm, Hyperparams
from protofed.algorithms.common.prototype_losses import (
    prototype_regularized_loss,
)
from protofed.core.seeding import SERVER, derive_seed
from protofed.core.types import (
    MODEL,
    AggregateResult,
    Arrays,
    FitResult,
    Metrics,
    Records,
    Reply,
)
from protofed.prototypes import (
    PROTOS,
    best_kmeans,
    embedding_means,
    kmeans,
    merge_means,
    pack_prototypes,
    unpack_prototypes,
    with_prototype_head,
)
from protofed.training.client import Client

# the server's record of the global prototypes: "prototypes" (C, D) and "present" (C,), 1
# where a class has a global prototype (sent down packed, as the record `protos`)
GLOBAL_PROTOS = "global"


# the server's computations, each on plain tensors ----------------------------------------
def heterogeneity(
    local: torch.Tensor,
    local_counts: torch.Tensor,
    global_: torch.Tensor,
    global_present: torch.Tensor,
    squared: bool = False,
) -> float:
    """Het_k (eq. 5): mean over shared classes of ||P_i^k - P_i^g|| (or its square); 0 if none."""
    shared = (local_counts > 0) & global_present.bool()
    if not bool(shared.any()):
        return 0.0
    dist = (local[shared] - global_[shared]).pow(2).sum(-1)
    return float((dist if squared else dist.sqrt()).mean())


def separation_loss(prototypes: torch.Tensor, present: torch.Tensor, margin: float) -> torch.Tensor:
    """L_sep (eq. 11): 1/(C(C-1)) sum_{i != j} max(m - ||P_i - P_j||, 0) over present classes."""
    p = prototypes[present.bool()]
    c = len(p)
    if c < 2:
        return prototypes.sum() * 0.0
    diff = p.unsqueeze(0) - p.unsqueeze(1)
    dist = (diff.pow(2).sum(-1) + 1e-12).sqrt()  # eps: differentiable where two coincide
    off = ~torch.eye(c, dtype=torch.bool, device=p.device)
    return torch.relu(margin - dist[off]).sum() / (c * (c - 1))


def min_distance(prototypes: torch.Tensor, present: torch.Tensor) -> float:
    """The smallest distance between two present prototypes (inf with fewer than two)."""
    p = prototypes[present.bool()]
    if len(p) < 2:
        return float("inf")
    dist = torch.cdist(p.double(), p.double())
    return float(dist[~torch.eye(len(p), dtype=torch.bool)].min())


def alignment_loss(
    prototypes: torch.Tensor, local: torch.Tensor, local_counts: torch.Tensor
) -> torch.Tensor:
    """L_align (eq. 10): 1/N sum_k sum_{i in client k} ||P_i^k - P_i^g||^2; local (N, C, D)."""
    has = (local_counts > 0).to(local.dtype)
    return ((local - prototypes.unsqueeze(0)).pow(2).sum(-1) * has).sum() / len(local)


def contrastive_refine(
    prototypes: torch.Tensor,
    present: torch.Tensor,
    local: torch.Tensor,
    local_counts: torch.Tensor,
    *,
    margin: float,
    sep_weight: float,
    steps: int,
    lr: float,
) -> torch.Tensor:
    """P^g after `steps` of gradient descent on L_align + sep_weight * L_sep (eq. 12)."""
    p = prototypes.detach().clone().requires_grad_(True)
    optimizer = torch.optim.SGD([p], lr=lr)
    for _ in range(steps):
        loss = alignment_loss(p, local, local_counts) + sep_weight * separation_loss(
            p, present, margin
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    out = p.detach()
    return torch.where(present.bool().unsqueeze(-1), out, prototypes)  # absent rows untouched


def group_clients(
    local: torch.Tensor,
    local_counts: torch.Tensor,
    num_groups: int,
    *,
    missing: Literal["mean", "zero"] = "mean",
    seed: int = 0,
) -> torch.Tensor:
    """Group labels (N,) by K-means on the clients' concatenated prototypes.

    A class a client lacks is filled with the mean over the clients that have it ("mean") or
    with zeros. `num_groups=0`: the count in 2..N-1 with the best Davies-Bouldin score.
    """
    n = len(local)
    if n == 1:
        return torch.zeros(1, dtype=torch.long)
    has = (local_counts > 0).unsqueeze(-1)
    filled = local
    if missing == "mean":
        fill, _ = merge_means(local, (local_counts > 0).to(local.dtype))
        filled = torch.where(has, local, fill.unsqueeze(0))
    points = filled.reshape(n, -1)
    if num_groups == 0:
        return best_kmeans(points, range(2, n), seed=seed)[1]
    return kmeans(points, min(num_groups, n), seed=seed)[1]


def hierarchical_weights(
    groups: torch.Tensor, num_examples: torch.Tensor, within: Literal["uniform", "samples"]
) -> torch.Tensor:
    """Per-client weights (N,), summing to 1, that make one weighted mean equal eq. 8 then 9:
    1/M per group, split among its members equally ("uniform") or by examples ("samples")."""
    ids = torch.unique(groups)
    w = torch.zeros(len(groups), dtype=torch.float64)
    for g in ids:
        members = groups == g
        share = num_examples[members].double() if within == "samples" else members[members].double()
        w[members] = share / share.sum() / len(ids)
    return w


def hierarchical_prototypes(
    local: torch.Tensor,
    local_counts: torch.Tensor,
    groups: torch.Tensor,
    within: Literal["uniform", "samples"],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 6 then 7: each group's mean prototype of class i over its members that have i,
    then the plain mean over the groups that have i. Returns (C, D) and present (C,)."""
    weights = local_counts if within == "samples" else (local_counts > 0).to(local.dtype)
    group_means, group_present = [], []
    for g in torch.unique(groups):
        members = groups == g
        m, total = merge_means(local[members], weights[members])
        group_means.append(m)
        group_present.append((total > 0).to(local.dtype))
    merged, total = merge_means(torch.stack(group_means), torch.stack(group_present))
    return merged, total > 0


# the algorithm ---------------------------------------------------------------------------
class FedDPA(Algorithm):
    name = "feddpa"
    summary = (
        "Global model with adaptive prototype regularisation, hierarchical (grouped) "
        "aggregation and margin-separated global prototypes."
    )
    reference = (
        "Bensiah & Benaboud, FedDPA: Dynamic Prototypical Alignment for Federated Learning "
        "with Non-IID Data, Electronics 2025"
    )

    class Params(Hyperparams):
        alpha: float = Field(0.01, ge=0, description="Base regularisation strength (paper: 0.01).")
        beta: float = Field(0.1, ge=0, description="Weight of the heterogeneity (paper: 0.1).")
        heterogeneity: Literal["distance", "squared"] = Field(
            "distance",
            description="Het_k: mean distance of local to global prototypes (text, notes) or "
            "mean squared distance (eq. 5 as printed).",
        )
        adaptive: bool = Field(
            True, description="Ablation switch: false fixes lambda_k to fixed_lambda."
        )
        fixed_lambda: float | None = Field(
            None, ge=0, description="lambda when adaptive=false; None: alpha."
        )
        reg_reduction: Literal["mean", "sum"] = Field(
            "mean",
            description="Regulariser: MSE per class and dimension, or the sum over classes of "
            "squared distances (eq. 3 as printed; diverges with the paper's alpha, beta).",
        )
        hierarchical: bool = Field(
            True, description="Ablation switch: false is one flat (FedAvg) average."
        )
        num_groups: int = Field(
            3, ge=0, description="Groups of the round's clients (0: Davies-Bouldin over 2..n-1)."
        )
        group_weighting: Literal["uniform", "samples"] = Field(
            "uniform",
            description="Members of a group average equally (eq. 6, 8) or by their examples.",
        )
        missing_class: Literal["mean", "zero"] = Field(
            "mean",
            description="Clustering: a lacking class is filled with the round's mean or zeros.",
        )
        contrastive: bool = Field(
            True, description="Ablation switch: false keeps the averaged prototypes."
        )
        margin: float = Field(1.0, ge=0, description="Separation margin m (paper: 1).")
        sep_weight: float = Field(
            0.1, ge=0, description="Weight lambda of L_sep in L_contrast (paper: 0.1)."
        )
        align_steps: int = Field(
            10, ge=0, description="Server gradient steps on L_contrast (not given in the paper)."
        )
        align_lr: float = Field(
            0.1, gt=0, description="Server step size on L_contrast (not given in the paper)."
        )
        initial_prototypes: Literal["none", "zeros"] = Field(
            "none",
            description="Round 1: no global prototypes, or Algorithm 2's P^g = 0 for all classes.",
        )
        global_inference: Literal["head", "prototype"] = Field(
            "head",
            description="Global model: its classifier head (paper) or the nearest global prototype.",
        )

    params: Params

    # server state = model weights + the global prototypes ---------------------------------
    def init_server(self) -> Records:
        model = dict(self.setting.init_model)
        num_classes, dim = model["head.weight"].shape
        zeros = self.params.initial_prototypes == "zeros"
        return {
            MODEL: model,
            GLOBAL_PROTOS: {
                "prototypes": torch.zeros(num_classes, dim),
                "present": torch.full((num_classes,), float(zeros)),
            },
        }

    def configure(self, server: Records, client: int, server_round: int) -> Records:
        glob = server[GLOBAL_PROTOS]
        packed = pack_prototypes(glob["prototypes"], glob["present"], with_counts=False)
        return {MODEL: server[MODEL], PROTOS: packed}

    def _lambda(self, het: float) -> float:
        if self.params.adaptive:
            return self.params.alpha + self.params.beta * het
        return self.params.alpha if self.params.fixed_lambda is None else self.params.fixed_lambda

    def alignment(
        self, client: Client, message: Records
    ) -> tuple[torch.Tensor, torch.Tensor, float, float]:
        """Load the sent model; the global prototypes (C, D) and their mask on the client's
        device, its Het_k (eq. 5, of the sent model's embeddings) and its lambda_k (eq. 4)."""
        data = client.data
        client.load(message[MODEL])
        protos, counts = unpack_prototypes(message.get(PROTOS), self.setting.num_classes)
        device = data.train_x.device
        protos, present = protos.to(device), (counts > 0).to(device)
        het = 0.0
        if bool(present.any()) and self.params.adaptive:
            before, before_counts = embedding_means(
                client.model, data.train_x, data.train_y, self.setting.num_classes
            )
            het = heterogeneity(
                before, before_counts, protos, present, self.params.heterogeneity == "squared"
            )
        return protos, present, het, self._lambda(het)

    def fitted(self, client: Client, metrics: Metrics, het: float, lam: float) -> FitResult:
        """The reply of the workspace model as trained: its weights and the class means of its
        embeddings of the client's data."""
        data = client.data
        means, counts = embedding_means(
            client.model, data.train_x, data.train_y, self.setting.num_classes
        )
        metrics = {**metrics, "heterogeneity": het, "reg_lambda": lam}
        reply = {MODEL: client.weights(), PROTOS: pack_prototypes(means.cpu(), counts.cpu())}
        return FitResult(reply, metrics)

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        protos, present, het, lam = self.alignment(client, message)
        loss_fn = prototype_regularized_loss(
            protos, present, lam, target="class_mean", reduction=self.params.reg_reduction
        )
        return self.fitted(client, client.train_model(loss_fn=loss_fn), het, lam)

    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        """The hierarchical model and prototype merge, then the contrastive refinement.

        Server metrics (the round's diagnostics): `lambda_mean` and `heterogeneity_mean` (the
        clients' lambda_k and Het_k), `groups`, `separation_before` and `separation_after`
        (L_sep around the contrastive step) and `min_distance` (the closest two prototypes),
        plus `Algorithm.average`'s under a robust `aggregation` rule. Only the model weights
        go through that rule (which ignores the hierarchical weights): the prototypes and
        groups still take every reply.
        """
        num_classes = self.setting.num_classes
        p = self.params
        replies = list(replies)  # grouping needs every client of the round
        if not replies:
            return AggregateResult(server)
        glob = server[GLOBAL_PROTOS]
        unpacked = [unpack_prototypes(r.records[PROTOS], num_classes) for r in replies]
        local = torch.stack([m for m, _ in unpacked]).to(glob["prototypes"].dtype)
        local_counts = torch.stack([c for _, c in unpacked]).to(local.dtype)
        bad = [r.client for r, m in zip(replies, local, strict=True) if not torch.isfinite(m).all()]
        if bad:
            raise FloatingPointError(
                f"feddpa round {server_round}: clients {bad} sent non-finite prototypes (local training "
                "diverged); lower train.lr, algorithm.alpha/beta, or use reg_reduction=mean"
            )
        if p.hierarchical:
            seed = derive_seed(self.setting.seed, SERVER, server_round) % 2**32  # sklearn: 32 bits
            groups = group_clients(
                local, local_counts, p.num_groups, missing=p.missing_class, seed=seed
            )
            examples = torch.tensor([r.num_examples for r in replies])
            weights = hierarchical_weights(groups, examples, p.group_weighting)
            by_client = {r.client: float(w) for r, w in zip(replies, weights, strict=True)}
            mean, _, averaged = self.average(
                replies, [MODEL], weight=lambda r: by_client[r.client], reference=server
            )
            merged, present = hierarchical_prototypes(
                local, local_counts, groups, p.group_weighting
            )
        else:
            groups = torch.zeros(len(replies), dtype=torch.long)
            mean, _, averaged = self.average(replies, [MODEL], reference=server)
            merged, total = merge_means(local, local_counts)
            present = total > 0
        previous, before = glob["prototypes"], glob["present"].bool()
        prototypes = torch.where(present.unsqueeze(-1), merged, previous)
        present = present | before
        sep_before = float(separation_loss(prototypes, present, p.margin))
        if p.contrastive and p.align_steps > 0:
            prototypes = contrastive_refine(
                prototypes,
                present,
                local,
                local_counts,
                margin=p.margin,
                sep_weight=p.sep_weight,
                steps=p.align_steps,
                lr=p.align_lr,
            )
        metrics = {
            "lambda_mean": sum(r.metrics.get("reg_lambda", 0.0) for r in replies) / len(replies),
            "heterogeneity_mean": sum(r.metrics.get("heterogeneity", 0.0) for r in replies)
            / len(replies),
            "groups": float(len(torch.unique(groups))),
            "separation_before": sep_before,
            "separation_after": float(separation_loss(prototypes, present, p.margin)),
            "min_distance": min_distance(prototypes, present),
            **averaged,
        }
        new = {"prototypes": prototypes, "present": present.to(previous.dtype)}
        return AggregateResult({MODEL: mean[MODEL], GLOBAL_PROTOS: new}, metrics)

    # client_model: the default (no personal model: the global one, shared storage)

    def prototypes(self, server: Records) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        glob = server[GLOBAL_PROTOS]
        return {"global": (glob["prototypes"], glob["present"])} if glob["present"].any() else {}

    def global_model(self, server: Records) -> Arrays | None:
        model = server[MODEL]
        glob = server[GLOBAL_PROTOS]
        if self.params.global_inference == "prototype" and bool(glob["present"].any()):
            return with_prototype_head(model, glob["prototypes"], glob["present"] > 0)
        return model
