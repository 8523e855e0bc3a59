"""FedALA and the ALA plug-in: the aggregation rule, W's training, per-client state, the plug-in.

Unit tests call `common.ala` directly on small real clients (sklearn's 8x8 digits); the state and
plug-in tests go through the real runtime; one end-to-end test runs FedALA on MNIST from
../shared/data (skipped without it).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from protofed.algorithms import ALGORITHMS, MODEL, Setting, parse_params
from protofed.algorithms.common import ala as _ala
from protofed.algorithms.common.ala import (
    LOCAL,
    OWN,
    PERSONAL,
    WEIGHTS,
    AdaptiveLocalAggregation,
    AlaSettings,
    adapt,
    ala_parameters,
    combine,
    initial_weights,
    with_ala,
)
from protofed.algorithms.common.split import HEAD, split_arrays
from protofed.algorithms.fedrep import FedRep
from protofed.config import ModelConfig, TrainConfig, load_config
from protofed.core.results import Summary
from protofed.data.federated import ClientData
from protofed.errors import ConfigError
from protofed.models import build_model
from protofed.models.base import FedModel
from protofed.runtime import RoundLoop, prepare, resume, simulate, start
from protofed.training.client import Client

TRAIN = TrainConfig(local_epochs=1, batch_size=32, lr=0.05)
PLUGIN = ["fedavg", "fedprox", "ditto", "fedrep"]
DIGITS = [
    "data.name=digits",
    "data.partition=pathological",
    "data.num_clients=4",
    "model.name=mlp",
    "model.hidden=[32]",
    "train.batch_size=32",
    "train.lr=0.1",
    "eval.every=1",
]


# helpers --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def digits_clients() -> list[ClientData]:
    """Two real clients with different labels: digits 0-4 and digits 5-9."""
    X, y = load_digits(return_X_y=True)
    x = torch.tensor(X / 16.0, dtype=torch.float32)
    t = torch.tensor(y, dtype=torch.long)
    out = []
    for i, mask in enumerate([t < 5, t >= 5]):
        xs, ys = x[mask][:300], t[mask][:300]
        out.append(
            ClientData(
                f"c{i}", None, xs[:200], ys[:200], xs[200:250], ys[200:250], xs[250:], ys[250:]
            )
        )
    return out


class BNNet(FedModel):
    """Linear, BatchNorm (with buffers), Linear head: three layers, one with buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU())
        self.head = nn.Linear(16, 10)
        self.embedding_dim = 16


def mlp(seed: int) -> FedModel:
    torch.manual_seed(seed)
    return build_model(ModelConfig(name="mlp", hidden=[32]), (64,), 10)


def weights_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def client_for(data: ClientData, model: FedModel, seed: int = 0) -> Client:
    gen = torch.Generator().manual_seed(seed)
    return Client(id=seed, data=data, model=model, train=TRAIN, server_round=2, generator=gen)


def global_and_local(model_fn=None):
    """Two different models of the same architecture (the mlp by default): (global, local)."""
    if model_fn is None:
        return weights_of(mlp(1)), weights_of(mlp(2))
    torch.manual_seed(1)
    g = weights_of(model_fn())
    torch.manual_seed(2)
    return g, weights_of(model_fn())


# the aggregation rule -------------------------------------------------------------------
def test_w_one_gives_exactly_the_global_model():
    model = mlp(0)
    g, loc = global_and_local()
    names = ala_parameters(model, g, loc, p=1)
    assert names == ["head.weight", "head.bias"]  # the top layer, chosen by layer
    hat = combine(g, loc, initial_weights(loc, names))
    assert hat.keys() == g.keys()
    for k in g:
        assert torch.equal(hat[k], g[k]), k


def test_w_zero_keeps_the_local_top_layers_and_the_global_lower_ones():
    model = mlp(0)
    g, loc = global_and_local()
    names = ala_parameters(model, g, loc, p=1)
    hat = combine(g, loc, {n: torch.zeros_like(loc[n]) for n in names})
    for k in g:
        expected = loc[k] if k in names else g[k]
        assert torch.equal(hat[k], expected), k


