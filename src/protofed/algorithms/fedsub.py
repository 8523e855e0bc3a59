"""FedSub: class-aware subnetworks fused per class-prototype cluster (docs/algorithms/fedsub.md)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Literal

import numpy as np
import torch
from pydantic import Field
from torch import nn

from protofed.algorithms.base import Algorithm, Hyperparams, Setting
from protofed.core.seeding import SERVER, derive_seed
from protofed.core.types import MODEL, AggregateResult, Arrays, FitResult, Records, Reply
from protofed.errors import ConfigError
from protofed.prototypes import best_kmeans, class_means, shared_class_similarity
from protofed.training.client import Client

# records besides "model" (the shared layers)
MASKS = "masks"  # reply: each shared parameter's per-class activation mask, by its name
CLASSES = "classes"  # reply: "means" (C, D) raw-feature prototypes, "counts" (C,), "accuracy" (C,)
LOCAL = "local"  # client state: the layers that are never shared


def fused_of(client: int) -> str:
    """The server's record of the shared layers fused for client `client`."""
    return f"fused.{client}"


Strategy = Literal["overlap", "cluster_avg", "leadership"]


class FedSubParams(Hyperparams):
    setting: Literal["partial", "full"] = Field(
        "partial",
        description="partial: the first L layers form subnetworks (paper's best); full: all.",
    )
    depth: int | None = Field(
        None, ge=1, description="L for the partial setting; None: every layer below the head."
    )
    fusion: Strategy = Field(
        "overlap",
        description="overlap (Overlapping Components, paper's best), cluster_avg, leadership.",
    )
    neighbours: int = Field(
        5, ge=1, description="n: clients whose prototypes predict a missing one."
    )
    max_clusters: int = Field(8, ge=2, description="Largest k tried by the Davies-Bouldin search.")
    active_fraction: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="A parameter is in a class subnetwork if more than this "
        "fraction of the class's samples activate it (0: any sample, the paper's non-zero).",
    )
    own_weight: float = Field(
        0.5,
        ge=0,
        le=1,
        description="overlap: share of the client's own value in eq. 7's "
        "normalised sum (0: the fused value replaces it).",
    )


