"""Stacked training must give every client the weights that training it alone gives."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import uci_har_slice
from protofed.config import ModelConfig, TrainConfig, load_config
from protofed.data.federated import ClientData
from protofed.errors import ConfigError
from protofed.models import build_model
from protofed.runtime import prepare, simulate
from protofed.runtime.stacking import adapter_for, stacked_reason
from protofed.training.client import Client
from protofed.training.loop import make_optimizer, train_epochs
from protofed.training.stacked import (
    StackedOptimizer,
    StackedTask,
    StackedTrainer,
    model_reason,
    train_stacked,
)

OPTIMIZERS = {
    "sgd": TrainConfig(lr=0.05),
    "momentum": TrainConfig(momentum=0.9, lr=0.05),
    "nesterov_wd": TrainConfig(momentum=0.9, nesterov=True, weight_decay=1e-3, lr=0.05),
    # Adam's L2 decay at 1e-2 as in test_fused.py: at 1e-4 g + wd * w cancels to ~1e-9 on
    # thousands of coordinates, where fp32 rounding alone decides an lr-sized step's sign
    "adam": TrainConfig(optimizer="adam", lr=1e-3, weight_decay=1e-2),
    "adamw": TrainConfig(optimizer="adamw", lr=1e-3, weight_decay=1e-2),
}
TIGHT = {"rtol": 1e-5, "atol": 1e-6}  # fp32 rounding over a few dozen steps
# as in test_fused.py: Adam divides each coordinate's step by its own gradient scale, so a
# gradient that is zero up to rounding (a cancelled sum, a ReLU at its kink) can step either
# way by up to lr; today's own two kernels (fused, autograd) differ the same way
ADAM = {"rtol": 1e-4, "atol": 1e-4}


def _split(x: torch.Tensor, y: torch.Tensor, sizes: list[int]) -> list[ClientData]:
    """Consecutive slices of these sizes as clients (only the training split is used)."""
    out, first = [], 0
    for n in sizes:
        xs, ys = x[first : first + n], y[first : first + n]
        out.append(ClientData(f"c{n}", None, xs, ys, xs[:0], ys[:0], xs[:0], ys[:0]))
        first += n
    return out


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return torch.tensor(X / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8), torch.tensor(y)


@pytest.fixture(scope="module")
def har(shared_data, tmp_path_factory) -> tuple[torch.Tensor, torch.Tensor]:
    """Real UCI-HAR windows (6 channels x 128 samples) of two subjects."""
    import numpy as np

    path = uci_har_slice(tmp_path_factory.mktemp("har") / "har.npz", [1, 3], every=7)
    raw = np.load(path, allow_pickle=False)
    return torch.tensor(raw["X"], dtype=torch.float32), torch.tensor(raw["y"], dtype=torch.long)


def _alone(model, start, clients, train, seeds):
    """Today's path: each client trained by itself from `start`."""
    out = []
    for data, seed in zip(clients, seeds, strict=True):
        m = copy.deepcopy(model)
        m.load_state_dict(start)
        metrics = train_epochs(
            m, data.train_x, data.train_y, train, torch.Generator().manual_seed(seed)
        )
        out.append((m.state_dict(), metrics))
    return out


def _together(model, start, clients, train, seeds, term=None, aux=None):
    contexts = [
        Client(i, d, model, train, 1, torch.Generator().manual_seed(s))
        for i, (d, s) in enumerate(zip(clients, seeds, strict=True))
    ]
    tasks = [StackedTask(start, aux or {}) for _ in clients]
    return train_stacked(model, contexts, tasks, term)


def _assert_same(alone, together, **tolerance):
    assert len(alone) == len(together)
    for (ref, ref_m), (got, got_m) in zip(alone, together, strict=True):
        assert got_m["steps"] == ref_m["steps"]
        assert got_m["loss"] == pytest.approx(ref_m["loss"], rel=1e-5)
        assert set(got) == set(ref)
        for name in ref:
            torch.testing.assert_close(got[name], ref[name], **(tolerance or TIGHT))


