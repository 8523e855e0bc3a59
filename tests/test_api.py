"""The public Python API: protofed.run, load_run, Run, and the examples of docs/python-api.md."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import protofed
from protofed.errors import ConfigError
from protofed.runtime import prepare

PYTHON_API_DOC = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"
DIGITS = {
    "data": {"name": "digits", "num_clients": 4, "alpha": 1.0},
    "model": {"name": "mlp", "hidden": [32]},
    "train": {"rounds": 3, "lr": 0.1, "threads": 1},
}


@pytest.fixture(scope="module")
def ditto_run(tmp_path_factory) -> protofed.Run:
    out = tmp_path_factory.mktemp("api") / "ditto"
    return protofed.run(DIGITS, out, algorithm={"name": "ditto"}, **{"eval.every": 1})


@pytest.mark.integration
def test_run_returns_the_run_and_its_typed_summary(ditto_run) -> None:
    s = ditto_run.summary
    assert s.algorithm == "ditto" and s.rounds == 3 and s.num_clients == 4
    assert s.engine == "builtin"
    assert s.as_dict() == protofed.load_run(ditto_run.path).summary.as_dict()
    assert ditto_run.path.is_dir() and (ditto_run.path / "summary.json").is_file()
    assert ditto_run.config.algorithm.name == "ditto" and ditto_run.config.eval.every == 1


def test_history_has_one_row_per_round_and_client(ditto_run) -> None:
    h = ditto_run.history
    assert len(h) == 3 * 4
    assert list(h["round"].unique()) == [1, 2, 3]
    assert set(h["client_name"]) == set(ditto_run.client_names)
    last = h[h["round"] == 3]
    assert last["pers_acc"].mean() == pytest.approx(ditto_run.summary.final.personalization.acc)


def test_loaded_models_reproduce_the_reported_scores(ditto_run) -> None:
    """Client i's model predicts its own test split with the personalization accuracy the
    run recorded for it; the global model scores the recorded global accuracy."""
    fed = prepare(ditto_run.config).fed
    last = ditto_run.history.query("round == 3").set_index("client")
    for i, client in enumerate(fed.clients):
        model = ditto_run.client_model(i)
        assert isinstance(model, torch.nn.Module) and not model.training
        with torch.no_grad():
            pred = model(client.test_x).argmax(1)
        acc = int((pred == client.test_y).sum()) / len(client.test_y)
        assert acc == pytest.approx(last.loc[i, "pers_acc"], abs=1e-9)
    x = torch.cat([c.test_x for c in fed.clients])
    y = torch.cat([c.test_y for c in fed.clients])
    with torch.no_grad():
        acc = int((ditto_run.global_model()(x).argmax(1) == y).sum()) / len(y)
    assert acc == pytest.approx(ditto_run.summary.final.global_.acc, abs=1e-9)
    # ditto's personal models differ from the global one
    g = ditto_run.global_model().state_dict()
    p = ditto_run.client_model(0).state_dict()
    assert any(not torch.equal(g[k], p[k]) for k in g)


def test_config_sources_and_overrides_agree(tmp_path) -> None:
    yaml_path = tmp_path / "c.yaml"
    yaml_path.write_text("data:\n  name: digits\ntrain:\n  rounds: 7\n")
    a = protofed.resolve_config(yaml_path, train={"lr": 0.2}, seed=4)
    b = protofed.resolve_config(
        {"data": {"name": "digits"}, "train": {"rounds": 7}}, **{"train.lr": 0.2, "seed": 4}
    )
    c = protofed.resolve_config(a)
    assert a == b == c and a.train.rounds == 7 and a.train.lr == 0.2 and a.seed == 4
    with pytest.raises(ConfigError, match="train.bogus"):
        protofed.resolve_config(None, **{"train.bogus": 1})
    with pytest.raises(ConfigError, match="config file not found"):
        protofed.resolve_config(tmp_path / "missing.yaml")


def test_an_unfinished_run_says_how_to_continue(tmp_path) -> None:
    class Stop(Exception):
        pass

    def stop(r, info, record):
        if r == 1:
            raise Stop

    with pytest.raises(Stop):
        protofed.run(DIGITS, tmp_path / "r", on_round=stop)
    run = protofed.load_run(tmp_path / "r")
    with pytest.raises(ConfigError, match="protofed.resume"):
        _ = run.summary
    assert len(run.history) == 4  # round 1 was evaluated before the stop
    assert isinstance(run.client_model(0), torch.nn.Module)  # round 1 was checkpointed
    rounds = []
    resumed = protofed.resume(tmp_path / "r", on_round=lambda r, info, record: rounds.append(r))
    assert rounds == [2, 3]  # from the checkpoint on
    whole = protofed.run(DIGITS, tmp_path / "whole")
    assert resumed.summary.final == whole.summary.final  # the numbers of an unbroken run
    assert protofed.resume(tmp_path / "r").summary.final == whole.summary.final  # finished


def _doc_examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PYTHON_API_DOC.read_text(), flags=re.S)


@pytest.mark.integration
def test_the_python_api_page_examples_run(tmp_path, monkeypatch) -> None:
    """Every python block of docs/python-api.md, in order, in one namespace (the README's
    own short example: tests/test_readme.py)."""
    examples = _doc_examples()
    assert len(examples) >= 4
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for code in examples:
        exec(compile(code, "python-api.md", "exec"), namespace)  # noqa: S102 - our own docs
    assert isinstance(namespace["run"], protofed.Run)
    assert np.isfinite(namespace["run"].summary.final.personalization.acc)
    # the custom algorithm really trains: at server_lr=1 it is FedAvg, number for number
    # (a fit that copied the weights before training would keep the initial model)
    same = {**namespace["digits"], "train": {"rounds": 2, "lr": 0.1}}
    step = protofed.run(same, out="step", algorithm={"name": "server_step", "server_lr": 1.0})
    fedavg = protofed.run(same, out="fedavg", algorithm={"name": "fedavg"})
    scores = ("personalization", "global_")
    assert [getattr(step.summary.final, s) for s in scores] == [
        getattr(fedavg.summary.final, s) for s in scores
    ]


def test_a_run_that_never_beats_chance_warns_the_python_caller(tmp_path) -> None:
    """The classic slip in a custom `fit`: the reply's weights copied before training, so
    the server never moves. The CLI prints the summary's warning; `protofed.run` warns."""
    from protofed.algorithms import ALGORITHMS
    from protofed.algorithms.base import MODEL, Algorithm, FitResult

    @protofed.register_algorithm
    class CopiesFirst(Algorithm):
        name = "copies_first"
        summary = "replies with the weights it received (a bug)"

        def fit(self, client, message, state):
            client.load(message[MODEL])
            return FitResult({MODEL: client.weights()}, client.train_model())

    try:
        with pytest.warns(RuntimeWarning, match="never beat chance.*try more rounds.*train.lr"):
            run = protofed.run(DIGITS, tmp_path / "r", algorithm={"name": "copies_first"})
        assert run.summary.warnings and "never beat chance" in run.summary.warnings[0]
    finally:
        ALGORITHMS.pop("copies_first")


