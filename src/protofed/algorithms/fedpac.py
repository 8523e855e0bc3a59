"""FedPAC: feature alignment to global prototypes and per-client classifier combination (docs/algorithms/fedpac.md)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from pydantic import Field

from protofed import prototypes
from protofed.algorithms.base import Algorithm
from protofed.algorithms.common.decoupled import (
    DecoupledParams,
    body_without_prototypes,
    global_prototypes,
    head_then_aligned_body,
)
from protofed.algorithms.common.split import head_names, split_arrays
from protofed.core.types import MODEL, AggregateResult, Arrays, FitResult, Records, Reply
from protofed.prototypes import PROTOS, pack_prototypes, unpack_prototypes
from protofed.training.client import Client

HEAD = "head"  # a head: the client's own (state, reply), or its combined one (message)
STATS = "stats"  # a reply's feature statistics: {"variance": (1,)}


def head_of(client: int) -> str:
    """The server's record of client `client`'s combined head."""
    return f"{HEAD}.{client}"


def feature_statistics(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(class means (C, D), class counts (C,), V) of one client's embeddings.

    V = (sum_k pi_k E_k||f||^2 - sum_k ||pi_k mu_k||^2) / n: the variance of the sample mean of
    e_y f^T, whose expectation is h = (pi_k mu_k)_k.
    """
    features = features.double()
    means, counts = prototypes.class_means(features, labels, num_classes)
    second, _ = prototypes.class_means(features.pow(2).sum(1, keepdim=True), labels, num_classes)
    n = counts.sum().clamp(min=1)
    pi = counts / n
    h = pi.unsqueeze(1) * means
    variance = ((pi * second[:, 0]).sum() - h.pow(2).sum()) / n
    return means, counts, variance.clamp(min=0)


def simplex_qp(q: torch.Tensor, iters: int = 1000, tol: float = 1e-12) -> torch.Tensor:
    """argmin over the probability simplex of a^T q a, q a PSD Gram matrix, exactly.

    With q = Z^T Z this is the point of smallest norm in the convex hull of Z's columns, which
    Wolfe's algorithm (1976) finds in finitely many steps: keep an affinely independent support
    S, add the column most opposed to the current point, re-solve the affine problem on S
    (min a^T q_SS a s.t. sum a = 1, a KKT linear system) and step back to the hull's face when a
    weight would turn negative. Only q is needed, never Z.
    """
    q = q.double()
    m = len(q)
    weights = torch.zeros(m, dtype=q.dtype, device=q.device)
    first = int(torch.argmin(torch.diagonal(q)))
    support = [first]
    weights[first] = 1.0
    scale = max(float(torch.diagonal(q).max()), 1e-300)
    for _ in range(iters):
        grad = q @ weights  # <x, z_j> for every column j
        norm2 = float(weights @ grad)  # ||x||^2
        j = int(torch.argmin(grad))
        if norm2 - float(grad[j]) <= tol * scale or j in support:
            break
        support.append(j)
        for _ in range(m + 1):  # minor cycles: at most one removal per support member
            idx = torch.tensor(support, device=q.device)
            affine = _affine_min_norm(q[idx][:, idx])
            if bool((affine > tol).all()):
                weights = torch.zeros_like(weights)
                weights[idx] = affine
                break
            current = weights[idx]
            shrinking = affine <= tol
            theta = float(torch.min(current[shrinking] / (current[shrinking] - affine[shrinking])))
            mixed = current + theta * (affine - current)
            weights = torch.zeros_like(weights)
            weights[idx] = mixed.clamp(min=0)
            support = [k for k in support if float(weights[k]) > tol]
            weights = weights / weights.sum()
    return weights


def _affine_min_norm(q: torch.Tensor) -> torch.Tensor:
    """argmin a^T q a subject to sum(a) = 1 (no sign constraint), from the KKT system."""
    k = len(q)
    kkt = torch.zeros(k + 1, k + 1, dtype=q.dtype, device=q.device)
    kkt[:k, :k] = q
    kkt[:k, k] = 1
    kkt[k, :k] = 1
    rhs = torch.zeros(k + 1, dtype=q.dtype, device=q.device)
    rhs[k] = 1
    solution = torch.linalg.lstsq(kkt, rhs.unsqueeze(1)).solution[:, 0]
    return solution[:k]