@pytest.mark.integration
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_every_optimizer_gives_each_client_its_own_weights(optimizer, digits):
    """Three clients of unequal sizes (4, 8 and 13 batches an epoch, the last batch short),
    two epochs: the shorter clients stop early and their weights are theirs alone."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="mlp", hidden=[32, 16]), (1, 8, 8), 10)
    start = copy.deepcopy(model.state_dict())
    train = OPTIMIZERS[optimizer].model_copy(update={"batch_size": 10, "local_epochs": 2})
    clients, seeds = _split(*digits, [37, 80, 123]), [11, 12, 13]
    alone = _alone(model, start, clients, train, seeds)
    assert [m["steps"] for _, m in alone] == [8, 16, 26]
    _assert_same(alone, _together(model, start, clients, train, seeds))


@pytest.mark.integration
@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_harcnn_on_real_har_windows(optimizer, har):
    """PFLlib's HAR CNN (convolutions, pooling) on UCI-HAR windows, clients in any order of
    size (the stacked order is by step count, the replies keep the clients')."""
    torch.manual_seed(1)
    model = build_model(ModelConfig(name="harcnn"), (6, 128), 6)
    start = copy.deepcopy(model.state_dict())
    train = OPTIMIZERS[optimizer].model_copy(update={"batch_size": 10})
    clients, seeds = _split(*har, [21, 47, 9]), [5, 6, 7]
    _assert_same(
        _alone(model, start, clients, train, seeds),
        _together(model, start, clients, train, seeds),
        **(ADAM if train.optimizer != "sgd" else TIGHT),
    )


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_a_client_out_of_batches_is_left_untouched(optimizer):
    """Each client's slice follows torch.optim's own optimizer for its own steps; a slice
    past its client's last step keeps its weights and its momentum or Adam state exactly."""
    train = OPTIMIZERS[optimizer]
    gen = torch.Generator().manual_seed(0)
    shapes = [(4, 3), (3,)]
    stacked = [torch.randn(3, *s, generator=gen) for s in shapes]
    alone = [[p[i].clone().requires_grad_() for p in stacked] for i in range(3)]
    torch_opts = [make_optimizer(ps, train) for ps in alone]
    ours = StackedOptimizer(stacked, train, None)
    for k in [3, 3, 2, 2, 1]:  # client 2 takes 2 steps, client 1 four, client 0 five
        grads = [torch.randn(k, *s, generator=gen) for s in shapes]
        before = [p[k:].clone() for p in stacked] + [
            b[k:].clone() for b in ours.first + ours.second
        ]
        ours.step(k, grads)
        after = [p[k:] for p in stacked] + [b[k:] for b in ours.first + ours.second]
        for a, b in zip(before, after, strict=True):
            assert torch.equal(a, b)  # not a zero-gradient step: nothing moved at all
        for i in range(k):
            for p, g in zip(alone[i], grads, strict=True):
                p.grad = g[i].clone()
            torch_opts[i].step()
    for i in range(3):
        for p, ref in zip(stacked, alone[i], strict=True):
            torch.testing.assert_close(p[i], ref.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.integration
def test_fedprox_term_matches_its_proximal_loss(digits):
    """FedProx's stacked round: its proximal term on each client's weights, anchored to the
    model it was sent, as its per-client proximal loss."""
    from protofed.algorithms import Setting, build_algorithm
    from protofed.algorithms.common.regularizers import proximal_loss

    torch.manual_seed(2)
    model = build_model(ModelConfig(name="mlp", hidden=[32]), (1, 8, 8), 10)
    start = copy.deepcopy(model.state_dict())
    train = OPTIMIZERS["momentum"].model_copy(update={"batch_size": 16, "local_epochs": 3})
    fedprox = build_algorithm("fedprox", {"mu": 0.5}, Setting(3, 10, train, start))
    clients, seeds = _split(*digits, [50, 30, 70]), [1, 2, 3]
    alone = []
    for data, seed in zip(clients, seeds, strict=True):
        m = copy.deepcopy(model)
        loss = proximal_loss({k: v.clone() for k, v in start.items()}, 0.5)
        gen = torch.Generator().manual_seed(seed)
        metrics = train_epochs(m, data.train_x, data.train_y, train, gen, loss_fn=loss)
        alone.append((m.state_dict(), metrics))
    contexts = [
        Client(i, d, model, train, 1, torch.Generator().manual_seed(s))
        for i, (d, s) in enumerate(zip(clients, seeds, strict=True))
    ]
    messages = [{"model": start} for _ in contexts]
    stacked_fit = adapter_for(fedprox)
    results = stacked_fit(fedprox, contexts, messages, [{}] * 3, StackedTrainer(model, contexts))
    _assert_same(alone, [(r.reply["model"], r.metrics) for r in results])


BASE = [
    "data.name=digits",
    "data.partition=dirichlet",
    "data.num_clients=6",
    "data.alpha=0.5",
    "model.name=mlp",
    "model.hidden=[32]",
    "train.rounds=2",
    "train.batch_size=16",
    "train.lr=0.1",
    "train.momentum=0.9",
    "train.workers=1",
    "train.clients_per_round=4",
    "eval.every=1",
]


def _loop(*extra: str):
    return simulate(prepare(load_config(None, [*BASE, *extra])))


def _scores(record: object, path: str = "") -> dict[str, float]:
    """Every number of a round record or a summary, by path (times left out)."""
    if isinstance(record, dict):
        out: dict[str, float] = {}
        for key, value in record.items():
            if "time" not in key and "seconds" not in key:
                out.update(_scores(value, f"{path}.{key}"))
        return out
    if isinstance(record, bool | int | float):
        return {path: float(record)}
    return {}


@pytest.mark.integration
@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [
        ("fedavg", ()),
        ("fedprox", ("algorithm.mu=0.1",)),
        ("local", ()),
        ("fedper", ("eval.client_model=trained",)),
        ("fedrep", ("algorithm.head_epochs=1", "train.optimizer=adamw", "train.lr=0.01")),
        ("ditto", ("algorithm.lam=0.5",)),
        ("fedbabu", ("algorithm.finetune_epochs=1",)),
        ("fedbabu", ("algorithm.finetune_epochs=1", "algorithm.finetune=head")),
        ("fedavg", ("eval.client_model=trained", "train.optimizer=adam", "train.lr=0.01")),
    ],
)
def test_a_whole_run_stacked_is_the_run_one_client_at_a_time(algorithm, extra):
    """4 of 6 clients a round (sampled), unequal sizes: the server's model, every client's
    kept state and trained model, the bytes and the scores are today's."""
    settings = (f"algorithm.name={algorithm}", *extra)
    _assert_same_run(
        _loop(*settings, "train.stacked='false'"), _loop(*settings, "train.stacked='true'")
    )


def _assert_same_run(ref, got) -> None:
    """The stacked run `got` is the one-client-at-a-time run `ref`: the server's records,
    every client's kept state and trained model, the bytes and the scores."""
    assert not ref.transport.stacked and got.transport.stacked
    ref_summary, got_summary = ref.run(), got.run()
    close = ADAM if ref.prepared.cfg.train.optimizer != "sgd" else TIGHT
    for record in ref.server:
        for name, value in ref.server[record].items():
            torch.testing.assert_close(got.server[record][name], value, **close)
    assert set(got.transport.states) == set(ref.transport.states)
    for cid, state in ref.transport.states.items():
        assert set(got.transport.states[cid]) == set(state)
        for record, arrays in state.items():
            for name, value in arrays.items():
                torch.testing.assert_close(got.transport.states[cid][record][name], value, **close)
    assert set(got.transport.trained or {}) == set(ref.transport.trained or {})
    for cid, kept in (ref.transport.trained or {}).items():
        for name, value in kept.items():
            torch.testing.assert_close((got.transport.trained or {})[cid][name], value, **close)
    assert (got.progress.down_bytes, got.progress.up_bytes) == (
        ref.progress.down_bytes,
        ref.progress.up_bytes,
    )
    # scores to 1e-3: weights equal to rounding may still flip a borderline prediction
    for a, b in zip(ref.history, got.history, strict=True):
        ref_scores = _scores(a.to_json())
        assert len(ref_scores) > 5 and _scores(b.to_json()) == pytest.approx(ref_scores, abs=1e-3)
    final = _scores(ref_summary.to_json()["final"])
    assert _scores(got_summary.to_json()["final"]) == pytest.approx(final, abs=1e-3)


@pytest.fixture(scope="module")
def har_natural(shared_data, tmp_path_factory) -> list[str]:
    """Settings of a small UCI-HAR federation: 4 subjects as natural clients, 3 a round (so
    round 2 mixes clients that trained in round 1 with one that did not), 2 rounds."""
    path = uci_har_slice(tmp_path_factory.mktemp("har") / "har4.npz", [1, 3, 5, 6], every=6)
    return [
        "data.name=arrays",
        f"data.path={path}",
        "data.partition=natural",
        "model.name=mlp",
        "model.hidden=[32]",
        "train.rounds=2",
        "train.batch_size=16",
        "train.lr=0.05",
        "train.momentum=0.9",
        "train.workers=1",
        "train.clients_per_round=3",
        "eval.every=1",
    ]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [
        ("fedproto", ()),
        # the squared distance is D times the MSE: lam 1 diverges here, as an MSE's would not
        (
            "pfpl",
            (
                "algorithm.align=class_mean",
                "algorithm.reg_reduction=squared_l2",
                "algorithm.lam=0.01",
            ),
        ),
        ("feddpa", ()),  # each client's own lambda_k, from its Het_k before training
        ("moon", ()),  # round 2: clients with a previous model and one without
    ],
)
def test_a_whole_har_run_stacked_is_the_run_one_client_at_a_time(algorithm, extra, har_natural):
    """Algorithms whose term reads the batch (its embeddings, under the client's weights or
    MOON's frozen ones): on real UCI-HAR clients the stacked run is today's, the prototypes
    sent and the states kept included."""
    settings = (*har_natural, f"algorithm.name={algorithm}", *extra)
    ref = simulate(prepare(load_config(None, [*settings, "train.stacked='false'"])))
    got = simulate(prepare(load_config(None, [*settings, "train.stacked='true'"])))
    _assert_same_run(ref, got)