def test_layers_are_counted_in_layers_not_tensors_and_buffers_are_global():
    model = BNNet()
    g, loc = global_and_local(BNNet)
    loc["features.1.running_mean"] += 1.0  # the local statistics differ from the global ones
    loc["features.1.num_batches_tracked"] += 5
    assert model.layers() == ["features.0", "features.1", "head"]
    names = ala_parameters(model, g, loc, p=2)  # BatchNorm + head: 4 tensors, 2 layers
    assert names == ["features.1.weight", "features.1.bias", "head.weight", "head.bias"]
    hat = combine(g, loc, {n: torch.full_like(loc[n], 0.5) for n in names})
    for buffer in (
        "features.1.running_mean",
        "features.1.running_var",
        "features.1.num_batches_tracked",
    ):
        assert torch.equal(hat[buffer], g[buffer])  # statistics of a top layer: global
    assert torch.allclose(hat["head.bias"], (g["head.bias"] + loc["head.bias"]) / 2)
    with pytest.raises(ConfigError, match="p=4"):
        ala_parameters(model, g, loc, p=4)
    with pytest.raises(ConfigError):
        parse_params("fedala", {"p": 0})  # never "all tensors"


# training W -----------------------------------------------------------------------------
def _adapt(data, settings, weights=None, seed=0):
    model = mlp(0)
    g, loc = global_and_local()
    client = client_for(data, model, seed)
    hat, w, metrics = adapt(client, g, loc, weights or {}, settings, assemble=lambda h: {**g, **h})
    return g, loc, hat, w, metrics


def test_trained_w_stays_in_the_unit_interval_and_lower_layers_are_global(digits_clients):
    settings = AlaSettings(eta=1000.0, threshold=1e9)  # huge steps: clipping must hold
    g, loc, hat, w, metrics = _adapt(digits_clients[0], settings)
    assert set(w) == {"head.weight", "head.bias"}
    values = torch.cat([t.flatten() for t in w.values()])
    assert values.min() >= 0 and values.max() <= 1
    assert (values == 0).any() or (values == 1).any()  # the clip was active
    assert not all(torch.equal(t, torch.ones_like(t)) for t in w.values())  # W moved
    for k in g:
        if k not in w:
            assert torch.equal(hat[k], g[k]), k  # lower layers: exactly the global model
        else:
            assert torch.equal(hat[k], torch.lerp(loc[k], g[k], w[k]))


@pytest.mark.integration
def test_start_phase_ends_on_the_threshold_then_one_epoch_per_round(digits_clients):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no cap warning
        *_, w, first = _adapt(digits_clients[0], AlaSettings(threshold=1e9))
        assert first["ala_start"] == 1 and first["ala_epochs"] == _ala.WINDOW
        assert first["ala_capped"] == 0
        *_, w2, later = _adapt(digits_clients[0], AlaSettings(threshold=1e9), weights=w)
    assert later["ala_start"] == 0 and later["ala_epochs"] == 1
    assert w2.keys() == w.keys()


@pytest.mark.integration
def test_start_phase_stops_at_the_cap_with_a_warning(digits_clients):
    with pytest.warns(RuntimeWarning, match="max_start_epochs=12"):
        *_, metrics = _adapt(digits_clients[0], AlaSettings(threshold=1e-12, max_start_epochs=12))
    assert metrics["ala_epochs"] == 12 and metrics["ala_capped"] == 1


@pytest.mark.integration
def test_cached_embeddings_train_the_same_weights_as_full_forward_passes(
    digits_clients, monkeypatch
):
    settings = AlaSettings(threshold=1e9)
    assert _ala._fixed_function(mlp(0).features)  # the first run takes the cached path ...
    assert not _ala._fixed_function(BNNet().features)  # (BatchNorm: never cached)
    *_, cached, _ = _adapt(digits_clients[1], settings)
    monkeypatch.setattr(_ala, "_fixed_function", lambda module: False)  # ... this one, not
    *_, full, _ = _adapt(digits_clients[1], settings)
    for k in cached:
        assert torch.allclose(cached[k], full[k], atol=1e-5), k
    assert not _ala.is_head("features.1.weight")


