"""Sinkhorn-Knopp (protofed.nn.ot): marginals, agreement with references, numerical safety."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from protofed.nn.ot import cosine_kernel, gibbs_scalings, sinkhorn, sinkhorn_log, sinkhorn_scalings


def _cosines(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g) * 2 - 1


def _swav_numpy(scores: np.ndarray, epsilon: float, iterations: int) -> np.ndarray:
    """The SwAV recipe written out densely in float64: the independent reference."""
    q = np.exp(scores / epsilon)
    q /= q.sum()
    n, k = q.shape
    for _ in range(iterations):
        q /= q.sum(axis=0, keepdims=True)
        q /= k
        q /= q.sum(axis=1, keepdims=True)
        q /= n
    return q


@pytest.mark.integration
@pytest.mark.parametrize("log_domain", [True, False])
def test_marginals_are_uniform_after_enough_iterations(log_domain: bool) -> None:
    scores = _cosines(4, 40, 25)  # a batch of four problems
    plan = sinkhorn(scores, epsilon=0.1, iterations=200, log_domain=log_domain)
    n, k = scores.shape[-2:]
    assert plan.shape == scores.shape
    assert torch.all(plan >= 0)
    assert torch.allclose(plan.sum(-1) * n, torch.ones(4, n), atol=1e-3)
    assert torch.allclose(plan.sum(-2) * k, torch.ones(4, k), atol=1e-3)


def test_few_iterations_balance_the_points_exactly_and_the_prototypes_roughly() -> None:
    scores = _cosines(64, 32, seed=1)
    plan = sinkhorn(scores, epsilon=0.05, iterations=3)
    assert torch.allclose(plan.sum(1) * 64, torch.ones(64), atol=1e-4)
    col = plan.sum(0) * 32
    # three iterations bring every prototype's mass far closer to 1/K than the raw kernel
    raw = torch.softmax(scores / 0.05, dim=1).sum(0) / 64 * 32
    assert (col - 1).abs().max() < 0.5 * (raw - 1).abs().max()


@pytest.mark.parametrize("iterations", [0, 1, 3, 10])
def test_agrees_with_a_dense_numpy_reference(iterations: int) -> None:
    scores = _cosines(30, 12, seed=2)
    expected = _swav_numpy(scores.double().numpy(), 0.05, iterations)
    for log_domain in (True, False):
        plan = sinkhorn(scores, 0.05, iterations, log_domain=log_domain)
        if iterations == 0:  # point-to-point: the rows of the Gibbs kernel, normalised
            expected = np.exp(scores.double().numpy() / 0.05)
            expected /= expected.sum(1, keepdims=True) * 30
        np.testing.assert_allclose(plan.double().numpy(), expected, rtol=1e-4, atol=1e-9)


@pytest.mark.integration
def test_agrees_with_pot_at_convergence() -> None:
    ot = pytest.importorskip("ot")  # POT, the dev extra: an independent implementation
    scores = _cosines(20, 15, seed=3).double()
    a, b = np.full(20, 1 / 20), np.full(15, 1 / 15)
    reference = ot.sinkhorn(a, b, -scores.numpy(), reg=0.1, numItermax=10_000, stopThr=1e-12)
    plan = sinkhorn(scores, epsilon=0.1, iterations=1000)
    np.testing.assert_allclose(plan.double().numpy(), reference, atol=1e-6)


@pytest.mark.integration
@pytest.mark.parametrize("epsilon", [1e-4, 1e-3, 0.01])
def test_small_epsilon_stays_finite_and_balanced(epsilon: float) -> None:
    scores = _cosines(50, 20, seed=4)
    plan = sinkhorn(scores, epsilon=epsilon, iterations=500)
    assert torch.isfinite(plan).all()
    assert torch.allclose(plan.sum(1) * 50, torch.ones(50), atol=1e-3)
    # the naive form overflows here: that is the failure the log domain avoids
    if epsilon <= 1e-3:
        assert not torch.isfinite(torch.exp(scores / epsilon)).all()


def test_direct_form_is_refused_where_unsafe_and_matches_the_log_domain_where_safe() -> None:
    scores = _cosines(40, 30, seed=5)
    with pytest.raises(ValueError, match="not safe"):
        sinkhorn(scores, epsilon=0.01, log_domain=False)
    kernel, u, v = sinkhorn_scalings(scores, 0.05, 3)
    dense = u[:, None] * kernel * v[None, :]
    assert torch.allclose(dense, sinkhorn_log(scores, 0.05, 3).exp(), atol=1e-7)


def test_bounded_cosine_kernel_gives_the_same_plan() -> None:
    g = torch.Generator().manual_seed(6)
    x, p = torch.randn(48, 16, generator=g), torch.randn(20, 16, generator=g)
    kernel = cosine_kernel(x, p, 0.05)
    assert kernel is not None and kernel.max() <= 1.0
    u, v = gibbs_scalings(kernel, 3)
    cos = torch.nn.functional.normalize(x, dim=1) @ torch.nn.functional.normalize(p, dim=1).T
    assert torch.allclose(
        u[:, None] * kernel * v[None, :], sinkhorn_log(cos, 0.05, 3).exp(), atol=1e-6
    )
    assert cosine_kernel(x, p, 0.01) is None  # outside the proven range: caller goes log-domain


@pytest.mark.integration
def test_direct_form_holds_at_a_vit_layers_size_on_the_extreme_kernel() -> None:
    # 4096 tokens (batch 64 x 64 patches) against 2 x 2048 prototypes, over the old 1e7-cell
    # bound: every cosine is +1 or -1, so the kernel takes only the values 1 and e^-40
    signs_x = torch.where(torch.arange(4096) < 3000, 1.0, -1.0)
    signs_p = torch.where(torch.arange(4096) < 10, 1.0, -1.0)
    x = torch.stack([signs_x, torch.zeros(4096)], dim=1)
    p = torch.stack([signs_p, torch.zeros(4096)], dim=1)
    kernel = cosine_kernel(x, p, 0.05)
    assert kernel is not None  # the direct form is taken at this size
    u, v = gibbs_scalings(kernel, 3)
    assert torch.isfinite(u).all() and torch.isfinite(v).all() and (u > 0).all() and (v > 0).all()
    plan = u[:, None] * kernel * v[None, :]
    assert torch.allclose(
        plan, sinkhorn_log(signs_x[:, None] * signs_p[None, :], 0.05, 3).exp(), atol=1e-9, rtol=1e-4
    )


def test_batched_problems_are_independent() -> None:
    scores = _cosines(3, 10, 7, seed=7)
    batched = sinkhorn(scores, 0.05, 3)
    for i in range(3):
        assert torch.allclose(batched[i], sinkhorn(scores[i], 0.05, 3), atol=1e-7)


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        sinkhorn(torch.zeros(3, 3), epsilon=0.0)
    with pytest.raises(ValueError):
        sinkhorn(torch.zeros(3, 3), iterations=-1)
    with pytest.raises(ValueError):
        sinkhorn(torch.zeros(3))


# the normalisation order: the official code's (columns last) and SwAV's (rows last) ---------
HAND_KERNEL = [[2.0, 1.0], [1.0, 1.0]]  # exp(scores) at epsilon 1: 2 tokens x 2 prototypes
# one iteration by hand from Q0 = K / 5 = [[.4, .2], [.2, .2]]:
# official (rows to 1/2, then columns to 1/2): rows [1/3, 1/6], [1/4, 1/4]; columns sum to
#   7/12 and 5/12, scaled by 6/7 and 6/5: [[2/7, 1/5], [3/14, 3/10]]
# SwAV (columns, then rows): columns [1/3, 1/6], [1/4, 1/4] ... the transpose of the above
HAND_COLUMNS_LAST = [[2 / 7, 1 / 5], [3 / 14, 3 / 10]]
HAND_ROWS_LAST = [[2 / 7, 3 / 14], [1 / 5, 3 / 10]]


@pytest.mark.parametrize(
    ("order", "want"), [("columns_last", HAND_COLUMNS_LAST), ("rows_last", HAND_ROWS_LAST)]
)
def test_one_iteration_of_either_order_matches_the_hand_checked_plan(order, want) -> None:
    scores = torch.tensor(HAND_KERNEL, dtype=torch.float64).log()
    want_t = torch.tensor(want, dtype=torch.float64)
    for log_domain in (True, False):
        plan = sinkhorn(scores, epsilon=1.0, iterations=1, log_domain=log_domain, order=order)
        assert torch.allclose(plan.double(), want_t, atol=1e-6)
    u, v = gibbs_scalings(torch.tensor(HAND_KERNEL, dtype=torch.float64), 1, order)
    plan = u.unsqueeze(-1) * torch.tensor(HAND_KERNEL, dtype=torch.float64) * v
    assert torch.allclose(plan, want_t, atol=1e-12)


def _official_numpy(scores: np.ndarray, epsilon: float, iterations: int) -> np.ndarray:
    """The official ALP layer's loop as its code runs it, in words: tokens x prototypes,
    divide by the total, then per iteration rows to 1/N and columns to 1/G, and a final
    factor G (columns sum to 1: a constant, left out of protofed's plan)."""
    q = np.exp(scores / epsilon)
    q /= q.sum()
    n, k = q.shape
    for _ in range(iterations):
        q /= q.sum(axis=1, keepdims=True)
        q /= n
        q /= q.sum(axis=0, keepdims=True)
        q /= k
    return q * k


@pytest.mark.parametrize("shape", [(12, 5), (5, 12), (40, 40)])
def test_columns_last_is_the_official_loop_up_to_its_constant_factor(shape) -> None:
    scores = _cosines(*shape, seed=3)
    want = _official_numpy(scores.double().numpy(), 0.05, 3) / shape[1]
    for log_domain in (True, False):
        plan = sinkhorn(scores, 0.05, 3, log_domain=log_domain, order="columns_last")
        np.testing.assert_allclose(plan.double().numpy(), want, rtol=1e-4, atol=1e-9)
        assert torch.allclose(plan.sum(0), torch.full((shape[1],), 1 / shape[1]), atol=1e-6)


def _clustered(n: int, k: int, d: int, noise: float, skew: float, seed: int):
    """Tokens crowded around a few of k random prototypes (a trained layer's picture)."""
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(k, d, generator=g)
    picked = (torch.rand(n, generator=g) ** skew * k).long()
    return prototypes[picked] + noise * torch.randn(n, d, generator=g), prototypes


# (tokens, prototypes, dims, noise, skew): d = 192 is an ALP layer's width
ORDER_CASES = [
    (512, 128, 192, 1.0, 1.0),
    (512, 128, 192, 1.0, 3.0),
    (512, 2048, 192, 1.0, 3.0),
    (512, 64, 16, 0.5, 3.0),
    (256, 256, 8, 0.3, 4.0),
]


def test_how_often_the_two_orders_pick_another_prototype() -> None:
    """The tokens' argmax prototype (epsilon 0.05, 3 iterations) under the two orders: the
    same for most tokens, not for all. Measured (torch 2, CPU): 0, 0.6 %, 0, 4.7 % and
    4.7 % of the tokens for the cases above."""
    rates = []
    for case in ORDER_CASES:
        tokens, prototypes = _clustered(*case, seed=0)
        kernel = cosine_kernel(tokens, prototypes, 0.05)
        assert kernel is not None
        picks = [(kernel * gibbs_scalings(kernel, 3, o)[1]).argmax(1) for o in ORDERS]
        rates.append((picks[0] != picks[1]).double().mean().item())
    assert max(rates) <= 0.1  # mostly the same prototype ...
    assert max(rates) > 0  # ... but the order is not a no-op
    assert rates[0] == 0.0  # random tokens far from every prototype: the same argmax


ORDERS = ("rows_last", "columns_last")


def test_unknown_order_is_refused() -> None:
    with pytest.raises(ValueError, match="order"):
        sinkhorn(_cosines(4, 3), order="diagonal")  # type: ignore[arg-type]
