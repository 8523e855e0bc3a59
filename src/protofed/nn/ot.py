"""Entropic optimal transport: the Sinkhorn-Knopp plan between points and prototypes.

FedAli's ALP layer (Ek et al., "FedAli: Personalized Federated Learning Alignment with
Prototype Layers for Generalized Mobile Services", eq. 3) matches token embeddings to
prototypes with the SwAV recipe (Caron et al. 2020): Q = exp(S / epsilon), divide by its
total, then alternately rescale so that every prototype receives 1/K of the mass and every
point sends 1/N of it. Which step comes last is `order`: "rows_last" (SwAV's code, the
library's default: the prototype step, then the point step) or "columns_last" (the FedAli
paper's eq. 3 read as Cuturi's u-then-v iteration, and its official code on the tokens x
prototypes matrix: the point step, then the prototype step). `sinkhorn_log` runs in the
log domain, safe for any epsilon > 0; `sinkhorn` takes the cheaper direct (exp-domain)
form when it is provably safe (bounded scores, see `_direct_is_safe`; docs/speed.md) and
the log domain otherwise; both give the same plan. Scores may carry leading batch dimensions (..., N, K): each trailing (N, K)
matrix is its own transport problem (the ALP layer's batch-independent mode solves one per
sample).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from protofed.nn.linear import matmul_nt

SinkhornOrder = Literal["rows_last", "columns_last"]
"""Which normalisation ends each Sinkhorn iteration: the rows' (points, SwAV's order) or the
columns' (prototypes, the FedAli paper's and official code's order)."""
SINKHORN_ORDERS = ("rows_last", "columns_last")

_LOG2_E = 1.4426950408889634  # log2(e)


def _check_arguments(
    scores: torch.Tensor, epsilon: float, iterations: int, order: str = "rows_last"
) -> None:
    """The inputs every Sinkhorn form needs: epsilon > 0, iterations >= 0, scores (..., N, K),
    a known order."""
    if order not in SINKHORN_ORDERS:
        raise ValueError(f"sinkhorn: order must be one of {SINKHORN_ORDERS}, got '{order}'")
    if epsilon <= 0:
        raise ValueError(f"sinkhorn: epsilon must be > 0, got {epsilon}")
    if iterations < 0:
        raise ValueError(f"sinkhorn: iterations must be >= 0, got {iterations}")
    if scores.dim() < 2:
        raise ValueError(f"sinkhorn: scores must be (..., N, K), got shape {tuple(scores.shape)}")


def sinkhorn_log(
    scores: torch.Tensor,
    epsilon: float = 0.05,
    iterations: int = 3,
    order: SinkhornOrder = "rows_last",
) -> torch.Tensor:
    """Log of the entropic transport plan for similarity `scores` (..., N, K).

    The plan has total mass 1 per problem: after the final step the last-normalised side
    (rows: every row sums to exactly 1/N; `columns_last`: every column to exactly 1/K) is
    exact and the other holds up to the Sinkhorn residual (which vanishes as `iterations`
    grows). `iterations=0` gives the unbalanced Gibbs kernel normalised per row
    (a row-wise softmax of scores / epsilon, divided by N): point-to-point matching.

    Why the log domain: `exp(S / epsilon)` overflows float32 once S / epsilon > 88 (epsilon
    below ~0.011 for cosines) and underflows to all-zero columns for small epsilon, which
    turns the plan into NaN. Here the normalisations are subtractions of `logsumexp`s, which
    never overflow, so any epsilon > 0 is safe (a test runs 1e-4).
    """
    _check_arguments(scores, epsilon, iterations, order)
    n, k = scores.shape[-2], scores.shape[-1]
    log_n, log_k = math.log(n), math.log(k)
    log_q = scores.float() / epsilon
    log_q = log_q - torch.logsumexp(log_q, dim=(-2, -1), keepdim=True)  # total mass 1
    # every prototype (column) receives 1/K of the mass, every point (row) sends 1/N of it
    steps = [(-2, log_k), (-1, log_n)] if order == "rows_last" else [(-1, log_n), (-2, log_k)]
    for _ in range(iterations):
        for dim, log_size in steps:
            log_q = log_q - torch.logsumexp(log_q, dim=dim, keepdim=True) - log_size
    if iterations == 0:
        log_q = log_q - torch.logsumexp(log_q, dim=-1, keepdim=True) - log_n
    return log_q


_MAX_SPAN = 40.0  # (max - min) of scores / epsilon allowed in the direct form
_MAX_CELLS = 2**30  # N * K allowed in the direct form (~1.07e9; a ViT layer is 4096 x 4096)


def _direct_is_safe(scores: torch.Tensor, epsilon: float) -> bool:
    """Whether the exp-domain iteration cannot produce a zero (hence no 0/0 = NaN).

    Proof. Let s = (max - min of scores) / epsilon and Kmat = exp((S - max S) / epsilon): its
    entries lie in [e^-s, 1]. Every iterate is Q = diag(u) Kmat diag(v) with positive u, v.
    After a column step v_j is proportional to 1 / sum_i u_i Kmat_ij, so for two columns
    v_j / v_l = sum_i u_i Kmat_il / sum_i u_i Kmat_ij <= max_i Kmat_il / Kmat_ij <= e^s, and
    within a row Q_ij / Q_il = (Kmat_ij / Kmat_il)(v_j / v_l) >= e^-2s; the same holds within
    a column after a row step. A row (column) sums to 1/N (1/K), so its largest entry is at
    least 1/(N K) and its smallest at least e^-2s / (N K). With s <= 40 and N K <= 2^30 that is
    >= e^-80 / 2^30 ~ 1.7e-44, above float32's smallest positive number (1.4e-45): no entry,
    row sum or column sum is ever zero, and no exponent overflows because all are <= 0.
    (A test runs the extreme two-valued kernel at 4096 x 4096 against the log domain.)
    Cosine scores span at most 2, so epsilon >= 0.05 (FedAli's) always qualifies.
    """
    if scores.shape[-2] * scores.shape[-1] > _MAX_CELLS or scores.numel() == 0:
        return False
    span = float((scores.amax() - scores.amin()).item()) / epsilon
    return math.isfinite(span) and span <= _MAX_SPAN