def test_two_layers_and_batchnorm_train_through_the_whole_model(digits_clients):
    torch.manual_seed(0)
    model = BNNet()
    g, loc = global_and_local(BNNet)
    client = client_for(digits_clients[0], model)
    hat, w, metrics = adapt(
        client, g, loc, {}, AlaSettings(p=2, threshold=1e9), assemble=lambda h: {**g, **h}
    )
    assert set(w) == {"features.1.weight", "features.1.bias", "head.weight", "head.bias"}
    assert metrics["ala_epochs"] == _ala.WINDOW
    assert all(torch.equal(hat[k], g[k]) for k in g if k not in w)


def test_no_training_while_the_local_model_equals_the_global_one(digits_clients):
    model = mlp(0)
    g = weights_of(model)
    client = client_for(digits_clients[0], model)
    hat, w, metrics = adapt(client, g, dict(g), {}, AlaSettings(), assemble=lambda h: h)
    assert w == {} and metrics == {}  # the start phase waits for a real local model
    assert all(torch.equal(hat[k], g[k]) for k in g)


def test_workspace_requires_grad_is_restored(digits_clients):
    model = mlp(0)
    g, loc = global_and_local()
    adapt(
        client_for(digits_clients[0], model),
        g,
        loc,
        {},
        AlaSettings(threshold=1e9),
        assemble=lambda h: {**g, **h},
    )
    assert all(p.requires_grad for p in model.parameters())


@pytest.mark.integration
def test_the_wrapped_algorithm_sees_only_its_own_records(digits_clients, monkeypatch):
    """FedRep with the plug-in: ALA's records sit beside FedRep's head in the client's state,
    and FedRep's `fit` is handed only its head and theta_hat as the message's model."""
    model = mlp(0)
    setting = Setting(2, 10, TRAIN, weights_of(model))
    algo = with_ala(FedRep)(FedRep.Params(head_epochs=1), setting, ala=AlaSettings(threshold=1e9))
    seen = []
    real = FedRep.fit

    def spy(self, client, message, state):
        seen.append((message, state))
        return real(self, client, message, state)

    monkeypatch.setattr(FedRep, "fit", spy)
    server = algo.init_server()
    first = algo.fit(client_for(digits_clients[0], model), server, {})
    assert seen[-1][0] is server and seen[-1][1] == {}  # no local model yet: nothing to adapt
    assert first.state.keys() == {HEAD, LOCAL}
    assert first.state[LOCAL] is first.reply[MODEL]  # the body it trained and sent

    glob = {MODEL: split_arrays(weights_of(mlp(1)))[0]}  # the next round's global body
    second = algo.fit(client_for(digits_clients[0], model), glob, first.state)
    message, state = seen[-1]
    assert state.keys() == {HEAD} and state[HEAD] is first.state[HEAD]
    assert second.state.keys() == {HEAD, LOCAL, WEIGHTS}
    w, local = second.state[WEIGHTS], first.state[LOCAL]
    assert w and all(k.startswith("features.") for k in w)  # the top body layer
    assert message.keys() == {MODEL} and message[MODEL].keys() == glob[MODEL].keys()
    for k, v in message[MODEL].items():  # theta_hat: global below, mixed by W on top
        expected = torch.lerp(local[k], glob[MODEL][k], w[k]) if k in w else glob[MODEL][k]
        assert torch.equal(v, expected), k
    personal = algo.client_model(glob, second.state)
    assert personal.keys() == setting.init_model.keys()
    assert all(torch.equal(personal[k], v) for k, v in second.state[HEAD].items())


# through the runtime --------------------------------------------------------------------
def _sim(*extra: str) -> RoundLoop:
    return simulate(prepare(load_config(None, [*DIGITS, *extra])))


def _numbers(summary: Summary) -> dict:
    return {k: v for k, v in summary.to_json().items() if k != "time"}


