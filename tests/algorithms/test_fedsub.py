"""FedSub's server computations on hand-made inputs, its client masks, the dynamic scenario,
and a short end-to-end run on the real WISDM features."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from protofed.algorithms import Setting, build_algorithm
from protofed.algorithms.fedsub import class_subnetworks, cluster_classes, fuse, predict_missing
from protofed.config import DynamicConfig, TrainConfig, load_config
from protofed.data.federated import ClientData, FederatedData
from protofed.errors import ConfigError
from protofed.runtime import fit_client, prepare, simulate
from protofed.runtime.dynamic import DynamicClasses, client_data


# missing-prototype prediction ------------------------------------------------------------
def test_predicted_prototype_is_the_similarity_weighted_mean_of_the_n_nearest():
    # 4 clients, 2 classes, 2-d prototypes; client 0 lacks class 1
    means = torch.tensor(
        [
            [[1.0, 0.0], [0.0, 0.0]],
            [[1.0, 0.2], [2.0, 4.0]],  # nearly parallel to client 0 on class 0
            [[1.0, 1.0], [6.0, 2.0]],  # 45 degrees
            [[0.0, 1.0], [9.0, 9.0]],  # orthogonal: the farthest
        ]
    )
    counts = torch.tensor([[5.0, 0.0], [3.0, 2.0], [4.0, 1.0], [2.0, 7.0]])
    filled, predicted = predict_missing(means, counts, neighbours=2)
    s1 = 1.0 / math.sqrt(1.0 + 0.04)  # eq. 1 over the one shared class (class 0)
    s2 = 1.0 / math.sqrt(2.0)
    expected = (s1 * means[1, 1] + s2 * means[2, 1]) / (s1 + s2)
    assert torch.allclose(filled[0, 1], expected, atol=1e-6)
    assert predicted.tolist() == [[False, True], [False, False], [False, False], [False, False]]
    # known prototypes are untouched
    assert torch.equal(filled[1:], means[1:]) and torch.equal(filled[0, 0], means[0, 0])
    # with n = 3 the orthogonal client joins with weight cos = 0: the same prediction
    filled3, _ = predict_missing(means, counts, neighbours=3)
    assert torch.allclose(filled3[0, 1], expected, atol=1e-6)


def test_a_class_no_client_has_stays_missing():
    means = torch.ones(3, 2, 2)
    counts = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    _, predicted = predict_missing(means, counts, neighbours=5)
    assert not predicted.any()


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_clusters_per_class_follow_the_prototypes():
    # class 0: groups {0,1,2} and {3,4,5}; class 1: groups {0,1} and {2,3,4}; 5 lacks class 1
    a, b = torch.tensor([0.0, 0.0]), torch.tensor([10.0, 10.0])
    class0 = torch.stack([a, a, a, b, b, b])
    class1 = torch.stack([b, b, a, a, a, b])
    means = torch.stack([class0, class1], dim=1)
    available = torch.ones(6, 2, dtype=torch.bool)
    available[5, 1] = False
    labels = cluster_classes(means, available, max_clusters=4, seed=0)
    assert labels[5, 1] == -1
    assert len(set(labels[:3, 0].tolist())) == 1 and len(set(labels[3:, 0].tolist())) == 1
    assert labels[0, 0] != labels[3, 0]
    assert labels[0, 1] == labels[1, 1] != labels[2, 1] == labels[3, 1] == labels[4, 1]


# fusion -----------------------------------------------------------------------------------
def _setup():
    """3 clients, 1 class, 4 parameters, all in one cluster."""
    weights = torch.tensor([[1.0, 2.0, 3.0, 4.0], [3.0, 6.0, 9.0, 12.0], [5.0, 5.0, 5.0, 5.0]])
    masks = torch.tensor([[[1, 1, 0, 1]], [[1, 0, 0, 1]], [[1, 1, 1, 0]]], dtype=torch.bool)
    counts = torch.tensor([[1.0], [3.0], [4.0]])
    accuracy = torch.tensor([[0.9], [0.5], [0.2]])
    labels = torch.zeros(3, 1, dtype=torch.long)
    return weights, masks, counts, accuracy, labels


def test_overlapping_components_changes_only_parameters_active_for_every_member():
    weights, masks, counts, accuracy, labels = _setup()
    out = fuse(weights, masks, counts, accuracy, labels, "overlap", own_weight=0.5)
    # only parameter 0 is active for all three members
    assert torch.equal(out[:, 1:], weights[:, 1:])
    fused0 = (1 * 1.0 + 3 * 3.0 + 4 * 5.0) / 8  # count-weighted cluster value (eq. 6)
    assert torch.allclose(out[:, 0], 0.5 * weights[:, 0] + 0.5 * fused0)
    replaced = fuse(weights, masks, counts, accuracy, labels, "overlap", own_weight=0.0)
    assert torch.allclose(replaced[:, 0], torch.full((3,), fused0))
    assert torch.equal(replaced[:, 1:], weights[:, 1:])


def test_cluster_average_weights_active_members_by_class_count():
    weights, masks, counts, accuracy, labels = _setup()
    out = fuse(weights, masks, counts, accuracy, labels, "cluster_avg")
    expected = torch.tensor(
        [
            (1 * 1 + 3 * 3 + 4 * 5) / 8,  # all active
            (1 * 2 + 4 * 5) / 5,  # clients 0 and 2
            5.0,  # client 2 only
            (1 * 4 + 3 * 12) / 4,  # clients 0 and 1
        ]
    )
    assert torch.allclose(out, expected.expand(3, 4))


def test_cluster_leadership_takes_the_leaders_active_parameters():
    weights, masks, counts, accuracy, labels = _setup()
    # scores acc x count: 0.9, 1.5, 0.8 -> client 1 leads; it is active on parameters 0 and 3
    out = fuse(weights, masks, counts, accuracy, labels, "leadership")
    assert torch.allclose(out[:, [0, 3]], weights[1, [0, 3]].expand(3, 2))
    assert torch.equal(out[:, [1, 2]], weights[:, [1, 2]])


def test_a_client_averages_over_its_class_clusters_and_predicted_members_only_receive():
    # 2 clients, 2 classes; class 0: separate clusters; class 1: one cluster, client 1 predicted
    weights = torch.tensor([[0.0, 10.0], [4.0, 20.0]])
    masks = torch.ones(2, 2, 2, dtype=torch.bool)
    counts = torch.tensor([[2.0, 2.0], [2.0, 0.0]])
    labels = torch.tensor([[0, 0], [1, 0]])
    out = fuse(weights, masks, counts, torch.ones(2, 2), labels, "cluster_avg")
    # client 0: mean of its class-0 cluster (itself) and class-1 cluster (itself) -> itself
    assert torch.allclose(out[0], weights[0])
    # client 1: mean of itself (class 0) and client 0's class-1 subnetwork
    assert torch.allclose(out[1], (weights[1] + weights[0]) / 2)


# client side ------------------------------------------------------------------------------
class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        self.head = nn.Linear(2, 2)

    def forward(self, x):
        return self.head(self.features(x))


def test_class_masks_mark_parameters_of_active_units_and_nonzero_inputs():
    model = _Tiny()
    with torch.no_grad():
        model.features[0].weight.copy_(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))
        model.features[0].bias.zero_()
        model.head.weight.copy_(torch.eye(2))
        model.head.bias.zero_()
    # class 0: x0 > 0 (unit 0 on, unit 1 off), input 1 is zero; class 1: x0 < 0
    x = torch.tensor([[1.0, 0.0], [2.0, 0.0], [-1.0, 3.0]])
    y = torch.tensor([0, 0, 1])
    masks, acc = class_subnetworks(model, ["features.0", "head"], x, y, 2)
    w = masks["features.0.weight"]
    assert w[0].tolist() == [[True, False], [False, False]]
    assert w[1].tolist() == [[False, False], [True, True]]
    assert masks["features.0.bias"].tolist() == [[True, False], [False, True]]
    # head: all output units count; inputs are the hidden units each class switches on
    assert masks["head.weight"][0].tolist() == [[True, False], [True, False]]
    assert acc.tolist() == [1.0, 1.0]  # logits = hidden units: class 0 -> unit 0, class 1 -> 1


def test_depth_beyond_the_model_is_a_config_error():
    model = _Tiny()
    setting = Setting(2, 2, TrainConfig(), {k: v.clone() for k, v in model.state_dict().items()})
    with pytest.raises(ConfigError, match="algorithm.depth"):
        build_algorithm("fedsub", {"depth": 3}, setting)
    partial = build_algorithm("fedsub", {}, setting)
    assert partial.layers == ["features.0"]
    full = build_algorithm("fedsub", {"setting": "full"}, setting)
    assert full.layers == ["features.0", "head"]


# the dynamic scenario --------------------------------------------------------------------
def _fed(num_clients: int = 10, num_classes: int = 4) -> FederatedData:
    """Clients with every class in every split; x encodes (client, class) for checks."""

    def part(i: int, reps: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.arange(num_classes).repeat(reps)
        return torch.stack([torch.full_like(y, i), y], 1).float(), y

    clients = [
        ClientData(f"c{i}", None, *part(i, 3), *part(i, 1), *part(i, 2)) for i in range(num_clients)
    ]
    return FederatedData(
        "toy",
        num_classes,
        [str(k) for k in range(num_classes)],
        (2,),
        "tabular",
        clients,
        counts=torch.zeros(1).numpy(),
    )


def test_withheld_classes_are_absent_until_their_round_then_back():
    fed = _fed()
    cfg = DynamicConfig(enabled=True, client_fraction=0.6, classes=2, every=5)
    dyn = DynamicClasses.build(cfg, fed, seed=3)
    assert len(dyn.withheld) == 6 and all(len(v) == 2 for v in dyn.withheld.values())
    for i, classes in dyn.withheld.items():
        first, second = classes
        for r in range(1, 16):
            view = client_data(fed, dyn, i, r)
            for split in ("train", "val", "test"):
                present = set(getattr(view, f"{split}_y").tolist())
                assert (first in present) == (r >= 5)
                assert (second in present) == (r >= 10)
                assert present >= set(range(4)) - set(classes)
        assert client_data(fed, dyn, i, 10) is fed.clients[i]  # all back: the original data
    for i in set(range(10)) - set(dyn.withheld):
        assert all(client_data(fed, dyn, i, r) is fed.clients[i] for r in (1, 7, 12))
    view = dyn.federated(fed, 1)
    assert [len(c.test_y) for c in view.clients] == [
        4 if i in dyn.withheld else 8 for i in range(10)
    ]


def test_the_same_seed_chooses_the_same_clients_and_classes():
    fed = _fed()
    cfg = DynamicConfig(enabled=True, client_fraction=0.5, classes=1, every=5)
    a, b = (DynamicClasses.build(cfg, fed, seed=7) for _ in range(2))
    assert a.withheld == b.withheld
    others = [DynamicClasses.build(cfg, fed, seed=s).withheld for s in range(8, 12)]
    assert any(o != a.withheld for o in others)
    assert DynamicClasses.build(DynamicConfig(), fed, seed=7) is None  # disabled by default


def test_a_client_keeps_a_class_with_train_and_test_samples():
    fed = _fed(num_clients=4, num_classes=3)
    cfg = DynamicConfig(enabled=True, client_fraction=1.0, classes=5, every=2)
    dyn = DynamicClasses.build(cfg, fed, seed=0)
    for i in range(4):
        assert len(dyn.withheld[i]) == 2
        view = client_data(fed, dyn, i, 1)
        assert len(view.train_y) > 0 and len(view.test_y) > 0


# end to end on real data ------------------------------------------------------------------
def _config(shared_data, *extra: str):
    return load_config(
        "configs/fedsub_wisdm.yaml",
        [
            f"data.dir={shared_data}",
            "train.rounds=2",
            "train.threads=1",
            "eval.every=1",
            "eval.generalization=false",
            *extra,
        ],
    )


@pytest.mark.integration
def test_fedsub_runs_on_wisdm_and_sends_each_client_its_own_model(shared_data):
    sim = simulate(prepare(_config(shared_data)))
    summary = sim.run()
    assert summary.rounds == 2 and len(sim.history) == 2
    assert summary.final is not None
    f1 = summary.final.personalization.f1
    assert f1 is not None
    assert 0.2 < f1 <= 1.0  # 6 classes; chance macro-F1 is far lower than this after training
    algo = sim.algorithm
    a, b = algo.configure(sim.server, 0, 3)["model"], algo.configure(sim.server, 1, 3)["model"]
    assert set(a) == set(algo.shared) and "head.weight" not in a  # partial: the head stays
    assert not torch.equal(a["features.1.weight"], b["features.1.weight"])
    assert "head.weight" in sim.client_state(0)["local"]


def test_dynamic_scenario_masks_training_and_evaluation_data(shared_data):
    cfg = _config(
        shared_data,
        "data.dynamic.enabled=true",
        "data.dynamic.classes=2",
        "data.dynamic.every=2",
        "algorithm.name=fedavg",
        "train.rounds=1",
    )
    prepared = prepare(cfg)
    dyn = prepared.dynamic
    assert len(dyn.withheld) == math.ceil(0.6 * len(prepared.fed.clients))
    sim = simulate(prepared)
    sim.run()
    ev1 = sim.evaluation.evaluator_for(1)
    for i, classes in dyn.withheld.items():
        lo, hi = ev1.test.bounds[i]
        assert not set(classes) & set(ev1.test.y[lo:hi].tolist())
    ev2 = sim.evaluation.evaluator_for(
        2
    )  # round 2: the first withheld class of every chosen client is back
    returned = {i: c[0] for i, c in dyn.withheld.items()}
    testable = [i for i in returned if returned[i] in prepared.fed.clients[i].test_y.tolist()]
    assert len(testable) >= len(returned) // 2  # most returned classes have test samples
    assert all(returned[i] in ev2.test.y[slice(*ev2.test.bounds[i])].tolist() for i in testable)
    second = {i: c[1] for i, c in dyn.withheld.items() if len(c) == 2}
    assert second and all(  # ... and the second withheld class is still out in round 2
        second[i] not in ev2.test.y[slice(*ev2.test.bounds[i])].tolist() for i in second
    )
    assert prepared.fed.meta["dynamic"]["every"] == 2


def test_a_client_trains_without_its_withheld_classes_until_they_return(shared_data):
    cfg = _config(
        shared_data, "data.dynamic.enabled=true", "data.dynamic.classes=2", "data.dynamic.every=2"
    )
    prepared = prepare(cfg)
    server = prepared.algorithm.init_server()
    cid, (first, second) = next((i, c) for i, c in prepared.dynamic.withheld.items() if len(c) == 2)
    full = torch.bincount(prepared.fed.clients[cid].train_y, minlength=6).float()
    for server_round, absent in ((1, [first, second]), (2, [second]), (4, [])):
        reply = fit_client(prepared, server, cid, server_round, {}).reply
        counts = reply["classes"]["counts"]
        assert all(counts[k] == 0 for k in absent)
        assert all(counts[k] == full[k] for k in range(6) if k not in absent)
