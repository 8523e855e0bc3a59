"""The shared prototype toolkit on small hand-made inputs."""

import functools
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import make_blobs

from protofed.prototypes import (
    best_kmeans,
    class_means,
    kmeans,
    merge_means,
    nearest_prototype_head,
    shared_class_similarity,
)


def test_class_means_counts_and_missing_class():
    x = torch.tensor([[1.0, 0.0], [3.0, 2.0], [0.0, 5.0]])
    y = torch.tensor([0, 0, 2])
    means, counts = class_means(x, y, 4)
    assert torch.equal(counts, torch.tensor([2.0, 0.0, 1.0, 0.0]))
    assert torch.allclose(means[0], torch.tensor([2.0, 1.0]))
    assert torch.allclose(means[2], torch.tensor([0.0, 5.0]))
    assert torch.count_nonzero(means[[1, 3]]) == 0


def test_merge_means_weights_by_count_and_keeps_absent_classes_empty():
    means = torch.tensor([[[0.0], [1.0], [9.0]], [[4.0], [3.0], [7.0]]])  # 2 clients, 3 classes
    counts = torch.tensor([[1.0, 3.0, 0.0], [3.0, 1.0, 0.0]])
    merged, total = merge_means(means, counts)
    assert torch.allclose(merged.squeeze(1), torch.tensor([3.0, 1.5, 0.0]))
    assert torch.equal(total, torch.tensor([4.0, 4.0, 0.0]))


def test_kmeans_from_weighted_mean_on_identical_clients_returns_that_mean():
    g = torch.Generator().manual_seed(0)
    local = torch.randn(5, 3, generator=g)  # every client holds the same 5 prototypes
    points = local.repeat(4, 1)
    start = local.clone()  # their sample-weighted average is the prototypes themselves
    centroids, labels = kmeans(points, 5, init=start)
    assert torch.allclose(centroids, local, atol=1e-6)
    assert torch.equal(labels, torch.arange(5).repeat(4))


@pytest.mark.integration
def test_davies_bouldin_selection_finds_the_planted_cluster_count():
    x, _ = make_blobs(
        n_samples=120, centers=4, cluster_std=0.3, center_box=(-20, 20), random_state=3
    )
    k, labels = best_kmeans(torch.as_tensor(x), range(2, 8), seed=0)
    assert k == 4
    assert len(torch.unique(labels)) == 4


def test_similarity_uses_only_shared_classes():
    means = torch.tensor(
        [
            [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]],
            [[1.0, 0.0], [0.0, -1.0], [5.0, 5.0]],
            [[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]],
        ]
    )
    counts = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 2.0]])
    sim = shared_class_similarity(means, counts)
    assert torch.isclose(sim[0, 1], torch.tensor(0.0))  # classes 0 (cos 1) and 1 (cos -1)
    assert torch.isclose(sim[1, 2], torch.tensor(1.0))  # only class 2 shared
    assert sim[0, 2] == float("-inf")  # nothing shared
    assert torch.allclose(sim, sim.T)


def test_nearest_prototype_head_matches_euclidean_argmin():
    g = torch.Generator().manual_seed(1)
    protos = torch.randn(6, 8, generator=g)
    present = torch.tensor([1, 1, 0, 1, 1, 1])
    f = torch.randn(200, 8, generator=g)
    w, b = nearest_prototype_head(protos, present)
    pred = (f @ w.T + b).argmax(1)
    dist = torch.cdist(f, protos)
    dist[:, 2] = float("inf")
    assert torch.equal(pred, dist.argmin(1))


# K-means in torch (`lloyd`, FedAli's server) against scikit-learn's float64 -------------------
@functools.cache
def _har_windows(path: Path) -> torch.Tensor:
    """All real UCI-HAR windows, 9 channels subsampled to 16 steps: 144-d real vectors."""
    raw = np.load(path, allow_pickle=False)
    return torch.as_tensor(raw["X"][:, :, ::8].reshape(len(raw["X"]), -1).copy())


