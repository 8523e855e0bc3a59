"""FedDPA: the server's computations on hand-made inputs, then a short run on real data."""

from __future__ import annotations

import math

import pytest
import torch

from protofed.algorithms import ALGORITHMS, Reply, Setting
from protofed.algorithms import parse_params as parse_algorithm_params
from protofed.algorithms.common.prototype_losses import class_mean_distance, prototype_distance
from protofed.algorithms.feddpa import (
    GLOBAL_PROTOS,
    FedDPA,
    alignment_loss,
    contrastive_refine,
    group_clients,
    heterogeneity,
    hierarchical_prototypes,
    hierarchical_weights,
    separation_loss,
)
from protofed.config import TrainConfig, load_config
from protofed.prototypes import PROTOS, pack_prototypes
from protofed.runtime import prepare, simulate

C, D = 3, 2


def algo(**params) -> FedDPA:
    init = {"head.weight": torch.zeros(C, D), "head.bias": torch.zeros(C)}
    setting = Setting(num_clients=4, num_classes=C, train=TrainConfig(), init_model=init)
    return FedDPA(parse_algorithm_params("feddpa", params), setting)


# separation loss (eq. 11) -----------------------------------------------------------------
def test_separation_loss_is_zero_when_every_pair_is_more_than_m_apart() -> None:
    protos = torch.tensor([[0.0, 0.0], [1.5, 0.0], [0.0, 1.5]])
    assert separation_loss(protos, torch.ones(C), margin=1.0).item() == 0.0
    # an absent class on top of another one does not count
    protos4 = torch.cat([protos, torch.zeros(1, D)])
    assert separation_loss(protos4, torch.tensor([1.0, 1, 1, 0]), margin=1.0).item() == 0.0


def test_separation_loss_is_the_mean_hinge_over_ordered_pairs_when_too_close() -> None:
    protos = torch.tensor([[0.0, 0.0], [0.6, 0.0], [0.0, 3.0]])
    # only the pair (0, 1) is within m = 1: hinge 0.4, counted as (0,1) and (1,0), / (3*2)
    loss = separation_loss(protos, torch.ones(C), margin=1.0)
    assert loss.item() == pytest.approx(2 * 0.4 / 6)
    assert loss.item() > 0
    assert separation_loss(protos, torch.ones(C), margin=0.5).item() == 0.0
    # coinciding prototypes: the largest hinge, and a finite gradient
    same = torch.zeros(2, D, requires_grad=True)
    loss = separation_loss(same, torch.ones(2), margin=1.0)
    loss.backward()
    assert loss.item() == pytest.approx(1.0, abs=1e-5) and torch.isfinite(same.grad).all()


@pytest.mark.integration
def test_contrastive_step_pushes_close_prototypes_apart_and_leaves_absent_ones() -> None:
    protos = torch.tensor([[0.0, 0.0], [0.2, 0.0], [5.0, 5.0]])
    present = torch.tensor([1.0, 1.0, 0.0])
    local = protos.unsqueeze(0).clone()
    counts = torch.tensor([[4.0, 4.0, 0.0]])
    kw = dict(margin=1.0, steps=50, lr=0.1)
    apart = contrastive_refine(protos, present, local, counts, sep_weight=1.0, **kw)
    assert torch.dist(apart[0], apart[1]) > 0.3  # the pair moved apart, against L_align
    assert torch.equal(apart[2], protos[2])  # absent: untouched
    # without separation, L_align alone keeps prototypes already at the local ones
    stay = contrastive_refine(protos, present, local, counts, sep_weight=0.0, **kw)
    assert torch.allclose(stay, protos)
    # L_align: 1/N sum_k sum_{i in k} ||P_i^k - P_i^g||^2
    local2 = torch.stack([protos + 1.0, protos])  # client 0 off by (1, 1) on every class
    counts2 = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    assert alignment_loss(protos, local2, counts2).item() == pytest.approx((2 + 2) / 2)


