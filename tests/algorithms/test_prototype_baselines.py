"""FedPAC, FedNH, ProtoHAR, FedCLAR and FedHome: each one's distinctive computation on tiny
hand-made inputs, their four questions called directly, and a short run on real UCI-HAR data.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from protofed.algorithms import ALGORITHMS, MODEL, Algorithm, Arrays, Reply, Setting
from protofed.algorithms import parse_params as parse_algorithm_params
from protofed.algorithms.common.split import body_names, head_names, split_arrays
from protofed.algorithms.fedclar import (
    ASSIGN,
    PERSONAL,
    FedCLAR,
    cosine_distances,
    group_record,
    threshold_clusters,
)
from protofed.algorithms.fedhome import FedHome, smote_balance
from protofed.algorithms.fednh import (
    FedNH,
    cosine_logits,
    orthogonal_prototypes,
    smooth_update,
    uniform_prototypes,
)
from protofed.algorithms.fedpac import (
    FedPAC,
    combination_weights,
    feature_statistics,
    simplex_qp,
)
from protofed.algorithms.protohar import ProtoHAR, client_mean_prototypes
from protofed.config import ModelConfig, TrainConfig, load_config
from protofed.data.federated import ClientData
from protofed.errors import ConfigError
from protofed.models import build_model
from protofed.models.base import FedModel
from protofed.prototypes import PROTOS, embed, pack_prototypes, unpack_prototypes
from protofed.runtime import prepare, simulate
from protofed.training.client import Client

NAMES = ["fedpac", "fednh", "protohar", "fedclar", "fedhome"]
NUM_CLASSES = 10
TRAIN = TrainConfig(rounds=10, local_epochs=1, batch_size=32, lr=0.05)


# fixtures and helpers ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def clients_data(digits_clients) -> list[ClientData]:
    """Two real clients: disjoint slices of 300 digits each (conftest.digits_clients)."""
    return digits_clients(300)


def make_model(seed: int = 0) -> FedModel:
    torch.manual_seed(seed)
    return build_model(ModelConfig(name="mlp", hidden=[16]), (64,), NUM_CLASSES)


def clone(arrays: Arrays) -> Arrays:
    return {k: v.detach().clone() for k, v in arrays.items()}


def setting_for(model: FedModel, num_clients: int = 2, train: TrainConfig = TRAIN) -> Setting:
    return Setting(num_clients, NUM_CLASSES, train, clone(model.state_dict()))


def make_client(data: ClientData, model: FedModel, cid: int = 0, server_round: int = 1) -> Client:
    gen = torch.Generator().manual_seed(99 + cid)
    return Client(
        id=cid, data=data, model=model, train=TRAIN, server_round=server_round, generator=gen
    )


def build(cls: type[Algorithm], setting: Setting, **params) -> Algorithm:
    return cls(cls.Params(**params), setting)


def clone_records(records: dict[str, Arrays]) -> dict[str, Arrays]:
    return {name: clone(arrays) for name, arrays in records.items()}


def equal(a: Arrays, b: Arrays) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# registry, hyperparameters and the shared helpers ---------------------------------------------
def test_registered_with_paper_defaults_and_global_model_flags() -> None:
    # the registry contract (docs, unknown keys) is test_weight_baselines.py's, for every algorithm
    assert {n: ALGORITHMS[n].has_global_model for n in NAMES} == {
        "fedpac": False,
        "fednh": True,
        "protohar": False,
        "fedclar": False,
        "fedhome": True,
    }
    assert FedPAC.describe_params() == {
        "lam": 1.0,
        "head_epochs": 1,
        "body_epochs": None,
        "head_lr": None,
        "min_weight": 1e-3,
        "qp_iters": 1000,
    }
    assert FedNH.describe_params() == {
        "rho": 0.9,
        "scale": 1.0,
        "learn_scale": True,
        "init": "uniform",
    }
    assert ProtoHAR.describe_params() == {
        "lam": 1.0,
        "head_epochs": 1,
        "body_epochs": None,
        "head_lr": None,
    }
    assert FedCLAR.describe_params() == {
        "cluster_round": None,
        "threshold": 1e-4,
        "linkage": "average",
        "finetune_epochs": 1,
    }
    assert FedHome.describe_params() == {
        "finetune_rounds": 50,
        "k_neighbors": 5,
        "finetune_epochs": None,
        "head_lr": None,
    }
    for name, raw in [
        ("fednh", {"rho": 1.5}),
        ("fedpac", {"min_weight": 1.0}),
        ("fedclar", {"linkage": "ward"}),
        ("fedhome", {"k_neighbors": 0}),
    ]:
        with pytest.raises(ConfigError):
            parse_algorithm_params(name, raw)


@pytest.mark.integration
def test_embed_is_the_eval_mode_body_and_restores_the_mode() -> None:
    model = make_model()
    model.train()
    x = torch.randn(700, 64)  # more than one batch of 512
    z = embed(model, x)
    assert model.training
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(z, model.features(x))


# FedPAC -----------------------------------------------------------------------------------------
def test_simplex_qp_matches_brute_force() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 3, generator=g, dtype=torch.float64)
    q = a @ a.T + 0.1 * torch.eye(3, dtype=torch.float64)
    alpha = simplex_qp(q)
    grid = [
        torch.tensor([i / 200, j / 200, 1 - (i + j) / 200], dtype=torch.float64)
        for i in range(201)
        for j in range(201 - i)
    ]
    best = min(float(v @ q @ v) for v in grid)
    assert float(alpha @ q @ alpha) <= best + 1e-9
    assert alpha.min() >= 0 and math.isclose(float(alpha.sum()), 1.0, abs_tol=1e-12)
    # optimality certificate on badly conditioned, rank-deficient problems: (Q a)_j >= a^T Q a
    # for every j, with equality where a_j > 0
    for seed, scales in [(1, [1.0, 1e-3, 50.0]), (2, [1.0, 1.0, 1.0]), (3, [1e2, 1e-2, 1.0])]:
        z = torch.randn(4, 7, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        z = z * torch.tensor(scales * 3, dtype=torch.float64)[:7]  # 7 points in 4 dimensions
        q = z.T @ z
        a = simplex_qp(q)
        value, grad = float(a @ q @ a), q @ a
        assert float(grad.min()) >= value - 1e-9 * float(q.diagonal().max())
        assert torch.allclose(
            grad[a > 1e-12],
            torch.full_like(grad[a > 1e-12], value),
            rtol=1e-7,
            atol=1e-9 * float(q.diagonal().max()),
        )


def test_feature_statistics_are_the_variance_of_the_class_weighted_means() -> None:
    f = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    y = torch.tensor([0, 0, 1])
    means, counts, v = feature_statistics(f, y, 3)
    pi = torch.tensor([2 / 3, 1 / 3, 0.0], dtype=torch.float64)
    # (sum_k pi_k E_k||f||^2 - sum_k ||pi_k mu_k||^2) / n
    expected = (pi[0] * (1 + 9) / 2 + pi[1] * 4 - (pi[0] ** 2 * 4 + pi[1] ** 2 * 4)) / 3
    assert math.isclose(float(v), float(expected), rel_tol=1e-12)
    assert torch.equal(counts, torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64))
    # the same number, from the per-sample terms e_y f^T directly
    outer = torch.stack(
        [torch.outer(F.one_hot(t, 3).double(), r.double()) for t, r in zip(y, f, strict=True)]
    )
    assert math.isclose(float(outer.var(0, unbiased=False).sum() / 3), float(v), rel_tol=1e-12)


def test_combination_weights_sum_to_one_and_favour_the_similar_client() -> None:
    h = torch.tensor([[[1.0, 0.0]], [[1.1, 0.0]], [[0.0, 50.0]]])  # client 1 ~ client 0
    alpha = combination_weights(h, torch.tensor([0.5, 0.5, 0.5]))
    torch.testing.assert_close(alpha.sum(1), torch.ones(3, dtype=torch.float64))
    assert alpha.min() >= 0
    assert alpha[0, 1] > 0.3 and alpha[0, 2] == 0  # a near twin helps, a stranger does not
    assert alpha[2, 2] == 1.0
    # without variance, nothing beats the client's own statistic
    own = combination_weights(h, torch.zeros(3))
    torch.testing.assert_close(own, torch.eye(3, dtype=torch.float64))
    # large variances everywhere: averaging the twins halves the variance
    noisy = combination_weights(h, torch.tensor([100.0, 100.0, 100.0]))
    assert abs(float(noisy[0, 0] - noisy[0, 1])) < 0.05


@pytest.mark.integration
def test_fedpac_round_trip_combines_heads_per_client(clients_data) -> None:
    model = make_model()
    setting = setting_for(model)
    algo = build(FedPAC, setting)
    server = algo.init_server()
    assert server[PROTOS]["means"].shape == (0, 16)  # no prototype yet
    message = algo.configure(server, 0, 1)
    assert "head" not in message  # no combined head yet: the client uses its own
    replies, states = [], []
    for cid in (0, 1):
        data = clients_data[cid]
        out = algo.fit(make_client(data, model, cid), message, {})
        assert set(out.state["head"]) == set(head_names(model))
        assert set(out.reply) == {"model", "head", PROTOS, "stats"}
        assert {"means", "counts"} <= set(out.reply[PROTOS]) and "variance" in out.reply["stats"]
        replies.append(Reply(cid, out.reply, out.metrics, float(len(data.train_y))))
        states.append(out.state)
    new = algo.aggregate(server, iter(replies), 1).server
    dense = [unpack_prototypes(r.records[PROTOS], NUM_CLASSES) for r in replies]
    means = torch.stack([m for m, _ in dense])
    counts = torch.stack([c for _, c in dense])
    expected = (means * counts.unsqueeze(-1)).sum(0) / counts.sum(0).unsqueeze(-1)
    merged, present = unpack_prototypes(new[PROTOS], NUM_CLASSES)
    torch.testing.assert_close(merged, expected)
    assert torch.equal(present, (counts.sum(0) > 0).float())
    n = [r.num_examples for r in replies]
    bodies = [r.records["model"] for r in replies]
    for name in body_names(model):
        w = (bodies[0][name] * n[0] + bodies[1][name] * n[1]) / sum(n)
        torch.testing.assert_close(new["model"][name], w)
    pi = counts / counts.sum(1, keepdim=True)
    variance = torch.cat([r.records["stats"]["variance"] for r in replies])
    alpha = combination_weights(pi.unsqueeze(-1) * means, variance)
    for cid in (0, 1):
        msg = algo.configure(new, cid, 2)
        for name in head_names(model):
            mixed = sum(alpha[cid, j] * replies[j].records["head"][name].double() for j in (0, 1))
            torch.testing.assert_close(msg["head"][name], mixed.float())
        personal = algo.client_model(msg, states[cid])
        assert set(personal) == set(model.state_dict())
        assert torch.equal(personal["head.weight"], msg["head"]["head.weight"])
    # a client the server never combined keeps its own head
    assert torch.equal(
        algo.client_model(algo.configure(new, 5, 2), states[0])["head.weight"],
        states[0]["head"]["head.weight"],
    )


# FedNH ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("classes,dim", [(6, 16), (10, 10), (2, 3)])
def test_uniform_prototypes_are_a_regular_simplex(classes: int, dim: int) -> None:
    p = uniform_prototypes(classes, dim)
    assert p.shape == (classes, dim)
    torch.testing.assert_close(p.norm(dim=1), torch.ones(classes))
    cos = p @ p.T
    off = cos[~torch.eye(classes, dtype=torch.bool)]
    torch.testing.assert_close(off, torch.full_like(off, -1 / (classes - 1)))  # the optimum


@pytest.mark.integration
def test_uniform_prototypes_beyond_the_dimension_spread_better_than_random() -> None:
    p = uniform_prototypes(12, 3, steps=500)  # more classes than dimensions: optimised
    torch.testing.assert_close(p.norm(dim=1), torch.ones(12))
    off = ~torch.eye(12, dtype=torch.bool)
    worst = float((p @ p.T)[off].max())
    # the best known 12 points on the 2-sphere (icosahedron) have max cosine 1/sqrt(5) = 0.447
    assert worst < 0.46
    g = torch.Generator().manual_seed(1)
    r = F.normalize(torch.randn(12, 3, generator=g), dim=1)
    assert worst < float((r @ r.T)[off].max())
    ortho = orthogonal_prototypes(4, 6)
    torch.testing.assert_close(ortho @ ortho.T, torch.eye(4))


def test_fednh_server_update_is_the_momentum_formula() -> None:
    p = F.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]), dim=1)
    means = torch.tensor(
        [[[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]], [[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]]]
    )
    counts = torch.tensor([[3.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # nobody has class 2
    rho = 0.9
    new = smooth_update(p, means, counts, rho)
    avg0 = F.normalize(torch.tensor([1.0, 3.0]) / 4, dim=0)
    torch.testing.assert_close(new[0], F.normalize(rho * p[0] + (1 - rho) * avg0, dim=0))
    torch.testing.assert_close(
        new[1], F.normalize(rho * p[1] + (1 - rho) * torch.tensor([1.0, 0.0]), dim=0)
    )
    torch.testing.assert_close(new[2], p[2])  # no class semantics this round: unchanged
    torch.testing.assert_close(smooth_update(p, means, counts, 1.0), p)


@pytest.mark.integration
def test_fednh_trains_the_body_under_fixed_prototypes(clients_data) -> None:
    model = make_model()
    setting = setting_for(model)
    algo = build(FedNH, setting)
    server = algo.init_server()
    p = server["model"]["head.weight"]
    torch.testing.assert_close(p @ p.T, torch.eye(10) * (1 + 1 / 9) - 1 / 9)
    assert torch.count_nonzero(server["model"]["head.bias"]) == 0
    message = algo.configure(server, 0, 1)
    out = algo.fit(make_client(clients_data[0], model), message, {})
    arrays, metrics, state = out.reply, out.metrics, out.state["model"]
    # the head is never trained, and never sent
    assert torch.equal(state["head.weight"], p) and not head_names(arrays["model"])
    assert metrics["scale"] != 1.0  # s is learned
    assert set(algo.client_model(message, out.state)) == set(model.state_dict())
    means, counts = unpack_prototypes(arrays[PROTOS], NUM_CLASSES)
    present = counts > 0
    torch.testing.assert_close(means[present].norm(dim=1), torch.ones(int(present.sum())))
    # the model's plain linear head predicts what the cosine classifier predicts
    model.load_state_dict(state)
    x = clients_data[0].test_x
    with torch.no_grad():
        cos = cosine_logits(model, x, p, torch.tensor(metrics["scale"]))
        assert torch.equal(model(x).argmax(1), cos.argmax(1))
    new = algo.aggregate(server, iter([Reply(0, arrays, metrics, 10.0)]), 1).server
    torch.testing.assert_close(
        new["model"]["head.weight"], smooth_update(p, means[None], counts[None], 0.9)
    )
    assert set(algo.global_model(new)) == set(model.state_dict())


# ProtoHAR ---------------------------------------------------------------------------------------
def test_protohar_server_averages_prototypes_per_client_not_per_sample() -> None:
    means = torch.tensor([[[0.0], [2.0]], [[4.0], [0.0]]])
    counts = torch.tensor([[1.0, 5.0], [9.0, 0.0]])
    merged, clients = client_mean_prototypes(means, counts)
    torch.testing.assert_close(merged[:, 0], torch.tensor([2.0, 2.0]))  # count-weighted: 3.6
    torch.testing.assert_close(clients, torch.tensor([2.0, 1.0]))


@pytest.mark.integration
def test_protohar_alignment_pulls_embeddings_to_the_global_prototypes(clients_data) -> None:
    model = make_model()
    setting = setting_for(model)
    data = clients_data[0]
    server = build(ProtoHAR, setting).init_server()
    # reachable targets: the embedding is a ReLU output, so non-negative
    targets = torch.rand(NUM_CLASSES, 16, generator=torch.Generator().manual_seed(3))
    server[PROTOS] = pack_prototypes(targets, torch.ones(NUM_CLASSES), with_counts=False)
    gaps, heads = {}, {}
    for lam in (0.0, 5.0):
        algo = build(ProtoHAR, setting, lam=lam, body_epochs=3)
        out = algo.fit(make_client(data, model), clone_records(server), {})
        arrays, metrics, state = out.reply, out.metrics, out.state["head"]
        assert set(state) == set(head_names(model)) and not head_names(arrays["model"])
        local, counts = unpack_prototypes(arrays[PROTOS], NUM_CLASSES)
        present = counts > 0
        gaps[lam] = float((local - targets)[present].pow(2).mean())
        heads[lam] = state
        assert {"head_loss", "body_loss"} <= set(metrics)
    assert gaps[5.0] < 0.5 * gaps[0.0]
    assert equal(heads[0.0], heads[5.0])  # the head phase runs first and ignores lam
    # the head phase alone leaves the body exactly as received
    algo = build(ProtoHAR, setting, body_epochs=0)
    arrays = algo.fit(make_client(data, model), clone_records(server), {}).reply["model"]
    assert all(torch.equal(arrays[n], server["model"][n]) for n in body_names(model))


# FedCLAR ----------------------------------------------------------------------------------------
def test_threshold_clustering_splits_two_planted_groups() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(40, generator=g), torch.randn(40, generator=g)
    noise = 1e-4
    vectors = torch.stack(
        [a + noise * torch.randn(40, generator=g) for _ in range(3)]
        + [b + noise * torch.randn(40, generator=g) for _ in range(3)]
    )
    vectors = vectors[[0, 3, 1, 4, 2, 5]]
    labels = threshold_clusters(vectors, threshold=0.01)
    assert labels.tolist() == [0, 1, 0, 1, 0, 1]
    d = cosine_distances(vectors)
    assert float(d.diagonal().abs().max()) == 0 and torch.allclose(d, d.T)
    assert threshold_clusters(vectors, threshold=10.0).tolist() == [0] * 6  # one cluster
    assert threshold_clusters(vectors, threshold=1e-12).unique().numel() == 6  # singletons


def test_fedclar_clusters_at_its_round_and_averages_per_cluster() -> None:
    model = make_model()
    setting = setting_for(model, num_clients=5)
    algo = build(FedCLAR, setting, cluster_round=2)
    server = algo.init_server()
    assert torch.equal(server[ASSIGN][ASSIGN], torch.zeros(5, dtype=torch.long))
    g = torch.Generator().manual_seed(0)
    heads = head_names(model)
    directions = [
        {n: torch.randn(setting.init_model[n].shape, generator=g) for n in heads} for _ in range(2)
    ]
    probe = body_names(model)[0]

    def reply(cid: int, group: int, value: float, n: float) -> Reply:
        arrays = {k: torch.full_like(v, value) for k, v in setting.init_model.items()}
        for name in heads:  # the same head direction within a group, a different length
            arrays[name] = directions[group][name] * (1 + value)
        return Reply(cid, {MODEL: arrays}, {}, n)

    plan = [(0, 0, 1.0, 1.0), (1, 1, 2.0, 1.0), (2, 0, 3.0, 3.0), (3, 1, 4.0, 1.0)]
    before = algo.aggregate(server, iter([reply(*p) for p in plan]), 1).server  # FedAvg round
    assert torch.equal(before[ASSIGN][ASSIGN], torch.zeros(5, dtype=torch.long))
    group0 = before[group_record(0)]
    torch.testing.assert_close(group0[probe], torch.full_like(group0[probe], 16 / 6))
    after = algo.aggregate(before, iter([reply(*p) for p in plan]), 2).server
    assign = after[ASSIGN][ASSIGN].tolist()
    assert assign[0] == assign[2] != assign[1] == assign[3] and assign[4] == 0
    m0 = algo.configure(after, 0, 3)
    assert m0.keys() == {MODEL} and set(m0[MODEL]) == set(model.state_dict())
    torch.testing.assert_close(m0[MODEL][probe], torch.full_like(m0[MODEL][probe], 2.5))
    m3 = algo.configure(after, 3, 3)
    torch.testing.assert_close(m3[MODEL][probe], torch.full_like(m3[MODEL][probe], 3.0))
    # client 4 was not there to be clustered: it keeps the global model of round 1
    assert equal(algo.configure(after, 4, 3)[MODEL], algo.configure(before, 4, 2)[MODEL])
    assert algo.global_model(after) is None


def test_fedclar_personal_model_is_the_received_model_fine_tuned(clients_data) -> None:
    model = make_model()
    setting = setting_for(model)
    message = {MODEL: clone(setting.init_model)}
    out = build(FedCLAR, setting).fit(make_client(clients_data[0], model), message, {})
    assert "finetune_loss" in out.metrics and out.state.keys() == {PERSONAL}
    assert not equal(out.state[PERSONAL], out.reply[MODEL])
    assert not equal(out.state[PERSONAL], message[MODEL])
    assert equal(
        FedCLAR(FedCLAR.Params(), setting).client_model(message, out.state), out.state[PERSONAL]
    )
    none = (
        build(FedCLAR, setting, finetune_epochs=0)
        .fit(make_client(clients_data[0], model), message, {})
        .state
    )
    assert none == {}


# FedHome ----------------------------------------------------------------------------------------
def _on_a_segment(p: torch.Tensor, members: torch.Tensor, k: int) -> bool:
    """Whether p lies on a segment between a member and one of its k nearest members."""
    dist = torch.cdist(members, members)
    dist.fill_diagonal_(float("inf"))
    nearest = dist.topk(k, largest=False).indices
    for i, j in itertools.product(range(len(members)), range(k)):
        a, b = members[i], members[nearest[i, j]]
        u = torch.dot(p - a, b - a) / torch.dot(b - a, b - a)
        if -1e-6 <= u <= 1 + 1e-6 and torch.allclose(a + u * (b - a), p, atol=1e-5):
            return True
    return False


def test_smote_balances_classes_with_points_between_same_class_neighbours() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.cat(
        [
            torch.randn(12, 3, generator=g),
            5 + torch.randn(4, 3, generator=g),
            torch.tensor([[9.0, 9.0, 9.0]]),
        ]
    )
    y = torch.tensor([0] * 12 + [1] * 4 + [2])
    xb, yb = smote_balance(x, y, k=2, generator=torch.Generator().manual_seed(1))
    assert torch.equal(xb[:17], x) and torch.equal(yb[:17], y)  # the real samples come first
    assert torch.bincount(yb).tolist() == [12, 12, 1]  # a lone sample cannot be interpolated
    members = x[y == 1]
    synthetic = xb[17:]
    assert (yb[17:] == 1).all() and len(synthetic) == 8
    assert all(_on_a_segment(p, members, k=2) for p in synthetic)
    again, _ = smote_balance(x, y, k=2, generator=torch.Generator().manual_seed(1))
    assert torch.equal(again, xb)  # all randomness from the generator


def test_fedhome_fedavg_then_head_fine_tuning(clients_data) -> None:
    model = make_model()
    setting = setting_for(model)  # 10 rounds
    with pytest.raises(ConfigError, match="finetune_rounds"):
        build(FedHome, setting)  # the default 50 does not fit in 10 rounds
    algo = build(FedHome, setting, finetune_rounds=3)
    server = algo.init_server()
    out = algo.fit(make_client(clients_data[0], model, server_round=7), server, {})
    assert out.state == {} and set(out.reply["model"]) == set(server["model"])  # round 7: FedAvg
    out = algo.fit(make_client(clients_data[0], model, server_round=8), server, {})
    assert out.reply == {} and set(out.state["head"]) == set(head_names(model))
    labels = clients_data[0].train_y
    assert out.metrics["balanced_examples"] == NUM_CLASSES * int(torch.bincount(labels).max())
    personal = algo.client_model(server, out.state)
    body, head = split_arrays(personal)
    assert all(torch.equal(body[k], server["model"][k]) for k in body)  # the body is frozen
    assert not equal(head, split_arrays(server["model"])[1])
    assert algo.aggregate(server, iter([Reply(0, {}, out.metrics)]), 8).server is server


# end to end on real data ------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("name", NAMES)
def test_a_short_run_on_uci_har_natural_clients(name: str, shared_data) -> None:
    extra = {"fedhome": ["algorithm.finetune_rounds=1"], "fedclar": ["algorithm.cluster_round=2"]}
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
            f"algorithm.name={name}",
            *extra.get(name, []),
        ],
    )
    summary = simulate(prepare(cfg)).run()
    final = summary.final
    assert final is not None
    assert summary.rounds == 3
    assert final.personalization.acc > 0.3  # 6 classes: chance is about 0.17
    assert (final.global_ is not None) == ALGORITHMS[name].has_global_model
    assert summary.comm.up_bytes > 0 and summary.comm.down_bytes > 0
