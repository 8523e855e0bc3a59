"""What protofed promises when things go wrong (docs/reliability.md), one test per fault.

A resume that cannot continue a different run; divergence stopped and reported; every bad
file or failing disk a one-line error with exit code 2 and nothing half-written; SIGTERM
and Ctrl-C that stop cleanly; a run directory one process at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
import yaml
from typer.testing import CliRunner

from protofed import load_run
from protofed.cli import app
from protofed.config import load_config
from protofed.core.files import atomic_write_text
from protofed.errors import ConfigError, RunComplete
from protofed.runs import RunDir
from protofed.runtime import resume, start

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}
SMALL = [
    "data.name=digits",
    "data.num_clients=4",
    "model.name=mlp",
    "model.hidden=[16]",
    "train.rounds=4",
    "train.lr=0.1",
]


def _sets(overrides: list[str]) -> list[str]:
    return [arg for item in overrides for arg in ("-s", item)]


def _one_error_line(result, *fragments: str) -> str:
    """The run failed with exit code 2 on one line, no traceback, naming `fragments`."""
    text = (result.stderr or result.output).strip()
    assert result.exit_code == 2, (result.exit_code, text, result.exception)
    assert len(text.splitlines()) == 1 and "Traceback" not in text, text
    for fragment in fragments:
        assert fragment in text, (fragment, text)
    return text


class Killed(Exception):
    pass


def _killed_run(path: Path, after: int = 2, *extra: str) -> Path:
    """A run stopped by an exception right after round `after` (its checkpoint written:
    every round's, not where the time-based default would put it)."""

    def kill(r: int, info: dict, record: dict | None) -> None:
        if r == after:
            raise Killed

    every_round = [*SMALL, "train.checkpoint_every=1", *extra]
    with pytest.raises(Killed):
        start(load_config(None, every_round), path).run(on_round=kill)
    return path


def _snapshot(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file()}


# 1. a resume that cannot lie -----------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("algorithm.name", "ditto", "algorithm.name 'fedavg' -> 'ditto'"),
        ("data.num_clients", 5, "data.num_clients 4 -> 5"),
        ("model.hidden", [32], "model.hidden [16] -> [32]"),
    ],
)
def test_resume_refuses_an_edited_config(tmp_path, key, value, named):
    run = _killed_run(tmp_path / "run")
    raw = yaml.safe_load((run / "config.yaml").read_text())
    section, name = key.split(".")
    raw[section][name] = value
    (run / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    before = _snapshot(run)
    result = runner.invoke(app, ["run", "--resume", str(run)])
    _one_error_line(result, "cannot resume", "round 2", named)
    assert _snapshot(run) == before  # nothing rewritten


@pytest.mark.integration
def test_resume_refuses_changed_data_and_another_protofed_version(tmp_path):
    X = np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32)
    y = np.arange(300) % 3
    data = tmp_path / "data.npz"
    np.savez(data, X=X, y=y)
    run = _killed_run(tmp_path / "run", 2, "data.name=arrays", f"data.path={data}")
    np.savez(data, X=X + 0.5, y=y)  # the same file name, other numbers
    _one_error_line(runner.invoke(app, ["run", "--resume", str(run)]), "the data")
    np.savez(data, X=X, y=y)
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    ckpt["fingerprint"]["protofed"] = "0.0.1"
    torch.save(ckpt, run / "checkpoint.pt")
    _one_error_line(runner.invoke(app, ["run", "--resume", str(run)]), "protofed 0.0.1 ->")


@pytest.mark.integration
def test_a_corrupt_metrics_record_is_refused_and_nothing_rewritten(tmp_path):
    run = _killed_run(tmp_path / "run", 3)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 3
    lines[1] = lines[1][:40] + "#" + lines[1][41:]  # one byte of round 2
    (run / "metrics.jsonl").write_text("".join(lines))
    before = _snapshot(run)
    result = runner.invoke(app, ["run", "--resume", str(run)])
    _one_error_line(result, "metrics.jsonl", "round 3", "nothing was changed")
    assert _snapshot(run) == before


@pytest.mark.integration
def test_a_truncated_record_the_checkpoint_covers_is_refused(tmp_path):
    run = _killed_run(tmp_path / "run", 3)
    text = (run / "metrics.jsonl").read_bytes()
    (run / "metrics.jsonl").write_bytes(text[:-30])  # round 3's line cut: not a torn tail
    _one_error_line(runner.invoke(app, ["run", "--resume", str(run)]), "metrics.jsonl")