def _as_numpy(r):
    from protofed.algorithms.base import FitResult

    return FitResult({"model": {k: v.numpy() for k, v in r.reply["model"].items()}})


def _fit_faults():
    from protofed.algorithms.base import FitResult

    return {
        "a dict": (lambda r: r.reply, "Bad.fit: must return a FitResult, not dict"),
        "one level": (
            lambda r: FitResult(r.reply["model"]),
            "Bad.fit: reply record 'head.weight' must be a dict of tensors, not Tensor",
        ),
        "numpy": (_as_numpy, "reply 'model.head.weight' must be a torch.Tensor, not ndarray"),
        "numpy metric": (
            lambda r: FitResult(r.reply, {"loss": np.float32(1.0)}),
            "Bad.fit: metric 'loss' must be a Python float, not float32",
        ),
        "no state": (
            lambda r: FitResult(r.reply, r.metrics, None),
            "Bad.fit: state must be a dict of records, not NoneType",
        ),
        "tensor metric": (
            lambda r: FitResult(r.reply, {"loss": torch.tensor(1.0)}),
            "Bad.fit: metric 'loss' must be a Python float, not Tensor",
        ),
    }


def _aggregate_faults():
    from protofed.algorithms.base import AggregateResult

    return {
        "Averaged": (lambda a: a, "Bad.aggregate: must return an AggregateResult, not Averaged"),
        "str metric": (
            lambda a: AggregateResult(a.records, {"n": "two"}),
            "Bad.aggregate: metric 'n' must be a Python float, not str",
        ),
    }


@pytest.mark.parametrize("case", [*_fit_faults(), *_aggregate_faults()])
def test_a_hook_returning_the_wrong_thing_is_named(tmp_path, case) -> None:
    """A custom algorithm's `fit` or `aggregate` returning the wrong shape of thing fails at
    once with the hook named, not deep in an engine."""
    from protofed.algorithms.fedavg import FedAvg
    from protofed.runs import RunDir
    from protofed.runtime import simulate

    fit, fit_error = _fit_faults().get(case, (None, None))
    aggregate, aggregate_error = _aggregate_faults().get(case, (None, None))

    class Bad(FedAvg):
        def fit(self, client, message, state):
            result = super().fit(client, message, state)
            return result if fit is None else fit(result)

        def aggregate(self, server, replies, server_round):
            if aggregate is None:
                return super().aggregate(server, replies, server_round)
            return aggregate(self.average(replies, reference=server))

    prepared = prepare(protofed.resolve_config(DIGITS, **{"model.hidden": []}))
    prepared.algorithm = Bad(prepared.algorithm.params, prepared.algorithm.setting)
    with pytest.raises(TypeError, match=re.escape(fit_error or aggregate_error)):
        simulate(prepared, RunDir.create(tmp_path / "r", {}, {}, "")).run()


