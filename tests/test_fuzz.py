"""Property: whatever happens to a file protofed reads, it either runs or fails on one line.

Hypothesis mutates real files (a slice of scikit-learn's digits as .npz, its wine data as
CSV, a config, a checkpoint, a metrics.jsonl) by truncation, bit flips, inserted garbage
and re-encoding. Every outcome must be exit code 0 (the file still made sense) or 2 with
exactly one line and no traceback, leaving no run directory (new runs) or an untouched one
(resumes). Derandomized, so CI runs the same bounded examples every time.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from protofed.cli import app
from protofed.config import load_config
from protofed.core.results import RoundInfo, RoundRecord
from protofed.runtime import start

runner = CliRunner()
FUZZ = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TINY = ["-s", "train.rounds=1", "-s", "model.name=mlp", "-s", "model.hidden=[8]"]

mutations = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0.0, 0.999)),
    st.tuples(
        st.just("flip"),
        st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(1, 255)), min_size=1, max_size=6),
    ),
    st.tuples(
        st.just("insert"), st.tuples(st.floats(0.0, 1.0), st.binary(min_size=1, max_size=40))
    ),
    st.tuples(st.just("encode"), st.sampled_from(["utf-16", "latin-1", "cp1252"])),
)


def mutate(data: bytes, mutation: tuple) -> bytes:
    kind, arg = mutation
    if kind == "truncate":
        return data[: int(arg * len(data))]
    if kind == "flip":
        out = bytearray(data)
        for where, mask in arg:
            out[min(int(where * len(out)), len(out) - 1)] ^= mask
        return bytes(out)
    if kind == "insert":
        where, garbage = arg
        at = int(where * len(data))
        return data[:at] + garbage + data[at:]
    text = data.decode("utf-8", errors="replace") + "é"  # a character outside ASCII
    return text.encode(arg, errors="replace")


def check(result, out: Path, before: dict[str, bytes] | None = None) -> None:
    """Exit 0, or exit 2 on one line with nothing left behind (or nothing changed)."""
    if result.exit_code == 0:
        return
    text = (result.stderr or result.output).strip()
    assert result.exit_code == 2, (result.exit_code, text, repr(result.exception))
    assert len(text.splitlines()) == 1 and "Traceback" not in text, text
    if before is None:
        assert not out.exists(), sorted(p.name for p in out.iterdir())
    else:
        assert snapshot(out) == before


def snapshot(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.name != ".lock"}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, bytes]:
    from sklearn.datasets import load_digits, load_wine

    folder = tmp_path_factory.mktemp("real")
    X, y = load_digits(return_X_y=True)
    np.savez(folder / "digits.npz", X=X[:240] / 16.0, y=y[:240])
    config = (
        "seed: 3\ndata:\n  name: digits\n  num_clients: 3\n  partition: dirichlet\n"
        "algorithm:\n  name: fedavg\ntrain:\n  lr: 0.1\n  batch_size: 16\n"
    )
    return {
        "npz": (folder / "digits.npz").read_bytes(),
        "csv": load_wine(as_frame=True).frame.to_csv(index=False).encode(),
        "yaml": config.encode(),
    }


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory) -> Path:
    """A run stopped after round 2 of 3: its checkpoint and metrics are what gets mutated."""
    path = tmp_path_factory.mktemp("killed") / "run"
    cfg = load_config(
        None,
        ["data.name=digits", "data.num_clients=3", "model.name=mlp", "model.hidden=[8]"]
        + ["train.rounds=3"],
    )

    class Killed(Exception):
        pass

    def kill(r: int, info: RoundInfo, record: RoundRecord | None) -> None:
        if r == 2:
            raise Killed

    with pytest.raises(Killed):
        start(cfg, path).run(on_round=kill)
    return path


@pytest.mark.integration
@FUZZ
@given(mutation=mutations, suffix=st.sampled_from(["npz", "csv"]))
def test_mutated_data_files(tmp_path_factory, files, mutation, suffix):
    folder = tmp_path_factory.mktemp("data")
    path = folder / f"data.{suffix}"
    path.write_bytes(mutate(files[suffix], mutation))
    label = ["-s", "data.label_column=target"] if suffix == "csv" else []
    out = folder / "run"
    args = ["run", "--out", str(out), "-s", "data.name=arrays", "-s", f"data.path={path}"]
    check(runner.invoke(app, [*args, *label, *TINY]), out)


@pytest.mark.integration
@FUZZ
@given(mutation=mutations)
def test_mutated_configs(tmp_path_factory, files, mutation):
    folder = tmp_path_factory.mktemp("config")
    path = folder / "experiment.yaml"
    path.write_bytes(mutate(files["yaml"], mutation))
    out = folder / "run"
    check(runner.invoke(app, ["run", str(path), "--out", str(out), *TINY]), out)


@pytest.mark.integration
@FUZZ
@given(mutation=mutations, target=st.sampled_from(["checkpoint.pt", "metrics.jsonl"]))
def test_mutated_checkpoints_and_metrics(tmp_path_factory, killed_run, mutation, target):
    run = tmp_path_factory.mktemp("resume") / "run"
    shutil.copytree(killed_run, run)
    (run / target).write_bytes(mutate((run / target).read_bytes(), mutation))
    before = snapshot(run)
    check(runner.invoke(app, ["run", "--resume", str(run)]), run, before)


@pytest.mark.integration
@FUZZ
@given(entry=st.integers(0, 1_000), element=st.floats(0.0, 1.0), bit=st.integers(0, 31))
def test_a_flipped_bit_in_any_tensor_of_a_checkpoint_never_resumes(
    tmp_path_factory, killed_run, entry, element, bit
):
    """One bit of any tensor's bytes (mantissa, exponent or sign; any entry of the zip): the
    resume is exit 2 naming checkpoint.pt, never a run that goes on with other numbers."""
    import struct
    import zipfile

    run = tmp_path_factory.mktemp("flip") / "run"
    shutil.copytree(killed_run, run)
    path = run / "checkpoint.pt"
    with zipfile.ZipFile(path) as archive:
        tensors = [i for i in archive.infolist() if "/data/" in i.filename and i.file_size]
    info = tensors[entry % len(tensors)]
    data = bytearray(path.read_bytes())
    head = info.header_offset
    start = head + 30 + sum(struct.unpack("<HH", data[head + 26 : head + 30]))
    at = start + min(int(element * info.file_size), info.file_size - 1)
    data[at] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))
    before = snapshot(run)
    result = runner.invoke(app, ["run", "--resume", str(run), "-q"])
    assert result.exit_code == 2, result.output
    check(result, run, before)
    assert "checkpoint.pt" in (result.stderr or result.output)