def _har_vectors(shared_data: Path, n: int) -> torch.Tensor:
    """The first `n` of `_har_windows` (loaded once per session)."""
    return _har_windows(shared_data / "har" / "uci_har.npz")[:n]


def _inertia(x: torch.Tensor, centroids: torch.Tensor, labels: torch.Tensor) -> float:
    return float(((x.double() - centroids.double()[labels]) ** 2).sum())


@pytest.mark.integration
def test_torch_kmeans_matches_sklearn_on_fedali_like_banks(shared_data):
    """8 clients' banks of 256 prototypes: a shared bank of real windows, each client's moved
    by EMA toward its own real windows (as ALP layers do); start at their average, the
    prototype's slot as the guess (FedAli's server step). Same centroids as scikit-learn to
    float32 rounding, same labels, identical on a rerun."""
    x = _har_vectors(shared_data, 256 + 8 * 256)
    base, own = x[:256], x[256:].reshape(8, 256, -1)
    banks = 0.97 * base + 0.03 * own  # (8, 256, 144)
    points, start = banks.reshape(-1, banks.shape[-1]), banks.mean(0)
    guess = torch.arange(256).repeat(8)
    ref_c, ref_l = kmeans(points, 256, init=start)
    new_c, new_l = kmeans(points, 256, init=start, backend="torch", guess=guess)
    assert torch.equal(new_l, ref_l)
    assert torch.allclose(new_c, ref_c, atol=1e-5, rtol=0)
    assert _inertia(points, new_c, new_l) / _inertia(points, ref_c, ref_l) < 1 + 1e-5
    again = kmeans(points, 256, init=start, backend="torch", guess=guess)
    assert torch.equal(again[0], new_c) and torch.equal(again[1], new_l)
    # the guess only saves work: a wrong one, or none, gives the same clustering
    wrong = kmeans(points, 256, init=start, backend="torch", guess=guess.roll(1))
    assert torch.equal(wrong[1], new_l) and torch.allclose(wrong[0], new_c, atol=1e-6)


@pytest.mark.integration
def test_torch_kmeans_on_overlapping_real_data_within_a_factor_of_sklearn(shared_data):
    """2000 real windows into 64 clusters from the first 64 (no separation to prune with:
    the full-distance path, many iterations): inertia within 0.1 % of scikit-learn's."""
    x = _har_vectors(shared_data, 2000)
    ref_c, ref_l = kmeans(x, 64, init=x[:64])
    new_c, new_l = kmeans(x, 64, init=x[:64], backend="torch")
    ratio = _inertia(x, new_c, new_l) / _inertia(x, ref_c, ref_l)
    assert 0.999 < ratio < 1.001
    assert (new_l == ref_l).double().mean() > 0.95
    again = kmeans(x, 64, init=x[:64], backend="torch")
    assert torch.equal(again[0], new_c) and torch.equal(again[1], new_l)


def test_torch_kmeans_relocates_an_empty_cluster_as_sklearn_does(shared_data):
    """A starting centroid far from every point is empty after the first assignment and
    takes the point farthest from its centroid, as in scikit-learn."""
    x = _har_vectors(shared_data, 600)
    init = torch.cat([x[:9], x[:1] + 100.0])  # centroid 9 is nobody's nearest
    ref_c, ref_l = kmeans(x, 10, init=init, max_iter=1)
    new_c, new_l = kmeans(x, 10, init=init, max_iter=1, backend="torch")
    assert (new_l == 9).any()
    assert torch.allclose(new_c, ref_c, atol=1e-5, rtol=0)
    full_ref = kmeans(x, 10, init=init)
    full_new = kmeans(x, 10, init=init, backend="torch")
    ratio = _inertia(x, *full_new) / _inertia(x, *full_ref)
    assert 0.999 < ratio < 1.001
