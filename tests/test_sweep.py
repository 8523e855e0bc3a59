"""`protofed sweep`: a grid times seeds on real data (scikit-learn's digits), side by side,
killed and resumed to the same numbers, and every bad spec refused before anything runs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from protofed import api
from protofed.cli import app
from protofed.runs import RunDir
from protofed.sweep import load_spec

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
BASE = {
    "data": {"name": "digits", "num_clients": 4},
    "model": {"name": "mlp", "hidden": [16]},
    "train.rounds": 10,
    "train.lr": 0.1,
    "train.threads": 1,
}
NAMES = ["fedavg_s0", "local_s0", "fedavg_s1", "local_s1"]


def _spec(path: Path, **changes) -> Path:
    spec = {"base": BASE, "grid": {"algorithm.name": ["fedavg", "local"]}, "seeds": [0, 1]}
    spec.update(changes)
    spec = {k: v for k, v in spec.items() if v is not None}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _sweep_process(*args: str) -> subprocess.Popen:
    """`protofed sweep` in its own process (to be interrupted)."""
    cmd = [sys.executable, "-m", "protofed", "sweep", *args]
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """The 2 x 2 sweep run uninterrupted, two runs at a time."""
    tmp = tmp_path_factory.mktemp("sweep")
    out = tmp / "out"
    spec = str(_spec(tmp / "spec.yaml"))
    done = runner.invoke(app, ["sweep", spec, "--out", str(out), "--workers", "2"])
    assert done.exit_code == 0, done.output
    lines = [line.split() for line in done.stderr.splitlines()]  # one per run, as it ends
    assert sorted(w[0] for w in lines) == sorted(NAMES) and {w[1] for w in lines} == {"complete"}
    return out


@pytest.mark.integration
def test_grid_times_seeds_runs_to_completion(whole: Path) -> None:
    for name in NAMES:
        summary = json.loads((whole / name / "summary.json").read_text())
        assert summary["status"] == "complete" and summary["rounds"] == 10
        assert summary["algorithm"] == name.split("_")[0] and summary["seed"] == int(name[-1])
        assert (whole / f"{name}.log").read_text().startswith("#")
    record = yaml.safe_load((whole / "sweep.yaml").read_text())
    assert list(record["runs"]) == NAMES
    assert record["runs"]["local_s1"]["changes"] == {"algorithm.name": "local", "seed": 1}
    # the seeds give different partitions, hence different scores
    f1 = [
        json.loads((whole / n / "summary.json").read_text())["final"]
        for n in ("fedavg_s0", "fedavg_s1")
    ]
    assert f1[0] != f1[1]


@pytest.mark.integration
def test_rerun_skips_finished_runs_and_reports_a_locked_one(whole: Path, tmp_path: Path) -> None:
    spec = _spec(tmp_path / "spec.yaml")
    before = {n: (whole / n / "summary.json").stat().st_mtime_ns for n in NAMES}
    held = RunDir(whole / "local_s0")
    held.lock()  # another process writing this run
    try:
        result = runner.invoke(app, ["sweep", str(spec), "--out", str(whole)])
    finally:
        held.unlock()
    assert result.exit_code == 1, result.output
    assert "local_s0  busy" in result.stderr and "in use by another process" in result.stderr
    assert result.stderr.count("skipped") == 3
    assert before == {n: (whole / n / "summary.json").stat().st_mtime_ns for n in NAMES}


def test_a_run_another_sweep_started_meanwhile_is_busy_not_failed(tmp_path: Path) -> None:
    """Two sweeps on one folder (the second with --only): a run the first looked at as new
    and the second has started since is reported busy, and nothing is launched over it."""
    from protofed.sweep import RunState, SweepScheduler

    runs = load_spec(_spec(tmp_path / "spec.yaml")).expand()[:2]
    out = tmp_path / "out"
    started = RunDir.create(out / runs[0].name, runs[0].config.to_dict(), {}, "")
    started.unlock()  # its config.yaml written, its child not yet holding the lock
    held = RunDir(out / runs[1].name)
    (out / runs[1].name).mkdir(parents=True)
    held.lock()
    try:
        states = {r.name: RunState("start") for r in runs}
        result = SweepScheduler(out, states, workers=1).run(runs)
    finally:
        held.unlock()
    assert [o.status for o in result.outcomes] == ["busy", "busy"]
    assert "since this sweep looked" in result.outcomes[0].detail
    assert "in use by another process" in result.outcomes[1].detail
    assert not (out / f"{runs[0].name}.log").exists()  # no child was started
    assert started.path.is_dir()


@pytest.mark.integration
def test_killed_sweep_resumes_to_the_uninterrupted_numbers(tmp_path: Path) -> None:
    """A short and a long run side by side; Ctrl-C once the short one is written. The long
    one is 25 times the short (not 7.5: on an idle machine 30 tiny rounds ended before the
    signal)."""
    spec = _spec(tmp_path / "spec.yaml", grid={"train.rounds": [4, 100]}, seeds=None)
    out = tmp_path / "out"
    proc = _sweep_process(str(spec), "--out", str(out), "--workers", "2")
    short, long = out / "rounds=4", out / "rounds=100"
    deadline = time.monotonic() + 90
    while not (
        (short / "summary.json").exists()
        and len(RunDir(long).history()) >= 2
        and (long / "checkpoint.pt").exists()
    ):
        assert proc.poll() is None and time.monotonic() < deadline, "sweep ended too early"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # Ctrl-C: the sweep stops its child, which checkpoints
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "rounds=100  interrupted" in err
    assert not (long / "summary.json").exists()
    short_mtime = (short / "summary.json").stat().st_mtime_ns

    again = runner.invoke(app, ["sweep", str(spec), "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert "rounds=4  skipped" in again.stderr and "rounds=100  complete" in again.stderr
    assert (short / "summary.json").stat().st_mtime_ns == short_mtime
    log = (out / "rounds=100.log").read_text()
    assert "(start)" in log and "(resume)" in log
    rounds = [r["round"] for r in RunDir(long).history()]
    assert rounds == list(range(1, 101))
    whole = api.run(out / "rounds=100.yaml", tmp_path / "whole")  # the same config, unbroken
    b = json.loads((long / "summary.json").read_text())
    a = whole.summary.to_json()
    assert a["final"] == b["final"] and a["selected"] == b["selected"]


def _one_line_error(result) -> str:
    text = result.stderr.strip()
    assert result.exit_code == 2, result.output
    assert len(text.splitlines()) == 1, text
    return text


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"grid": {"train.roundz": [1, 2]}}, "unknown config key 'train.roundz'"),
        ({"grid": {"algorithm.name": "fedavg"}}, "grid 'algorithm.name': a list of values"),
        ({"grid": {"algorithm.name": []}}, "grid 'algorithm.name' is empty"),
        ({"seeds": []}, "'seeds'"),
        ({"base": {**BASE, "train.rounds": -1}}, "invalid value for 'train.rounds'"),
        ({"grid": {"train.rounds": [2, -1]}}, "run train.rounds=-1 seed=0: invalid value"),
        ({"grid": {"algorithm.name": ["fedavg", "fedavgg"]}}, "did you mean 'fedavg'"),
        ({"grid": {"algorithm.mu": [0.1]}}, "unknown config key 'algorithm.mu'"),
        ({"seedz": [0]}, "unknown key 'seedz'"),
        ({"folder": "fixed"}, "two runs are named 'fixed'"),
        ({"folder": "x" * 235 + "_{seed}"}, "is 237 bytes, over the 236"),  # .yaml's temp
        ({"folder": "x" * 256 + "/{seed}"}, "is 256 bytes, over the 255"),
        ({"config": "nowhere.yaml"}, "config file not found: nowhere.yaml"),
        (
            {"base": {**BASE, "data": {"name": "uci_har", "dir": "/nonexistent"}}},
            "data set 'uci_har' is not in /nonexistent",
        ),
    ],
)
def test_bad_spec_is_one_line_and_creates_nothing(tmp_path: Path, changes, expected) -> None:
    spec = _spec(tmp_path / "spec.yaml", **changes)
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", str(spec), "--out", str(out)])
    assert expected in _one_line_error(result)
    assert not out.exists()


@pytest.mark.integration
def test_a_folder_made_from_another_spec_is_refused(whole: Path, tmp_path: Path) -> None:
    spec = _spec(tmp_path / "spec.yaml", seeds=[0, 1, 2])
    for dry in ([], ["--dry-run"]):
        result = runner.invoke(app, ["sweep", str(spec), "--out", str(whole), *dry])
        assert "different sweep spec (added: fedavg_s2, local_s2)" in _one_line_error(result)
    assert not (whole / "fedavg_s2").exists()
    # --force goes on with the new spec; its dry run says what it would do
    result = runner.invoke(app, ["sweep", str(spec), "--out", str(whole), "--dry-run", "--force"])
    assert result.exit_code == 0, result.output
    assert "6 runs (4 skip, 2 start)" in result.stdout
    assert "fedavg_s2  [start] algorithm.name=fedavg seed=2" in result.stdout


@pytest.mark.integration
def test_a_folder_from_before_a_new_config_key_still_resumes(whole: Path, tmp_path: Path) -> None:
    """A newer protofed adds config keys (eval.unseen_clients, say): the record's digests of
    an unchanged spec then differ, but each run's config as written, read by this version,
    is the same experiment, so the folder is accepted; a real change is still refused."""
    import shutil

    from protofed.sweep import config_digest

    out = tmp_path / "out"
    shutil.copytree(whole, out)
    record = yaml.safe_load((out / "sweep.yaml").read_text())
    for name in NAMES:  # as an older protofed, without the key, wrote them
        written = yaml.safe_load((out / f"{name}.yaml").read_text())
        del written["eval"]["unseen_clients"]  # an execution key would not move the digest
        (out / f"{name}.yaml").write_text(yaml.safe_dump(written))
        record["runs"][name]["config_sha256"] = config_digest(written)
    (out / "sweep.yaml").write_text(yaml.safe_dump(record))
    spec = str(_spec(tmp_path / "spec.yaml"))
    result = runner.invoke(app, ["sweep", spec, "--out", str(out), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "4 runs (4 skip)" in result.stdout
    written = yaml.safe_load((out / "local_s1.yaml").read_text())
    written["train"]["lr"] = 0.5  # this run was made with another learning rate
    (out / "local_s1.yaml").write_text(yaml.safe_dump(written))
    result = runner.invoke(app, ["sweep", spec, "--out", str(out), "--dry-run"])
    assert "different sweep spec (changed: local_s1)" in _one_line_error(result)


def test_dry_run_lists_the_runs_and_their_differences(tmp_path: Path) -> None:
    spec = _spec(tmp_path / "spec.yaml")
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", str(spec), "--out", str(out), "--dry-run"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines[:4]] == NAMES
    assert lines[1].split()[1:] == ["algorithm.name=local", "seed=0"]
    assert not out.exists()


def test_names_templates_and_variants(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({"data": {"name": "digits"}}))
    spec = _spec(
        tmp_path / "spec.yaml",
        config="base.yaml",  # beside the spec
        grid={"algorithm.name": ["fedprox"], "algorithm.mu": [0.01, 0.1]},
        seeds=[3],
        folder="{run}/{algorithm.name}_mu{algorithm.mu}_s{seed}",
        runs=[
            {"name": "a/x y", "set": {"train.rounds": 2}},
            {"name": "b", "grid": {}, "seeds": [0], "folder": "b_{model.name}"},
        ],
    )
    runs = load_spec(spec).with_overrides(["train.lr=0.5"]).expand()
    assert [r.name for r in runs] == [
        "a/x-y/fedprox_mu0.01_s3",
        "a/x-y/fedprox_mu0.1_s3",
        "b_mlp",
    ]
    assert runs[0].config.train.rounds == 2 and runs[2].config.train.rounds == 10
    assert {r.config.train.lr for r in runs} == {0.5}
    assert runs[1].changes == {
        "train.rounds": 2,
        "algorithm.name": "fedprox",
        "algorithm.mu": 0.1,
        "seed": 3,
    }
    shortened = load_spec(spec).with_overrides(["train.rounds=1"]).expand()  # beats `set`
    assert shortened[1].config.train.rounds == 1 and shortened[1].changes["train.rounds"] == 1


# the product's example specs, then the papers' reproduction grids
SPEC_DIRS = (ROOT / "configs" / "sweeps", ROOT / "experiments" / "sweeps")
SHIPPED_SPECS = [path for folder in SPEC_DIRS for path in sorted(folder.glob("*.yaml"))]


@pytest.mark.parametrize("path", SHIPPED_SPECS, ids=str)
def test_every_shipped_sweep_expands_and_validates(path: Path) -> None:
    runs = load_spec(path).expand()  # configs and names checked; no data read
    assert runs and len({r.name for r in runs}) == len(runs)


def test_the_sweeps_page_lists_every_shipped_spec_with_its_run_count() -> None:
    """docs/sweeps.md's table of shipped specs: each spec once, with the runs it expands to."""
    listed: dict[str, int] = {}
    for line in (ROOT / "docs" / "sweeps.md").read_text().splitlines():
        cells = line.split(" | ")
        names = re.findall(r"`([\w.-]+\.yaml)`", cells[0])
        if len(cells) < 3 or not names:
            continue
        counts = [int(n) for n in re.findall(r"\d+", cells[1].replace("(GPU)", ""))]
        assert len(counts) == len(names), line
        for name, count in zip(names, counts, strict=True):
            assert name not in listed, f"{name} listed twice"
            listed[name] = count
    shipped = {p.name: len(load_spec(p).expand()) for p in SHIPPED_SPECS}
    assert len(shipped) == len(SHIPPED_SPECS), "a spec name in both folders"
    assert listed == shipped


