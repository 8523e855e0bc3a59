"""The baselines (local, centralized, FedProx, FedPer, FedRep, Ditto), called directly.

No runtime: each test builds a small MLP, real clients cut from sklearn's digits (8x8), a
`Client` around them and a `Setting`, then calls the algorithm's four questions and checks
what goes down, what comes back, and what stays in the client's state.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from protofed.algorithms import ALGORITHMS, MODEL, Algorithm, Arrays, Records, Reply, Setting
from protofed.algorithms import parse_params as parse_algorithm_params
from protofed.algorithms.centralized import Centralized
from protofed.algorithms.common.ala import PERSONAL
from protofed.algorithms.common.regularizers import (
    parameter_snapshot,
    proximal_loss,
    squared_distance,
)
from protofed.algorithms.common.split import (
    HEAD,
    body_names,
    body_parameters,
    head_names,
    head_parameters,
    split_arrays,
)
from protofed.algorithms.ditto import Ditto
from protofed.algorithms.fedavg import FedAvg
from protofed.algorithms.fedper import FedPer
from protofed.algorithms.fedprox import FedProx
from protofed.algorithms.fedrep import FedRep
from protofed.algorithms.local import Local
from protofed.config import ModelConfig, TrainConfig
from protofed.data.federated import ClientData
from protofed.errors import ConfigError
from protofed.models import build_model
from protofed.models.base import FedModel

BASELINES = ["local", "centralized", "fedprox", "fedper", "fedrep", "ditto"]
PERSONAL_HEAD = [FedPer, FedRep]
INPUT_SHAPE = (64,)
NUM_CLASSES = 10
TRAIN = TrainConfig(local_epochs=1, batch_size=32, lr=0.05)


# fixtures and helpers ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def clients_data(digits_clients) -> list[ClientData]:
    """Two real clients: disjoint slices of 400 digits each (conftest.digits_clients)."""
    return digits_clients(400)


def make_model(seed: int = 0) -> FedModel:
    torch.manual_seed(seed)
    return build_model(ModelConfig(name="mlp", hidden=[32]), INPUT_SHAPE, NUM_CLASSES)


def clone(arrays: Arrays) -> Arrays:
    return {k: v.detach().clone() for k, v in arrays.items()}


def setting_for(model: nn.Module, train: TrainConfig = TRAIN) -> Setting:
    return Setting(
        num_clients=2,
        num_classes=NUM_CLASSES,
        train=train,
        init_model=clone(model.state_dict()),
    )


def make_client(data: ClientData, model: FedModel, cid: int = 0, train: TrainConfig = TRAIN):
    from protofed.training.client import Client

    gen = torch.Generator().manual_seed(1234 + cid)
    return Client(id=cid, data=data, model=model, train=train, server_round=1, generator=gen)


def build(cls: type[Algorithm], setting: Setting, **params) -> Algorithm:
    return cls(cls.Params(**params), setting)


def distance(a: Arrays, b: Arrays, names=None) -> float:
    names = list(a) if names is None else list(names)
    return math.sqrt(sum(float((a[n].double() - b[n].double()).pow(2).sum()) for n in names))


def equal(a: Arrays, b: Arrays) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def equal_records(a: Records, b: Records) -> bool:
    return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)


def param_names(model: nn.Module) -> list[str]:
    return [n for n, _ in model.named_parameters()]


# registry and hyperparameters ----------------------------------------------------------------
def test_registry_lists_the_baselines_with_their_metadata() -> None:
    assert set(BASELINES) <= set(ALGORITHMS)
    for name in BASELINES:
        cls = ALGORITHMS[name]
        assert cls.summary and cls.reference
        assert sys.modules[cls.__module__].__doc__
    expected_global = {
        "local": False,
        "centralized": True,
        "fedprox": True,
        "fedper": False,
        "fedrep": False,
        "ditto": True,
    }
    assert {n: ALGORITHMS[n].has_global_model for n in BASELINES} == expected_global
    assert Centralized.pools_data is True
    assert not getattr(FedAvg, "pools_data", False)


def test_paper_defaults() -> None:
    assert FedProx.describe_params() == {"mu": 0.01}
    assert FedRep.describe_params() == {"head_epochs": 10, "body_epochs": None}
    assert Ditto.describe_params() == {"lam": 0.1, "personal_epochs": None}
    for cls in (Local, Centralized, FedPer):
        assert cls.describe_params() == {}
    for name in BASELINES:
        for field in ALGORITHMS[name].Params.model_fields.values():
            assert field.description


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_documents_itself_and_rejects_unknown_keys(name: str) -> None:
    """The registry contract, for every algorithm: summary, reference, module docstring, a
    description for each hyperparameter, and an unknown key named in a ConfigError."""
    cls = ALGORITHMS[name]
    assert cls.summary and cls.reference and sys.modules[cls.__module__].__doc__
    assert all(f.description for f in cls.Params.model_fields.values())
    with pytest.raises(ValidationError):
        cls.Params.model_validate({"no_such_key": 1})
    with pytest.raises(ConfigError, match="no_such_key"):
        parse_algorithm_params(name, {"no_such_key": 1})


def test_params_reject_bad_values() -> None:
    for name, raw in [
        ("fedprox", {"mu": -1}),
        ("ditto", {"lam": -0.1}),
        ("ditto", {"personal_epochs": 0}),
        ("fedrep", {"head_epochs": -1}),
    ]:
        with pytest.raises(ConfigError):
            parse_algorithm_params(name, raw)
    assert parse_algorithm_params("fedrep", {"head_epochs": 3}).head_epochs == 3


# the shared helpers ----------------------------------------------------------------------
class TinyBN(FedModel):
    """A body with BatchNorm (buffers) and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU()
        )
        self.head = nn.Linear(16, NUM_CLASSES)
        self.embedding_dim = 16