def test_a_gpu_runs_models_load_where_there_is_no_gpu(ditto_run, tmp_path) -> None:
    """A run made with train.device=cuda: its models load on the CPU of a machine without
    a GPU (analysis on a laptop), weight for weight."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    copy = tmp_path / "gpu_run"
    shutil.copytree(ditto_run.path, copy)
    config = copy / "config.yaml"
    assert "  device: cpu\n" in config.read_text()
    config.write_text(config.read_text().replace("  device: cpu\n", "  device: cuda\n"))
    run = protofed.load_run(copy)
    assert run.config.train.device == "cuda" and run.device.type == "cpu"
    ours, theirs = run.client_model(0).state_dict(), ditto_run.client_model(0).state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_client_data_is_what_the_run_trained_and_was_scored_on(ditto_run) -> None:
    """Every client's splits: the sizes partition.json recorded, the very tensors
    `build_federated` makes from the run's config (seeded: rebuilt identical)."""
    import json

    from protofed.data.federated import build_federated

    part = json.loads((ditto_run.path / "partition.json").read_text())
    cfg = ditto_run.config
    fed = build_federated(cfg.data, cfg.seed)
    for i, recorded in enumerate(part["clients"]):
        for split in ("train", "val", "test"):
            x, y = ditto_run.client_data(i, split)
            assert len(x) == len(y) == recorded[split]
            assert torch.equal(x, getattr(fed.clients[i], f"{split}_x"))
            assert torch.equal(y, getattr(fed.clients[i], f"{split}_y"))


def test_client_data_faults_are_one_line_errors(ditto_run, tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"client 4 is not in this run \(0\.\.3\)"):
        ditto_run.client_data(4)
    with pytest.raises(ConfigError, match="split 'holdout' is not one of train, val, test"):
        ditto_run.client_data(0, "holdout")
    # data read from a root that is gone: the root and data_dir= named, on one line
    copy = tmp_path / "moved"
    shutil.copytree(ditto_run.path, copy)
    config = copy / "config.yaml"
    text = config.read_text().replace("name: digits", "name: arrays", 1)
    config.write_text(text.replace("  path: null\n", f"  path: {tmp_path / 'gone.npz'}\n", 1))
    with pytest.raises(ConfigError) as err:
        protofed.load_run(copy).client_data(0, data_dir=tmp_path / "nowhere")
    message = str(err.value)
    assert "\n" not in message and "data root" in message and "data_dir=" in message


def test_predict_is_the_client_models_argmax(ditto_run) -> None:
    """`predict` labels as the client's model does, and reproduces the personalization
    accuracy the run recorded; batching does not change an MLP's labels."""
    last = ditto_run.history.query("round == 3").set_index("client")
    for i in range(4):
        x, y = ditto_run.client_data(i, "test")
        pred = ditto_run.predict(i, x)
        with torch.no_grad():
            expected = ditto_run.client_model(i)(x).argmax(1)
        assert pred.dtype == torch.int64 and torch.equal(pred, expected)
        assert torch.equal(ditto_run.predict(i, x, batch_size=3), pred)
        acc = int((pred == y).sum()) / len(y)
        assert acc == pytest.approx(last.loc[i, "pers_acc"], abs=1e-9)
    with pytest.raises(ConfigError, match="client 9 is not in this run"):
        ditto_run.predict(9, x)


def test_scores_are_fractions_and_history_uses_the_reports_names(ditto_run) -> None:
    """One unit in the Python API (fractions in [0, 1]); the report's columns (%) carry
    the same names as `history`'s and `REPORT_COLUMNS` maps the summary's fields to them."""
    from protofed.api import REPORT_COLUMNS
    from protofed.report import METRICS, run_row

    h = ditto_run.history
    scores = ["pers_acc", "pers_f1", "gen_acc", "gen_f1", "val_acc", "val_f1"]
    scores += ["global_acc", "global_f1"]
    values = h[[c for c in scores if h[c].notna().any()]].to_numpy(dtype=float)
    assert ((values >= 0) & (values <= 1)).all()
    final = ditto_run.summary.final
    for record in ditto_run.summary.final, ditto_run.summary.selected:
        for part in (record.personalization, record.generalization):
            assert part is not None and 0 <= part.acc <= 1 and 0 <= part.f1 <= 1
    report_names = {name for name, _, _ in METRICS}
    shared = {"round", "pers_acc", "pers_f1", "gen_acc", "gen_f1", "train_loss"}
    shared |= {"global_acc", "global_f1"}
    assert shared <= set(h.columns) & report_names
    assert set(REPORT_COLUMNS.values()) <= report_names
    row = run_row(ditto_run.path, which="final")
    for field, column in REPORT_COLUMNS.items():
        section, key = field.split(".")
        part = getattr(final, section)
        if part is not None and getattr(part, key) is not None:
            assert row[column] == pytest.approx(100 * getattr(part, key))
    last = h[h["round"] == final.round]
    assert row["pers_f1"] == pytest.approx(100 * last["pers_f1"].mean())