def combination_weights(
    h: torch.Tensor, variance: torch.Tensor, min_weight: float = 1e-3, iters: int = 1000
) -> torch.Tensor:
    """(M, M): row i = client i's weights over the M clients' heads (FedPAC's QP).

    h (M, C, D) the clients' statistics pi_k mu_k, variance (M,) their V_j.
    """
    flat = h.reshape(len(h), -1).double()
    rows = []
    for i in range(len(flat)):
        diff = flat - flat[i]
        q = diff @ diff.T + torch.diag(variance.double())
        alpha = simplex_qp(q, iters)
        alpha = torch.where(alpha < min_weight, torch.zeros_like(alpha), alpha)
        rows.append(alpha / alpha.sum())
    return torch.stack(rows)


class FedPAC(Algorithm):
    name = "fedpac"
    summary = (
        "Body aligned to global prototypes; each head a QP-weighted mix of the clients' heads."
    )
    reference = "Xu et al., Personalized Federated Learning with Feature Alignment and Classifier Collaboration, ICLR 2023"
    has_global_model = False

    class Params(DecoupledParams):
        min_weight: float = Field(
            1e-3,
            ge=0,
            lt=1,
            description="Combination weights below this are zeroed (authors: 1e-3).",
        )
        qp_iters: int = Field(
            1000, ge=1, description="Most major steps of the QP solver (Wolfe's min-norm point)."
        )

    params: Params

    def init_server(self) -> Records:
        return body_without_prototypes(self.setting)

    def configure(self, server: Records, client: int, server_round: int) -> Records:
        """The body, the global prototypes, and this client's combined head if it has one."""
        message = {MODEL: server[MODEL], PROTOS: server[PROTOS]}
        if head_of(client) in server:
            message[HEAD] = server[head_of(client)]
        return message

    def _head(self, message: Records, state: Records) -> Arrays:
        if HEAD in message:
            return message[HEAD]
        return state[HEAD] if state else split_arrays(self.setting.init_model)[1]

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(message[MODEL])
        client.load(self._head(message, state))
        metrics = head_then_aligned_body(
            client, message[PROTOS], self.params, self.setting.num_classes
        )
        features = prototypes.embed(client.model, client.data.train_x)
        means, counts, variance = feature_statistics(
            features, client.data.train_y, self.setting.num_classes
        )
        body, head = split_arrays(client.weights())
        reply = {
            MODEL: body,
            HEAD: head,
            PROTOS: pack_prototypes(means.float(), counts.float()),
            STATS: {"variance": variance.float().reshape(1)},
        }
        return FitResult(reply, metrics, {HEAD: head})

    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        heads = head_names(self.setting.init_model)
        mean, seen, metrics = self.average(replies, records=[MODEL], reference=server)
        extras = [r.records for r in seen]
        dense = [unpack_prototypes(e[PROTOS], self.setting.num_classes) for e in extras]
        means = torch.stack([m for m, _ in dense])
        counts = torch.stack([c for _, c in dense])
        merged, total = prototypes.merge_means(means, counts)
        pi = counts / counts.sum(1, keepdim=True).clamp(min=1)
        alpha = combination_weights(
            pi.unsqueeze(-1) * means,
            torch.cat([e[STATS]["variance"] for e in extras]),
            self.params.min_weight,
            self.params.qp_iters,
        )
        new: Records = {
            MODEL: mean[MODEL],
            PROTOS: pack_prototypes(merged, total, with_counts=False),
        }
        new.update({k: v for k, v in server.items() if k.startswith(f"{HEAD}.")})  # not seen
        combined: list[Arrays] = [{} for _ in seen]
        for name in heads:
            stacked = torch.stack([e[HEAD][name].double() for e in extras])
            mixed = torch.tensordot(alpha.to(stacked), stacked, dims=1)  # row i: client i's head
            for i in range(len(seen)):
                combined[i][name] = mixed[i].to(extras[i][HEAD][name].dtype)
        for reply, head in zip(seen, combined, strict=True):
            new[head_of(reply.client)] = head
        return AggregateResult(new, metrics)

    def prototypes(self, server: Records) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return global_prototypes(server, self.setting.num_classes)

    def client_model(self, message: Records, state: Records) -> Arrays:
        return {**message[MODEL], **self._head(message, state)}

    def trained_model(self, message: Records, result: FitResult) -> Arrays:
        """The trained body and head: the message's combined head is what training started
        from, not what it ended with."""
        return {**result.reply[MODEL], **result.reply[HEAD]}
