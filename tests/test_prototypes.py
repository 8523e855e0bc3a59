"""The shared prototype toolkit on small hand-made inputs."""

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