@pytest.mark.integration
def test_w_persists_per_client_and_never_leaks(monkeypatch):
    calls: list[tuple[int, int, bool, dict]] = []
    real = _ala.train_weights

    def spy(client, model_arrays, global_, local, weights, settings, start):
        calls.append(
            (client.id, client.server_round, start, {k: v.clone() for k, v in weights.items()})
        )
        return real(client, model_arrays, global_, local, weights, settings, start)

    monkeypatch.setattr(_ala, "train_weights", spy)
    sim = _sim("algorithm.name=fedala", "train.rounds=3", "train.workers=1")  # spied here
    kept: dict[int, dict] = {}

    def after(r, info, rec):
        kept[r] = {c: sim.client_state(c).get(WEIGHTS, {}) for c in range(4)}
        kept[r] = {c: {k: v.clone() for k, v in w.items()} for c, w in kept[r].items()}

    sim.run(on_round=after)
    by_round = {r: {c: (start, w) for c, rr, start, w in calls if rr == r} for r in (1, 2, 3)}
    assert by_round[1] == {}  # round 1: no local model yet, no ALA
    assert set(by_round[2]) == set(by_round[3]) == {0, 1, 2, 3}
    for cid in range(4):
        start2, w2 = by_round[2][cid]
        start3, w3 = by_round[3][cid]
        assert start2 and not start3
        assert all(torch.equal(t, torch.ones_like(t)) for t in w2.values())  # initialised to 1
        # round 3 starts from exactly what this client kept after round 2, nobody else's
        assert w3.keys() == kept[2][cid].keys()
        assert all(torch.equal(w3[k], kept[2][cid][k]) for k in w3)
    final = kept[3]
    assert any(not torch.equal(final[0][k], final[1][k]) for k in final[0])  # different data
    state = sim.client_state(0)
    assert state.keys() == {LOCAL, WEIGHTS}  # FedAvg keeps nothing of its own
    glob = sim.server[MODEL]
    local = state[LOCAL]
    assert local.keys() == glob.keys()
    # the personalized model is theta_hat: global lower layers, top layer mixed by this W
    hat = sim.algorithm.client_model(sim.server, state)
    w = final[0]
    assert hat.keys() == glob.keys()
    for k in hat:
        expected = torch.lerp(local[k], glob[k], w[k]) if k in w else glob[k]
        assert torch.equal(hat[k], expected), k
    assert not torch.equal(hat["head.weight"], glob["head.weight"])
    assert not torch.equal(hat["head.weight"], local["head.weight"])


def test_personalized_trained_evaluates_the_model_trained_last():
    sim = _sim("algorithm.name=fedala", "algorithm.personalized=trained", "train.rounds=2")
    sim.run()
    for cid in range(4):
        state = sim.client_state(cid)
        model = sim.algorithm.client_model(sim.server, state)
        assert model.keys() == sim.server[MODEL].keys()
        assert all(model[k] is v for k, v in state[LOCAL].items())
    never_trained = sim.algorithm.client_model(sim.server, {})
    assert all(never_trained[k] is v for k, v in sim.server[MODEL].items())  # the global model


@pytest.mark.integration
def test_killed_fedala_run_resumes_with_its_weights(tmp_path):
    cfg = load_config(
        None, [*DIGITS, "algorithm.name=fedala", "train.rounds=4", "train.client_fraction=0.5"]
    )
    whole = start(cfg, tmp_path / "whole").run()

    class Killed(Exception):
        pass

    def kill(r, info, rec):
        if r == 3:
            raise Killed

    with pytest.raises(Killed):
        start(cfg, tmp_path / "killed").run(on_round=kill)
    assert _numbers(resume(tmp_path / "killed").run()) == _numbers(whole)


@pytest.mark.integration
def test_fedala_is_fedavg_with_the_plugin():
    a = _sim("algorithm.name=fedala", "train.rounds=3").run()
    b = _sim("algorithm.name=fedavg", "algorithm.ala.enabled=true", "train.rounds=3").run()
    assert (a.algorithm, b.algorithm) == ("fedala", "fedavg+ala")
    assert {**_numbers(a), "algorithm": None} == {**_numbers(b), "algorithm": None}


@pytest.mark.integration
def test_summary_and_report_say_when_ala_was_on(tmp_path):
    from protofed.report import collect, to_markdown

    for name, extra in (("plain", []), ("ala", ["algorithm.ala.enabled=true"])):
        cfg = load_config(None, [*DIGITS, "algorithm.name=fedprox", "train.rounds=1", *extra])
        start(cfg, tmp_path / name).run()
    rows = collect([tmp_path / "plain", tmp_path / "ala"])
    assert [r["algorithm"] for r in rows] == ["fedprox", "fedprox+ala"]
    assert "| ala | fedprox+ala | digits |" in to_markdown(rows)
    off = _sim("algorithm.name=ditto", "algorithm.ala.enabled=false", "train.rounds=1").run()
    assert off.algorithm == "ditto"