def test_split_puts_buffers_with_their_part() -> None:
    model = TinyBN()
    state = model.state_dict()
    body, head = split_arrays(state)
    assert set(head) == {"head.weight", "head.bias"} == set(head_names(model))
    assert {"features.2.running_mean", "features.2.num_batches_tracked"} <= set(body)
    assert set(body) | set(head) == set(state) and not set(body) & set(head)
    assert body_names(state) == [n for n in state if n in body]
    assert head_names(["head.w", "features.head.x", "headless.y"]) == ["head.w"]
    groups = model.param_groups()
    assert [
        n for n, p in model.named_parameters() if any(p is q for q in head_parameters(model))
    ] == groups["head"]
    assert len(body_parameters(model)) == len(groups["features"])


def test_proximal_loss_adds_half_mu_squared_distance() -> None:
    model = make_model()
    anchor = parameter_snapshot(model)
    assert squared_distance(model, anchor).item() == 0.0
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1)
    x, y = torch.zeros(2, 64), torch.zeros(2, dtype=torch.long)
    expected = sum(
        float((p.detach() - anchor[n]).pow(2).sum()) for n, p in model.named_parameters()
    )
    assert squared_distance(model, anchor).item() == pytest.approx(expected, rel=1e-5)

    def zero(m, x, y):
        return torch.zeros(())

    assert proximal_loss(anchor, 0.0, base=zero) is zero
    loss = proximal_loss(anchor, 2.0, base=zero)(model, x, y)
    assert loss.item() == pytest.approx(expected, rel=1e-5)  # 2/2 * distance
    loss.backward()
    for n, p in model.named_parameters():  # gradient mu * (w - anchor)
        torch.testing.assert_close(p.grad, 2.0 * (p.detach() - anchor[n]))


