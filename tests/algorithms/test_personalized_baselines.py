"""MOON, FedBN, FedRoD, FedBABU, APFL, Per-FedAvg and pFedMe: each one's distinctive
computation on tiny hand-made inputs, their four questions called directly on real clients
(slices of scikit-learn's digits), and a short run of each on real UCI-HAR data.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.func import functional_call

from protofed.algorithms import ALGORITHMS, MODEL, Algorithm, Arrays, Records, Reply, Setting
from protofed.algorithms import parse_params as parse_algorithm_params
from protofed.algorithms.apfl import ALPHA, APFL, BUFFERS
from protofed.algorithms.common.ala import OWN, PERSONAL, WEIGHTS, AdaptiveLocalAggregation
from protofed.algorithms.common.split import HEAD, body_names, split_arrays
from protofed.algorithms.fedbabu import FedBABU
from protofed.algorithms.fedbn import BATCHNORM, FedBN, batchnorm_names
from protofed.algorithms.fedrod import FedRoD, balanced_softmax_loss, fedrod_loss, log_prior
from protofed.algorithms.moon import MOON, PREVIOUS, model_contrastive_loss
from protofed.algorithms.perfedavg import PerFedAvg, batch_groups, meta_gradient
from protofed.algorithms.pfedme import PFedMe, proximal_steps, server_mix
from protofed.config import ModelConfig, TrainConfig, load_config
from protofed.data.federated import ClientData
from protofed.errors import ConfigError
from protofed.models import build_model
from protofed.models.base import FedModel
from protofed.runtime import prepare, simulate
from protofed.training.client import Client

# PERSONAL ("personal"): the client-state record of a personalized model, in every method here
NAMES = ["moon", "fedbn", "fedrod", "fedbabu", "apfl", "perfedavg", "pfedme"]
NUM_CLASSES = 10
TRAIN = TrainConfig(local_epochs=1, batch_size=32, lr=0.05)


# fixtures and helpers ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def clients_data(digits_clients) -> list[ClientData]:
    """Two real clients: disjoint slices of 300 digits each (conftest.digits_clients)."""
    return digits_clients(300)


def tiny_data(n: int = 8) -> ClientData:
    """A hand-sized client: the first n digits (train = val = test)."""
    X, y = load_digits(return_X_y=True)
    x = torch.tensor(X[:n] / 16.0, dtype=torch.float32)
    t = torch.tensor(y[:n], dtype=torch.long)
    return ClientData("tiny", None, x, t, x, t, x, t)


def make_model(seed: int = 0, hidden: list[int] | None = None) -> FedModel:
    torch.manual_seed(seed)
    return build_model(
        ModelConfig(name="mlp", hidden=[16] if hidden is None else hidden), (64,), NUM_CLASSES
    )


class TinyBN(FedModel):
    """A body with BatchNorm (affine parameters and running statistics) and a linear head."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.features = nn.Sequential(
            nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU()
        )
        self.head = nn.Linear(16, NUM_CLASSES)
        self.embedding_dim = 16


def clone(arrays: Arrays) -> Arrays:
    return {k: v.detach().clone() for k, v in arrays.items()}


def setting_for(model: nn.Module, train: TrainConfig = TRAIN) -> Setting:
    return Setting(2, NUM_CLASSES, train, clone(model.state_dict()))


def make_client(
    data: ClientData, model: FedModel, cid: int = 0, train: TrainConfig = TRAIN, seed: int = 99
) -> Client:
    gen = torch.Generator().manual_seed(seed + cid)
    return Client(id=cid, data=data, model=model, train=train, server_round=1, generator=gen)


def build(cls: type[Algorithm], setting: Setting, **params) -> Algorithm:
    return cls(cls.Params(**params), setting)


def equal(a: Arrays, b: Arrays) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def equal_records(a: Records, b: Records) -> bool:
    return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)


def distance(a: Arrays, b: Arrays, names=None) -> float:
    names = list(a) if names is None else list(names)
    return math.sqrt(sum(float((a[n].double() - b[n].double()).pow(2).sum()) for n in names))