# adaptive lambda (eq. 4, 5) ---------------------------------------------------------------
def test_heterogeneity_and_adaptive_lambda_on_hand_made_prototypes() -> None:
    glob = torch.tensor([[0.0, 0.0], [1.0, 1.0], [9.0, 9.0]])
    local = torch.tensor([[3.0, 0.0], [1.0, 5.0], [0.0, 0.0]])
    counts = torch.tensor([10.0, 2.0, 0.0])  # class 2 is missing locally
    present = torch.tensor([1.0, 1.0, 1.0])
    het = heterogeneity(local, counts, glob, present)
    assert het == pytest.approx((3 + 4) / 2)
    assert heterogeneity(local, counts, glob, present, squared=True) == pytest.approx((9 + 16) / 2)
    # a class without a global prototype does not count either; nothing shared -> 0
    assert heterogeneity(local, counts, glob, torch.tensor([1.0, 0, 1])) == pytest.approx(3.0)
    assert heterogeneity(local, counts, glob, torch.zeros(C)) == 0.0
    a = algo(alpha=0.01, beta=0.1)
    assert a._lambda(het) == pytest.approx(0.01 + 0.1 * 3.5)
    assert a._lambda(0.5) < a._lambda(het)  # the more heterogeneous client is held more tightly
    assert algo(adaptive=False)._lambda(het) == pytest.approx(0.01)
    assert algo(adaptive=False, fixed_lambda=0.3)._lambda(het) == pytest.approx(0.3)


def test_summed_reduction_is_eq3_sum_of_squared_distances() -> None:
    feats = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0], [7.0, 7.0]])
    labels = torch.tensor([0, 0, 1, 2])
    protos = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    present = torch.tensor([1.0, 1.0, 0.0])  # class 2 has no prototype
    # class means (2, 0) and (0, 2): squared distances 4 + 4
    assert class_mean_distance(feats, labels, protos, present, "sum").item() == pytest.approx(8.0)
    assert class_mean_distance(feats, labels, protos, present).item() == pytest.approx(8.0 / 4)
    assert prototype_distance(feats, labels, protos, present, "sum").item() == pytest.approx(
        1 + 9 + 4
    )


# hierarchical aggregation (eq. 6-9) -------------------------------------------------------
def test_hierarchical_weights_give_each_group_the_same_total() -> None:
    groups = torch.tensor([0, 0, 0, 1])
    w = hierarchical_weights(groups, torch.tensor([100.0, 100.0, 100.0, 10.0]), "uniform")
    assert w.tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 6, 1 / 2])
    w = hierarchical_weights(groups, torch.tensor([100.0, 300.0, 100.0, 10.0]), "samples")
    assert w.tolist() == pytest.approx([0.1, 0.3, 0.1, 0.5])
    assert float(w.sum()) == pytest.approx(1.0)


def _reply(client: int, value: float, protos: torch.Tensor, counts: torch.Tensor, n: int) -> Reply:
    model = {"head.weight": torch.full((C, D), value), "head.bias": torch.full((C,), value)}
    return Reply(client, {"model": model, PROTOS: pack_prototypes(protos, counts)}, {}, float(n))


def _two_groups() -> list[Reply]:
    """Three large clients near one prototype layout (weights 0), one small client far off (4)."""
    near = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    far = near + 10.0
    full = torch.tensor([5.0, 5.0, 5.0])
    return [
        _reply(0, 0.0, near, full, 300),
        _reply(1, 0.0, near + 0.1, full, 300),
        _reply(2, 0.0, near - 0.1, torch.tensor([5.0, 5.0, 0.0]), 300),  # lacks class 2
        _reply(3, 4.0, far, full, 30),
    ]


def test_two_groups_give_the_mean_of_group_means_not_the_sample_mean() -> None:
    a = algo(num_groups=2, contrastive=False)
    result = a.aggregate(a.init_server(), iter(_two_groups()), 1)
    server, model = result.server[GLOBAL_PROTOS], result.server["model"]
    # group means 0 and 4 -> 2; the sample-weighted mean would be 4 * 30/930 = 0.13
    assert torch.allclose(model["head.weight"], torch.full((C, D), 2.0))
    assert torch.allclose(model["head.bias"], torch.full((C,), 2.0))
    near = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    # group 1's prototypes average to `near`, except class 2: only clients 0 and 1 have it,
    # so near + 0.05; the far group's are near + 10; the global is their midpoint
    expected = near + 5.0
    expected[2] += 0.025
    assert torch.allclose(server["prototypes"], expected, atol=1e-5)
    assert server["present"].tolist() == [1.0, 1.0, 1.0]
    assert result.metrics["groups"] == 2.0  # two groups were found
    flat = algo(hierarchical=False, contrastive=False)
    model = flat.aggregate(flat.init_server(), iter(_two_groups()), 1).server["model"]
    assert torch.allclose(model["head.weight"], torch.full((C, D), 4 * 30 / 930))


