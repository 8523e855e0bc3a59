"""The public Python API: protofed.run, load_run, Run, and the README's examples."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import protofed
from protofed.errors import ConfigError
from protofed.runtime import prepare

README = Path(__file__).resolve().parents[1] / "README.md"
DIGITS = {
    "data": {"name": "digits", "num_clients": 4, "alpha": 1.0},
    "model": {"name": "mlp", "hidden": [32]},
    "train": {"rounds": 3, "lr": 0.1, "threads": 1},
}


@pytest.fixture(scope="module")
def ditto_run(tmp_path_factory) -> protofed.Run:
    out = tmp_path_factory.mktemp("api") / "ditto"
    return protofed.run(DIGITS, out, algorithm={"name": "ditto"}, **{"eval.every": 1})


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
    assert last["pers_acc"].mean() == pytest.approx(
        ditto_run.summary.final["personalization"]["acc"]
    )


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
    assert acc == pytest.approx(ditto_run.summary.final["global"]["acc"], abs=1e-9)
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
    with pytest.raises(ConfigError, match="--resume"):
        _ = run.summary
    assert len(run.history) == 4  # round 1 was evaluated before the stop
    assert isinstance(run.client_model(0), torch.nn.Module)  # round 1 was checkpointed


def _readme_examples() -> list[str]:
    text = README.read_text()
    section = text.split("## Python API", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_readme_python_api_examples_run(tmp_path, monkeypatch) -> None:
    """Every python block of the README's "Python API" section, in order, in one namespace."""
    examples = _readme_examples()
    assert len(examples) >= 4
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for code in examples:
        exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    assert isinstance(namespace["run"], protofed.Run)
    assert np.isfinite(namespace["run"].summary.final["personalization"]["acc"])