def param_names(model: nn.Module) -> list[str]:
    return [n for n, _ in model.named_parameters()]


def grad_at(model: nn.Module, weights: Arrays, x: torch.Tensor, y: torch.Tensor) -> Arrays:
    """grad of the mean cross-entropy at `weights` (parameters only), without touching `model`."""
    params = {n: weights[n].detach().clone().requires_grad_(True) for n in param_names(model)}
    loss = F.cross_entropy(functional_call(model, params, (x,)), y)
    return dict(zip(params, torch.autograd.grad(loss, list(params.values())), strict=True))


# registry and hyperparameters ----------------------------------------------------------------
def test_registered_with_paper_defaults_flags_and_ala() -> None:
    # the registry contract (docs, unknown keys) is test_weight_baselines.py's, for every algorithm
    assert {n: ALGORITHMS[n].has_global_model for n in NAMES} == {
        "moon": True,
        "fedbn": False,
        "fedrod": True,
        "fedbabu": True,
        "apfl": True,
        "perfedavg": True,
        "pfedme": True,
    }
    assert {n: getattr(ALGORITHMS[n], "ala_local", None) for n in NAMES} == {
        "moon": None,
        "fedbn": None,
        "fedrod": None,
        "fedbabu": None,
        "apfl": None,
        "perfedavg": "reply",
        "pfedme": "reply",
    }
    assert MOON.describe_params() == {"mu": 1.0, "temperature": 0.5}
    assert FedBN.describe_params() == {} and FedRoD.describe_params() == {}
    assert FedBABU.describe_params() == {"finetune_epochs": 5, "finetune": "full"}
    assert APFL.describe_params() == {"alpha": 0.5, "adaptive": True, "alpha_lr": None}
    assert PerFedAvg.describe_params() == {"alpha": 0.01, "variant": "hf", "delta": 1e-3}
    assert PFedMe.describe_params() == {
        "lam": 15.0,
        "inner_steps": 5,
        "personal_lr": 0.09,
        "beta": 1.0,
    }
    for name, raw in [
        ("moon", {"temperature": 0}),
        ("apfl", {"alpha": 1.5}),
        ("fedbabu", {"finetune": "neck"}),
        ("perfedavg", {"variant": "so"}),
        ("pfedme", {"inner_steps": 0}),
        ("moon", {"mu": -1}),
    ]:
        with pytest.raises(ConfigError):
            parse_algorithm_params(name, raw)


# MOON -----------------------------------------------------------------------------------------
def test_moon_loss_is_lower_when_closer_to_the_global_representation() -> None:
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    near = torch.tensor([[1.0, 0.1], [0.1, 1.0]])  # almost parallel to z
    far = torch.tensor([[0.0, 1.0], [1.0, 0.0]])  # orthogonal to z
    closer_to_global = model_contrastive_loss(z, near, far, 0.5)
    closer_to_previous = model_contrastive_loss(z, far, near, 0.5)
    assert closer_to_global < math.log(2) < closer_to_previous
    # by hand: -log(e^{s+/tau} / (e^{s+/tau} + e^{s-/tau})), averaged over the batch
    cos = 1 / math.sqrt(1.01)
    expected = -math.log(math.exp(cos / 0.5) / (math.exp(cos / 0.5) + math.exp(0.0)))
    assert closer_to_global.item() == pytest.approx(expected, rel=1e-6)
    # equal positive and negative: log 2, whatever the temperature
    assert model_contrastive_loss(z, near, near, 0.1).item() == pytest.approx(math.log(2))