def test_personalization_scores_are_each_clients_own_aggregate():
    """Aggregates are built on the fly, so no two clients may pass for one model (a freed
    tensor's address is reused): every client's score is its own model's."""
    from protofed.training.loop import predict

    sim = _sim("algorithm.name=fedala", "train.rounds=3", "data.num_clients=6")
    sim.run()
    scores = sim.history[-1].clients.pers_acc
    assert len(set(scores)) > 1
    model = sim.prepared.model
    for cid, data in enumerate(sim.prepared.fed.clients):
        model.load_state_dict(sim.algorithm.client_model(sim.server, sim.client_state(cid)))
        acc = (predict(model, data.test_x) == data.test_y).double().mean().item()
        assert scores[cid] == pytest.approx(acc, abs=1e-12), cid


@pytest.mark.integration
@pytest.mark.parametrize("name", PLUGIN)
def test_plugin_runs_and_adds_zero_bytes(name):
    plain = _sim(f"algorithm.name={name}", "train.rounds=2")
    with_ala = _sim(
        f"algorithm.name={name}",
        "algorithm.ala.enabled=true",
        "train.rounds=2",
        "algorithm.ala.threshold=1.0",
    )
    assert isinstance(with_ala.algorithm, AdaptiveLocalAggregation)
    assert isinstance(with_ala.algorithm, ALGORITHMS[name])
    assert not isinstance(plain.algorithm, AdaptiveLocalAggregation)
    a, b = plain.run(), with_ala.run()
    assert a.comm == b.comm
    assert b.final is not None and b.final.personalization.acc > 0.2  # it learns
    for cid in range(4):
        w = with_ala.client_state(cid).get(WEIGHTS, {})
        assert w, f"client {cid} kept no ALA weights"
        expected = "head" if name != "fedrep" else "features.1"  # fedrep: top *shared* layer
        assert {k.rsplit(".", 1)[0] for k in w} == {expected}


@pytest.mark.integration
def test_ditto_applies_ala_to_its_personal_model(digits_clients, monkeypatch):
    """Ditto ("state"): ALA mixes the personal model v it kept with the received global
    model, and Ditto's `fit` trains its personal model from that theta_hat; the message (its
    FedAvg part) is handed over untouched."""
    model = mlp(0)
    setting = Setting(2, 10, TRAIN, weights_of(model))
    algo = with_ala(ALGORITHMS["ditto"])(
        ALGORITHMS["ditto"].Params(), setting, ala=AlaSettings(threshold=1e9)
    )
    seen = []
    real = ALGORITHMS["ditto"].fit

    def spy(self, client, message, state):
        seen.append((message, {k: dict(v) for k, v in state.items()}))
        return real(self, client, message, state)

    monkeypatch.setattr(ALGORITHMS["ditto"], "fit", spy)
    first = algo.fit(client_for(digits_clients[0], model), {MODEL: weights_of(mlp(1))}, {})
    assert seen[-1][1] == {} and first.state.keys() == {PERSONAL}  # no v yet: nothing to adapt
    glob = {MODEL: weights_of(mlp(2))}  # the next round's global model
    second = algo.fit(client_for(digits_clients[0], model), glob, first.state)
    message, state = seen[-1]
    assert message is glob and state.keys() == {PERSONAL}
    assert second.state.keys() == {PERSONAL, WEIGHTS}  # no LOCAL: v is Ditto's own record
    w, v = second.state[WEIGHTS], first.state[PERSONAL]
    assert set(w) == {"head.weight", "head.bias"}
    for k, t in state[PERSONAL].items():  # theta_hat: global below, v and global mixed on top
        expected = torch.lerp(v[k], glob[MODEL][k], w[k]) if k in w else glob[MODEL][k]
        assert torch.equal(t, expected), k
    assert not torch.equal(state[PERSONAL]["head.weight"], glob[MODEL]["head.weight"])
    assert not torch.equal(state[PERSONAL]["head.weight"], v["head.weight"])
    personal = algo.client_model(glob, second.state)  # Ditto's trained v, either way
    assert all(torch.equal(personal[k], t) for k, t in second.state[PERSONAL].items())

    sim = _sim("algorithm.name=ditto", "algorithm.ala.enabled=true", "train.rounds=2")
    sim.run()
    state = sim.client_state(0)
    assert LOCAL not in state and WEIGHTS in state  # the local model is Ditto's own state
    assert {k for k in state if k not in OWN} == {PERSONAL}
    assert state[PERSONAL].keys() == sim.server[MODEL].keys()
    assert sim.algorithm.client_model(sim.server, state) == state[PERSONAL]


