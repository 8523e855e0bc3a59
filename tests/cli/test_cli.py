"""The command line as a user meets it: errors are one line, exit 2, and write nothing."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from protofed.cli import app

runner = CliRunner()
SMALL = [
    "-s",
    "data.num_clients=4",
    "-s",
    "model.name=mlp",
    "-s",
    "model.hidden=[16]",
    "-s",
    "train.rounds=2",
    "-q",
]


def _error_line(result) -> str:
    text = (result.stderr or result.output).strip()
    assert len(text.splitlines()) == 1, text
    return text


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["algorithm.name=fedavgg"], "did you mean 'fedavg'"),
        (["data.name=digitz"], "digits"),
        (["data.nme=digits"], "unknown config key 'data.nme' (did you mean 'data.name'?)"),
        (["model.alp.topkk=2"], "'model.alp.topkk' (did you mean 'model.alp.topk'?)"),
        (["zzz=1"], "unknown config key 'zzz'"),
        (["train.rounds=many"], "train.rounds"),
        (["data.alpha=0"], "data.alpha"),
        (["data.alpha=-1"], "data.alpha"),
        (["data.num_clients=5000", "data.partition=iid"], "data.num_clients"),
        (["algorithm.mu=0.1"], "algorithm.mu"),
        (["data.name=uci_har", "data.dir=/nonexistent"], "/nonexistent"),
        (["data.name=arrays", "data.path=/nonexistent/x.npz"], "/nonexistent/x.npz"),
        (["model.name=resnet99"], "model.name"),
        (["eval.client_model=kept"], "eval.client_model"),
        (["eval.f1_labels=all"], "eval.f1_labels"),
        (["eval.client_model=trained", "eval.trained_memory_mb=0.5"], "eval.trained_memory_mb"),
        (["seed=-1"], "'seed'"),
        (["data.image_size=100000"], "data.image_size"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, overrides, expected):
    out = tmp_path / "run"
    args = ["run", "--out", str(out), "-q"]
    for o in overrides:
        args += ["-s", o]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert expected in _error_line(result)
    assert not out.exists()


def test_a_yaml_error_names_its_line_and_column(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("train:\n  rounds: [1, 2\nseed: 3\n")
    line = _error_line(runner.invoke(app, ["run", str(config), "--out", str(tmp_path / "r")]))
    assert "bad.yaml: not valid YAML" in line and "line 3 column 5" in line, line


def test_missing_config_file(tmp_path):
    result = runner.invoke(app, ["run", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert "nope.yaml" in _error_line(result)


def test_a_folder_where_a_file_goes_and_a_file_where_a_folder_goes(tmp_path):
    result = runner.invoke(app, ["run", str(tmp_path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "is a folder" in _error_line(result)
    a_file = tmp_path / "data.txt"
    a_file.write_text("")
    result = runner.invoke(app, ["data", "list", "--data-dir", str(a_file)])
    assert result.exit_code == 2 and "--data-dir" in _error_line(result)
    assert not (tmp_path / "r").exists()


@pytest.mark.integration
def test_run_then_report(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert runner.invoke(app, ["run", "--out", str(a), *SMALL]).exit_code == 0
    res = runner.invoke(app, ["run", "--out", str(b), *SMALL, "-s", "algorithm.name=local"])
    assert res.exit_code == 0, res.output
    again = runner.invoke(app, ["run", "--out", str(a), *SMALL])
    assert again.exit_code == 2 and "already exists" in _error_line(again)
    result = runner.invoke(
        app, ["report", str(a), str(b), "--group-by", "none", "--out", str(tmp_path / "cmp")]
    )
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((tmp_path / "cmp.csv").open()))
    assert [r["algorithm"] for r in rows] == ["fedavg", "local"]
    assert rows[1]["global_acc"] == ""
    md = (tmp_path / "cmp.md").read_text()
    assert md.count("\n| ") == 2 and "fedavg" in md
    resumed = runner.invoke(app, ["run", "--resume", str(a)])
    assert resumed.exit_code == 0 and "already complete" in resumed.output


def test_report_of_an_unfinished_run_is_an_error(tmp_path):
    import protofed

    class Stop(Exception):
        pass

    def stop(r, info, record):
        raise Stop  # after round 1 of 2: a run killed before its summary

    config = {"data": {"num_clients": 4}, "model": {"name": "mlp", "hidden": [16]}}
    with pytest.raises(Stop):
        protofed.run(config, tmp_path / "r", on_round=stop, **{"train.rounds": 2})
    assert not (tmp_path / "r" / "summary.json").exists()
    for target in (tmp_path / "r", tmp_path):  # the run itself, or the folder holding it
        result = runner.invoke(app, ["report", str(target)])
        assert result.exit_code == 2
        line = _error_line(result)
        assert "no finished run" in line and "unfinished (resume it)" in line, line
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["report", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "no run directory" in _error_line(result)


def test_list_names_every_part():
    from protofed.algorithms import ALGORITHMS
    from protofed.data import DATASETS, PARTITIONERS
    from protofed.models import MODELS

    result = runner.invoke(app, ["list"], env={"COLUMNS": "250"})
    assert result.exit_code == 0
    rows = {}  # first word -> the rest of its line, under each table's title
    for line in result.output.splitlines():
        if line.startswith(" ") and line.strip():
            name, _, rest = line.strip().partition(" ")
            rows[name] = rest.strip()
    described = {
        **{n: c.summary for n, c in ALGORITHMS.items()},
        **{n: d.description for n, d in DATASETS.items()},
        **{n: p[0] if isinstance(p, tuple) else p.description for n, p in PARTITIONERS.items()},
        **{n: m.description for n, m in MODELS.items()},
    }
    assert len(described) > 50 and set(rows) == set(described)  # every part, nothing else
    for name, text in described.items():
        assert rows[name] == text, name


@pytest.mark.integration
def test_entry_point_exit_code(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "protofed.cli",
            "run",
            "-s",
            "algorithm.name=nope",
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error:") and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_bring_your_own_table_end_to_end(tmp_path):
    """A CSV the library has never seen: natural clients from its group column."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    rows = []
    for person in range(5):
        shift = rng.normal(0, 0.3, size=4)
        for label in ("walk", "sit", "run"):
            centre = {"walk": 0.0, "sit": 2.0, "run": -2.0}[label]
            for _ in range(20):
                f = rng.normal(centre, 0.5, size=4) + shift
                rows.append(
                    {"who": f"p{person}", "activity": label, **{f"f{i}": f[i] for i in range(4)}}
                )
    path = tmp_path / "mine.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "run",
            "--out",
            str(out),
            "-q",
            "-s",
            "data.name=arrays",
            "-s",
            f"data.path={path}",
            "-s",
            "data.label_column=activity",
            "-s",
            "data.group_column=who",
            "-s",
            "data.partition=natural",
            "-s",
            "model.name=mlp",
            "-s",
            "model.hidden=[16]",
            "-s",
            "train.rounds=5",
            "-s",
            "train.lr=0.1",
            "-s",
            "train.local_epochs=5",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_clients"] == 5
    assert summary["final"]["global"]["acc"] > 0.9  # well-separated blobs