@pytest.mark.integration
def test_moon_pulls_the_local_representation_to_the_global_one(clients_data) -> None:
    train = TrainConfig(local_epochs=3, batch_size=32, lr=0.05)
    model = make_model()
    setting = setting_for(model, train)
    message = {MODEL: clone(setting.init_model)}
    plain = build(MOON, setting, mu=0.0)
    # the client's previous model: the global one after local training elsewhere (seed 1)
    previous = plain.fit(make_client(clients_data[1], model, train=train), message, {}).state
    # first round without a previous model: exactly FedAvg; the state is the reply
    fedavg = ALGORITHMS["fedavg"](ALGORITHMS["fedavg"].Params(), setting)
    ref = fedavg.fit(make_client(clients_data[0], model, train=train), message, {})
    first = build(MOON, setting).fit(make_client(clients_data[0], model, train=train), message, {})
    state = first.state
    assert equal_records(first.reply, ref.reply) and equal_records(
        state, {PREVIOUS: ref.reply[MODEL]}
    )
    assert "num_examples" not in first.metrics

    x = clients_data[0].train_x

    def encode(weights: Arrays) -> torch.Tensor:
        model.load_state_dict(weights)
        model.eval()
        with torch.no_grad():
            return model.features(x)

    z_global, z_previous = encode(message[MODEL]), encode(previous[PREVIOUS])

    def contrastive(weights: Arrays) -> float:
        return model_contrastive_loss(encode(weights), z_global, z_previous, 0.5).item()

    kept = clone(message[MODEL])
    out_plain = plain.fit(make_client(clients_data[0], model, train=train), message, previous)
    out_moon = build(MOON, setting, mu=5.0).fit(
        make_client(clients_data[0], model, train=train), message, previous
    )
    assert equal(message[MODEL], kept)  # the global and previous encoders are read, never written
    # the term MOON adds is what its training lowers, compared with FedAvg's from the same start
    assert contrastive(out_moon.reply[MODEL]) < contrastive(out_plain.reply[MODEL]) - 0.01
    assert all(p.requires_grad for p in model.parameters())
    assert equal(MOON(MOON.Params(), setting).client_model(message, state), message[MODEL])


# FedBN ----------------------------------------------------------------------------------------
def test_batchnorm_names_are_the_batchnorm_layers() -> None:
    for model in (
        TinyBN(),
        build_model(ModelConfig(name="resnet18"), (3, 32, 32), 10),
        build_model(ModelConfig(name="cnn1dbn"), (6, 128), 6),
        build_model(ModelConfig(name="cnnbn"), (1, 28, 28), 10),
    ):
        expected = [
            f"{m}.{n}"
            for m, module in model.named_modules()
            if isinstance(module, nn.modules.batchnorm._BatchNorm)
            for n in list(dict(module.named_parameters(recurse=False)))
            + list(dict(module.named_buffers(recurse=False)))
        ]
        assert expected and sorted(batchnorm_names(model.state_dict())) == sorted(expected)
    assert batchnorm_names(make_model().state_dict()) == []
    with pytest.raises(ConfigError, match="BatchNorm"):
        build(FedBN, setting_for(make_model()))


@pytest.mark.integration
def test_fedbn_never_averages_batchnorm_parameters_or_statistics(clients_data) -> None:
    model = TinyBN()
    setting = setting_for(model)
    algo = build(FedBN, setting)
    local = set(batchnorm_names(setting.init_model))
    assert local == {
        f"features.2.{n}"
        for n in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    }
    server = algo.init_server()
    shared = set(server[MODEL])
    assert server.keys() == {MODEL}
    assert not local & shared and shared | local == set(setting.init_model)
    assert algo.global_model(server) is None

    replies, states = [], []
    for cid, data in enumerate(clients_data):
        out = algo.fit(make_client(data, model, cid), server, {})
        bn = out.state[BATCHNORM]
        assert out.reply.keys() == {MODEL} and set(out.reply[MODEL]) == shared
        assert out.state.keys() == {BATCHNORM} and set(bn) == local
        assert bn["features.2.num_batches_tracked"].item() == math.ceil(len(data.train_y) / 32)
        replies.append(Reply(cid, out.reply, out.metrics, float(len(data.train_y))))
        states.append(out.state)
    assert not torch.equal(
        states[0][BATCHNORM]["features.2.running_mean"],
        states[1][BATCHNORM]["features.2.running_mean"],
    )
    new = algo.aggregate(server, iter(replies), 1).server
    assert new.keys() == {MODEL} and set(new[MODEL]) == shared  # BatchNorm never reaches the server
    for state in states:  # each client runs the averaged weights with its own BatchNorm
        personal = algo.client_model(new, state)
        assert all(torch.equal(personal[n], state[BATCHNORM][n]) for n in local)
        assert all(torch.equal(personal[n], new[MODEL][n]) for n in shared)
    # next round: a client's BatchNorm continues from its state, not from the initial model
    again = algo.fit(make_client(clients_data[0], model, 0), new, states[0]).state[BATCHNORM]
    batches = states[0][BATCHNORM]["features.2.num_batches_tracked"]
    assert again["features.2.num_batches_tracked"] == 2 * batches
    initial = algo.client_model(new, {})
    assert all(torch.equal(initial[n], setting.init_model[n]) for n in local)