def gibbs_scalings(
    kernel: torch.Tensor, iterations: int = 3, order: SinkhornOrder = "rows_last"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scalings (u, v) of a positive Gibbs kernel (..., N, K): plan = u K v.

    The same iteration as `sinkhorn_log` (in `order`), kept as two scaling vectors, so each
    step is two matrix-vector products instead of two passes of sums and divisions over the
    matrix. The kernel may carry any positive constant factor (it cancels in the first step).
    """
    n, k = kernel.shape[-2], kernel.shape[-1]
    total = kernel.sum(dim=(-2, -1))
    u = (1.0 / total).unsqueeze(-1).expand(*kernel.shape[:-1]).contiguous()  # Q = K / total
    v = torch.ones(*kernel.shape[:-2], k, dtype=kernel.dtype, device=kernel.device)
    for _ in range(iterations):
        if order == "columns_last":
            u = 1.0 / (n * _matvec(kernel, v))  # rows sum to 1/N
        v = 1.0 / (k * _matvec(kernel.transpose(-2, -1), u))  # columns sum to 1/K
        if order == "rows_last":
            u = 1.0 / (n * _matvec(kernel, v))  # rows sum to 1/N
    if iterations == 0:
        u = 1.0 / (n * _matvec(kernel, v))
    return u, v


def _matvec(matrix: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """matrix (..., N, K) times vector (..., K): BLAS gemv for one problem (a matmul with a
    one-column matrix runs as a full gemm on CPU, several times slower)."""
    if matrix.dim() == 2:
        return torch.mv(matrix, vector)
    return (matrix @ vector.unsqueeze(-1)).squeeze(-1)


def sinkhorn_scalings(
    scores: torch.Tensor,
    epsilon: float = 0.05,
    iterations: int = 3,
    order: SinkhornOrder = "rows_last",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The direct form as (kernel, u, v): plan = u[..., :, None] * kernel * v[..., None, :].

    A caller that only needs each row's argmax (kernel * v) or each column's ranking
    (u * kernel) never forms the plan. Only valid where `_direct_is_safe`.
    """
    kernel = torch.exp((scores.float() - scores.amax(dim=(-2, -1), keepdim=True).float()) / epsilon)
    u, v = gibbs_scalings(kernel, iterations, order)
    return kernel, u, v


def cosine_kernel(x: torch.Tensor, prototypes: torch.Tensor, epsilon: float) -> torch.Tensor | None:
    """exp((cos(x, p) - 1) / epsilon) (..., N, K), or None where the direct form is unsafe.

    The bounded-cosine form: cosines lie in [-1, 1], so the entries lie in [e^(-2/epsilon), 1]
    without looking at the data, and `_direct_is_safe`'s proof applies with span 2/epsilon:
    safe for epsilon >= 2 / 40 = 0.05 and N K <= 2^30. One matrix product, one in-place
    shift and one in-place power of two: the cheapest kernel for the ALP layer.

    Computed as 2^((cos - 1) log2(e) / epsilon), the same number: torch's float32 exp2 is
    measured several times faster on the CPU than its exp (docs/speed.md); the two differ
    by float32 rounding of the exponent (relative 2e-6 at most).
    """
    n, k = x.shape[-2], prototypes.shape[-2]
    if 2.0 / epsilon > _MAX_SPAN or n * k > _MAX_CELLS:
        return None
    scale = _LOG2_E / epsilon
    xn = torch.nn.functional.normalize(x.float(), dim=-1) * scale
    pn = torch.nn.functional.normalize(prototypes.float(), dim=-1)
    # Stored prototype-major (K, N) and returned as the (N, K) view: a prototype's column
    # is contiguous, so the ALP layer's per-prototype top-k and the split into the local and
    # global banks read memory in order. Cosines of unit vectors exceed 1 by rounding only
    # (~1e-7): entries <= e^(1e-7 / epsilon), no overflow.
    return matmul_nt(pn, xn).sub_(scale).exp2_().transpose(-2, -1)


def direct_is_safe(scores: torch.Tensor, epsilon: float) -> bool:
    """Public name of `_direct_is_safe`, for callers of `sinkhorn_scalings`."""
    return _direct_is_safe(scores, epsilon)


def sinkhorn(
    scores: torch.Tensor,
    epsilon: float = 0.05,
    iterations: int = 3,
    *,
    log_domain: bool | None = None,
    order: SinkhornOrder = "rows_last",
) -> torch.Tensor:
    """The entropic transport plan (..., N, K) for `scores`; see `sinkhorn_log`.

    Marginals: rows sum to 1/N, columns to 1/K (the side `order` normalises last exactly, the
    other approximately after few iterations).
    `log_domain=None` picks the direct form when `_direct_is_safe`, else the log domain;
    True / False force one (False on unsafe input is refused, not silently wrong).
    """
    _check_arguments(scores, epsilon, iterations, order)
    safe = _direct_is_safe(scores, epsilon)
    if log_domain is False and not safe:
        raise ValueError("sinkhorn: the direct form is not safe for these scores and epsilon")
    if log_domain or not safe:
        return sinkhorn_log(scores, epsilon, iterations, order).exp()
    kernel, u, v = sinkhorn_scalings(scores, epsilon, iterations, order)
    return u.unsqueeze(-1) * kernel * v.unsqueeze(-2)
