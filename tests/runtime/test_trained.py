"""`eval.client_model=trained`: each client scored with the model it held right after its last
local training (FedAli's official code), kept by the runtime per client."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, f1_score

from protofed.api import load_run
from protofed.config import load_config
from protofed.core.types import MODEL, clone
from protofed.runtime import RoundLoop, prepare, run_fit, simulate, start

BASE = [
    "data.name=digits",
    "data.partition=dirichlet",
    "data.num_clients=6",
    "data.alpha=1.0",
    "model.name=mlp",
    "model.hidden=[32]",
    "train.batch_size=32",
    "train.lr=0.1",
]


def _cfg(*extra: str):
    return load_config(None, [*BASE, *extra])


@pytest.mark.integration
def test_a_fedavg_client_is_scored_with_the_model_its_fit_returned(tmp_path):
    """The issue's acceptance test: the personalization score of each client in the selected
    round is that of the weights its `fit` returned (in that round, or its last before it),
    computed here independently with scikit-learn."""
    cfg = _cfg(
        "eval.client_model=trained",
        "train.rounds=4",
        "train.client_fraction=0.5",
        "eval.selection=best_test",
        "train.workers=1",  # the spy below sees fits in this process only
    )
    loop = start(cfg, tmp_path / "run")
    prepared = loop.prepared
    returned: dict[tuple[int, int], dict] = {}
    fit = prepared.algorithm.fit

    def spy(client, message, state):
        result = fit(client, message, state)
        returned[(client.server_round, client.id)] = clone(result.reply[MODEL])
        return result

    prepared.algorithm.fit = spy  # type: ignore[method-assign]
    summary = loop.run()
    chosen = summary.selected.round
    record = next(h for h in loop.history if h.round == chosen)
    model = copy.deepcopy(prepared.model).eval()
    checked = 0
    for i, data in enumerate(prepared.fed.clients):
        rounds = [r for r, c in returned if c == i and r <= chosen]
        if not rounds:
            continue
        model.load_state_dict(returned[(max(rounds), i)])
        with torch.no_grad():
            pred = model(data.test_x).argmax(1).numpy()
        y = data.test_y.numpy()
        f1 = f1_score(y, pred, labels=np.unique(y), average="macro", zero_division=0)
        assert record.clients.pers_acc[i] == pytest.approx(accuracy_score(y, pred))
        assert record.clients.pers_f1[i] == pytest.approx(f1)
        checked += 1
    assert checked >= 3 and any(r == chosen for r, _ in returned)
    # Run.client_model gives the kept model back: each client's last training
    run = load_run(tmp_path / "run")
    for i in range(len(prepared.fed.clients)):
        rounds = [r for r, c in returned if c == i]
        if rounds:
            got = run.client_model(i).state_dict()
            want = returned[(max(rounds), i)]
            assert all(torch.equal(got[k], want[k]) for k in want)


# every built-in algorithm's `trained_model` -------------------------------------------------
WORKSPACE = {  # the model the workspace holds at the end of `fit` is the personalized one
    "fedavg": [],
    "fedprox": [],
    "moon": [],
    "local": [],
    "centralized": [],
    "ditto": [],
    "fedala": [],
    "fedbabu": ["algorithm.finetune_epochs=1"],
    "fedper": [],
    "fedrep": [],
    "fedpac": [],
    "fedclar": [],
    "fedsub": ["algorithm.max_clusters=2"],
    "fednh": [],
    "feddpa": [],
    "pfedme": [],
    "fedhome": ["algorithm.finetune_rounds=1"],  # round 2 fine-tunes the head
    "protohar": [],
    "fedproto": ["algorithm.inference=head"],
    "pfpl": [],
}
# by their method, these evaluate another model than the one the workspace trained last:
# APFL the mixture alpha*v + (1-alpha)*w, Per-FedAvg one step from the received model,
# FedRoD the summed heads, FedProto (default) its nearest-prototype head; FedBN and FedAli
# need other models and are covered by the runtime tests (fedali: tests/flower/test_flower.py).
NOT_THE_WORKSPACE = ["apfl", "perfedavg", "fedrod", "fedproto"]


def _after_round_1(name: str, *extra: str) -> RoundLoop:
    cfg = _cfg(f"algorithm.name={name}", "train.rounds=2", "train.clients_per_round=2", *extra)
    loop = simulate(prepare(cfg))
    loop.run_round(1)
    return loop


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(WORKSPACE))
def test_trained_model_is_the_model_the_client_holds_after_training(name):
    """Round 2 (after one aggregation, so FedPAC's message carries a combined head that its
    training replaces): `trained_model` of the message and the `FitResult` equals the
    workspace model's weights as `fit` left them, and is a complete model."""
    loop = _after_round_1(name, *WORKSPACE[name])
    p = loop.prepared
    cid = loop.sample(1)[0]  # trained in round 1: it has a state (POOLED for centralized)
    message = p.algorithm.configure(loop.server, cid, 2)
    result = run_fit(
        p.algorithm, p.model, p.cfg, p.client_data(cid, 2), message, cid, 2, loop.client_state(cid)
    )
    workspace = p.model.state_dict()
    trained = p.algorithm.trained_model(message, result)
    assert trained.keys() == workspace.keys()
    assert all(torch.equal(trained[k], workspace[k]) for k in workspace), name


@pytest.mark.integration
@pytest.mark.parametrize("name", NOT_THE_WORKSPACE)
def test_trained_model_of_the_other_methods_is_their_personalized_model_after_training(name):
    """Their personalized model built from what training left (the default hook, no override)."""
    loop = _after_round_1(name)
    p = loop.prepared
    cid = loop.sample(1)[0]
    message = p.algorithm.configure(loop.server, cid, 2)
    result = run_fit(
        p.algorithm, p.model, p.cfg, p.client_data(cid, 2), message, cid, 2, loop.client_state(cid)
    )
    got = p.algorithm.trained_model(message, result)
    assert got.keys() == p.model.state_dict().keys()
    state, reply = result.state, result.reply
    if name == "apfl":  # alpha * v + (1 - alpha) * w, with the trained w
        alpha = state["alpha"]["alpha"]
        want = {k: alpha * v + (1 - alpha) * reply[MODEL][k] for k, v in state["personal"].items()}
    elif name == "perfedavg":  # one step from the model received this round
        want = state["personal"]
    elif name == "fedrod":  # the trained generic model, head h_G + h_P
        want = {k: v + state["head"].get(k, 0) for k, v in reply[MODEL].items()}
    else:  # fedproto: the trained own model's body, the nearest-prototype head
        want = {k: v for k, v in state[MODEL].items() if not k.startswith("head.")}
    assert all(torch.allclose(got[k], want[k]) for k in want), name


@pytest.mark.integration
def test_kept_models_share_the_tensors_of_the_state():
    """Local's trained model is its state: in the serial engine keeping it costs nothing
    (from worker processes it is copied out of shared memory, one file descriptor a tensor)."""
    extra = ("algorithm.name=local", "eval.client_model=trained", "train.rounds=1")
    loop = simulate(prepare(_cfg(*extra, "train.workers=1")))
    loop.run()
    trained, states = loop.transport.trained, loop.transport.states
    assert trained is not None and trained.keys() == states.keys()
    for i, model in trained.items():
        assert all(t is states[i][MODEL][k] for k, t in model.items())