# FedRoD ---------------------------------------------------------------------------------------
def test_balanced_softmax_shifts_logits_by_the_log_class_prior() -> None:
    labels = torch.tensor([0, 0, 0, 1])
    prior = log_prior(labels, 3)
    torch.testing.assert_close(prior[:2], torch.tensor([math.log(0.75), math.log(0.25)]))
    assert prior[2] == -math.inf  # a class the client never saw
    logits = torch.zeros(2, 3, requires_grad=True)
    loss = balanced_softmax_loss(logits, torch.tensor([0, 1]), prior)
    # zero logits + log prior: the softmax is the prior itself
    assert loss.item() == pytest.approx(-(math.log(0.75) + math.log(0.25)) / 2)
    loss.backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[:, 2] == 0).all()
    # a uniform prior shifts every logit alike: plain cross-entropy
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 2, 0, 1])
    uniform = log_prior(torch.tensor([0, 1, 2]), 3)
    torch.testing.assert_close(balanced_softmax_loss(x, y, uniform), F.cross_entropy(x, y))
    skewed = log_prior(torch.tensor([0, 0, 0, 0, 1, 2]), 3)
    torch.testing.assert_close(balanced_softmax_loss(x, y, skewed), F.cross_entropy(x + skewed, y))


def test_fedrod_personal_loss_never_reaches_the_generic_model() -> None:
    model = make_model()
    data = tiny_data(16)
    personal = nn.Linear(16, NUM_CLASSES)
    prior = log_prior(data.train_y, NUM_CLASSES)
    fedrod_loss(personal, prior)(model, data.train_x, data.train_y).backward()
    both = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert all(p.grad is not None for p in personal.parameters())
    model.zero_grad()
    balanced_softmax_loss(model(data.train_x), data.train_y, prior).backward()
    for n, p in model.named_parameters():  # the generic model sees only the balanced loss
        torch.testing.assert_close(both[n], p.grad)


def test_fedrod_personalized_model_is_generic_plus_personal_head(clients_data) -> None:
    model = make_model()
    setting = setting_for(model)
    algo = build(FedRoD, setting)
    message = {MODEL: clone(setting.init_model)}
    assert equal(algo.client_model(message, {}), message[MODEL])  # zero personal head at first
    out = algo.fit(make_client(clients_data[0], model), message, {})
    arrays, state = out.reply[MODEL], out.state
    assert out.reply.keys() == {MODEL} and arrays.keys() == message[MODEL].keys()
    assert state.keys() == {HEAD} and set(state[HEAD]) == {"head.weight", "head.bias"}
    head = state[HEAD]
    assert distance(arrays, message[MODEL]) > 0 and float(head["head.weight"].abs().sum()) > 0
    personal = algo.client_model(out.reply, state)
    x = clients_data[0].test_x
    model.load_state_dict(arrays)
    with torch.no_grad():
        z = model.features(x)
        expected = model.head(z) + F.linear(z, head["head.weight"], head["head.bias"])
        model.load_state_dict(personal)
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)
    assert equal(algo.global_model(out.reply), arrays)


