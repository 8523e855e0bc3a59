"""Class prototypes and the clustering around them, shared by every prototype method.

FedProto, PFPL, FedDPA, FedSub, FedPAC, FedNH, ProtoHAR and FedAli's server all compute the
same few things: per-class means with their counts (a client may lack classes), weighted
merges of such means across clients, K-means (optionally with a given start), the number of
clusters chosen by the Davies-Bouldin score, and client similarity over the classes two
clients share. They live here once, on torch tensors; clustering goes through scikit-learn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
import torch


def class_means(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class mean of `features` (N, D) and the per-class counts (C,).

    A class with no sample has a zero row and count 0: callers mask with `counts > 0`
    instead of guessing, so a missing class never passes for a prototype at the origin.
    """
    features = features.reshape(len(features), -1)
    counts = torch.bincount(labels.long(), minlength=num_classes)[:num_classes]
    sums = torch.zeros(num_classes, features.shape[1], dtype=features.dtype, device=features.device)
    sums.index_add_(0, labels.long(), features)
    means = sums / counts.clamp(min=1).unsqueeze(1).to(features.dtype)
    return means, counts.to(features.dtype)


@torch.no_grad()
def embed(
    model: torch.nn.Module, x: torch.Tensor, batch_size: int = 512, pooled: bool = False
) -> torch.Tensor:
    """`model.features(x)` (N, D), in eval mode, batch by batch, detached.

    The raw embeddings, for methods that need more than the class means (FedPAC's feature
    variance, FedNH's normalised means, FedHome's synthetic samples). `pooled`: the
    features' `pooled` output instead, where they have one (HART's encoder output before
    its embedding layer, for figures).
    """
    was_training = model.training
    model.eval()
    try:
        module = model.get_submodule("features")
        features: Callable[[torch.Tensor], torch.Tensor] = (
            getattr(module, "pooled") if pooled else module  # noqa: B009 (nn.Module types it as a tensor)
        )
        chunks = [features(x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
    finally:
        model.train(was_training)
    return torch.cat(chunks).reshape(len(x), -1) if chunks else x.new_zeros(0, 1)


def embedding_means(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    batch_size: int = 512,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class means of `model.features(x)`, in eval mode, batch by batch."""
    return class_means(embed(model, x, batch_size), y, num_classes)


def merge_means(means: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Count-weighted mean over the first axis: (M, C, D), (M, C) -> (C, D), (C,).

    This is how per-client prototypes become global ones (FedProto's eq. 6 with the sample
    counts as weights); a class no client has keeps count 0 and a zero row.
    """
    total = counts.sum(0)
    merged = (means * counts.unsqueeze(-1)).sum(0) / total.clamp(min=1e-12).unsqueeze(-1)
    return torch.where(total.unsqueeze(-1) > 0, merged, torch.zeros_like(merged)), total


def kmeans(
    points: torch.Tensor,
    k: int,
    *,
    init: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    seed: int = 0,
    max_iter: int = 300,
    tol: float = 1e-4,
    backend: Literal["sklearn", "torch"] = "sklearn",
    guess: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K-means centroids (k, D) and labels (N,).

    With `init` the run starts from those centroids (one run: FedAli starts at the clients'
    weighted average); without it, k-means++ with 10 restarts from `seed`. `tol` is
    scikit-learn's: stop when the squared centroid shift, summed, is at most `tol` times the
    mean per-feature variance of the points (or when no label changes).

    `backend="sklearn"` (the default, every method's) runs scikit-learn in float64;
    `backend="torch"` runs `lloyd` (float32, on the points' device, `init` required): the
    same iterations and stopping rule, with exact assignments that skip the distance matrix
    for points provably nearest to their current centroid; `guess` (N,), each point's likely
    cluster under `init`, spares its first full distance matrix (the result does not
    depend on it).
    """
    if k > len(points):
        raise ValueError(f"kmeans: k={k} clusters but only {len(points)} points")
    if backend == "torch":
        if init is None:
            raise ValueError("kmeans: backend='torch' needs `init` (it has no k-means++)")
        return lloyd(points, init, weights=weights, max_iter=max_iter, tol=tol, guess=guess)
    if backend != "sklearn":
        raise ValueError(f"kmeans: unknown backend '{backend}'")
    from sklearn.cluster import KMeans  # here: scikit-learn is slow to import (`protofed list`)

    data = points.detach().cpu().double().numpy()
    if init is not None:
        start = init.detach().cpu().double().numpy()
        model = KMeans(k, init=start, n_init=1, max_iter=max_iter, tol=tol)
    else:
        model = KMeans(k, n_init=10, random_state=seed, max_iter=max_iter, tol=tol)
    sample_weight = None if weights is None else weights.detach().cpu().double().numpy()
    model.fit(data, sample_weight=sample_weight)
    centroids = torch.as_tensor(model.cluster_centers_, dtype=points.dtype, device=points.device)
    return centroids, torch.as_tensor(model.labels_, dtype=torch.long)


def _half_separation(centroids: torch.Tensor) -> torch.Tensor:
    """Half the distance of each centroid to its nearest other one (k,), from below.

    Squared distances come from one float32 matmul; the bound on its rounding error
    (2 D eps (|a|^2 + |b|^2)) is subtracted, so the result never exceeds the exact value.
    """
    k, dim = centroids.shape
    if k < 2:
        return centroids.new_full((k,), float("inf"))
    sq = (centroids * centroids).sum(1)
    pair = sq.unsqueeze(1) + sq.unsqueeze(0)
    dist = pair - 2 * centroids @ centroids.T
    dist -= 2 * dim * torch.finfo(centroids.dtype).eps * pair
    dist.fill_diagonal_(float("inf"))
    return 0.5 * dist.min(1).values.clamp_min(0).sqrt()


def _assign(
    x: torch.Tensor, centroids: torch.Tensor, guess: torch.Tensor | None, chunk: int = 4096
) -> torch.Tensor:
    """Each row's nearest centroid (N,), exactly up to float32 ties.

    Elkan's lemma: if |x - c_g| <= half the distance from c_g to every other centroid, c_g is
    x's nearest. Rows whose `guess` passes that test keep it after one distance each (N x D
    work); only the others get the full distance row (matmul, chunked).
    """
    labels = (
        torch.empty(len(x), dtype=torch.long, device=x.device) if guess is None else guess.clone()
    )
    if guess is None:
        todo = torch.arange(len(x), device=x.device)
    else:
        near = (x - centroids[guess]).norm(dim=1)
        todo = torch.nonzero(near > _half_separation(centroids)[guess] * (1 - 1e-5)).flatten()
    if len(todo):
        half_sq = 0.5 * (centroids * centroids).sum(1)
        for rows in todo.split(chunk):
            labels[rows] = (half_sq - x[rows] @ centroids.T).argmin(1)
    return labels


@torch.no_grad()
def lloyd(
    points: torch.Tensor,
    init: torch.Tensor,
    *,
    weights: torch.Tensor | None = None,
    max_iter: int = 300,
    tol: float = 1e-4,
    guess: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's K-means from `init` in torch, scikit-learn's iteration and stopping rule.

    Why: FedAli's server clusters 30 x 2048 prototypes (192-d) into 2048 and scikit-learn's
    float64 Lloyd computes the full 61k x 2048 distance matrix every iteration. Here
    distances are float32 (as the official code's data) and `_assign` skips them for the
    points that provably stay (`guess` for the first assignment: FedAli's points start in
    their own slot's cluster); centroid sums are float64. Measured faster than
    scikit-learn's float64 Lloyd on FedAli's banks, the same centroids to 4e-7; the pruning
    is the gain, not the precision (docs/speed.md).
    Empty clusters take the points farthest from their centroids, as scikit-learn's do.
    Deterministic on CPU. Returns centroids (k, D) in `points`' dtype and labels (N,).
    """
    x = points.detach().reshape(len(points), -1).float()
    centroids = init.detach().to(x)
    k = len(centroids)
    w = (
        torch.ones(len(x), dtype=torch.float64, device=x.device)
        if weights is None
        else weights.detach().to(x.device, torch.float64)
    )
    xw = x.double() * w.unsqueeze(1)
    threshold = tol * x.var(0, unbiased=False).mean().item()
    guess = None if guess is None else guess.to(x.device, torch.long)
    labels: torch.Tensor | None = None
    strict = False
    for _ in range(max_iter):
        new_labels = _assign(x, centroids, labels if labels is not None else guess)
        mass = torch.zeros(k, dtype=torch.float64, device=x.device).index_add_(0, new_labels, w)
        empty = torch.nonzero(mass == 0).flatten()
        if len(empty):
            far = (x - centroids[new_labels]).norm(dim=1).topk(len(empty)).indices
            new_labels[far] = empty
            mass = torch.zeros_like(mass).index_add_(0, new_labels, w)
        sums = torch.zeros(k, x.shape[1], dtype=torch.float64, device=x.device)
        sums.index_add_(0, new_labels, xw)
        moved = (sums / mass.clamp_min(1e-300).unsqueeze(1)).float()
        moved = torch.where(mass.unsqueeze(1) > 0, moved, centroids)
        if labels is not None and torch.equal(new_labels, labels):
            strict = True
            labels, centroids = new_labels, moved
            break
        shift = float(((moved - centroids) ** 2).sum())
        labels, centroids = new_labels, moved
        if shift <= threshold:
            break
    if not strict or labels is None:  # strict: labels are the last assignment's
        labels = _assign(x, centroids, labels)
    return centroids.to(points.dtype), labels.cpu()


def best_kmeans(
    points: torch.Tensor, k_range: range | list[int], *, seed: int = 0
) -> tuple[int, torch.Tensor]:
    """The cluster count in `k_range` with the lowest Davies-Bouldin score, and its labels.

    Davies-Bouldin needs at least 2 clusters and fewer clusters than points; counts outside
    that are skipped. With fewer than 3 points everything is one cluster.
    """
    n = len(points)
    candidates = [k for k in k_range if 2 <= k < n]
    if not candidates:
        return 1, torch.zeros(n, dtype=torch.long)
    from sklearn.metrics import davies_bouldin_score

    data = points.detach().cpu().double().numpy()
    best: tuple[float, int, torch.Tensor] | None = None
    for k in candidates:
        _, labels = kmeans(points, k, seed=seed)
        if len(np.unique(labels.numpy())) < 2:
            continue
        score = float(davies_bouldin_score(data, labels.numpy()))
        if best is None or score < best[0]:
            best = (score, k, labels)
    if best is None:
        return 1, torch.zeros(n, dtype=torch.long)
    return best[1], best[2]


def shared_class_similarity(means: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Client-by-client cosine similarity of prototypes, averaged over shared classes.

    means (M, C, D), counts (M, C) -> (M, M). Clients that share no class get -inf (never
    among each other's nearest); the diagonal is the client with itself.
    """
    unit = torch.nn.functional.normalize(means, dim=-1)
    present = (counts > 0).to(means.dtype)  # (M, C)
    cos = torch.einsum("icd,jcd->ijc", unit, unit)  # (M, M, C)
    shared = present.unsqueeze(1) * present.unsqueeze(0)  # (M, M, C)
    n_shared = shared.sum(-1)
    sim = (cos * shared).sum(-1) / n_shared.clamp(min=1)
    return torch.where(n_shared > 0, sim, torch.full_like(sim, float("-inf")))


def nearest_prototype_head(
    prototypes: torch.Tensor, present: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear head (weight, bias) whose argmax is the nearest prototype in Euclidean distance.

    argmin_c ||f - p_c||^2 = argmax_c (2 p_c . f - ||p_c||^2), because ||f||^2 is the same for
    every class: so nearest-prototype inference (FedProto, FedPAC-style) runs as an ordinary
    model and the evaluation protocol needs no special case. Absent classes get a bias of
    -1e9, so they are never predicted while any class is present.
    """
    weight = 2 * prototypes
    bias = -(prototypes * prototypes).sum(-1)
    bias = torch.where(present.bool(), bias, torch.full_like(bias, -1e9))
    return weight, bias


PROTOS = "protos"
"""The record that carries packed prototypes in messages and replies (`pack_prototypes`)."""


def pack_prototypes(
    means: torch.Tensor, counts: torch.Tensor, *, with_counts: bool = True
) -> dict[str, torch.Tensor]:
    """Only the present classes' rows, as the record `protos` of a message or a reply.

    {"classes": (k,) int64, "means": (k, D)[, "counts": (k,)]}: a client with 3 of 10
    classes sends 3 rows, not 10 (the bytes counted are the bytes needed).
    """
    present = torch.nonzero(counts > 0).flatten()
    packed = {"classes": present, "means": means[present].detach().clone()}
    if with_counts:
        packed["counts"] = counts[present].detach().to(means.dtype).clone()
    return packed


def unpack_prototypes(
    record: dict[str, torch.Tensor] | None, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `pack_prototypes`: dense (C, D) means and (C,) counts (0 = absent).

    Without "counts" every sent class counts 1; with no record (nothing sent yet) the result
    is (C, 0) and all-zero counts.
    """
    if not record or "means" not in record:
        return torch.zeros(num_classes, 0), torch.zeros(num_classes)
    rows, classes = record["means"], record["classes"].long()
    means = rows.new_zeros(num_classes, rows.shape[1])
    means[classes] = rows
    counts = rows.new_zeros(num_classes)
    counts[classes] = record["counts"].to(rows.dtype) if "counts" in record else 1.0
    return means, counts


def with_prototype_head(
    weights: dict[str, torch.Tensor], prototypes: torch.Tensor, present: torch.Tensor
) -> dict[str, torch.Tensor]:
    """`weights` with the linear head replaced by nearest-prototype classification.

    How FedProto's and PFPL's prototype inference becomes a model the evaluation can load.
    The head must be one linear layer on the embedding (`head.weight` (C, D), `head.bias`
    (C,)), as every protofed model has; anything else is an error, not a silent mismatch.
    """
    w, b = weights.get("head.weight"), weights.get("head.bias")
    weight, bias = nearest_prototype_head(prototypes, present)
    if w is None or b is None or w.shape != weight.shape or b.shape != bias.shape:
        got = None if w is None else tuple(w.shape)
        raise ValueError(
            f"nearest-prototype inference needs a linear head of shape {tuple(weight.shape)} "
            f"(classes x embedding dim) with a bias; the model's head.weight is {got}"
        )
    out = dict(weights)
    out["head.weight"] = weight.to(w.dtype).to(w.device)
    out["head.bias"] = bias.to(b.dtype).to(b.device)
    return out