def test_the_experiments_readme_lists_every_page_spec_and_script() -> None:
    """experiments/README.md names each results page, reproduction spec and script once."""
    experiments = ROOT / "experiments"
    readme = (experiments / "README.md").read_text()
    listed = set(re.findall(r"`((?:sweeps|scripts)/[\w.-]+)`", readme))
    listed |= set(re.findall(r"\]\((results/[\w.-]+\.md)\)", readme))
    present = {
        p.relative_to(experiments).as_posix()
        for pattern in ("results/*.md", "sweeps/*.yaml", "scripts/*.py")
        for p in experiments.glob(pattern)
    }
    assert present and listed == present


def _read_back(config: dict) -> dict:
    """`config` as `RunDir.config` reads it from a run directory's config.yaml."""
    import tempfile

    from protofed.runs import RunDir

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.yaml").write_text(yaml.safe_dump(config))
        return RunDir(folder).config()


def test_a_natural_run_that_recorded_its_client_count_is_the_spec_s_run():
    """A natural partition's run over every group writes the clients it built
    (`num_clients: 9`, `clients: all` for HHAR's 9 users) into config.yaml; the sweep must
    still see it as the spec's run (not "changed"), and so a run written before data.clients
    (`num_clients` as recorded, no `clients`). A spec that draws 3 groups is another run."""
    from protofed.config import build_config
    from protofed.sweep import config_digest

    spec = build_config({"data": {"name": "digits", "partition": "natural"}})
    recorded = spec.model_copy(deep=True)
    recorded.data.clients = "all"
    recorded.data.num_clients = 9
    assert config_digest(spec) == config_digest(recorded)
    before = {**recorded.to_dict(), "data": {**recorded.to_dict()["data"], "num_clients": 10}}
    del before["data"]["clients"]
    assert config_digest(spec) == config_digest(build_config(_read_back(before)))
    three = spec.model_copy(deep=True)
    three.data.num_clients = 3
    assert config_digest(three) != config_digest(spec)
    other = spec.model_copy(deep=True)
    other.data.partition = "iid"
    moved = other.model_copy(deep=True)
    moved.data.num_clients = 9
    assert config_digest(other) != config_digest(moved)  # elsewhere the count is the experiment