@pytest.mark.parametrize("name", ["local", "centralized", "fedala"])
def test_unsupported_algorithms_reject_the_ala_section(name):
    with pytest.raises(ConfigError, match=r"algorithm\.ala\.enabled"):
        prepare(
            load_config(None, [*DIGITS, f"algorithm.name={name}", "algorithm.ala.enabled=true"])
        )


def test_ala_section_is_validated():
    with pytest.raises(ConfigError, match=r"algorithm\.ala\.p"):
        parse_params("fedavg", {"ala": {"enabled": True, "p": 0}})
    with pytest.raises(ConfigError, match=r"algorithm\.ala\.bogus"):
        parse_params("fedavg", {"ala": {"bogus": 1}})
    with pytest.raises(ConfigError, match="section"):
        parse_params("fedavg", {"ala": True})
    disabled = _sim("algorithm.name=fedavg", "algorithm.ala.p=2")
    assert not isinstance(disabled.algorithm, AdaptiveLocalAggregation)
    assert ALGORITHMS["fedala"].describe_params() == {
        "p": 1,
        "s": 80.0,
        "eta": 1.0,
        "threshold": 0.1,
        "max_start_epochs": 100,
        "personalized": "hat",
    }


def test_info_lists_the_ala_keys_where_the_plugin_applies():
    from typer.testing import CliRunner

    from protofed.cli import app

    runner = CliRunner()
    for name in PLUGIN:
        out = runner.invoke(app, ["info", name], env={"COLUMNS": "250"})
        assert out.exit_code == 0, out.output
        lines = {
            line.split()[1]: line for line in out.output.splitlines() if line.startswith("│ ala.")
        }
        assert set(lines) == {f"ala.{k}" for k in _ala.AlaParams.model_fields}
        assert "False" in lines["ala.enabled"] and "'hat' | 'trained'" in lines["ala.personalized"]
        assert " 1 " in lines["ala.p"] and "80.0" in lines["ala.s"] and "slides" in lines["ala.s"]
    for name in ("local", "centralized", "fedala", "fedper"):
        out = runner.invoke(app, ["info", name], env={"COLUMNS": "250"})
        assert out.exit_code == 0 and "ala." not in out.output, name
    fedala = runner.invoke(app, ["info", "fedala"], env={"COLUMNS": "250"}).output
    assert "│ p " in fedala and "│ personalized " in fedala  # its own keys, without the prefix


# end to end on real data ----------------------------------------------------------------
@pytest.mark.integration
def test_fedala_on_mnist_pathological(shared_data):
    base = [
        f"data.dir={shared_data}",
        "data.name=mnist",
        "data.partition=pathological",
        "data.num_clients=10",
        "model.name=mlp",
        "model.hidden=[64]",
        "train.rounds=3",
        "train.batch_size=32",
        "train.lr=0.05",
        "eval.every=3",
        "eval.generalization=false",
    ]
    fedala = simulate(prepare(load_config(None, [*base, "algorithm.name=fedala"]))).run()
    fedavg = simulate(prepare(load_config(None, [*base, "algorithm.name=fedavg"]))).run()
    assert fedala.final is not None and fedavg.final is not None
    assert fedala.final.personalization.acc > 0.9  # 2 classes per client
    assert fedala.final.personalization.acc > fedavg.final.personalization.acc
    assert fedala.comm == fedavg.comm