@pytest.mark.parametrize("target", ["sample", "class_mean"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "squared_l2"])
def test_the_masked_prototype_distance_is_the_per_client_one(target, reduction, digits):
    """The stacked term's distance over a padded batch (rows of weight 0 at the end) is the
    per-client loss's over the real rows, for every target and reduction; classes without a
    prototype, or none at all, add nothing."""
    from protofed.algorithms.common.prototype_losses import (
        masked_prototype_distance,
        prototype_distance,
    )

    torch.manual_seed(3)
    model = build_model(ModelConfig(name="mlp", hidden=[16]), (1, 8, 8), 10)
    x, y = digits[0][:40], digits[1][:40]
    with torch.no_grad():
        features = model.features(x)
    prototypes = torch.randn(10, features.shape[1], generator=torch.Generator().manual_seed(4))
    weight = torch.cat([torch.full((29,), 1 / 29), torch.zeros(11)])  # 29 real rows, padded
    for present in (torch.arange(10) % 3 != 0, torch.zeros(10, dtype=torch.bool)):
        ref = prototype_distance(features[:29], y[:29], prototypes, present, reduction, target)
        got = masked_prototype_distance(
            features, y, weight, prototypes, present.float(), reduction, target
        )
        torch.testing.assert_close(got, ref, **TIGHT)