# local ------------------------------------------------------------------------------------
@pytest.mark.integration
def test_local_never_communicates_and_keeps_its_model(clients_data) -> None:
    model = make_model()
    setting = setting_for(model)
    algo = build(Local, setting)
    server = algo.init_server()
    message = algo.configure(server, 0, 1)
    assert message == {} and server == {}
    assert equal(algo.client_model(message, {}), setting.init_model)  # never trained

    out = algo.fit(make_client(clients_data[0], model), message, {})
    assert out.reply == {}
    assert "num_examples" not in out.metrics and out.metrics["loss"] > 0  # the engine's
    state = out.state
    assert state.keys() == {MODEL} and state[MODEL].keys() == setting.init_model.keys()
    assert distance(state[MODEL], setting.init_model) > 0
    assert equal(algo.client_model({}, state), state[MODEL])
    assert algo.global_model(server) is None

    # the next round starts from the state, not from what the workspace holds
    model.load_state_dict(make_model(seed=7).state_dict())
    state2 = algo.fit(make_client(clients_data[0], model), {}, state).state[MODEL]
    assert distance(state2, state[MODEL]) < distance(state2, setting.init_model)

    consumed = []

    def replies() -> Iterator[Reply]:
        for i in range(2):
            consumed.append(i)
            yield Reply(i, {}, {}, 1.0)

    result = algo.aggregate(server, replies(), 1)
    assert result.server is server and result.metrics == {}
    assert consumed == [0, 1]  # the lazy round was driven to the end


# centralized ------------------------------------------------------------------------------
def test_centralized_trains_one_model_from_the_message(clients_data) -> None:
    model = make_model()
    setting = setting_for(model)
    algo = build(Centralized, setting)
    server = algo.init_server()
    message = algo.configure(server, -1, 1)
    model.load_state_dict(make_model(seed=3).state_dict())  # stale workspace
    out = algo.fit(make_client(clients_data[0], model, cid=-1), message, {})
    arrays = out.reply[MODEL]
    assert out.state == {} and out.reply.keys() == server.keys() == {MODEL}
    assert arrays.keys() == server[MODEL].keys()
    assert 0 < distance(arrays, server[MODEL]) < distance(arrays, make_model(seed=3).state_dict())
    n = float(len(clients_data[0].train_y))
    new = algo.aggregate(server, iter([Reply(-1, out.reply, out.metrics, n)]), 1).server
    assert equal_records(new, out.reply)
    assert equal(algo.global_model(new), new[MODEL])
    assert equal(algo.client_model(algo.configure(new, 0, 2), {}), new[MODEL])


# aggregation: 1:3 weighted means -------------------------------------------------------------
@pytest.mark.parametrize("cls", [Centralized, FedProx, Ditto, FedPer, FedRep])
def test_aggregate_is_the_sample_weighted_mean(cls) -> None:
    model = make_model()
    algo = build(cls, setting_for(model))
    server = algo.init_server()
    assert server.keys() == {MODEL}
    if cls in PERSONAL_HEAD:
        assert set(server[MODEL]) == set(body_names(model)) and not head_names(server[MODEL])
    else:
        assert server[MODEL].keys() == model.state_dict().keys()
    gen = torch.Generator().manual_seed(5)
    a = {k: torch.randn(v.shape, generator=gen) for k, v in server[MODEL].items()}
    b = {k: torch.randn(v.shape, generator=gen) for k, v in server[MODEL].items()}
    replies = [Reply(0, {MODEL: a}, {}, 1.0), Reply(1, {MODEL: b}, {}, 3.0)]
    new = algo.aggregate(server, iter(replies), 1).server
    assert new.keys() == server.keys() and new[MODEL].keys() == server[MODEL].keys()
    for k in server[MODEL]:
        torch.testing.assert_close(new[MODEL][k], (a[k] + 3 * b[k]) / 4)


# FedProx ------------------------------------------------------------------------------------
@pytest.mark.integration
def test_fedprox_mu_zero_is_fedavg(clients_data) -> None:
    model = make_model()
    setting = setting_for(model)
    message = FedAvg(FedAvg.Params(), setting).init_server()
    ref = FedAvg(FedAvg.Params(), setting).fit(make_client(clients_data[0], model), message, {})
    out = build(FedProx, setting, mu=0.0).fit(make_client(clients_data[0], model), message, {})
    assert equal_records(out.reply, ref.reply) and out.state == {}
    assert out.metrics == ref.metrics and "num_examples" not in out.metrics


