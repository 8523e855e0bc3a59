"""Live tracking and provenance (docs/tracking.md): TensorBoard scalars equal to metrics.jsonl,
one plain line per evaluated round where stderr is a pipe, the progress bar's ETA, and
provenance.json (versions, git, the data file's sha256, sessions across a resume)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

import protofed
from protofed.cli import app
from protofed.core.results import RoundInfo, RoundRecord
from protofed.tracking import duration

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENV = {
    **os.environ,
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}
# scikit-learn's digits; max_update_norm only adds a server metric (no reply is that far)
DIGITS = [
    "data.name=digits",
    "data.num_clients=4",
    "model.name=mlp",
    "model.hidden=[16]",
    "train.rounds=4",
    "train.lr=0.1",
    "eval.every=2",
    "aggregation.max_update_norm=1000",
    "train.threads=1",  # 2 cores shared with other tests: no oversubscribed threads
]
EVERY_ROUND = {"train/loss", "time/train_s", "time/guard_s", "time/aggregate_s", "time/round_s"}
SCORES = {"acc", "acc_std", "f1", "f1_std"}
EVALUATED = (
    {f"{p}/{k}" for p in ("personalization", "generalization", "validation") for k in SCORES}
    | {"global/acc", "global/f1", "global/f1_std"}
    | {"comm/up_bytes", "comm/down_bytes", "time/eval_s"}
)


def _sets(overrides: list[str]) -> list[str]:
    return [arg for item in overrides for arg in ("-s", item)]


def _metric(record: dict, tag: str) -> float:
    """The metrics.jsonl value a TensorBoard tag stands for."""
    prefix, name = tag.split("/")
    if tag == "train/loss":
        return record["train_loss"]
    section = {"validation": "val"}.get(prefix, prefix)
    return record[section][name]


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {t: [(e.step, e.value) for e in events.Scalars(t)] for t in events.Tags()["scalars"]}


def _check_scalars(run: Path, rounds: int) -> None:
    """Each tag once per round (per evaluated round for scores), equal to metrics.jsonl."""
    records = {
        r["round"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    }
    scalars = _scalars(run / "tensorboard")
    server = {f"server/{k}" for k in records[rounds]["server"]}
    assert server, "the config was chosen to give a server metric"
    assert set(scalars) == EVERY_ROUND | EVALUATED | server
    for tag, points in scalars.items():
        steps = [s for s, _ in points]
        every = tag in EVERY_ROUND or tag in server
        assert steps == (list(range(1, rounds + 1)) if every else sorted(records)), tag
        for step, value in points:
            if step in records and tag != "time/round_s":
                assert value == pytest.approx(_metric(records[step], tag), rel=1e-6), tag


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`protofed run --log tensorboard` in a subprocess, stderr a pipe (as under nohup)."""
    out = tmp_path_factory.mktemp("cli") / "run"
    args = [str(BIN / "protofed"), "run", "--out", str(out), "--log", "tensorboard"]
    done = subprocess.run(
        [*args, *_sets(DIGITS)], env=ENV, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    return out, done


@pytest.mark.integration
def test_tensorboard_scalars_are_the_metrics_of_each_round(cli_run):
    out, _ = cli_run
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1
    _check_scalars(out, rounds=4)


def test_a_piped_stderr_gets_one_plain_line_per_evaluated_round(cli_run):
    """Round 1, not evaluated, gets a line without scores (the CLI's, issue 57)."""
    out, done = cli_run
    lines = [line for line in done.stderr.splitlines() if line.startswith("round ")]
    assert [line.split()[1] for line in lines] == ["1/4", "2/4", "4/4"]
    assert "F1" not in lines[0] and " s/round  ETA " in lines[0], lines[0]
    lines = lines[1:]
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    for line, record in zip(lines, records, strict=True):
        pers = f"pers F1 {100 * record['personalization']['f1']:.2f}%"
        assert f"loss {record['train_loss']:.4f}" in line and pers in line, line
        assert "gen F1 " in line and "global F1 " in line and " s/round  ETA " in line, line
    assert lines[-1].endswith("ETA 0s")
    assert "━" not in done.stderr  # no progress bar drawn into a log file


def test_a_cli_run_records_its_command_and_no_data_file_for_digits(cli_run):
    out, _ = cli_run
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["command"] == f"protofed run --out {out} --log tensorboard " + " ".join(
        f"-s '{s}'" if "[" in s else f"-s {s}" for s in DIGITS
    )
    assert prov["data"] == []  # scikit-learn's digits: its version is the provenance
    assert [(s["outcome"], s["engine"]) for s in prov["sessions"]] == [("complete", "builtin")]
    assert prov["end"] == prov["sessions"][0]["end"]


@pytest.mark.integration
def test_the_progress_bar_shows_eta_loss_and_score_when_forced_on(tmp_path, monkeypatch):
    monkeypatch.setenv("PROTOFED_PROGRESS", "1")
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--out", str(out), *_sets(DIGITS)])
    assert result.exit_code == 0, result.output
    bar = [line for line in result.stderr.splitlines() if "━" in line]
    assert bar, result.stderr
    final = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    pers = f"pers F1 {100 * final['personalization']['f1']:.2f}%"
    assert re.search(r"4/4 \d+:\d\d:\d\d ETA \d+:\d\d:\d\d loss \d\.\d{4}", bar[-1]), bar[-1]
    assert pers in bar[-1], bar[-1]
    assert not [line for line in result.stderr.splitlines() if line.startswith("round ")]


def test_log_values_and_a_missing_tensorboard_are_one_line_errors(tmp_path, monkeypatch):
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--out", str(out), "--log", "neptune", *_sets(DIGITS)])
    assert result.exit_code == 2 and "unknown --log 'neptune'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if the extra were not installed
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    result = runner.invoke(app, ["run", "--out", str(out), "--log", "tensorboard"])
    text = result.stderr.strip()
    assert result.exit_code == 2 and len(text.splitlines()) == 1, text
    assert "pip install 'protofed[tensorboard]'" in text and not out.exists()


def test_duration_reads_like_an_eta():
    assert [duration(s) for s in (0, 12.4, 288, 3600 + 125, -3)] == [
        "0s",
        "12s",
        "4m48s",
        "1h02m",
        "0s",
    ]


def _utc(stamp: str) -> dt.datetime:
    assert stamp.endswith("Z"), stamp
    return dt.datetime.fromisoformat(stamp[:-1] + "+00:00")


@pytest.mark.integration
def test_provenance_across_a_resume_with_tensorboard(tmp_path, shared_data):
    """Killed after round 3 of 4 (checkpoint at 2), resumed from the CLI: two sessions, the data
    file's sha256, the installed versions, and each round once in TensorBoard."""
    out = tmp_path / "run"
    config = {
        "data": {"name": "uci_har", "dir": str(shared_data), "num_clients": 4},
        "model": {"name": "mlp", "hidden": [16]},
        "train": {
            "rounds": 4,
            "checkpoint_every": 2,
            "lr": 0.1,
            "threads": 1,
            "clients_per_round": 2,
        },
        "aggregation": {"max_update_norm": 1000},
    }

    class Killed(Exception):
        pass

    def kill(r: int, info: RoundInfo, record: RoundRecord | None) -> None:
        if r == 3:
            raise Killed

    with pytest.raises(Killed):
        protofed.run(config, out, log="tensorboard", on_round=kill)
    first = json.loads((out / "provenance.json").read_text())
    assert first["sessions"][0]["outcome"] == "stopped" and first["end"] is None
    resumed = subprocess.run(
        [str(BIN / "protofed"), "run", "--resume", str(out), "--log", "tensorboard", "-q"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert resumed.returncode == 0, resumed.stderr

    prov = protofed.load_run(out).provenance
    assert prov == json.loads((out / "provenance.json").read_text())
    assert set(prov) == {
        *("protofed", "git", "python", "packages", "machine", "data"),
        *("command", "start", "end", "sessions"),
    }
    data = shared_data / "har" / "uci_har.npz"
    assert prov["data"] == [
        {
            "path": str(data.absolute()),
            "bytes": data.stat().st_size,
            "sha256": hashlib.sha256(data.read_bytes()).hexdigest(),
        }
    ]
    assert prov["protofed"] == version("protofed")
    assert prov["python"] == platform.python_version()
    assert prov["packages"] == {
        name: version(name) for name in ("torch", "numpy", "scikit-learn", "flwr")
    }
    assert prov["machine"]["cores"] == os.cpu_count() and prov["machine"]["device"] == "cpu"
    git = ["git", "-C", str(REPO)]
    if subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True).returncode == 0:
        commit = prov["git"]["commit"]  # HEAD when it ran (a commit may have come since)
        assert re.fullmatch("[0-9a-f]{40}", commit) and isinstance(prov["git"]["dirty"], bool)
        ancestor = [*git, "merge-base", "--is-ancestor", commit, "HEAD"]
        assert subprocess.run(ancestor, capture_output=True).returncode == 0, commit

    one, two = prov["sessions"]
    assert (one["command"], one["outcome"]) == ("python api", "stopped")
    assert two["command"] == f"protofed run --resume {out} --log tensorboard -q"
    assert two["outcome"] == "complete" and "changed" not in two  # same machine, same data
    assert prov["command"] == one["command"] and prov["start"] == one["start"]
    assert prov["end"] == two["end"]
    times = [_utc(t) for t in (one["start"], one["end"], two["start"], two["end"])]
    assert times == sorted(times)
    # round 3 ran twice (the kill came after it); TensorBoard shows it once, as metrics.jsonl
    _check_scalars(out, rounds=4)


def _mlflow_history(out: Path) -> tuple[object, str, dict[str, list[tuple[int, float]]]]:
    """The MLflow run a run directory logged to, read with MLflow's own client: the client,
    the run id and every metric's (step, value) history."""
    from mlflow.tracking import MlflowClient

    kept = json.loads((out / "mlflow_run.json").read_text())
    client = MlflowClient(kept["tracking_uri"])
    run = client.get_run(kept["run_id"])
    history = {
        key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        for key in run.data.metrics
    }
    return client, kept["run_id"], history


@pytest.fixture(autouse=True)
def _no_tracking_server(monkeypatch):
    """The default local stores, whatever the environment running the tests says."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.integration
def test_log_mlflow_writes_the_rounds_the_config_and_the_summary(tmp_path):
    """`--log mlflow`: a local store in RUN/mlruns/ whose run holds each round's scalars
    under TensorBoard's tags, equal to metrics.jsonl, the config as flattened params and
    the summary's reported scores."""
    pytest.importorskip("mlflow")
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--out", str(out), "--log", "mlflow", *_sets(DIGITS)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "mlruns" / "mlflow.db").is_file() and not (out / "mlruns").exists()
    client, run_id, history = _mlflow_history(out)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    records = {
        r["round"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    }
    server = {f"server/{k}" for k in records[4]["server"]}
    rounds = {k for k in history if not k.startswith(("final/", "selected/"))}
    assert rounds == EVERY_ROUND | EVALUATED | server
    for tag in rounds:
        steps = [s for s, _ in history[tag]]
        every = tag in EVERY_ROUND or tag in server
        assert steps == ([1, 2, 3, 4] if every else sorted(records)), tag
        if tag != "time/round_s":
            for step, value in history[tag]:
                if step in records:
                    assert value == pytest.approx(_metric(records[step], tag), rel=1e-12), tag
    summary = json.loads((out / "summary.json").read_text())
    for when in ("final", "selected"):
        for key in ("acc", "f1", "f1_std"):
            got = history[f"{when}/personalization/{key}"]
            assert got == [(4, pytest.approx(summary[when]["personalization"][key]))]
    params = run.data.params
    assert params["train.lr"] == "0.1" and params["data.name"] == "digits"
    assert params["model.hidden"] == "[16]" and params["algorithm.name"] == "fedavg"


@pytest.mark.integration
def test_a_resumed_run_logs_into_the_same_mlflow_run(tmp_path):
    """Killed after round 3 (checkpoint at 2), resumed: one MLflow run, each round logged
    by the session that ran it (round 3 twice, as documented)."""
    pytest.importorskip("mlflow")
    out = tmp_path / "run"
    config = {
        "data": {"name": "digits", "num_clients": 4},
        "model": {"name": "mlp", "hidden": [16]},
        "train": {"rounds": 4, "checkpoint_every": 2, "lr": 0.1, "threads": 1},
    }

    class Killed(Exception):
        pass

    def kill(r: int, info: RoundInfo, record: RoundRecord | None) -> None:
        if r == 3:
            raise Killed

    with pytest.raises(Killed):
        protofed.run(config, out, log="mlflow", on_round=kill)
    client, first_id, history = _mlflow_history(out)
    assert client.get_run(first_id).info.status == "KILLED"
    assert [s for s, _ in history["train/loss"]] == [1, 2, 3]
    protofed.resume(out, log="mlflow")
    client, run_id, history = _mlflow_history(out)
    assert run_id == first_id and client.get_run(run_id).info.status == "FINISHED"
    assert [s for s, _ in history["train/loss"]] == [1, 2, 3, 3, 4]
    assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == 1


TINY = {
    "data": {"name": "digits", "num_clients": 4},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"rounds": 2, "lr": 0.1, "threads": 1},
}


@pytest.mark.integration
def test_runs_under_one_root_share_one_mlflow_store(tmp_path, monkeypatch):
    """Two runs under one folder: one store beside them (ROOT/mlruns/), one experiment, one
    MLflow run each; $MLFLOW_TRACKING_URI moves a run elsewhere."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    root = tmp_path / "runs"
    for name in ("a", "b"):
        protofed.run(TINY, root / name, log="mlflow")
        assert not (root / name / "mlruns").exists()
    store = f"sqlite:///{(root / 'mlruns' / 'mlflow.db').as_posix()}"
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("protofed")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["a", "b"]
    assert {r.info.status for r in runs} == {"FINISHED"}
    for r in runs:
        kept = json.loads((root / r.info.run_name / "mlflow_run.json").read_text())
        assert kept == {"tracking_uri": store, "run_id": r.info.run_id}
        loss = json.loads((root / r.info.run_name / "metrics.jsonl").read_text().splitlines()[-1])
        history = client.get_metric_history(r.info.run_id, "train/loss")
        assert (history[-1].step, history[-1].value) == (2, pytest.approx(loss["train_loss"]))
    elsewhere = f"sqlite:///{(tmp_path / 'other.db').as_posix()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", elsewhere)
    protofed.run(TINY, root / "c", log="mlflow")
    assert len(client.search_runs([experiment.experiment_id])) == 2
    other = MlflowClient(elsewhere)
    found = other.search_runs([other.get_experiment_by_name("protofed").experiment_id])
    assert [r.info.run_name for r in found] == ["c"]


@pytest.mark.integration
def test_a_sweep_logs_every_run_into_one_mlflow_store(tmp_path):
    """`protofed sweep --log mlflow`, two runs at a time in nested folders: one store in the
    sweep's --out, one MLflow run per run, each FINISHED."""
    pytest.importorskip("mlflow")
    import yaml
    from mlflow.tracking import MlflowClient

    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "base": TINY,
                "grid": {"algorithm.name": ["fedavg", "local"]},
                "folder": "{algorithm.name}/s{seed}",
            }
        )
    )
    out = tmp_path / "sweep"
    args = [str(BIN / "protofed"), "sweep", str(spec), "--out", str(out), "-j", "2"]
    done = subprocess.run(
        [*args, "--log", "mlflow"], env=ENV, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.parent.name for p in out.rglob("mlflow.db")) == ["mlruns"]
    client = MlflowClient(f"sqlite:///{(out / 'mlruns' / 'mlflow.db').as_posix()}")
    runs = client.search_runs([client.get_experiment_by_name("protofed").experiment_id])
    assert sorted(r.data.tags["protofed.run_dir"] for r in runs) == [
        str(out / "fedavg" / "s0"),
        str(out / "local" / "s0"),
    ]
    assert {r.info.status for r in runs} == {"FINISHED"}