def test_info_lists_hyperparameters():
    result = runner.invoke(app, ["info", "fedprox"])
    assert result.exit_code == 0 and "mu" in result.output and "0.01" in result.output
    assert runner.invoke(app, ["info", "fedproxx"]).exit_code == 2


def _natural_npz(path):
    """A small labelled set of 5 natural groups (subjects), 3 classes, 8 features."""
    import numpy as np

    rng = np.random.default_rng(0)
    y = np.tile(np.arange(3), 100)
    X = (rng.normal(size=(300, 8)) + y[:, None]).astype(np.float32)
    np.savez(path, X=X, y=y, group=np.repeat(np.arange(5), 60))
    return path


def _kill_at(stop: int):
    class Killed(Exception):
        pass

    def kill(r, info, record):
        if r == stop:
            raise Killed

    return Killed, kill


@pytest.mark.integration
def test_a_natural_partition_records_the_clients_it_built_and_resumes(tmp_path):
    """5 groups, data.num_clients left at 10: config.yaml says 5 (and so does the summary);
    killed after its checkpoint, it resumes; a run written before (config.yaml and the
    checkpoint's fingerprint holding the configured 10) still resumes too."""
    import shutil

    import torch
    import yaml

    import protofed

    data = {"name": "arrays", "path": str(_natural_npz(tmp_path / "g.npz"))}
    config = {
        "data": {**data, "partition": "natural"},
        "model": {"name": "mlp", "hidden": [8]},
        "train": {"rounds": 3, "checkpoint_every": 1, "threads": 1},
    }
    out = tmp_path / "new"
    Killed, kill = _kill_at(2)
    with pytest.raises(Killed):
        protofed.run(config, out, on_round=kill)
    written = yaml.safe_load((out / "config.yaml").read_text())
    assert written["data"]["num_clients"] == 5 and written["data"]["partition"] == "natural"
    old = tmp_path / "old"
    shutil.copytree(out, old)
    # the same run as an earlier version wrote it: the configured count in both places
    cfg = old / "config.yaml"
    text = cfg.read_text().replace("num_clients: 5", "num_clients: 10", 1)
    cfg.write_text(text.replace("  clients: all\n", "", 1))  # written before data.clients
    assert "clients:" not in cfg.read_text().split("alpha:")[0].split("num_clients:")[1]
    ckpt = torch.load(old / "checkpoint.pt", weights_only=True)
    fp = json.loads(ckpt["fingerprint"]["config"])
    assert fp["data.num_clients"] == 5
    fp["data.num_clients"] = 10
    ckpt["fingerprint"]["config"] = json.dumps(fp, sort_keys=True)
    torch.save(ckpt, old / "checkpoint.pt")
    for path in (out, old):
        done = protofed.resume(path)
        assert done.summary.num_clients == 5 and done.summary.rounds == 3
    assert protofed.load_run(out).history.equals(protofed.load_run(old).history)
    # three of the five groups, drawn from the seed: recorded as asked, and resumed
    picked = tmp_path / "picked"
    with pytest.raises(Killed):
        protofed.run(
            {**config, "data": {**config["data"], "num_clients": 3}}, picked, on_round=kill
        )
    assert yaml.safe_load((picked / "config.yaml").read_text())["data"]["num_clients"] == 3
    done = protofed.resume(picked)
    assert done.summary.num_clients == 3 and done.summary.rounds == 3


def test_version_prints_the_version():
    import protofed

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"protofed {protofed.__version__}"


def test_the_cli_starts_without_the_heavy_packages():
    """`protofed --help` imports neither torch nor scikit-learn, scipy, pandas, matplotlib
    or flwr (benchmarks/cli_startup.py times it); `protofed list` with its listing kept
    neither."""
    heavy = ["torch", "sklearn", "scipy", "pandas", "matplotlib", "flwr"]
    probe = f"import sys, protofed.cli; print(','.join(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout + done.stderr


@pytest.mark.integration
def test_fedavgs_generalization_shows_no_spread(tmp_path):
    """Every FedAvg client holds the same model: its generalization score has no spread
    across clients, so the summary says "(one model)" instead of "± 0.00"."""
    out = tmp_path / "fedavg"
    result = runner.invoke(app, ["run", "--out", str(out), "-s", "algorithm.name=fedavg", *SMALL])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "generalization" in line)
    assert "(one model)" in row and "±" not in row
    pers = next(line for line in result.output.splitlines() if "personalization" in line)
    caption = " ".join(result.output.split())  # however the terminal wrapped it
    assert "±" in pers and "one model: every client holds the same model" in caption