@pytest.mark.integration
def test_fedprox_large_mu_stays_near_the_global_model(clients_data) -> None:
    train = TrainConfig(local_epochs=3, batch_size=32, lr=0.05)
    model = make_model()
    setting = setting_for(model, train)
    message = {MODEL: setting.init_model}
    names = param_names(model)
    moved = {}
    for mu in (0.0, 10.0):  # lr * mu = 0.5: a strong but stable pull
        algo = build(FedProx, setting, mu=mu)
        out = algo.fit(make_client(clients_data[0], model, train=train), message, {})
        moved[mu] = distance(out.reply[MODEL], message[MODEL], names)
    assert 0 < moved[10.0] < 0.5 * moved[0.0]


# FedPer and FedRep ---------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("cls", PERSONAL_HEAD)
def test_head_stays_local_body_is_shared(cls, clients_data) -> None:
    model = make_model()
    setting = setting_for(model)
    algo = build(cls, setting, head_epochs=2) if cls is FedRep else build(cls, setting)
    body_keys, head_keys = set(body_names(model)), set(head_names(model))
    init_body, init_head = split_arrays(setting.init_model)

    body = split_arrays(clone(make_model(seed=1).state_dict()))[0]  # another global body
    message = {MODEL: body}
    garbage = clone(make_model(seed=2).state_dict())
    sent = algo.configure(algo.init_server(), 0, 1)
    assert sent.keys() == {MODEL} and sent[MODEL].keys() == body_keys
    model.load_state_dict(garbage)  # whatever the workspace last held must not matter
    out = algo.fit(make_client(clients_data[0], model), message, {})
    arrays = out.reply[MODEL]

    assert out.reply.keys() == {MODEL}
    assert set(arrays) == body_keys and all(n.startswith("features.") for n in arrays)
    assert out.state.keys() == {HEAD} and set(out.state[HEAD]) == head_keys
    head = out.state[HEAD]
    assert "num_examples" not in out.metrics and out.metrics["loss"] > 0
    # the received body was trained, not the initial or the stale one
    assert distance(arrays, body) < distance(arrays, init_body)
    assert distance(arrays, body) < distance(arrays, garbage, body_keys)
    # the head started from the initial head (no state yet) and was trained
    assert 0 < distance(head, init_head) < distance(head, garbage, head_keys)

    # next round: the head comes from the state
    own_head = split_arrays(clone(make_model(seed=4).state_dict()))[1]
    head2 = algo.fit(make_client(clients_data[0], model), message, {HEAD: own_head}).state[HEAD]
    assert distance(head2, own_head) < distance(head2, init_head)

    personal = algo.client_model(message, out.state)
    assert equal(personal, {**body, **head})
    assert equal(algo.client_model(message, {}), {**body, **init_head})
    assert algo.global_model(algo.init_server()) is None


def test_fedrep_head_phase_leaves_the_body_unchanged(clients_data) -> None:
    model = make_model()
    setting = setting_for(model)
    body, init_head = split_arrays(setting.init_model)
    message = {MODEL: body}

    head_only = build(FedRep, setting, head_epochs=2, body_epochs=0)
    out = head_only.fit(make_client(clients_data[0], model), message, {})
    assert equal_records(out.reply, message)  # body frozen: bit-for-bit what was received
    assert distance(out.state[HEAD], init_head) > 0
    steps_per_epoch = math.ceil(len(clients_data[0].train_y) / TRAIN.batch_size)
    assert out.metrics["steps"] == 2 * steps_per_epoch

    body_only = build(FedRep, setting, head_epochs=0, body_epochs=1)
    out = body_only.fit(make_client(clients_data[0], model), message, {})
    assert equal_records(out.state, {HEAD: init_head})  # head frozen
    assert distance(out.reply[MODEL], body) > 0
    assert out.metrics["steps"] == steps_per_epoch

    both = build(FedRep, setting)  # paper default: 10 head epochs, then local_epochs body
    metrics = both.fit(make_client(clients_data[0], model), message, {}).metrics
    assert metrics["steps"] == (10 + TRAIN.local_epochs) * steps_per_epoch
    assert {"head_loss", "body_loss", "loss"} <= set(metrics)