def _wandb_records(path: Path) -> list:
    """The records of an offline W&B run's `.wandb` file: LevelDB's log format (32 KiB
    blocks, each record a 7-byte header: crc32, length, type) after W&B's 7-byte header."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, parts, records = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            records.append(record)
            parts = b""
    return records


@pytest.mark.integration
def test_log_wandb_writes_an_offline_run_of_the_rounds_and_the_summary(tmp_path):
    """`--log wandb` with no API key: an offline W&B run whose history holds each round's
    scalars under TensorBoard's tags, equal to metrics.jsonl, its config and summary."""
    pytest.importorskip("wandb")
    out, folder = tmp_path / "run", tmp_path / "wandb_dir"
    folder.mkdir()
    env = {k: v for k, v in ENV.items() if not k.startswith("WANDB_")}
    env.update(
        WANDB_MODE="offline",
        WANDB_DIR=str(folder),
        WANDB_CONFIG_DIR=str(tmp_path / "wandb_config"),
        WANDB_CACHE_DIR=str(tmp_path / "wandb_cache"),
        WANDB_DATA_DIR=str(tmp_path / "wandb_data"),
        WANDB_ERROR_REPORTING="false",
        WANDB_SILENT="true",
        NETRC=str(tmp_path / "no.netrc"),
    )
    args = [str(BIN / "protofed"), "run", "--out", str(out), "--log", "wandb", *_sets(DIGITS)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    kept = json.loads((out / "wandb_run.json").read_text())
    assert kept["project"] == "protofed" and kept["mode"] == "offline"
    (run_file,) = folder.glob(f"wandb/offline-run-*-{kept['run_id']}/run-{kept['run_id']}.wandb")
    history: dict[int, dict[str, float]] = {}
    summary: dict[str, object] = {}
    config: dict[str, object] = {}
    exits = []
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            history[row.pop("_step")] = row
        elif kind == "summary":
            summary.update(
                {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.summary.update
                }
            )
        elif kind == "run":
            assert record.run.display_name == "run" and record.run.project == "protofed"
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "exit":
            exits.append(record.exit.exit_code)
    assert exits == [0]
    assert config["data"]["name"] == "digits" and config["model"]["hidden"] == [16]
    records = {
        r["round"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    }
    server = {f"server/{k}" for k in records[4]["server"]}
    assert sorted(history) == [1, 2, 3, 4]
    for step, row in history.items():
        tags = {k for k in row if not k.startswith("_")}
        expected = EVERY_ROUND | server | (EVALUATED if step in records else set())
        assert tags == expected, step
        for tag in tags - {"time/round_s"}:
            if step in records:
                assert row[tag] == pytest.approx(_metric(records[step], tag), rel=1e-12), tag
    reported = json.loads((out / "summary.json").read_text())
    for when in ("final", "selected"):
        for key in ("acc", "f1", "f1_std"):
            got = summary[f"{when}/personalization/{key}"]
            assert got == pytest.approx(reported[when]["personalization"][key])
    assert not (out / "wandb").exists()  # WANDB_DIR holds it


def test_a_missing_wandb_is_a_one_line_error(tmp_path, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the extra were not installed
    result = runner.invoke(app, ["run", "--out", str(out), "--log", "wandb"])
    text = result.stderr.strip()
    assert result.exit_code == 2 and len(text.splitlines()) == 1, text
    assert "pip install 'protofed[wandb]'" in text and not out.exists()


def test_wandb_runs_offline_unless_a_key_or_a_mode_says_otherwise(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from protofed.tracking import wandb_mode

    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no.netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"


def test_a_missing_mlflow_and_a_bad_log_value_are_one_line_errors(tmp_path, monkeypatch):
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--out", str(out), "--log", "tensorboard=x"])
    assert result.exit_code == 2 and "takes no value" in result.stderr and not out.exists()
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if the extra were not installed
    result = runner.invoke(app, ["run", "--out", str(out), "--log", "mlflow=http://x:5000"])
    text = result.stderr.strip()
    assert result.exit_code == 2 and len(text.splitlines()) == 1, text
    assert "pip install 'protofed[mlflow]'" in text and not out.exists()
    with pytest.raises(protofed.ConfigError, match=r"unknown --log 'nope' \(valid: .*mlflow"):
        protofed.run(out=out, log="nope")


def test_a_plugin_logger_gets_the_run_its_rounds_and_its_summary(tmp_path):
    """`register_logger(name)`: a logger of one's own, called as the built-in ones are."""
    from protofed import plugins
    from protofed.tracking import LOGGERS, register_logger

    calls: list[tuple] = []

    @register_logger("memory")
    class Memory:
        def __init__(self, value: str | None) -> None:
            calls.append(("built", value))

        def start(self, run) -> None:
            calls.append(("start", run.first_round, run.total, run.config["data"]["name"]))

        def log_round(self, scalars, step: int) -> None:
            calls.append(("round", step, "train/loss" in scalars))

        def close(self, summary) -> None:
            calls.append(("close", summary.rounds if summary is not None else None))

    try:
        protofed.run(
            {"data": {"name": "digits", "num_clients": 4}, "model": {"name": "mlp"}},
            tmp_path / "run",
            log="memory=label",
            train={"rounds": 2, "threads": 1},
        )
    finally:
        LOGGERS.pop("memory")
        plugins.DEFINITIONS.pop(("loggers", "memory"), None)
    built = [c for c in calls if c[0] == "built"]
    assert built and all(c == ("built", "label") for c in built)
    assert [c for c in calls if c[0] != "built"] == [
        ("start", 1, 2, "digits"),
        ("round", 1, True),
        ("round", 2, True),
        ("close", 2),
    ]