# FedBABU --------------------------------------------------------------------------------------
@pytest.mark.integration
def test_fedbabu_head_never_changes_before_fine_tuning(clients_data) -> None:
    model = make_model()
    setting = setting_for(model)
    body0, head0 = split_arrays(setting.init_model)
    algo = build(FedBABU, setting, finetune_epochs=0)
    server = algo.init_server()
    assert server.keys() == {MODEL}
    assert set(server[MODEL]) == set(body_names(model))  # the head is never sent
    body = split_arrays(clone(make_model(seed=1).state_dict()))[0]
    message = {MODEL: body}
    model.load_state_dict(make_model(seed=2).state_dict())  # a stale workspace
    replies = []
    for cid, data in enumerate(clients_data):
        out = algo.fit(make_client(data, model, cid), message, {})
        arrays = out.reply[MODEL]
        assert out.reply.keys() == {MODEL} and set(arrays) == set(body0) and out.state == {}
        assert distance(arrays, body) > 0
        assert equal(split_arrays(model.state_dict())[1], head0)  # trained with the fixed head
        replies.append(Reply(cid, out.reply, out.metrics, float(len(data.train_y))))
    new = algo.aggregate(server, iter(replies), 1).server
    glob = algo.global_model(new)
    assert equal(split_arrays(glob)[1], head0) and equal(split_arrays(glob)[0], new[MODEL])
    assert equal(algo.client_model(new, {}), glob)


@pytest.mark.integration
@pytest.mark.parametrize("part", ["full", "head", "body"])
def test_fedbabu_fine_tunes_the_received_model(part: str, clients_data) -> None:
    model = make_model()
    setting = setting_for(model)
    algo = build(FedBABU, setting, finetune_epochs=2, finetune=part)
    message = algo.init_server()
    out = algo.fit(make_client(clients_data[0], model), message, {})
    assert out.state.keys() == {PERSONAL}
    body, head = split_arrays(out.state[PERSONAL])
    _, head0 = split_arrays(setting.init_model)
    assert (distance(head, head0) > 0) == (part != "body")
    assert (distance(body, message[MODEL]) > 0) == (part != "head")
    assert out.metrics["finetune_loss"] > 0
    assert equal(algo.client_model(message, out.state), out.state[PERSONAL])
    again = algo.fit(make_client(clients_data[0], model), message, {}).state
    assert equal_records(again, out.state)  # deterministic given the client's generator


# APFL -----------------------------------------------------------------------------------------
def test_apfl_one_step_is_the_papers_update() -> None:
    data = tiny_data(8)
    train = TrainConfig(local_epochs=1, batch_size=8, lr=0.3)  # one full-batch step
    model = make_model(hidden=[])
    setting = setting_for(model, train)
    w0 = clone(setting.init_model)
    v0 = clone(make_model(seed=5, hidden=[]).state_dict())
    a0 = 0.3
    state = {PERSONAL: v0, ALPHA: {ALPHA: torch.tensor(a0)}}
    algo = build(APFL, setting)
    out = algo.fit(make_client(data, model, train=train), {MODEL: w0}, state)
    reply, metrics, new_state = out.reply[MODEL], out.metrics, out.state
    assert new_state.keys() == {PERSONAL, BUFFERS, ALPHA} and new_state[BUFFERS] == {}

    x, y, lr = data.train_x, data.train_y, train.lr
    g_w = grad_at(model, w0, x, y)
    mixed = {n: a0 * v0[n] + (1 - a0) * w0[n] for n in g_w}
    g_bar = grad_at(model, mixed, x, y)
    d_alpha = sum(float(((v0[n] - w0[n]) * g_bar[n]).sum()) for n in g_w)
    for n in g_w:
        torch.testing.assert_close(reply[n], w0[n] - lr * g_w[n])
        torch.testing.assert_close(new_state[PERSONAL][n], v0[n] - lr * a0 * g_bar[n])
    a1 = new_state[ALPHA][ALPHA]
    assert a1.item() == pytest.approx(min(max(a0 - lr * d_alpha, 0), 1), abs=1e-5)
    assert metrics["alpha"] == pytest.approx(a1.item())
    personal = algo.client_model(out.reply, new_state)
    for n in g_w:
        torch.testing.assert_close(personal[n], a1 * new_state[PERSONAL][n] + (1 - a1) * reply[n])