def test_group_clients_recovers_planted_groups_with_missing_classes() -> None:
    local = torch.stack(
        [torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]) + s for s in (0, 0.1, -0.1, 10)]
    )
    counts = torch.tensor([[5.0, 5, 5], [5, 5, 5], [5, 5, 0], [5, 5, 5]])
    local[2, 2] = 0.0  # what unpack gives for a missing class
    labels = group_clients(local, counts, 2, seed=0)
    assert labels[0] == labels[1] == labels[2] != labels[3]
    # num_groups=0: Davies-Bouldin picks the 2 planted groups (6 clients, all classes)
    six = torch.stack([local[0] + s for s in (0, 0.1, -0.1, 10, 10.1, 9.9)])
    auto = group_clients(six, torch.full((6, C), 5.0), 0, seed=0)
    assert auto[0] == auto[1] == auto[2] != auto[3] == auto[4] == auto[5]
    merged, present = hierarchical_prototypes(local, counts, labels, "uniform")
    group_a = (local[0, 2] + local[1, 2]) / 2  # client 2 lacks class 2
    assert present.all() and torch.allclose(merged[2], (group_a + local[3, 2]) / 2, atol=1e-5)


def test_absent_classes_keep_their_previous_global_prototype() -> None:
    a = algo(contrastive=False, hierarchical=False)
    server = a.init_server()
    server[GLOBAL_PROTOS] = {
        "prototypes": torch.tensor([[0.0, 0.0], [0.0, 0.0], [7.0, 7.0]]),
        "present": torch.tensor([0.0, 0.0, 1.0]),
    }
    reply = _reply(0, 1.0, torch.ones(C, D), torch.tensor([3.0, 3.0, 0.0]), 6)
    out = a.aggregate(server, iter([reply]), 2).server
    assert out[GLOBAL_PROTOS]["prototypes"].tolist() == [[1.0, 1.0], [1.0, 1.0], [7.0, 7.0]]
    assert out[GLOBAL_PROTOS]["present"].tolist() == [1.0, 1.0, 1.0]
    message = a.configure(out, 0, 3)
    assert message[PROTOS]["classes"].tolist() == [0, 1, 2] and "counts" not in message[PROTOS]
    assert set(a.client_model(message, {})) == {"head.weight", "head.bias"}


# end to end on real data ------------------------------------------------------------------
@pytest.mark.integration
def test_a_short_run_on_uci_har_aligns_and_reports_a_global_model(shared_data) -> None:
    assert ALGORITHMS["feddpa"] is FedDPA and FedDPA.has_global_model
    cfg = load_config(
        None,
        [
            f"data.dir={shared_data}",
            "data.name=uci_har",
            "data.partition=natural",
            "model.name=mlp",
            "model.hidden=[64]",
            "train.rounds=3",
            "train.clients_per_round=6",
            "train.local_epochs=1",
            "train.batch_size=32",
            "train.lr=0.05",
            "train.threads=1",
            "eval.every=3",
            "eval.generalization=false",
            "algorithm.name=feddpa",
        ],
    )
    sim = simulate(prepare(cfg))
    summary = sim.run()
    final = summary.final
    assert final is not None and final.global_ is not None
    assert summary.rounds == 3
    assert final.global_.acc > 0.4  # 6 classes: chance is about 0.17
    assert summary.comm.up_bytes > 0 and summary.comm.down_bytes > 0
    server = sim.server
    glob = server[GLOBAL_PROTOS]
    assert glob["present"].tolist() == [1.0] * 6 and glob["prototypes"].shape == (6, 64)
    stats = final.server  # the server's metrics of the last round, by name
    assert stats == sim.history[-1].server
    mean_lambda, mean_het, groups = (
        stats["lambda_mean"],
        stats["heterogeneity_mean"],
        stats["groups"],
    )
    assert mean_het > 0 and mean_lambda == pytest.approx(0.01 + 0.1 * mean_het)
    assert 1 <= groups <= 3 and math.isfinite(stats["separation_after"])
    assert set(sim.algorithm.global_model(server)) == set(sim.algorithm.setting.init_model)
    assert set(stats) == {
        "lambda_mean",
        "heterogeneity_mean",
        "groups",
        "separation_before",
        "separation_after",
        "min_distance",
    }


def test_diverged_local_training_is_a_clear_error_not_a_clustering_crash() -> None:
    bad = _reply(0, 0.0, torch.full((C, D), float("nan")), torch.ones(C), 5)
    with pytest.raises(FloatingPointError, match="clients \\[0\\]"):
        algo().aggregate(algo().init_server(), iter([bad, _two_groups()[0]]), 2)