@pytest.mark.integration
def test_a_round_larger_than_a_group_trains_group_by_group(monkeypatch):
    """A round of more than STACK_GROUP clients trains in groups, each client as alone."""
    from protofed.runtime import in_process as local

    monkeypatch.setattr(local, "STACK_GROUP", 3)  # 4 clients a round: a group of 3, then 1
    groups: list[int] = []
    real = local.fit_stacked

    def spy(prepared, server, clients, server_round, states):
        groups.append(len(clients))
        return real(prepared, server, clients, server_round, states)

    monkeypatch.setattr(local, "fit_stacked", spy)
    ref = _loop("train.stacked='false'")
    got = _loop("train.stacked='true'")
    ref.run(), got.run()
    assert groups == [3, 1, 3, 1]
    for name, value in ref.server["model"].items():
        torch.testing.assert_close(got.server["model"][name], value, **TIGHT)


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (("algorithm.name=fedpac",), "fedpac cannot"),
        (("algorithm.name=fedala",), "fedala cannot"),
        (("model.name=cnnbn",), "buffers"),
    ],
)
def test_true_where_it_cannot_is_one_line(settings, says):
    cfg = load_config(None, [*BASE, *settings, "train.stacked='true'"])
    with pytest.raises(ConfigError, match=says) as caught:
        simulate(prepare(cfg))
    assert "\n" not in str(caught.value)
    auto = simulate(prepare(load_config(None, [*BASE, *settings, "train.stacked=auto"])))
    assert not auto.transport.stacked


def test_privacy_keeps_every_client_on_its_own_fit():
    """Privacy's wrapper is around each client's fit: true refuses in one line, auto falls
    back to one client at a time (through the wrapper)."""
    private = [*BASE, "privacy.enabled=true", "privacy.noise_multiplier=1.0"]
    with pytest.raises(ConfigError, match="privacy") as caught:
        simulate(prepare(load_config(None, [*private, "train.stacked='true'"])))
    assert "\n" not in str(caught.value)
    auto = simulate(prepare(load_config(None, [*private, "train.stacked='auto'"])))
    assert not auto.transport.stacked
    reason = stacked_reason(auto.prepared.cfg, auto.prepared.algorithm, auto.prepared.model)
    assert reason is not None and "privacy" in reason


def test_auto_keeps_todays_path_until_a_measurement_says_otherwise():
    assert not _loop("train.stacked=auto").transport.stacked


def test_models_that_cannot_stack_say_why():
    torch.manual_seed(0)
    assert model_reason(build_model(ModelConfig(name="harcnn"), (6, 128), 6)) is None
    assert "buffers" in (model_reason(build_model(ModelConfig(name="cnn1dbn"), (6, 128), 6)) or "")
    dropout = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.1))
    assert "dropout" in (model_reason(dropout) or "")


def test_a_bare_true_is_the_same_switch_and_a_refusal_writes_nothing(tmp_path):
    from protofed.runtime.engine import start

    assert load_config(None, ["train.stacked=true"]).train.stacked == "true"
    assert load_config(None, ["train.stacked=false"]).train.stacked == "false"
    cfg = load_config(None, [*BASE, "train.stacked=true", "algorithm.name=fedpac"])
    with pytest.raises(ConfigError, match="train.stacked=true"):
        start(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