@pytest.mark.integration
def test_apfl_alpha_grows_when_the_personal_model_is_better(clients_data) -> None:
    data = clients_data[0]
    train = TrainConfig(local_epochs=2, batch_size=32, lr=0.05)
    model = make_model()
    setting = setting_for(model, train)
    init = clone(setting.init_model)
    local = build(ALGORITHMS["local"], setting)
    kept = local.fit(make_client(data, model, train=train), {}, {}).state
    trained = local.fit(make_client(data, model, train=train), {}, kept).state[MODEL]

    def alpha_after(global_: Arrays, personal: Arrays, adaptive: bool = True) -> float:
        state = {PERSONAL: personal, ALPHA: {ALPHA: torch.tensor(0.5)}}
        out = (
            build(APFL, setting, adaptive=adaptive)
            .fit(make_client(data, model, train=train), {MODEL: global_}, state)
            .state
        )
        return out[ALPHA][ALPHA].item()

    assert 0.5 < alpha_after(init, trained) <= 1  # v fits the data, w does not: trust v more
    assert 0 <= alpha_after(trained, init) < 0.5  # and the other way round
    assert alpha_after(init, trained, adaptive=False) == 0.5
    # first round: v starts as the global model
    first = build(APFL, setting).fit(make_client(data, model, train=train), {MODEL: init}, {})
    assert first.state.keys() == {PERSONAL, BUFFERS, ALPHA} and first.state[BUFFERS] == {}
    assert set(first.state[PERSONAL]) == set(param_names(model))


# Per-FedAvg -----------------------------------------------------------------------------------
@pytest.mark.integration
def test_per_fedavg_meta_step_is_fedavg_step_at_the_adapted_point() -> None:
    torch.manual_seed(0)
    model = make_model(hidden=[]).double()
    params = list(model.parameters())
    w = clone(model.state_dict())
    data = tiny_data(24)
    x, y = data.train_x.double(), data.train_y
    group = [(x[:8], y[:8]), (x[8:16], y[8:16]), (x[16:], y[16:])]
    alpha = 0.05
    fo, meta_loss = meta_gradient(model, params, group, alpha, "fo")
    assert equal(clone(model.state_dict()), w)  # the model is left where it was
    # FO: FedAvg's gradient on D', taken at the adapted point w - alpha grad f(w; D)
    g_inner = grad_at(model, w, *group[0])
    adapted = {n: w[n] - alpha * g_inner[n] for n in g_inner}
    g_adapted = grad_at(model, adapted, *group[1])
    for p, n in zip(fo, g_inner, strict=True):
        torch.testing.assert_close(p, g_adapted[n])
    assert meta_loss == pytest.approx(
        F.cross_entropy(functional_call(model, adapted, (group[1][0],)), group[1][1]).item()
    )
    # ... which differs from FedAvg's gradient at w by about -alpha * H(w; D') grad f(w; D)
    names = list(g_inner)
    flat_w = torch.cat([w[n].reshape(-1) for n in names])

    def loss_of(flat: torch.Tensor, batch) -> torch.Tensor:
        weights, i = {}, 0
        for n in names:
            k = w[n].numel()
            weights[n] = flat[i : i + k].reshape(w[n].shape)
            i += k
        return F.cross_entropy(functional_call(model, weights, (batch[0],)), batch[1])

    fedavg = torch.cat([grad_at(model, w, *group[1])[n].reshape(-1) for n in names])
    hessian = torch.autograd.functional.hessian(lambda f: loss_of(f, group[1]), flat_w)
    g_d = torch.cat([g_inner[n].reshape(-1) for n in names])
    meta = torch.cat([g.reshape(-1) for g in fo])
    predicted = fedavg - alpha * hessian @ g_d
    assert (meta - fedavg).norm() > 1e-3
    assert (meta - predicted).norm() < 0.05 * (meta - fedavg).norm()
    # HF: the finite difference is the Hessian-vector product on D''
    hf, _ = meta_gradient(model, params, group, alpha, "hf", delta=1e-4)
    h3 = torch.autograd.functional.hessian(lambda f: loss_of(f, group[2]), flat_w)
    expected = meta - alpha * h3 @ meta
    torch.testing.assert_close(
        torch.cat([g.reshape(-1) for g in hf]), expected, rtol=1e-5, atol=1e-6
    )


