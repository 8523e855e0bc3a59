"""FedProto and PFPL: server computations on hand-made inputs, client side on real clients,
and a few rounds end to end on real data (../shared/data)."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from protofed.algorithms import Reply, Setting, build_algorithm
from protofed.algorithms.common.prototype_losses import (
    class_mean_distance,
    prototype_distance,
    prototype_regularized_loss,
)
from protofed.algorithms.fedproto import FedProto
from protofed.algorithms.pfpl import PFPL, neighbour_weights, personalized_prototypes
from protofed.config import DataConfig, ModelConfig, TrainConfig, build_config
from protofed.core.results import Summary
from protofed.data.federated import ClientData
from protofed.data.partition import mixed
from protofed.data.types import Dataset
from protofed.errors import ConfigError
from protofed.models import build_model
from protofed.prototypes import (
    PROTOS,
    embed,
    embedding_means,
    pack_prototypes,
    unpack_prototypes,
    with_prototype_head,
)
from protofed.report import group_scores
from protofed.runtime import start
from protofed.training.client import Client, load_weights
from protofed.training.loop import predict

NUM_CLASSES = 10
TRAIN = TrainConfig(local_epochs=1, batch_size=32, lr=0.05)


def _setting(model: torch.nn.Module, num_clients: int = 2) -> Setting:
    return Setting(
        num_clients, NUM_CLASSES, TRAIN, {k: v.clone() for k, v in model.state_dict().items()}
    )


@pytest.fixture(scope="module")
def digits_clients() -> list[ClientData]:
    """Two real clients with different classes: 8x8 digits {0,1,2} and {2,3,4}."""
    X, y = load_digits(return_X_y=True)
    x, t = torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y, dtype=torch.long)
    out = []
    for i, classes in enumerate([(0, 1, 2), (2, 3, 4)]):
        keep = torch.isin(t, torch.tensor(classes))
        xs, ys = x[keep][i::2], t[keep][i::2]
        a, b = int(0.7 * len(xs)), int(0.8 * len(xs))
        out.append(ClientData(f"c{i}", None, xs[:a], ys[:a], xs[a:b], ys[a:b], xs[b:], ys[b:]))
    return out


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(name="mlp", hidden=[32]), (64,), NUM_CLASSES)


def _client(model, data: ClientData, cid: int, server_round: int = 1) -> Client:
    generator = torch.Generator().manual_seed(cid + 10 * server_round)
    return Client(cid, data, model, TRAIN, server_round, generator)


# toolkit additions ------------------------------------------------------------------------
def test_pack_sends_only_present_classes_and_unpacks_to_dense() -> None:
    means = torch.arange(12.0).reshape(4, 3)
    counts = torch.tensor([2.0, 0.0, 5.0, 0.0])
    packed = pack_prototypes(means, counts)
    assert set(packed) == {"classes", "means", "counts"}  # the record `protos`, no prefixes
    assert packed["classes"].tolist() == [0, 2]
    assert packed["means"].shape == (2, 3)
    dense, back = unpack_prototypes(packed, 4)
    assert torch.equal(back, counts)
    assert torch.equal(dense[[0, 2]], means[[0, 2]]) and torch.count_nonzero(dense[[1, 3]]) == 0
    _, ones = unpack_prototypes(pack_prototypes(means, counts, with_counts=False), 4)
    assert ones.tolist() == [1.0, 0.0, 1.0, 0.0]
    empty, none = unpack_prototypes({}, 4)
    assert empty.shape == (4, 0) and not none.any()


def test_class_mean_distance_compares_batch_class_means() -> None:
    f = torch.tensor([[0.0, 0.0], [2.0, 2.0], [4.0, 0.0]])
    y = torch.tensor([0, 0, 1])
    protos = torch.tensor([[1.0, 3.0], [4.0, 0.0], [9.0, 9.0]])
    present = torch.tensor([True, True, True])
    # class 0's batch mean (1, 1) is (0, 2) away from its prototype; class 1 matches exactly
    assert class_mean_distance(f, y, protos, present).item() == pytest.approx((0 + 4 + 0 + 0) / 4)
    present[0] = False
    assert class_mean_distance(f, y, protos, present).item() == 0.0


def test_reductions_of_the_prototype_distance() -> None:
    """mean is the MSE, squared_l2 the per-row squared distance (D times it), sum their sum."""
    f = torch.tensor([[0.0, 0.0], [2.0, 2.0], [4.0, 0.0]])
    y = torch.tensor([0, 0, 1])
    protos = torch.tensor([[1.0, 3.0], [4.0, 0.0]])
    present = torch.tensor([True, True])
    rows = [1 + 9, 1 + 1, 0 + 0]  # squared distances of the three samples to their prototypes
    dist = functools.partial(prototype_distance, f, y, protos, present)
    assert dist("mean").item() == pytest.approx(sum(rows) / 6)
    assert dist("squared_l2").item() == pytest.approx(sum(rows) / 3)
    assert dist("sum").item() == pytest.approx(sum(rows))


def test_pfpl_squared_l2_option_is_d_times_the_default_regulariser(digits_clients) -> None:
    model = build_model(ModelConfig(name="mlp", hidden=[16]), (64,), 10)
    x, y = digits_clients[0].train_x[:20], digits_clients[0].train_y[:20]
    protos, present = torch.randn(10, 16), torch.ones(10)
    ce = torch.nn.functional.cross_entropy(model(x), y).item()
    values = {}
    for reduction in ("mean", "squared_l2"):
        pfpl = build_algorithm("pfpl", {"reg_reduction": reduction}, _setting(model))
        values[reduction] = pfpl.local_loss(protos, present)(model, x, y).item() - ce
    assert values["squared_l2"] == pytest.approx(16 * values["mean"], rel=1e-5)


def test_nearest_prototype_head_predicts_the_argmin_distance(digits_clients) -> None:
    model = _model()
    x = digits_clients[0].test_x
    g = torch.Generator().manual_seed(1)
    protos = torch.rand(NUM_CLASSES, model.embedding_dim, generator=g)
    present = torch.ones(NUM_CLASSES, dtype=torch.bool)
    present[[3, 7]] = False
    weights = with_prototype_head(model.state_dict(), protos, present)
    features = embed(model, x)
    dist = torch.cdist(features.double(), protos.double())
    dist[:, ~present] = float("inf")
    load_weights(model, weights)
    pred = predict(model, x)
    assert torch.equal(pred, dist.argmin(1))
    assert not torch.isin(pred, torch.tensor([3, 7])).any()


def test_prototype_head_rejects_a_head_of_the_wrong_shape() -> None:
    weights = {"head.weight": torch.zeros(NUM_CLASSES, 5), "head.bias": torch.zeros(NUM_CLASSES)}
    with pytest.raises(ValueError, match="linear head"):
        with_prototype_head(weights, torch.zeros(NUM_CLASSES, 8), torch.ones(NUM_CLASSES))


# PFPL's server ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["inverse", "softmax"])
def test_pfpl_weights_sum_to_one_and_favour_the_nearer_client(mode: str) -> None:
    d = torch.tensor([4.0, 1.0, 9.0])
    w = neighbour_weights(d, mode)
    assert w.sum().item() == pytest.approx(1.0)
    assert (w > 0).all()
    assert w[1] > w[0] > w[2]
    if mode == "inverse":
        assert w.tolist() == pytest.approx(
            [(1 / 4) / (1 / 4 + 1 + 1 / 9), 1 / (1 / 4 + 1 + 1 / 9), (1 / 9) / (1 / 4 + 1 + 1 / 9)]
        )


def test_pfpl_literal_formula_is_the_printed_one_and_favours_the_farther_client() -> None:
    w = neighbour_weights(torch.tensor([4.0, 1.0, 5.0]), "literal")
    assert w.tolist() == pytest.approx([0.4, 0.1, 0.5])


def test_pfpl_weights_split_ties_at_zero_distance() -> None:
    assert neighbour_weights(torch.tensor([0.0, 3.0, 0.0]), "inverse").tolist() == [0.5, 0.0, 0.5]
    assert neighbour_weights(torch.tensor([0.0, 0.0]), "softmax").tolist() == [0.5, 0.5]


def test_pfpl_personalized_prototype_mixes_own_and_distance_weighted_neighbours() -> None:
    # 3 clients, 2 classes, D = 1. Class 0: client 0 at 0, client 1 at 1 (near), client 2 at 3.
    means = torch.tensor([[[0.0], [5.0]], [[1.0], [0.0]], [[3.0], [0.0]]])
    counts = torch.tensor([[10.0, 4.0], [1.0, 0.0], [7.0, 0.0]])
    out, present = personalized_prototypes(means, counts, 0, alpha=0.3, mode="inverse")
    w_near, w_far = 1 / (1 + 1 / 9), (1 / 9) / (1 + 1 / 9)  # d = 1 and 9
    assert out[0].item() == pytest.approx(0.3 * 0 + 0.7 * (w_near * 1 + w_far * 3))
    assert out[0].item() < 0.7 * 2  # nearer than the plain mean of the neighbours
    assert out[1].item() == 5.0  # client 0 alone with class 1: its own prototype
    assert present.tolist() == [True, True]
    out1, present1 = personalized_prototypes(means, counts, 1, alpha=1.0)
    assert out1[0].item() == 1.0 and present1.tolist() == [True, False]  # alpha = 1: own only


def test_pfpl_server_keeps_latest_prototypes_and_sends_each_client_its_own(digits_clients) -> None:
    model = _model()
    algo = PFPL(PFPL.Params(alpha=0.5), _setting(model, num_clients=3))
    server = algo.init_server()
    assert algo.configure(server, 0, 1) == {}  # nothing uploaded yet
    d = model.embedding_dim
    up0 = pack_prototypes(torch.full((NUM_CLASSES, d), 1.0), torch.tensor([1.0, 1.0] + [0.0] * 8))
    up1 = pack_prototypes(torch.full((NUM_CLASSES, d), 3.0), torch.tensor([0.0, 1.0] + [0.0] * 8))
    replies = [Reply(0, {PROTOS: up0}), Reply(1, {PROTOS: up1})]
    server = algo.aggregate(server, iter(replies), 1).server
    msg0 = algo.configure(server, 0, 2)[PROTOS]
    assert msg0["classes"].tolist() == [0, 1]
    assert torch.allclose(msg0["means"][0], torch.full((d,), 1.0))  # alone with class 0
    assert torch.allclose(msg0["means"][1], torch.full((d,), 2.0))  # 0.5 * 1 + 0.5 * 3
    assert algo.configure(server, 2, 2) == {}  # client 2 never replied
    # round 2: client 1 alone replies; client 0's prototypes stay on the server
    server = algo.aggregate(server, iter([Reply(1, {PROTOS: up0})]), 2).server
    again = algo.configure(server, 0, 3)[PROTOS]["means"][1]
    assert torch.allclose(again, torch.full((d,), 1.0))


# client sides on real clients ---------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("cls", [FedProto, PFPL])
def test_client_trains_its_own_model_and_sends_only_its_class_prototypes(
    cls, digits_clients
) -> None:
    model = _model()
    algo = cls(cls.Params(), _setting(model))
    data = digits_clients[1]
    result = algo.fit(_client(model, data, 1), {}, {})
    assert set(result.reply) == {PROTOS}  # only prototypes travel
    reply, metrics, state = result.reply[PROTOS], result.metrics, result.state["model"]
    assert reply["classes"].tolist() == [2, 3, 4]
    assert set(reply) <= {"classes", "means", "counts"}
    assert "num_examples" not in metrics  # the engine stamps it
    load_weights(model, state)  # the trained personal model: its class means were sent
    expected, _ = embedding_means(model, data.train_x, data.train_y, NUM_CLASSES)
    assert torch.allclose(
        unpack_prototypes(reply, NUM_CLASSES)[0][[2, 3, 4]], expected[[2, 3, 4]], atol=1e-6
    )
    assert not torch.equal(state["head.weight"], algo.setting.init_model["head.weight"])
    # evaluated on its own model, no weights sent
    assert algo.client_model({}, result.state) is state


@pytest.mark.integration
def test_prototype_loss_pulls_embeddings_toward_the_prototypes(digits_clients) -> None:
    """With a large lam, local training moves the class means toward the sent prototypes."""
    data = digits_clients[0]
    model = _model()
    before, counts = embedding_means(model, data.train_x, data.train_y, NUM_CLASSES)
    target = torch.zeros_like(before)
    present = counts > 0
    dist = {}
    for lam in (0.0, 50.0):
        load_weights(model, _setting(_model()).init_model)
        _client(model, data, 0).train_model(
            loss_fn=prototype_regularized_loss(target, present, lam)
        )
        f = embed(model, data.train_x)
        dist[lam] = ((f - target[data.train_y]) ** 2).mean().item()
    assert dist[50.0] < 0.5 * dist[0.0]


# FedProto's server ------------------------------------------------------------------------
def test_fedproto_aggregates_count_weighted_or_uniform_means() -> None:
    model = _model()
    d = model.embedding_dim
    m0 = torch.zeros(NUM_CLASSES, d)
    m0[0], m0[1] = 1.0, 2.0
    m1 = torch.zeros(NUM_CLASSES, d)
    m1[1], m1[5] = 6.0, 4.0
    c0 = torch.zeros(NUM_CLASSES)
    c0[0], c0[1] = 3.0, 1.0
    c1 = torch.zeros(NUM_CLASSES)
    c1[1], c1[5] = 3.0, 2.0
    replies = [
        Reply(0, {PROTOS: pack_prototypes(m0, c0)}),
        Reply(1, {PROTOS: pack_prototypes(m1, c1)}),
    ]
    server = FedProto(FedProto.Params(), _setting(model)).aggregate({}, iter(replies), 1).server
    counted = server[PROTOS]
    assert torch.allclose(counted["means"][1], torch.full((d,), (1 * 2.0 + 3 * 6.0) / 4))
    assert torch.allclose(counted["means"][0], torch.full((d,), 1.0))
    assert counted["counts"].tolist() == [3.0, 4.0, 0, 0, 0, 2.0, 0, 0, 0, 0]
    uniform = (
        FedProto(FedProto.Params(weighting="uniform"), _setting(model))
        .aggregate({}, iter(replies), 1)
        .server[PROTOS]
    )
    assert torch.allclose(uniform["means"][1], torch.full((d,), 4.0))
    algo = FedProto(FedProto.Params(), _setting(model))
    msg = algo.configure(server, 3, 2)
    assert msg[PROTOS]["classes"].tolist() == [0, 1, 5] and "counts" not in msg[PROTOS]
    # evaluation: the personal model with the nearest-global-prototype head
    evaluated = algo.client_model(msg, {})
    assert torch.allclose(evaluated["head.weight"][1], 2 * counted["means"][1])
    assert evaluated["head.bias"][2].item() == -1e9
    assert torch.equal(evaluated["features.1.weight"], algo.setting.init_model["features.1.weight"])
    head = FedProto(FedProto.Params(inference="head"), _setting(model))
    assert head.client_model(msg, {}) is head.setting.init_model


# data scenario ----------------------------------------------------------------------------
def _domains_dataset() -> Dataset:
    y = np.tile(np.arange(10), 600)
    groups = np.repeat(np.arange(3), 2000)
    return Dataset(
        name="toy",
        X=np.zeros((6000, 2), np.float32),
        y=y,
        num_classes=10,
        class_names=[str(i) for i in range(10)],
        groups=groups,
        kind="tabular",
    )


def test_mixed_gives_each_client_one_domain_and_n_classes_or_n_on_average() -> None:
    ds = _domains_dataset()
    exact = mixed(
        DataConfig(partition="mixed", num_clients=20, classes_per_client=4),
        ds,
        np.random.default_rng(0),
    )
    assert all(len(np.unique(ds.groups[p])) == 1 for p in exact)
    assert [len(np.unique(ds.y[p])) for p in exact] == [4] * 20
    spread = mixed(
        DataConfig(partition="mixed", num_clients=200, classes_per_client=4, classes_spread=2),
        ds,
        np.random.default_rng(0),
    )
    ways = np.array([len(np.unique(ds.y[p])) for p in spread])
    assert ways.min() == 2 and ways.max() == 6 and abs(ways.mean() - 4) < 0.3


# end to end on real data ------------------------------------------------------------------
def _run(tmp_path, shared_data, name: str, **overrides) -> tuple[Summary, dict]:
    raw = {
        "seed": 0,
        "data": {
            "name": "office_caltech",
            "partition": "mixed",
            "num_clients": 8,
            "classes_per_client": 3,
            "dir": str(shared_data),
        },
        "model": {"name": "mlp", "hidden": [64]},
        "algorithm": {"name": name, **overrides},
        "train": {"rounds": 3, "batch_size": 32, "lr": 0.05, "momentum": 0.9, "threads": 1},
        "eval": {"every": 1},
    }
    sim = start(build_config(raw), tmp_path / name)
    summary = sim.run()
    return summary, group_scores(tmp_path / name, "final")


@pytest.mark.integration
@pytest.mark.parametrize("name", ["fedproto", "pfpl"])
def test_runs_end_to_end_on_office_caltech_domains(tmp_path, shared_data, name: str) -> None:
    summary, by_domain = _run(tmp_path, shared_data, name)
    assert summary.final is not None
    pers = summary.final.personalization
    assert pers.acc > 0.5  # 3 classes per client: chance is 1/3
    assert summary.final.global_ is None
    # only prototypes travel: 8 clients x 3 rounds x 3 classes x 64 floats up, at most
    up = summary.comm.up_bytes
    assert 0 < up <= 8 * 3 * 3 * (64 * 4 + 8 + 4)
    model_bytes = (800 * 64 + 64 + 64 * 10 + 10) * 4
    assert up < 0.1 * model_bytes * 8 * 3
    assert set(by_domain) == {"amazon", "caltech", "dslr", "webcam"}
    record = json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[-1])
    partition = json.loads((tmp_path / name / "partition.json").read_text())
    amazon = [
        a
        for a, c in zip(record["clients"]["pers_acc"], partition["clients"], strict=True)
        if c["group"] == 0
    ]
    assert by_domain["amazon"] == pytest.approx(sum(amazon) / len(amazon))


@pytest.mark.integration
def test_pfpl_runs_on_digits_domains(tmp_path, shared_data) -> None:
    raw = {
        "seed": 1,
        "data": {
            "name": "digits_domains",
            "partition": "mixed",
            "num_clients": 6,
            "classes_per_client": 2,
            "image_size": 8,
            "dir": str(shared_data),
            "split": [0.2, 0.1, 0.7],
        },
        "model": {"name": "mlp", "hidden": [32]},
        "algorithm": {
            "name": "pfpl",
            "weights": "literal",
            "align": "class_mean",
            "inference": "prototype",
        },
        "train": {"rounds": 2, "batch_size": 64, "lr": 0.05, "threads": 1},
        "eval": {"every": 1},
    }
    sim = start(build_config(raw), tmp_path / "digits")
    summary = sim.run()
    assert summary.final is not None
    assert summary.final.personalization.acc > 0.6  # 2 classes each
    # 6 clients dealt round-robin over the 3 domains: every domain scored, 2 clients each
    by_domain = group_scores(tmp_path / "digits")
    assert set(by_domain) == {"mnist", "usps", "mnist_m"}
    assert all(0.0 <= v <= 1.0 for v in by_domain.values())


def test_build_by_name_validates_params() -> None:
    model = _model()
    with pytest.raises(ConfigError, match="weights"):
        build_algorithm("pfpl", {"weights": "far"}, _setting(model))
    assert build_algorithm("fedproto", {"lam": 2.0}, _setting(model)).params.lam == 2.0