@pytest.mark.integration
def test_a_torn_tail_beyond_the_checkpoint_is_cut_and_the_numbers_hold(tmp_path):
    whole = runner.invoke(app, ["run", "--out", str(tmp_path / "whole"), *_sets(SMALL)])
    assert whole.exit_code == 0, whole.output
    run = _killed_run(tmp_path / "run", 2)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"round": 3, "train_loss": 0.1')  # a kill in the middle of round 3's line
    assert runner.invoke(app, ["run", "--resume", str(run)]).exit_code == 0
    a = json.loads((tmp_path / "whole" / "summary.json").read_text())
    b = json.loads((run / "summary.json").read_text())
    assert a["final"] == b["final"] and a["selected"] == b["selected"]
    assert [json.loads(x)["round"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
        3,
        4,
    ]


@pytest.mark.integration
def test_a_corrupt_checkpoint_is_one_line_that_never_suggests_unpickling(tmp_path):
    run = _killed_run(tmp_path / "run", 2)
    data = bytearray((run / "checkpoint.pt").read_bytes())
    (run / "checkpoint.pt").write_bytes(bytes(data[: len(data) // 2]))
    text = _one_error_line(runner.invoke(app, ["run", "--resume", str(run)]), "checkpoint.pt")
    assert "weights_only" not in text


def _drop_a_weight(ckpt: dict) -> None:
    del ckpt["server"]["model"]["head.bias"]


def _reshape_a_weight(ckpt: dict) -> None:
    ckpt["server"]["model"]["head.bias"] = torch.zeros(3)


def _string_for_a_tensor(ckpt: dict) -> None:
    ckpt["server"]["model"]["head.bias"] = "x"


def _string_for_a_round(ckpt: dict) -> None:
    ckpt["progress"]["server_round"] = "2"


def _foreign_client(ckpt: dict) -> None:
    ckpt["clients"]["x"] = {}


def _metrics_not_a_position(ckpt: dict) -> None:
    ckpt["metrics"] = "x"


def _fingerprint_not_a_mapping(ckpt: dict) -> None:
    ckpt["fingerprint"] = [1]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (_drop_a_weight, "server 'model.head.bias' is missing"),
        (_reshape_a_weight, "server 'model.head.bias' has shape (3,), the model's (10,)"),
        (_string_for_a_tensor, "server 'model.head.bias' must be a torch.Tensor, not str"),
        (_string_for_a_round, "'progress.server_round' is not a round number"),
        (_foreign_client, "'clients.x' is not a client id"),
        (_metrics_not_a_position, "'metrics' is not a position in metrics.jsonl"),
        (_fingerprint_not_a_mapping, "fingerprint is not as protofed writes it"),
    ],
)
def test_an_edited_checkpoint_is_one_line_and_resumes_nothing(tmp_path, edit, named):
    """Before, a weight taken out resumed silently on the initial weights, and the others
    failed in a raw error."""
    run = _killed_run(tmp_path / "run")
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    edit(ckpt)
    torch.save(ckpt, run / "checkpoint.pt")
    before = _snapshot(run)
    _one_error_line(runner.invoke(app, ["run", "--resume", str(run)]), named)
    assert _snapshot(run) == before


@pytest.mark.integration
def test_a_model_is_not_loaded_from_an_edited_checkpoint(tmp_path):
    run = _killed_run(tmp_path / "run")
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    _drop_a_weight(ckpt)
    torch.save(ckpt, run / "checkpoint.pt")
    with pytest.raises(ConfigError, match="server 'model.head.bias' is missing"):
        load_run(run).client_model(0)


@pytest.mark.integration
def test_one_process_per_run_directory(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, **FLOWER_ENV}
    slow = [*SMALL, "train.rounds=400"]
    proc = subprocess.Popen(
        [str(BIN / "protofed"), "run", "--out", str(out), "-q", *_sets(slow)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").stat().st_size:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.2)
        busy = f"in use by another process (pid {proc.pid})"
        _one_error_line(runner.invoke(app, ["run", "--resume", str(out)]), busy)
        forced = runner.invoke(app, ["run", "--out", str(out), "--force", *_sets(SMALL)])
        _one_error_line(forced, busy)
        assert proc.poll() is None  # the running process was not disturbed
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_resume_holds_the_directory_before_it_reads_anything(tmp_path):
    run = _killed_run(tmp_path / "run")
    holder = RunDir.open(run)
    holder.lock()  # flock: a second descriptor conflicts even in this process
    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text("{:")  # refused for the lock, before it is read
    with pytest.raises(ConfigError, match="in use by another process"):
        resume(run)
    (run / "config.yaml").write_text(config)
    holder.unlock()
    (run / "summary.json").write_text("{}")  # the other process finished meanwhile
    before = _snapshot(run)
    with pytest.raises(RunComplete, match="is complete: nothing to resume"):
        resume(run)
    assert _snapshot(run) == before
    RunDir.open(run).lock()  # and the refused resume let go of it


def test_every_write_is_fsynced_before_its_rename(tmp_path, monkeypatch):
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync")
        real_fsync(fd)

    def replace(src, dst) -> None:
        calls.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    atomic_write_text(tmp_path / "f.txt", "x")
    assert calls == ["fsync", "replace", "fsync"]  # the file, the rename, the folder
    assert (tmp_path / "f.txt").read_text() == "x"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_written_files_get_the_mode_a_plain_open_gives(tmp_path):
    """The temporary behind every write is 0o600; the file must not stay so (a run directory
    unreadable to the user's group), and a file's own mode survives a rewrite."""
    old = os.umask(0o027)
    try:
        fresh = atomic_write_text(tmp_path / "fresh.txt", "x")
        assert fresh.stat().st_mode & 0o777 == 0o640
        kept = tmp_path / "kept.txt"
        kept.write_text("old")
        kept.chmod(0o604)
        atomic_write_text(kept, "new")
        assert kept.stat().st_mode & 0o777 == 0o604 and kept.read_text() == "new"
    finally:
        os.umask(old)


def test_a_file_system_that_refuses_modes_still_gets_the_file(tmp_path, monkeypatch):
    def refuse(fd, mode):
        raise PermissionError(1, "Operation not permitted")  # FAT's answer to chmod

    monkeypatch.setattr(os, "fchmod", refuse)
    assert atomic_write_text(tmp_path / "f.txt", "x").read_text() == "x"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


# 2. divergence -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [".inf", ".nan", "-.inf"])
def test_non_finite_config_values_are_config_errors(tmp_path, value):
    result = runner.invoke(
        app, ["run", "--out", str(tmp_path / "r"), *_sets([*SMALL, f"train.lr={value}"])]
    )
    _one_error_line(result, "train.lr", "finite")
    assert not (tmp_path / "r").exists()


def test_features_that_overflow_the_cast_to_float32_are_refused(tmp_path):
    X = np.ones((60, 4))
    X[7, 2] = 1e300  # finite in float64, infinite in float32
    np.savez(tmp_path / "d.npz", X=X, y=np.arange(60) % 2)
    result = runner.invoke(
        app,
        [
            "run",
            "--out",
            str(tmp_path / "r"),
            *_sets(["data.name=arrays", f"data.path={tmp_path / 'd.npz'}", "train.rounds=1"]),
        ],
    )
    _one_error_line(result, "float32", "NaN or inf")
    assert not (tmp_path / "r").exists()


def test_a_diverging_run_stops_with_its_own_status_and_exit_code(tmp_path):
    out = tmp_path / "r"
    result = runner.invoke(app, ["run", "--out", str(out), *_sets([*SMALL, "train.lr=1e30"])])
    assert result.exit_code == 3, result.output
    assert "diverged: round 1" in result.stderr and "NaN or inf" in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["rounds"] == 0
    assert summary["final"] is None and "round 1" in summary["diverged"]
    again = runner.invoke(app, ["run", "--resume", str(out)])
    assert again.exit_code == 3 and "Traceback" not in again.output, again.output
    assert len(again.stderr.strip().splitlines()) == 1 and "nothing to resume" in again.stderr
    assert json.loads((out / "summary.json").read_text()) == summary


@pytest.mark.integration
def test_non_finite_replies_can_be_dropped_and_counted(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 6)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    group = np.arange(400) % 4
    X[group == 3] *= 1e37  # finite, but one SGD step on them overflows
    np.savez(tmp_path / "d.npz", X=X, y=y, group=group)
    base = [
        "data.name=arrays",
        f"data.path={tmp_path / 'd.npz'}",
        "data.partition=natural",
        "data.standardize=false",
        "train.rounds=3",
    ]
    # in this process, then in two workers (each checks the replies it trains)
    serial = _sets([*base, "train.workers=1"])
    stopped = runner.invoke(app, ["run", "--out", str(tmp_path / "a"), *serial])
    assert stopped.exit_code == 3 and "client 3" in stopped.stderr
    drop = _sets([*base, "train.workers=2", "train.on_nonfinite=drop"])
    dropped = runner.invoke(app, ["run", "--out", str(tmp_path / "b"), *drop])
    assert dropped.exit_code == 0, dropped.output
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["dropped_nonfinite"] == 3
    assert summary["final"]["personalization"]["acc"] > 0.5


def test_the_non_finite_guard_names_the_first_bad_array_and_only_then_scans():
    """One sum per array decides; a total that overflows from finite values is no fault."""
    from protofed.runtime.nonfinite import nonfinite

    big = torch.full((4,), 3e38)  # finite, but its float32 sum is inf
    clean = {"model": {"w": torch.randn(5, 3), "b": torch.zeros(3), "n": torch.arange(3)}}
    assert nonfinite(clean) is None and nonfinite({"model": {"w": big}}) is None
    assert nonfinite({"h": {"w": torch.full((9,), 60000.0, dtype=torch.float16)}}) is None
    assert nonfinite({"e": {}, "m": {"n": torch.tensor([1, 2])}}) is None
    for bad in (float("nan"), float("inf"), -float("inf")):
        w = torch.randn(6, dtype=torch.float64)
        w[4] = bad
        records = {**clean, "state": {"ok": big, "w": w, "v": w.clone()}}
        assert nonfinite(records) == "state/w"
    both = {"a": {"x": torch.tensor([float("inf")]), "y": torch.tensor([-float("inf")])}}
    assert nonfinite(both) == "a/x"  # inf + -inf is NaN: still named, the first one


# 3. bad files and failing disks: one line, exit code 2, nothing half-written ---------------


def _npz_bytes(tmp_path: Path) -> bytes:
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    np.savez(tmp_path / "real.npz", X=X[:300] / 16.0, y=y[:300])
    return (tmp_path / "real.npz").read_bytes()


def _csv_text() -> str:
    from sklearn.datasets import load_wine

    frame = load_wine(as_frame=True).frame
    return frame.to_csv(index=False)


def _bitflip(data: bytes, at: float) -> bytes:
    out = bytearray(data)
    out[int(at * (len(out) - 1))] ^= 0xFF
    return bytes(out)


FAULTY_FILES = {
    "truncated.npz": lambda d: _npz_bytes(d)[:1000],
    "bitflip.npz": lambda d: _bitflip(_npz_bytes(d), 0.02),  # in the zip's headers
    "renamed.npz": lambda d: (np.save(d / "a.npy", np.zeros(3)), (d / "a.npy").read_bytes())[1],
    "empty.npz": lambda d: b"",
    "ragged.csv": lambda d: (
        _csv_text() + "1,2,3\n1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16\n"
    ).encode(),
    "latin1.csv": lambda d: _csv_text().replace("alcohol", "alcöhol").encode("latin-1"),
    "corrupt.parquet": lambda d: b"PAR1" + bytes(range(256)) * 4 + b"PAR1",
    "empty.csv": lambda d: b"",
}


@pytest.mark.parametrize("name", list(FAULTY_FILES))
def test_a_damaged_data_file_is_one_line(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(FAULTY_FILES[name](tmp_path))
    out = tmp_path / "run"
    extra = ["data.label_column=target"] if name.endswith((".csv", ".parquet")) else []
    result = runner.invoke(
        app,
        ["run", "--out", str(out), *_sets(["data.name=arrays", f"data.path={path}", *extra])],
    )
    _one_error_line(result, name)
    assert not out.exists()


@pytest.mark.parametrize("label", [99, -1])
def test_labels_outside_the_classes_of_a_data_file_are_one_line(shared_data, tmp_path, label):
    """An edited data file under the data root: named, with the fetch that repairs it."""
    with np.load(shared_data / "har" / "hhar_sa.npz", allow_pickle=False) as data:
        arrays = dict(data)
    arrays["y"] = arrays["y"].copy()
    arrays["y"][0] = label
    (tmp_path / "har").mkdir()
    np.savez(tmp_path / "har" / "hhar_sa.npz", **arrays)
    out = tmp_path / "run"
    args = ["run", "--out", str(out), "-s", "data.name=hhar", "--data-dir", str(tmp_path)]
    line = _one_error_line(runner.invoke(app, args), "data.name=hhar", "labels run", "data fetch")
    assert str(label) in line
    assert not out.exists()


@pytest.mark.integration
def test_a_last_batch_of_one_that_batchnorm_cannot_train_on_is_refused_up_front(tmp_path):
    """resnet18 on 8x8 digits ends in 1x1 maps: a batch of one sample gives BatchNorm one
    value per channel. 315 training samples in batches of 157 leave one; before, the run
    failed in its first round with a traceback."""
    out = tmp_path / "run"
    iid = ["data.partition=iid", "model.name=resnet18", "train.batch_size=157"]
    result = runner.invoke(app, ["run", "--out", str(out), *_sets([*SMALL, *iid])])
    _one_error_line(result, "client_000 has 315 training samples", "train.batch_size=157")
    assert not out.exists()


def test_out_on_a_file_and_on_a_read_only_place_are_one_line(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    result = runner.invoke(app, ["run", "--out", str(tmp_path / "file"), *_sets(SMALL)])
    _one_error_line(result, "is a file")
    assert (tmp_path / "file").read_text() == "not a directory"
    if not os.access("/sys", os.W_OK) and Path("/sys").is_dir():  # read-only even for root
        result = runner.invoke(app, ["run", "--out", "/sys/protofed-run", *_sets(SMALL)])
        _one_error_line(result, "/sys/protofed-run")


@pytest.mark.integration
def test_a_full_disk_is_one_line_and_leaves_no_half_file(tmp_path):
    """A file-size limit (RLIMIT_FSIZE) makes the kernel fail writes past it, as a full
    disk does: the round-1 checkpoint (about 6 kB) cannot be written."""

    # set in a process of its own, then exec'd: a preexec_fn can deadlock a process that
    # has threads (Ray's, after the Flower tests)
    limit_then_exec = (
        "import os, resource, signal, sys; "
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "  # EFBIG instead of a kill
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", limit_then_exec, str(BIN / "protofed"), "run", "--out", str(out)]
        + ["-q", *_sets(SMALL)],
        env={**os.environ, **FLOWER_ENV},
        capture_output=True,
        text=True,
        timeout=120,
    )
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1, err
    assert "cannot write" in err and "checkpoint.pt" in err and "File too large" in err
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]  # no temporary left
    assert not (out / "summary.json").exists()


# 4. signals -------------------------------------------------------------------------------


class _Spawned:
    """A protofed command in its own process, its output in a file, never in a pipe.

    A pipe's reader waits for EOF from every process holding its write end, and any
    process forked (without exec) while the pipe exists holds it: so `communicate` can
    wait on a process other than the one under test. Waiting for the PID measures the
    process itself; the leftover processes are checked separately (`_left`).
    """

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.log = log
        with log.open("w") as sink:
            self.proc = subprocess.Popen(
                cmd,
                env={**os.environ, **FLOWER_ENV},
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, seconds: float) -> int:
        """The exit code, or a failure that says where the process stood (per thread)."""
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            where = _where(self.proc.pid)
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"no exit within {seconds} s; {where}; output: {self.output()[-2000:]}")

    def wait_for_first_round(self, out: Path, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").stat().st_size:
            assert self.proc.poll() is None, self.output()[-3000:]
            assert time.monotonic() < deadline, "no round finished in time"
            time.sleep(0.2)


def _where(pid: int) -> str:
    """Each thread's state and kernel wait channel, read from /proc (for a hang's report)."""
    threads = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        with contextlib.suppress(OSError):
            stat = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            threads.append(
                f"{(task / 'comm').read_text().strip()}:{stat}:{(task / 'wchan').read_text()}"
            )
    return "threads " + ", ".join(threads)


@pytest.mark.integration
def test_sigterm_stops_a_run_resumably(tmp_path):
    out = tmp_path / "run"
    cmd = [str(BIN / "protofed"), "run", "-q", *_sets([*SMALL, "train.rounds=60"])]
    run = _Spawned([*cmd, "--out", str(out)], tmp_path / "log")
    run.wait_for_first_round(out, 60)
    run.proc.send_signal(signal.SIGTERM)
    code, err = run.wait(30), run.output()
    assert code == 130, err
    assert f"continue with: protofed run --resume {out}" in " ".join(err.split())
    resumed = runner.invoke(app, ["run", "--resume", str(out)])
    assert resumed.exit_code == 0, resumed.output
    whole = runner.invoke(
        app, ["run", "--out", str(tmp_path / "whole"), *_sets([*SMALL, "train.rounds=60"])]
    )
    assert whole.exit_code == 0
    a = json.loads((tmp_path / "whole" / "summary.json").read_text())
    b = json.loads((out / "summary.json").read_text())
    assert a["final"] == b["final"] and a["comm"] == b["comm"]


def _flower_run(out: Path, *overrides: str) -> list[str]:
    """The command line of a small `--engine flower` run writing to `out`."""
    cli = [str(BIN / "protofed"), "run", "-q", "--engine", "flower", "--out", str(out)]
    return [*cli, *_sets([*SMALL, *overrides])]


def _start_flower_run(out: Path, rounds: int) -> tuple[_Spawned, list[psutil.Process]]:
    """A Flower run in its own process, once its first round is written: (it, its children)."""
    run = _Spawned(_flower_run(out, f"train.rounds={rounds}"), out.parent / "log")
    run.wait_for_first_round(out, 180)
    tree = psutil.Process(run.proc.pid).children(recursive=True)
    assert len(tree) > 1, "Flower's simulation started no process"
    return run, tree


def _left(tree: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    _, alive = psutil.wait_procs(tree, timeout=seconds)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


LONG_ROUNDS = ["train.rounds=500", "model.hidden=[512,512]", "train.local_epochs=30"]
"""A Flower run whose clients train for seconds: a signal after round 1 finds them in it."""

STOPPED = (
    r"interrupted after round \d+; a Flower run cannot resume; start it again with --force"
    r"|interrupted: Flower's simulation did not stop within 8 s, so its processes were "
    r"killed; a Flower run cannot resume; start it again with --force"
)
"""What follows the stop notice: the CLI's line, or `StopDeadline`'s when it gave up."""


@pytest.mark.integration
def test_ctrl_c_on_the_flower_engine_exits_within_seconds_and_leaves_no_process(tmp_path):
    """One Ctrl-C while the clients train: before, the session waited for them to reply
    (68.6 s with two busy loops on the 2 cores); now it is interrupted at once 2 s after the
    signal and its processes killed by PID at 8 s (flower/session.py `StopDeadline`), then
    the interpreter's exit takes at most 3 s more."""
    out = tmp_path / "run"
    run = _Spawned(_flower_run(out, *LONG_ROUNDS), tmp_path / "log")
    run.wait_for_first_round(out, 180)
    tree = psutil.Process(run.proc.pid).children(recursive=True)
    run.proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    code = run.wait(30)
    took = time.monotonic() - t0
    err = run.output()
    assert code == 130, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    after = " ".join(err.split("(again: stop at once)", 1)[1].split())
    assert re.fullmatch(STOPPED, after), err[-3000:]
    assert took < 8 + 3 + 2, f"one Ctrl-C took {took:.1f} s"
    assert not _left(tree, 10)
    result = runner.invoke(app, ["run", "--resume", str(out)])
    _one_error_line(result, "flower-simulation engine", "cannot resume")


@pytest.mark.integration
def test_a_second_ctrl_c_on_the_flower_engine_is_one_line_and_no_traceback(tmp_path):
    """The second Ctrl-C while the clients train (Flower's threads wait on Ray's actors):
    before, Flower logged each call's `ActorDiedError` with its traceback, and the process
    could hang on its way out (joining a thread left in `ray.get`); now the run's one line,
    exit 130 within seconds, and no process left (flower/session.py)."""
    out = tmp_path / "run"
    run = _Spawned(_flower_run(out, *LONG_ROUNDS), tmp_path / "log")
    run.wait_for_first_round(out, 180)
    tree = psutil.Process(run.proc.pid).children(recursive=True)
    run.proc.send_signal(signal.SIGINT)
    time.sleep(0.1)
    run.proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    code = run.wait(60)
    took = time.monotonic() - t0
    err = run.output()
    assert code == 130, err[-3000:]
    assert "Traceback" not in err and "ActorDiedError" not in err, err[-3000:]
    after = " ".join(err.split("(again: stop at once)", 1)[1].split())
    assert re.fullmatch(STOPPED, after), err[-3000:]
    assert took < 20, f"the second Ctrl-C took {took:.1f} s"
    assert not _left(tree, 10)


@pytest.mark.integration
def test_a_killed_flower_run_leaves_no_process(tmp_path):
    """SIGKILL cannot be handled: the watchdog (flower/reaper.py) kills Ray's processes."""
    run, tree = _start_flower_run(tmp_path / "run", rounds=500)
    run.proc.kill()
    run.wait(30)
    left = _left(tree, 20)
    for p in left:  # do not leave them to the next test either
        with contextlib.suppress(psutil.Error):
            p.kill()
    assert not left, [(p.pid, p.name()) for p in left]


@pytest.mark.integration
def test_a_failed_flower_round_is_one_line(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        _flower_run(out, "train.rounds=2", "data.num_clients=2"),
        env={**os.environ, **FLOWER_ENV, "PROTOFED_FLOWER_FAULT": "0:1,1:1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(err) == 1 and "round 1: 0 valid repl" in err[0]
    # Flower logs the failing ClientApps' own tracebacks (the drill's); none is protofed's
    assert proc.stderr.strip().splitlines()[-1] == err[0]
    assert "protofed/runtime" not in proc.stderr and "protofed/cli" not in proc.stderr


# 5. integrity to the last byte --------------------------------------------------------------


def _flip_a_tensor_bit(path: Path, bit: int, entry: int = -1) -> None:
    """Flip `bit` of the first float32 in a torch checkpoint's largest tensor (0: the
    mantissa's lowest bit, 23: the exponent's lowest), in place in the zip (stored
    uncompressed, as torch.save writes it)."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as archive:
        entries = sorted(
            (i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size
        )
    info = entries[entry]
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack(
        "<HH", data[info.header_offset + 26 : info.header_offset + 30]
    )
    start = info.header_offset + 30 + name_len + extra_len
    data[start + bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))


@pytest.mark.integration
@pytest.mark.parametrize("bit", [0, 23], ids=["mantissa", "exponent"])
def test_a_flipped_bit_in_a_checkpoint_is_one_line_naming_it(tmp_path, bit):
    """Before checksums, one flipped bit resumed silently to other numbers (exit 0)."""
    run = _killed_run(tmp_path / "run", 2)
    _flip_a_tensor_bit(run / "checkpoint.pt", bit)
    before = _snapshot(run)
    result = runner.invoke(app, ["run", "--resume", str(run), "-q"])
    text = _one_error_line(result, "checkpoint.pt", "damaged")
    assert "diverged" not in text
    assert _snapshot(run) == before
    with pytest.raises(ConfigError, match="damaged"):
        load_run(run).client_model(0)


@pytest.mark.integration
def test_a_checkpoint_written_before_checksums_still_resumes(tmp_path):
    run = _killed_run(tmp_path / "run", 2)
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    assert isinstance(ckpt.pop("sha256"), str)
    torch.save(ckpt, run / "checkpoint.pt")
    assert resume(run).run().status == "complete"


def test_a_checkpoint_of_the_first_checksummed_version_is_not_called_damaged(tmp_path):
    """That version digested the fingerprint too; its checkpoints resume, and a flipped bit
    in one is still damage."""
    from protofed.core.files import tensors_digest

    run = _killed_run(tmp_path / "run", 2)
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    ckpt.pop("sha256")
    ckpt["sha256"] = tensors_digest(ckpt)
    torch.save(ckpt, run / "checkpoint.pt")
    load_run(run).client_model(0)  # no error
    _flip_a_tensor_bit(run / "checkpoint.pt", 3)
    with pytest.raises(ConfigError, match="damaged"):
        load_run(run).client_model(0)


def _flip_a_safetensors_bit(path: Path, bit: int) -> str:
    """Flip `bit` of the first value of the file's first float32 tensor; its name."""
    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    name = next(k for k, v in sorted(header.items()) if k != "__metadata__" and v["dtype"] == "F32")
    start = 8 + size + header[name]["data_offsets"][0]
    data[start + bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))
    return name


@pytest.mark.integration
def test_a_flipped_bit_in_a_pretrain_state_is_one_line_naming_it(shared_data, tmp_path):
    """Before checksums, one flipped bit resumed with 124 of 125 tensors different, and 50
    flipped bytes ended in `pretrain diverged ... lower pretrain.lr`."""
    import protofed
    from protofed.training.pretrain import state_path

    sets = ["model.alp.prototypes=[32,16,16,16,16,16]", "pretrain.max_windows=100"]
    sets += ["pretrain.batch_size=50", "train.threads=1", "pretrain.epochs=2"]
    cfg = load_config("configs/fedali_hhar_natural.yaml", [f"data.dir={shared_data}", *sets])
    out = tmp_path / "hhar.safetensors"

    def stop(epoch: int, loss: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        protofed.pretrain(cfg, out, on_epoch=stop)
    state = state_path(out)
    kept = state.read_bytes()
    args = ["pretrain", "configs/fedali_hhar_natural.yaml", *_sets(sets), "--out", str(out)]
    args += ["--data-dir", str(shared_data), "--resume", "-q"]
    for bit in (0, 23):
        state.write_bytes(kept)
        _flip_a_safetensors_bit(state, bit)
        text = _one_error_line(runner.invoke(app, args), str(state), "damaged")
        assert "diverged" not in text and not out.exists()
    state.write_bytes(kept)
    assert runner.invoke(app, args).exit_code == 0  # intact, it resumes
    _flip_a_safetensors_bit(out, 0)  # the finished checkpoint, as model.init reads it
    with pytest.raises(ConfigError, match="damaged"):
        protofed.training.pretrain.read_checkpoint(out)


def _limited(limit: int, *args: str) -> subprocess.CompletedProcess:
    """`protofed ARGS` under a file-size limit (RLIMIT_FSIZE) with SIGXFSZ ignored: a write
    past it fails with EFBIG, as on a full disk."""
    limit_then_exec = (
        "import os, resource, signal, sys; "
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    return subprocess.run(
        [sys.executable, "-c", limit_then_exec, str(BIN / "protofed"), *args],
        env={**os.environ, **FLOWER_ENV},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    ("limit", "workers", "named"),
    [(120 * 1024, 1, "checkpoint.pt"), (100 * 1024, 2, "train.workers")],
    ids=["mid-checkpoint", "worker-shared-memory"],
)
def test_a_disk_that_fills_mid_write_is_one_line_and_the_run_resumes(
    tmp_path, limit, workers, named
):
    """A 120 kB limit stops torch.save's zip writer mid-checkpoint (a RuntimeError from
    inline_container.cc before); 100 kB with workers stops torch's shared-memory file for the
    workers' tensors (`unable to resize file`). Both were tracebacks."""
    out = tmp_path / "run"
    sets = [*SMALL, "model.hidden=[512]", "train.rounds=2", f"train.workers={workers}"]
    proc = _limited(limit, "run", "--out", str(out), "-q", *_sets(sets))
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1, err
    assert named in err and "Traceback" not in err
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    assert not (out / "summary.json").exists()
    result = runner.invoke(app, ["run", "--resume", str(out), "-q"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "override",
    ["train.lr=1e308", "train.weight_decay=1.0e39", "train.momentum=-1e39", "algorithm.mu=1e300"],
)
def test_float_values_that_overflow_float32_are_one_line(tmp_path, override):
    """`train.lr=1e308` (finite in float64) overflowed float32 in training/fused.py: a
    traceback, and a half-made run that tracebacked again on --resume."""
    out = tmp_path / "run"
    sets = [*SMALL, override] + (["algorithm.name=fedprox"] if "mu" in override else [])
    result = runner.invoke(app, ["run", "--out", str(out), "-q", *_sets(sets)])
    _one_error_line(result, override.split("=")[0], "float32")
    assert not out.exists()


@pytest.mark.parametrize("hidden", ["[100000000]", "[100000000,100000000]"])
def test_a_model_too_large_for_memory_is_one_line(tmp_path, hidden):
    """`DefaultCPUAllocator: can't allocate memory` was a traceback. (On digits, 1e8 hidden
    units are 28 GiB of parameters: a machine with 4 times that free would build them.)"""
    from protofed.runtime.prepare import COPIES, _available_memory

    if hidden == "[100000000]" and (_available_memory() or 0) > COPIES * 28 * 2**30:
        pytest.skip("this machine has the memory for it")
    out = tmp_path / "run"
    sets = [*SMALL, f"model.hidden={hidden}"]
    _one_error_line(runner.invoke(app, ["run", "--out", str(out), *_sets(sets)]), "model.")
    assert not out.exists()


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("train.rounds=true", "train.rounds"),
        ("train.rounds='5'", "train.rounds"),
        ("data.alpha=true", "data.alpha"),
        ("model.hidden=[true]", "model.hidden"),
        ("train.lr=false", "train.lr"),
        ("train.lr=fast", "train.lr"),
    ],
)
def test_a_boolean_or_a_string_is_not_a_number(tmp_path, override, key):
    """`train.rounds=true` ran 1 round with exit 0."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--out", str(out), *_sets([*SMALL, override])])
    _one_error_line(result, key)
    assert not out.exists()
    # what YAML means by a number still is one: an int for a float, 1e-3 (a string to PyYAML)
    cfg = load_config(None, ["train.lr=1", "data.split=[0.7, 0.1, 0.2]", "algorithm.mu=1e-3"])
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
    assert load_config(None, ["train.lr=1e-3"]).train.lr == 0.001


@pytest.mark.integration
@pytest.mark.parametrize("text", ["[]", '{"clients": {"0": 1}}', '{"counts": "x"}'])
def test_a_partition_json_not_as_written_is_refused_by_resume_and_report(tmp_path, text):
    """A partition.json holding a list passed `--resume` and `report`."""
    run = _killed_run(tmp_path / "run", 2)
    written = (run / "partition.json").read_text()
    (run / "partition.json").write_text(text)
    before = _snapshot(run)
    _one_error_line(runner.invoke(app, ["run", "--resume", str(run), "-q"]), "partition.json")
    assert _snapshot(run) == before
    (run / "partition.json").write_text(written)
    assert resume(run).run().status == "complete"
    (run / "partition.json").write_text(text)
    args = ["report", str(run), "--out", str(tmp_path / "table")]
    _one_error_line(runner.invoke(app, args), "partition.json")
    with pytest.raises(ConfigError, match="partition.json"):
        load_run(run)


def test_a_signal_after_the_summary_is_written_ends_the_run_complete(tmp_path, monkeypatch):
    """A SIGTERM right after summary.json was written exited 130 with `interrupted after
    round 4; continue with --resume` while the summary said complete."""
    write_json = RunDir.write_json

    def then_a_signal(self, name, obj):
        write_json(self, name, obj)
        if name == "summary.json":
            raise KeyboardInterrupt  # what SIGTERM becomes (terminate_as_interrupt)

    monkeypatch.setattr(RunDir, "write_json", then_a_signal)
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--out", str(out), "-q", *_sets(SMALL)])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "interrupted" not in result.output and "run directory" in result.output
    doc = json.loads((out / "provenance.json").read_text())
    assert doc["sessions"][-1]["outcome"] == "complete" and doc["end"] is not None


@pytest.mark.integration
def test_provenance_records_a_killed_session_and_the_resume(tmp_path):
    """A SIGKILLed session kept `outcome: running, end: null` after the resume finished."""
    run = _killed_run(tmp_path / "run", 2)
    doc = json.loads((run / "provenance.json").read_text())
    doc["sessions"][-1].update(outcome="running", end=None)  # as a SIGKILL leaves it
    (run / "provenance.json").write_text(json.dumps(doc))
    assert resume(run).run().status == "complete"
    doc = json.loads((run / "provenance.json").read_text())
    first, second = doc["sessions"]
    assert first["outcome"] == "killed" and first["end"] is not None
    assert second["outcome"] == "complete" and second["end"] is not None
    assert doc["end"] == second["end"]


# 6. what a resume verifies and restores, and what load_run checks -----------------------------


@pytest.mark.integration
@pytest.mark.parametrize("text", ["{not json", '{"sessions": 3}', '{"sessions": [1]}'])
def test_a_resume_refused_for_its_provenance_touches_nothing(tmp_path, text):
    """A damaged provenance.json was refused only once the torn tail of metrics.jsonl had
    been cut: a refusing resume must leave every byte as it was."""
    run = _killed_run(tmp_path / "run", 2)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"round": 3, "train_loss": 0.1')  # a kill in the middle of round 3's line
    (run / "provenance.json").write_text(text)
    before = _snapshot(run)
    _one_error_line(runner.invoke(app, ["run", "--resume", str(run), "-q"]), "provenance.json")
    assert _snapshot(run) == before


@pytest.mark.integration
def test_the_temporary_of_a_killed_checkpoint_write_is_removed_on_resume(tmp_path):
    """A SIGKILL while checkpoint.pt was written left `.checkpoint.pt.*.tmp` (the size of a
    checkpoint) that no resume removed; a refused resume still touches nothing."""
    import tempfile

    run = _killed_run(tmp_path / "run", 2)
    left = []
    for name in ("checkpoint.pt", "metrics.jsonl", "provenance.json"):
        fd, tmp = tempfile.mkstemp(dir=run, prefix=f".{name}.", suffix=".tmp")
        os.write(fd, (run / name).read_bytes()[:1000])
        os.close(fd)
        left.append(Path(tmp))
    mine = run / "notes.tmp"  # not protofed's: left alone
    mine.write_text("x")
    config = (run / "config.yaml").read_text()
    raw = yaml.safe_load(config)
    raw["model"]["hidden"] = [32]
    (run / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    before = _snapshot(run)
    _one_error_line(runner.invoke(app, ["run", "--resume", str(run), "-q"]), "cannot resume")
    assert _snapshot(run) == before
    (run / "config.yaml").write_text(config)
    assert runner.invoke(app, ["run", "--resume", str(run), "-q"]).exit_code == 0
    assert not [p for p in left if p.exists()] and mine.exists()
    assert not list(run.glob(".*.tmp"))


@pytest.mark.integration
def test_a_deleted_partition_json_is_restored_and_an_edited_one_refused(tmp_path):
    """A deleted partition.json stayed deleted through a resume (and load_run failed); an
    edited one (still valid JSON) was kept. Now the checkpoint records its sha256."""
    run = _killed_run(tmp_path / "run", 2)
    written = {n: (run / n).read_bytes() for n in ("partition.json", "partition.txt")}
    for name in written:
        (run / name).unlink()
    assert resume(run).run().status == "complete"
    assert {n: (run / n).read_bytes() for n in written} == written
    assert len(load_run(run).history) > 0
    edited = _killed_run(tmp_path / "edited", 2)
    doc = json.loads((edited / "partition.json").read_text())
    doc["clients"][0]["name"] = "someone_else"
    (edited / "partition.json").write_text(json.dumps(doc, indent=2) + "\n")
    before = _snapshot(edited)
    result = runner.invoke(app, ["run", "--resume", str(edited), "-q"])
    _one_error_line(result, "partition.json", "edited")
    assert _snapshot(edited) == before
    (edited / "partition.json").unlink()  # restored from the federation, then it resumes
    assert resume(edited).run().status == "complete"


def test_a_nan_in_the_group_array_of_an_npz_is_one_line(tmp_path):
    """A NaN group dropped its sample silently."""
    rng = np.random.default_rng(0)
    group = np.repeat(np.arange(3.0), 40)
    group[5] = np.nan
    path = tmp_path / "g.npz"
    np.savez(path, X=rng.normal(size=(120, 4)), y=np.arange(120) % 3, group=group)
    out = tmp_path / "run"
    args = ["data.name=arrays", f"data.path={path}", "data.partition=natural", "train.rounds=1"]
    result = runner.invoke(app, ["run", "--out", str(out), *_sets(args)])
    _one_error_line(result, "g.npz", "'group'", "NaN")
    assert not out.exists()


def test_the_api_refuses_a_client_that_is_not_an_int_of_the_run_in_one_line(tmp_path):
    """`Run.client_model("0")` raised a raw TypeError."""
    run = _killed_run(tmp_path / "run", 2)
    opened = load_run(run)
    x = torch.zeros(2, 64)
    calls = [
        lambda c: opened.client_model(c),
        lambda c: opened.client_data(c),
        lambda c: opened.predict(c, x),
    ]
    for call in calls:
        for client in ("0", 4, -1, True, 1.0, None):
            with pytest.raises(ConfigError, match=r"^client .* is not ") as err:
                call(client)
            assert "\n" not in str(err.value)
    assert opened.client_model(3) is not None


def test_an_edited_summary_or_metrics_of_a_finished_run_is_refused_by_load_run(tmp_path):
    """An edited accuracy in summary.json came back from load_run; now the run's end records
    their sha256 (checksums.json) and load_run checks them. Runs from before still load."""
    out = tmp_path / "run"
    assert runner.invoke(app, ["run", "--out", str(out), "-q", *_sets(SMALL)]).exit_code == 0
    assert load_run(out).summary.final is not None
    for name in ("summary.json", "metrics.jsonl"):
        written = (out / name).read_text()
        key = '"acc": 0.' if '"acc": 0.' in written else '"acc":0.'
        assert key in written, name
        (out / name).write_text(written.replace(key, key + "9", 1))
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(out / name))}: damaged") as err:
            load_run(out)
        assert "\n" not in str(err.value)
        (out / name).write_text(written)
    assert load_run(out).summary.final is not None
    (out / "checksums.json").unlink()  # a run written before checksums
    assert load_run(out).summary.final is not None
    (out / "checksums.json").write_text("[1]")
    with pytest.raises(ConfigError, match="checksums.json"):
        load_run(out)