def test_per_fedavg_groups_and_personalization(clients_data) -> None:
    gen = torch.Generator().manual_seed(0)
    groups = list(batch_groups(100, 32, 3, 2, gen))  # 4 steps per epoch, as FedAvg's
    assert len(groups) == 8 and all(len(g) == 3 for g in groups)
    sizes = [len(b) for g in groups for b in g]
    assert sizes == [32, 32, 32, 4] * 6  # consecutive full shuffles of the data
    for k in range(6):  # each shuffle covers every sample once
        shuffle = torch.cat([b for g in groups for b in g][4 * k : 4 * k + 4])
        assert sorted(shuffle.tolist()) == list(range(100))
    assert list(batch_groups(0, 32, 2, 1, gen)) == []
    assert len(list(batch_groups(10, 32, 2, 3, gen))) == 3  # one step per epoch

    data = tiny_data(16)
    train = TrainConfig(local_epochs=1, batch_size=16, lr=0.05)
    model = make_model()
    setting = setting_for(model, train)
    glob = clone(setting.init_model)
    message = {MODEL: glob}
    algo = build(PerFedAvg, setting, alpha=0.1, variant="fo")
    out = algo.fit(make_client(data, model, train=train), message, {})
    assert out.state.keys() == {PERSONAL}
    personal = out.state[PERSONAL]
    g = grad_at(model, glob, data.train_x, data.train_y)  # the batch is all 16 samples
    for n in g:  # the personalized model: one step of size alpha from the received model
        torch.testing.assert_close(personal[n], glob[n] - 0.1 * g[n])
    assert out.metrics["steps"] == 1 and distance(out.reply[MODEL], glob) > 0
    assert equal(algo.client_model(message, out.state), personal)
    assert equal(algo.client_model(message, {}), glob)


# pFedMe ---------------------------------------------------------------------------------------
@pytest.mark.integration
def test_pfedme_personal_model_approximately_solves_the_proximal_problem() -> None:
    torch.manual_seed(0)
    data = tiny_data(32)
    x, y = data.train_x, data.train_y
    model = make_model(hidden=[])
    params = list(model.parameters())
    w = [p.detach().clone() for p in params]
    lam = 4.0
    # the minimiser of f(theta) + lam/2 ||theta - w||^2 (strongly convex here), to precision
    optimum = make_model(hidden=[])
    opt_params = list(optimum.parameters())
    proximal_steps(optimum, opt_params, w, x, y, lam, lr=0.1, steps=400)
    star = [p.detach().clone() for p in opt_params]

    def dist(a, b) -> float:
        return math.sqrt(sum(float((u - v).pow(2).sum()) for u, v in zip(a, b, strict=True)))

    before = dist(w, star)
    proximal_steps(model, params, w, x, y, lam, lr=0.1, steps=5)  # K = 5
    theta = [p.detach() for p in params]
    assert dist(theta, star) < 0.5 * before
    # its gradient condition: grad f(theta*) + lam (theta* - w) = 0
    loss = F.cross_entropy(optimum(x), y)
    grads = torch.autograd.grad(loss, opt_params)
    residual = math.sqrt(
        sum(float((g + lam * (s - a)).pow(2).sum()) for g, s, a in zip(grads, star, w, strict=True))
    )
    assert residual < 1e-4