def test_fedper_with_batchnorm_shares_body_buffers(clients_data) -> None:
    torch.manual_seed(0)
    model = TinyBN()
    algo = build(FedPer, setting_for(model))
    message = algo.init_server()
    assert "features.2.running_mean" in message[MODEL]
    out = algo.fit(make_client(clients_data[0], model), message, {})
    assert "features.2.running_var" in out.reply[MODEL]
    assert out.state.keys() == {HEAD} and set(out.state[HEAD]) == {"head.weight", "head.bias"}
    assert distance(out.reply[MODEL], message[MODEL], ["features.2.running_mean"]) > 0


# Ditto --------------------------------------------------------------------------------------
def test_ditto_global_update_is_fedavg_and_personal_model_is_pulled(clients_data) -> None:
    model = make_model()
    setting = setting_for(model)
    glob = clone(make_model(seed=1).state_dict())
    message = {MODEL: glob}
    ref = FedAvg(FedAvg.Params(), setting).fit(make_client(clients_data[0], model), message, {})
    names = param_names(model)

    moved = {}
    for lam in (0.0, 10.0):  # lr * lam = 0.5
        algo = build(Ditto, setting, lam=lam, personal_epochs=3)
        out = algo.fit(make_client(clients_data[0], model), message, {})
        assert equal_records(out.reply, ref.reply)  # the global part is exactly FedAvg's update
        assert out.state.keys() == {PERSONAL} and out.state[PERSONAL].keys() == glob.keys()
        assert "personal_loss" in out.metrics and "num_examples" not in out.metrics
        moved[lam] = distance(out.state[PERSONAL], glob, names)
        assert equal(algo.client_model(message, out.state), out.state[PERSONAL])
    assert 0 < moved[10.0] < 0.5 * moved[0.0]

    algo = build(Ditto, setting)
    assert equal(algo.client_model(message, {}), glob)  # never trained: the global model
    assert equal(algo.global_model(message), glob)

    # next round: the personal model continues from the state
    own = clone(make_model(seed=6).state_dict())
    state2 = (
        build(Ditto, setting, lam=0.0)
        .fit(make_client(clients_data[0], model), message, {PERSONAL: own})
        .state[PERSONAL]
    )
    assert distance(state2, own, names) < distance(state2, glob, names)


# every baseline: replies and states are copies, not views of the workspace -----------------
@pytest.mark.parametrize("name", BASELINES)
def test_replies_and_states_do_not_alias_the_workspace(name: str, clients_data) -> None:
    model = make_model()
    setting = setting_for(model)
    cls = ALGORITHMS[name]
    algo = build(cls, setting, head_epochs=1) if cls is FedRep else build(cls, setting)
    message = algo.configure(algo.init_server(), 0, 1)
    out = algo.fit(make_client(clients_data[1], model, cid=1), message, {})
    snapshot = (
        {k: clone(v) for k, v in out.reply.items()},
        {k: clone(v) for k, v in out.state.items()},
    )
    assert "num_examples" not in out.metrics  # the engine stamps the reply with it
    assert all(isinstance(v, float) for v in out.metrics.values())
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.fill_(7.0)
            else:
                t.zero_()
    assert equal_records(out.reply, snapshot[0]) and equal_records(out.state, snapshot[1])
    assert all(
        not t.requires_grad
        for records in (out.reply, out.state)
        for arrays in records.values()
        for t in arrays.values()
    )


@pytest.mark.integration
def test_frozen_batchnorm_keeps_its_statistics():
    """FedRep's head phase must not move the body's BatchNorm running statistics."""
    import torch

    from protofed.config import ModelConfig, TrainConfig
    from protofed.models import build_model
    from protofed.training.loop import train_epochs

    model = build_model(ModelConfig(name="resnet18"), (3, 8, 8), 4)
    before = {k: v.clone() for k, v in model.state_dict().items() if "running" in k}
    x, y = torch.randn(16, 3, 8, 8), torch.randint(0, 4, (16,))
    head = [p for n, p in model.named_parameters() if n.startswith("head.")]
    train_epochs(
        model, x, y, TrainConfig(batch_size=8), torch.Generator().manual_seed(0), parameters=head
    )
    after = model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())
    train_epochs(model, x, y, TrainConfig(batch_size=8), torch.Generator().manual_seed(0))
    assert not all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