# server computations (pure functions on small tensors; tested on hand-made inputs) ---------
def predict_missing(
    means: torch.Tensor, counts: torch.Tensor, neighbours: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fill missing prototypes by collaborative filtering (Algorithm 3, eq. 1-2).

    means (M, C, D), counts (M, C) -> (filled means, predicted (M, C) bool). Client u's
    missing class l is the S(u, v)-weighted mean of class l's prototype over the `neighbours`
    clients v most similar to u that have l; if no client has l it stays missing.
    """
    sim = shared_class_similarity(means, counts)
    present = counts > 0
    filled = means.clone()
    predicted = torch.zeros_like(present)
    m, c = present.shape
    for u in range(m):
        for label in range(c):
            if present[u, label]:
                continue
            donors = [v for v in range(m) if v != u and present[v, label] and sim[u, v] > -np.inf]
            if not donors:
                continue
            donors.sort(key=lambda v: (-float(sim[u, v]), v))
            near = torch.tensor(donors[:neighbours])
            w = sim[u, near].to(torch.float64)
            if w.sum() <= 0:
                w = torch.ones_like(w)
            protos = means[near, label].to(torch.float64)
            filled[u, label] = ((w[:, None] * protos).sum(0) / w.sum()).to(means.dtype)
            predicted[u, label] = True
    return filled, predicted


@functools.lru_cache(maxsize=64)
def _cluster_cached(data: bytes, shape: tuple[int, int], max_clusters: int, seed: int) -> bytes:
    points = torch.from_numpy(np.frombuffer(data, dtype=np.float64).reshape(shape).copy())
    _, labels = best_kmeans(points, range(2, max_clusters + 1), seed=seed)
    return labels.numpy().astype(np.int64).tobytes()


def cluster_classes(
    means: torch.Tensor, available: torch.Tensor, max_clusters: int, seed: int
) -> torch.Tensor:
    """Per class, K-means over the clients' prototypes with k by Davies-Bouldin.

    means (M, C, D), available (M, C) -> cluster labels (M, C), -1 where a client has no
    (real or predicted) prototype. The same prototypes give the same clusters (cached: in a
    static scenario the input-feature prototypes never change).
    """
    device = means.device
    means, available = means.cpu(), available.cpu()  # scikit-learn works on host memory
    m, c = available.shape
    labels = torch.full((m, c), -1, dtype=torch.long)
    for label in range(c):
        rows = torch.nonzero(available[:, label]).flatten()
        if len(rows) == 0:
            continue
        points = means[rows, label].to(torch.float64).contiguous()
        found = _cluster_cached(
            points.numpy().tobytes(),
            tuple(points.shape),
            max_clusters,
            derive_seed(seed, SERVER, label) % 2**32,  # scikit-learn takes 32-bit seeds
        )
        labels[rows, label] = torch.from_numpy(np.frombuffer(found, dtype=np.int64).copy())
    return labels.to(device)


def fuse(
    weights: torch.Tensor,
    masks: torch.Tensor,
    counts: torch.Tensor,
    accuracy: torch.Tensor,
    labels: torch.Tensor,
    strategy: Strategy,
    own_weight: float = 0.5,
) -> torch.Tensor:
    """Every client's fused parameters (eq. 3-7).

    weights (M, P): each client's flattened subnetwork layers; masks (M, C, P) bool: A_k^y;
    counts and accuracy (M, C); labels (M, C): class clusters (-1: none). A client's element
    is the mean over its clusters of the cluster's fused value, over the clusters that fuse
    that element; elements no cluster fuses keep the client's own value.
    """
    m, c = counts.shape
    own = weights.to(torch.float64)
    total = torch.zeros_like(own)
    covered = torch.zeros(own.shape, dtype=torch.float64, device=own.device)
    for label in range(c):
        for cluster in torch.unique(labels[:, label]):
            if cluster < 0:
                continue
            members = torch.nonzero(labels[:, label] == cluster).flatten()
            contrib = members[counts[members, label] > 0]  # predicted members bring nothing
            if len(contrib) == 0:
                continue
            w, a = own[contrib], masks[contrib, label]
            p = counts[contrib, label].to(torch.float64)
            if strategy == "cluster_avg":
                pa = p[:, None] * a
                den = pa.sum(0)
                value = (pa * w).sum(0) / den.clamp(min=1e-300)
                hit = den > 0
            elif strategy == "overlap":
                value = (p[:, None] * w).sum(0) / p.sum()
                hit = a.all(0)
            elif strategy == "leadership":
                score = accuracy[contrib, label].to(torch.float64) * p
                leader = int(torch.argmax(score))
                value, hit = w[leader], a[leader]
            else:
                raise ValueError(f"unknown fusion strategy '{strategy}'")
            total[members] += torch.where(hit, value, torch.zeros_like(value))
            covered[members] += hit.to(torch.float64)
    fused = total / covered.clamp(min=1)
    if strategy == "overlap":
        fused = own_weight * own + (1 - own_weight) * fused
    return torch.where(covered > 0, fused, own).to(weights.dtype)


# client computations ---------------------------------------------------------------------
@torch.no_grad()
def class_subnetworks(
    model: nn.Module,
    layers: list[str],
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    active_fraction: float = 0.0,
) -> tuple[Arrays, torch.Tensor]:
    """Per-class activation masks of the parameters of `layers`, and per-class accuracy.

    Returns ({param name: (C, *param shape) bool}, accuracy (C,)). Parameter w_ij of a Linear
    layer counts as activated by a sample when output unit i is active (pre-activation > 0;
    every unit of the model's output layer) and input j is non-zero (module docstring, 1).
    """
    modules = [model.get_submodule(name) for name in layers]
    for name, module in zip(layers, modules, strict=True):
        if not isinstance(module, nn.Linear):
            raise ConfigError(
                f"fedsub: layer '{name}' is a {type(module).__name__}; subnetworks "
                "are defined for Linear layers (use model.name=mlp)"
            )
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = [
        module.register_forward_hook(
            lambda mod, inp, out, name=name: seen.__setitem__(name, (inp[0], out))
        )
        for name, module in zip(layers, modules, strict=True)
    ]
    was_training = model.training
    model.eval()
    try:
        logits = model(x)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    output_layer = getattr(model, "head", None)
    onehot = torch.nn.functional.one_hot(y, num_classes).to(torch.float32)  # (N, C)
    n_class = onehot.sum(0).clamp(min=1)  # (C,)
    masks: Arrays = {}
    for name, module in zip(layers, modules, strict=True):
        inputs, out = seen[name]
        inputs = inputs.reshape(len(x), -1)
        # the output layer has no ReLU after it: every unit of it counts as active
        unit = torch.ones_like(out) if module is output_layer else (out > 0).to(torch.float32)
        feed = (inputs != 0).to(torch.float32)
        # fraction of class y's samples with unit i and input j both active: (C, out, in)
        both = torch.einsum("nc,ni,nj->cij", onehot, unit, feed) / n_class[:, None, None]
        masks[f"{name}.weight"] = both > active_fraction
        if module.bias is not None:
            masks[f"{name}.bias"] = (onehot.T @ unit) / n_class[:, None] > active_fraction
    correct = (logits.argmax(1) == y).to(torch.float32)
    accuracy = (onehot.T @ correct) / n_class
    return masks, accuracy


# the algorithm ----------------------------------------------------------------------------
def _layer_order(names: Iterable[str]) -> list[str]:
    """Layer names (a parameter's name minus its last part), input to output."""
    return list(dict.fromkeys(n.rsplit(".", 1)[0] for n in names if "." in n))


class FedSub(Algorithm):
    name = "fedsub"
    summary = "Class-aware subnetworks fused per class-prototype cluster (per-client updates)."
    reference = (
        "Campana and Delmastro, FedSub: Introducing class-aware Subnetworks Fusion to Enhance "
        "Personalized Federated Learning in Ubiquitous Systems, 2025"
    )
    Params = FedSubParams
    has_global_model = False
    params: FedSubParams

    def __init__(self, params: Hyperparams, setting: Setting) -> None:
        super().__init__(params, setting)
        init = setting.init_model
        layers = _layer_order(n for n, v in init.items() if v.is_floating_point())
        if self.params.setting == "full":
            depth = len(layers)
        else:
            depth = self.params.depth if self.params.depth is not None else len(layers) - 1
        if not 1 <= depth <= len(layers):
            raise ConfigError(
                f"invalid value for 'algorithm.depth': the model has {len(layers)} layers (got {self.params.depth})"
            )
        self.layers = layers[:depth]
        self.shared = [n for n in init if n.rsplit(".", 1)[0] in self.layers]
        self.local = [n for n in init if n not in self.shared]

    # server -------------------------------------------------------------------------------
    def init_server(self) -> Records:
        """The initial shared layers (every client's first message); fused ones are added as
        the record `fused.<i>` once client i has taken part."""
        return {MODEL: {n: self.setting.init_model[n].clone() for n in self.shared}}

    def configure(self, server: Records, client: int, server_round: int) -> Records:
        return {MODEL: server.get(fused_of(client), server[MODEL])}

    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        replies = list(replies)
        ids = [r.client for r in replies]
        means = torch.stack([r.records[CLASSES]["means"] for r in replies])
        counts = torch.stack([r.records[CLASSES]["counts"] for r in replies])
        accuracy = torch.stack([r.records[CLASSES]["accuracy"] for r in replies])
        filled, predicted = predict_missing(means, counts, self.params.neighbours)
        labels = cluster_classes(
            filled, (counts > 0) | predicted, self.params.max_clusters, self.setting.seed
        )
        weights = torch.stack(
            [torch.cat([r.records[MODEL][n].reshape(-1) for n in self.shared]) for r in replies]
        )
        masks = torch.stack(
            [
                torch.cat([r.records[MASKS][n].reshape(len(counts[0]), -1) for n in self.shared], 1)
                for r in replies
            ]
        )
        fused = fuse(
            weights, masks, counts, accuracy, labels, self.params.fusion, self.params.own_weight
        )
        new = dict(server)
        shapes = [self.setting.init_model[n].shape for n in self.shared]
        sizes = [int(np.prod(s)) for s in shapes]
        for row, cid in enumerate(ids):
            parts = fused[row].split(sizes)
            new[fused_of(cid)] = {
                n: part.reshape(shape).clone()
                for n, part, shape in zip(self.shared, parts, shapes, strict=True)
            }
        return AggregateResult(new)

    # client -------------------------------------------------------------------------------
    def _local_part(self, state: Records) -> Arrays:
        return state[LOCAL] if state else {n: self.setting.init_model[n] for n in self.local}

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(self._local_part(state))
        client.load(message[MODEL])
        metrics = client.train_model()
        data = client.data
        c = self.setting.num_classes
        masks, accuracy = class_subnetworks(
            client.model, self.layers, data.train_x, data.train_y, c, self.params.active_fraction
        )
        protos, counts = class_means(data.train_x, data.train_y, c)
        weights = client.weights()
        reply = {
            MODEL: {n: weights[n] for n in self.shared},
            MASKS: {n: masks[n] for n in self.shared},
            CLASSES: {"means": protos, "counts": counts, "accuracy": accuracy},
        }
        return FitResult(reply, metrics, {LOCAL: {n: weights[n] for n in self.local}})

    def client_model(self, message: Records, state: Records) -> Arrays:
        return {**self._local_part(state), **message[MODEL]}