def test_pfedme_local_and_server_updates() -> None:
    data = tiny_data(8)
    train = TrainConfig(local_epochs=1, batch_size=8, lr=0.01)  # one outer step, full batch
    model = make_model(hidden=[])
    setting = setting_for(model, train)
    message = clone(setting.init_model)
    algo = build(PFedMe, setting, lam=15.0, inner_steps=5, personal_lr=0.09)
    out = algo.fit(make_client(data, model, train=train), {MODEL: message}, {})
    assert out.state.keys() == {PERSONAL}
    reply, metrics, personal = out.reply[MODEL], out.metrics, out.state[PERSONAL]
    twin = make_model(hidden=[])
    twin.load_state_dict(message)
    anchor = [p.detach().clone() for p in twin.parameters()]
    proximal_steps(twin, list(twin.parameters()), anchor, data.train_x, data.train_y, 15.0, 0.09, 5)
    theta = dict(twin.named_parameters())
    for n, w in message.items():  # w <- w - lr * lam * (w - theta)
        torch.testing.assert_close(personal[n], theta[n].detach())
        torch.testing.assert_close(reply[n], w - 0.01 * 15.0 * (w - theta[n].detach()))
    assert metrics["steps"] == 1
    assert equal(algo.client_model({MODEL: message}, out.state), personal)
    assert equal(algo.client_model({MODEL: message}, {}), message)

    server = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    mean = {"w": torch.tensor([3.0, 0.0]), "n": torch.tensor(5)}
    assert server_mix(server, mean, 1.0) is mean
    mixed = server_mix(server, mean, 2.0)  # (1 - beta) w + beta mean
    torch.testing.assert_close(mixed["w"], torch.tensor([5.0, -2.0]))
    assert mixed["n"] == 5
    new = build(PFedMe, setting, beta=2.0).aggregate(
        {MODEL: message}, iter([Reply(0, out.reply, metrics, 8.0)]), 1
    )
    assert new.server.keys() == {MODEL} and new.metrics == {}
    for n in message:
        torch.testing.assert_close(new.server[MODEL][n], 2 * reply[n] - message[n])


# the ALA plug-in where the FedALA slides use it ------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("name", ["perfedavg", "pfedme"])
def test_ala_plugin_runs_on_per_fedavg_and_pfedme(name: str) -> None:
    overrides = [
        "data.name=digits",
        "data.partition=pathological",
        "data.num_clients=4",
        "model.name=mlp",
        "model.hidden=[32]",
        "train.batch_size=32",
        "train.lr=0.1",
        "train.rounds=2",
        "train.threads=1",
        "eval.every=2",
        f"algorithm.name={name}",
    ]
    plain = simulate(prepare(load_config(None, overrides)))
    ala = simulate(
        prepare(
            load_config(
                None,
                [
                    *overrides,
                    "algorithm.ala.enabled=true",
                    "algorithm.ala.threshold=1.0",
                ],
            )
        )
    )
    assert isinstance(ala.algorithm, AdaptiveLocalAggregation)
    a, b = plain.run(), ala.run()
    assert a.comm == b.comm  # ALA sends nothing
    assert b.algorithm == f"{name}+ala"
    for cid in range(4):
        state = ala.client_state(cid)
        assert state[WEIGHTS]
        personal = {k: v for k, v in state.items() if k not in OWN}
        assert personal.keys() == {PERSONAL}  # the algorithm's own record, beside ALA's
        assert equal(ala.algorithm.client_model(ala.server, state), personal[PERSONAL])


# end to end on real data ------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("name", NAMES)
def test_a_short_run_on_uci_har_natural_clients(name: str, shared_data) -> None:
    model = ["model.name=cnn1dbn"] if name == "fedbn" else ["model.name=mlp", "model.hidden=[64]"]
    cfg = load_config(
        None,
        [
            f"data.dir={shared_data}",
            "data.name=uci_har",
            "data.partition=natural",
            *model,
            "train.rounds=3",
            "train.clients_per_round=4",
            "train.local_epochs=1",
            "train.batch_size=32",
            "train.lr=0.05",
            "train.threads=1",
            "eval.every=3",
            "eval.generalization=false",
            f"algorithm.name={name}",
        ],
    )
    sim = simulate(prepare(cfg))
    losses: list[float] = []
    summary = sim.run(on_round=lambda r, info, rec: losses.append(info.train_loss))
    final = summary.final
    assert final is not None
    assert summary.rounds == 3 and all(math.isfinite(v) for v in losses)
    assert final.personalization.f1 is not None and math.isfinite(final.personalization.f1)
    assert final.personalization.acc > 0.3  # 6 classes: chance is about 0.17
    assert (final.global_ is not None) == ALGORITHMS[name].has_global_model
    if name != "moon":  # MOON's loss gains its contrastive term from round 2 on
        assert losses[-1] < losses[0]
    assert summary.comm.up_bytes > 0 and summary.comm.down_bytes > 0
