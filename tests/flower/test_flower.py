"""protofed on Flower: the wire format, reply validation, the simulation engine against the
built-in one, and a real deployment (SuperLink + 3 SuperNodes) on loopback.

Real data throughout: a slice of UCI-HAR (a few subjects, every few windows, 6 channels).
Starting Ray is most of the cost, so every Flower simulation experiment of this file runs in
one session (`simulation.run_simulations`); the deployment test starts its own processes and
stops each one by its PID, also when it fails.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from io import BytesIO
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

# Flower's simulation and deployment engines: Ray, subprocesses, whole runs
pytestmark = pytest.mark.integration

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, MetricRecord  # noqa: E402

from protofed.config import load_config  # noqa: E402
from protofed.core.results import Summary  # noqa: E402
from protofed.core.types import Reply  # noqa: E402
from protofed.errors import ConfigError  # noqa: E402
from protofed.flower import wire  # noqa: E402
from protofed.flower.partitions import export_partitions, load_partition  # noqa: E402
from protofed.flower.session import FLOWER_ENV  # noqa: E402
from protofed.flower.simulation import run_simulations  # noqa: E402
from protofed.flower.simulation import start as start_flower  # noqa: E402
from protofed.flower.transport import RoundFailed  # noqa: E402
from protofed.flower.validation import ReplyValidator  # noqa: E402
from protofed.runtime import fit_client, prepare, simulate  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: test_golden, conftest
import test_golden  # noqa: E402
from conftest import har_slice_config, uci_har_slice  # noqa: E402

for _key, _value in FLOWER_ENV.items():  # no telemetry, no update check, no pip installs
    os.environ.setdefault(_key, _value)

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# The algorithms whose Flower runs must equal the built-in engine's. Add a name here when an
# algorithm lands; its experiment joins the one simulation session below.
EQUIVALENT = ["fedavg", "fedali", "pfpl", "fedproto", "ditto", "fedsub"]
# The same equality under other evaluation rules, "algorithm:variant" -> overrides: clients
# scored with the model kept in Context.state after their last training (half the clients a
# round, so some are scored with an older one, or never trained), macro-F1 over the union.
TRAINED = ["eval.client_model=trained", "eval.f1_labels=union", "train.client_fraction=0.5"]
# and under differential privacy: the server's noise on the mean (adaptive clipping, Poisson
# sampling), and each client's own noise on its prototypes
DP = [
    "privacy.enabled=true",
    "privacy.noise_multiplier=0.5",
    "privacy.prototype_clip=5",
    "privacy.noise=seeded",  # equal numbers on both engines need replayable noise
]
VARIANTS = {
    "fedavg:trained": TRAINED,
    "fedali:trained": TRAINED,
    "fedavg:dp": [
        *DP,
        "privacy.adaptive=true",
        "privacy.count_noise=1",
        "privacy.sampling=poisson",
    ],
    "fedproto:dp-local": [*DP, "privacy.mode=local"],
    # unseen users: one client held out, fine-tuned one epoch on the server's copy of its data
    "fedavg:unseen": ["eval.unseen_clients=1", "eval.finetune_epochs=1"],
}
CASES = {**{name: [] for name in EQUIVALENT}, **VARIANTS}
SMALL = {  # per-algorithm settings that keep the runs short
    "fedali": [
        "model.name=hart",
        "model.alp.enabled=true",
        "model.alp.prototypes=[8,8,4,4,4,4]",
        "train.optimizer=adam",
        "train.lr=0.002",
        "algorithm.kmeans_iters=5",
    ],
}


def _config(path: Path, name: str, *extra: str):
    model = SMALL.get(name, ["model.name=mlp", "model.hidden=[64]"])
    return har_slice_config(path, "eval.batch_size=256", *model, f"algorithm.name={name}", *extra)


@pytest.fixture(scope="module")
def har(shared_data, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("har")
    return {
        "4": uci_har_slice(folder / "har4.npz", [1, 3, 5, 6], every=6),
        "6": uci_har_slice(folder / "har6.npz", [1, 3, 5, 6, 7, 8], every=8),
        "3": uci_har_slice(folder / "har3.npz", [1, 3, 5], every=6),
    }


# the wire ------------------------------------------------------------------------------------
def test_arrays_cross_the_wire_unchanged_and_never_pickled() -> None:
    arrays = {
        "w": torch.randn(3, 4),
        "b": torch.randn(4, dtype=torch.float64),
        "n": torch.tensor(7, dtype=torch.int64),
        "mask": torch.tensor([True, False]),
        "empty": torch.zeros(0, 5),
    }
    back = wire.from_record(wire.to_record(arrays))
    assert list(back) == list(arrays)
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v)
    assert wire.from_metrics(wire.to_metrics({"loss": 0.5, "num_examples": 12})) == {
        "loss": 0.5,
        "num_examples": 12.0,
    }
    # an array whose header declares an object dtype only decodes with pickle: it is refused
    # (the header is written by hand, so no pickle is ever produced, and the payload is junk)
    buffer = BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "|O", "fortran_order": False, "shape": (1,)}
    )
    buffer.write(b"not a pickle")
    record = ArrayRecord()
    record["evil"] = Array(
        dtype="object", shape=(1,), stype="numpy.ndarray", data=buffer.getvalue()
    )
    with pytest.raises(ValueError, match="evil"):
        wire.from_record(record)
    with pytest.raises(ValueError, match="loss"):
        wire.from_metrics(MetricRecord({"loss": float("nan")}))


# validation ----------------------------------------------------------------------------------
def test_malformed_replies_are_rejected_with_a_reason(har, caplog) -> None:
    prepared = prepare(_config(har["4"], "fedavg"))
    server = prepared.algorithm.init_server()
    replies = []
    for cid in range(4):
        result = fit_client(prepared, server, cid, 1, {})
        replies.append(Reply(cid, result.reply, result.metrics, 10.0))
    models = [r.records["model"] for r in replies]
    name = next(iter(models[0]))

    def spoiled(i: int, model: dict) -> Reply:
        return Reply(i, {"model": model}, replies[i].metrics, 10.0)

    nan = dict(models[1], **{name: models[1][name].clone().fill_(math.nan)})
    shape = dict(models[2], **{name: models[2][name][:-1].clone()})
    missing = {k: v for k, v in models[3].items() if k != name}
    bad = [replies[0], spoiled(1, nan), spoiled(2, shape), spoiled(3, missing)]
    validator = ReplyValidator.for_model(prepared.model.state_dict())
    messages = {cid: server for cid in range(4)}
    kept, rejected = validator.check_round(bad, messages)
    assert [r.client for r in kept] == [0]
    reasons = {r.client: r.reason for r in rejected}
    assert "non-finite" in reasons[1] and name in reasons[1]
    assert "the model's weight is" in reasons[2]
    assert "missing" in reasons[3] and name in reasons[3]
    # well-formed replies all pass, and negative sample counts do not
    kept, rejected = validator.check_round(replies, messages)
    assert len(kept) == 4 and not rejected
    assert "negative" in validator.check_one(replies[0].records, {}, server, num_examples=-1.0)


def test_prototype_replies_may_differ_in_rows_but_not_in_width(har) -> None:
    """FedProto sends one row per class present: clients differ in rows, never in width."""
    prepared = prepare(
        _config(
            har["4"], "fedproto", "data.partition=dirichlet", "data.num_clients=4", "data.alpha=0.2"
        )
    )
    server = prepared.algorithm.init_server()
    replies = []
    for cid in range(4):
        result = fit_client(prepared, server, cid, 1, {})
        replies.append(Reply(cid, result.reply, result.metrics, 10.0))
    rows = {r.records["protos"]["means"].shape[0] for r in replies}
    assert len(rows) > 1  # the clients really hold different classes
    validator = ReplyValidator.for_model(prepared.model.state_dict())
    kept, rejected = validator.check_round(replies, {cid: {} for cid in range(4)})
    assert len(kept) == 4 and not rejected
    protos = replies[0].records["protos"]
    narrow = {**replies[0].records, "protos": {**protos, "means": protos["means"][:, :-1]}}
    kept, rejected = validator.check_round(
        [Reply(0, narrow, replies[0].metrics, 10.0), *replies[1:]], {cid: {} for cid in range(4)}
    )
    assert [r.client for r in rejected] == [0] and "protos/means" in rejected[0].reason


def test_flower_settings_are_validated(har, tmp_path) -> None:
    with pytest.raises(ConfigError, match="min_replies"):
        start_flower(_config(har["4"], "fedavg", "flower.min_replies=5"), tmp_path / "x")
    assert not (tmp_path / "x").exists()
    with pytest.raises(ConfigError, match="flower.min_replies"):
        load_config(None, ["flower.min_replies=0"])
    with pytest.raises(ConfigError, match="pools all data"):
        start_flower(_config(har["4"], "centralized"), tmp_path / "y")


def test_cli_engine_option_errors_are_one_line(tmp_path) -> None:
    from typer.testing import CliRunner

    from protofed.cli import app

    runner = CliRunner()
    bad = runner.invoke(app, ["run", "--engine", "ray"])
    assert bad.exit_code == 2 and "unknown --engine" in bad.output
    out = tmp_path / "x"
    few = runner.invoke(
        app,
        [
            "run",
            "--engine",
            "flower",
            "-s",
            "data.name=digits",
            "-s",
            "flower.min_replies=99",
            "--out",
            str(out),
        ],
    )
    assert few.exit_code == 2 and "flower.min_replies=99" in few.output and not out.exists()
    resume = runner.invoke(app, ["run", "--engine", "flower", "--resume", str(tmp_path)])
    assert resume.exit_code == 2 and "no --resume" in resume.output


def test_a_ray_address_nothing_answers_at_is_one_line_before_any_file(tmp_path, monkeypatch):
    """Before, Ray waited on such an address, or failed after the run directory was made."""
    from typer.testing import CliRunner

    from protofed.cli import app

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    out = tmp_path / "x"

    def line(address: str) -> str:
        args = ["run", "--engine", "flower", "--out", str(out), "-s", "data.name=digits"]
        result = CliRunner().invoke(app, [*args, "-s", f"flower.ray_address={address}"])
        text = result.output.strip()
        assert result.exit_code == 2 and len(text.splitlines()) == 1, text
        assert not out.exists()
        return text

    assert f"nothing answers at 127.0.0.1:{port}" in line(f"127.0.0.1:{port}")
    assert "is not HOST:PORT" in line("head-without-port")
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")  # as in Ray: what `auto` means
    assert f"(RAY_ADDRESS=127.0.0.1:{port}): nothing answers" in line("auto")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # stale, but a HOST:PORT given wins
    assert f"flower.ray_address=127.0.0.1:{port}: nothing answers" in line(f"127.0.0.1:{port}")


# the simulation engine: one Ray session for every experiment ----------------------------------
class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _own_sigterm(signum: int, frame: object) -> None:
    """The handler the session must find again (never called)."""


@pytest.fixture(scope="module")
def session(har, tmp_path_factory) -> dict:
    """The built-in runs, then every Flower experiment in one simulation session.

    Faults (PROTOFED_FLOWER_FAULT, read by the real ClientApp in Ray's workers) hit clients
    4 and 5 only, which exist only in the 6-client experiments: "tolerated" (3 rounds: a NaN
    reply, a client raising, then a reply missing an array and an inflated one, weights x1e6
    claiming 1e12 examples) and "too_few" (min_replies=5: round 3 has only 4 valid replies).
    """
    out = tmp_path_factory.mktemp("flower")
    configs = {case: _config(har["4"], case.split(":")[0], *extra) for case, extra in CASES.items()}
    builtin = {case: simulate(prepare(configs[case])).run().to_json() for case in CASES}
    # SecAgg+ on Ray's nodes: the built-in engine releases the same sum (no secure sum there)
    secagg = [*DP, "privacy.adaptive=true", "privacy.count_noise=1"]
    builtin["secagg"] = simulate(prepare(_config(har["4"], "fedavg", *secagg))).run().to_json()
    configs["secagg"] = _config(har["4"], "fedavg", *secagg, "privacy.secure_aggregation=true")
    configs["tolerated"] = _config(har["6"], "fedavg", "train.rounds=3", "flower.min_replies=4")
    configs["too_few"] = _config(
        har["6"], "fedavg", "train.rounds=3", "flower.min_replies=5", "eval.every=3"
    )
    golden_har = test_golden.har_slice(out / "golden_har4.npz")
    for name in test_golden.RUNS:  # the golden runs (test_golden.py), on Flower too
        configs[f"golden:{name}"] = test_golden.config_of(name, golden_har)
    sims = {key: start_flower(cfg, out / key.replace(":", "_")) for key, cfg in configs.items()}
    handler = _Records()
    logging.getLogger("protofed.flower").addHandler(handler)
    os.environ["PROTOFED_FLOWER_FAULT"] = "4:1:nan,5:2:raise,4:3:missing,5:3:inflate"
    t0 = time.perf_counter()
    # ray.init replaces SIGTERM's handler: the session must give back the ones it found
    found = signal.signal(signal.SIGTERM, _own_sigterm)
    sigint = signal.getsignal(signal.SIGINT)
    try:
        results = run_simulations(list(sims.values()))
        after = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    finally:
        signal.signal(signal.SIGTERM, found)
        del os.environ["PROTOFED_FLOWER_FAULT"]
        logging.getLogger("protofed.flower").removeHandler(handler)
    return {
        "signals": {"before": (_own_sigterm, sigint), "after": after},
        "builtin": builtin,
        "flower": {
            key: r if isinstance(r, BaseException) else r.to_json()
            for key, r in zip(sims, results, strict=True)
        },
        "out": out,
        "log": handler.messages,
        "seconds": time.perf_counter() - t0,
    }


@pytest.mark.parametrize("name", list(CASES))
def test_flower_simulation_equals_the_builtin_engine(session, name) -> None:
    ours, ref = session["flower"][name], session["builtin"][name]
    assert not isinstance(ours, BaseException), ours
    assert ours["engine"] == "flower-simulation" and ours["flower"]["rejected"] == 0
    for when in ("final", "selected"):
        assert ours[when]["round"] == ref[when]["round"]
        for part in ("personalization", "generalization", "global"):
            if ref[when][part] is None:
                assert ours[when][part] is None
                continue
            for key, value in ref[when][part].items():
                assert ours[when][part][key] == pytest.approx(value, abs=1e-4), (when, part, key)
    assert ours["comm"] == ref["comm"]  # the same bytes each way
    run = session["out"] / name.replace(":", "_")
    assert {p.name for p in run.iterdir()} >= {
        "config.yaml",
        "partition.json",
        "metrics.jsonl",
        "summary.json",
    }
    assert json.loads((run / "summary.json").read_text())["final"] == ours["final"]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2


def test_unseen_users_score_the_same_on_flower_as_on_the_builtin_engine(session) -> None:
    """The held-out client never trains on Flower either (the same bytes, so the same
    replies), and its unseen scores, global and fine-tuned, are the built-in engine's."""
    ours, ref = session["flower"]["fedavg:unseen"], session["builtin"]["fedavg:unseen"]
    assert not isinstance(ours, BaseException), ours
    for when in ("final", "selected"):
        mine, theirs = ours[when]["unseen"], ref[when]["unseen"]
        assert mine["clients"] == theirs["clients"] and len(mine["clients"]) == 1
        for part in ("personalized", "global"):
            for key, value in theirs[part].items():
                assert mine[part][key] == pytest.approx(value, abs=1e-4), (when, part, key)


def test_secure_aggregation_releases_what_the_server_would_sum(session) -> None:
    """With seeded noise both engines add the same noise to the same sums: the secure sum
    (SecAgg+ through Ray's nodes) differs from the plain one by SecAgg+'s quantization only."""
    ours, ref = session["flower"]["secagg"], session["builtin"]["secagg"]
    assert not isinstance(ours, BaseException), ours
    assert ours["flower"]["rejected"] == 0
    assert ours["privacy"]["epsilon"] == pytest.approx(ref["privacy"]["epsilon"])
    assert ours["privacy"]["clip_norm"] == pytest.approx(ref["privacy"]["clip_norm"], rel=1e-4)
    for part in ("personalization", "global"):
        for key, value in ref["final"][part].items():
            assert ours["final"][part][key] == pytest.approx(value, abs=2e-3), (part, key)
    assert ours["comm"]["up_bytes"] > ref["comm"]["up_bytes"]  # keys and shares besides


@pytest.mark.parametrize("name", sorted(test_golden.RUNS))
def test_flower_simulation_reproduces_the_golden_numbers(session, name) -> None:
    ours = session["flower"][f"golden:{name}"]
    assert not isinstance(ours, BaseException), ours
    summary = Summary.from_json(ours)  # the session keeps summary.json's dicts
    test_golden.assert_same(test_golden.scores(summary), test_golden.golden(name))


def test_bad_replies_and_failing_clients_do_not_stop_the_round(session) -> None:
    ours = session["flower"]["tolerated"]
    assert not isinstance(ours, BaseException), ours
    got = [(r["round"], r["client"]) for r in ours["flower"]["rejections"]]
    assert got == [(1, 4), (2, 5), (3, 4), (3, 5)]
    reasons = [r["reason"] for r in ours["flower"]["rejections"]]
    assert "non-finite" in reasons[0] and "failed" in reasons[1] and "missing" in reasons[2]
    assert "num_examples 1e+12 exceeds the" in reasons[3]  # the poisoning attempt
    assert all(any(f"client {c} rejected" in m for m in session["log"]) for _, c in got)
    assert ours["rounds"] == 3
    assert 0.3 < ours["final"]["personalization"]["acc"] <= 1  # six classes: chance ~0.17
    # a rejected client was still sent its message; it sent nothing that counts
    per_client = ours["comm"]["down_bytes_per_round"] / 6
    assert ours["comm"]["up_bytes"] == pytest.approx(per_client * (3 * 6 - 4))


def test_a_round_with_too_few_replies_stops_the_run(session) -> None:
    result = session["flower"]["too_few"]
    assert isinstance(result, RoundFailed) and "round 3" in str(result)
    assert not (session["out"] / "too_few" / "summary.json").exists()


def test_the_session_gives_back_the_signal_handlers_it_found(session) -> None:
    """Else pool workers forked later inherit Ray's SIGTERM handler (and hang when stopped)."""
    assert session["signals"]["after"] == session["signals"]["before"]


def test_the_session_leaves_no_process_behind(session) -> None:
    """Ray's raylet, GCS and actors were this process's descendants: all gone."""
    left = [
        p
        for p in psutil.Process().children(recursive=True)
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]
    assert not left, [(p.pid, p.name()) for p in left]


# what a deployed node reads, what a deployed server writes --------------------------------------
def test_a_supernode_reads_only_its_partition_never_a_data_path_the_server_sends(
    har, tmp_path, monkeypatch
) -> None:
    from protofed.flower import clientapp

    def no_prepare(cfg):  # building data from the server's config: never on a deployed node
        raise AssertionError(f"the node built data from the server's config ({cfg.data.path})")

    monkeypatch.setattr(clientapp, "prepare", no_prepare)
    monkeypatch.setattr(clientapp, "_CACHE", {})
    source = tmp_path / "har.npz"
    source.write_bytes(har["3"].read_bytes())
    cfg = _config(source, "fedavg")
    part = export_partitions(cfg, tmp_path / "parts")[1]
    source.unlink()  # the data path the server sends no longer exists anywhere
    assert not clientapp.in_simulation()
    side = clientapp.client_side(wire.config_json(cfg), {"partition": str(part)})
    assert side.partition is not None and side.prepared is None
    assert torch.equal(side.data(1, 1).train_y, load_partition(part).data.train_y)
    # a config naming another data file is refused by the partition's fingerprint, unread
    other = _config(tmp_path / "elsewhere.npz", "fedavg")
    with pytest.raises(ConfigError, match="another data config"):
        clientapp.client_side(wire.config_json(other), {"partition": str(part)})
    # partition-id (simulation only) would build the data from the server's data.path/dir
    served = _config(har["3"], "fedavg", f"data.dir={tmp_path}")
    with pytest.raises(ConfigError, match="simulation"):
        clientapp.client_side(wire.config_json(served), {"partition-id": 0})


def test_an_export_never_mixes_with_an_earlier_one(har, tmp_path) -> None:
    """3 new clients beside 10 old files would pass for a 10-client federation."""
    source = tmp_path / "har.npz"
    source.write_bytes(har["3"].read_bytes())
    cfg = _config(source, "fedavg")
    out = tmp_path / "parts"
    first = export_partitions(cfg, out)
    (out / "client_9.npz").write_bytes(first[0].read_bytes())  # a larger, older export's
    (out / "notes.txt").write_text("the operator's own file\n")
    with pytest.raises(ConfigError, match="not empty"):
        export_partitions(cfg, out)
    again = export_partitions(cfg, out, force=True)
    assert len(again) < 10
    assert sorted(p.name for p in out.glob("client_*.npz")) == sorted(p.name for p in again)
    assert (out / "notes.txt").exists()  # only an export's own files are replaced
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ConfigError):  # data that fail to build replace nothing
        export_partitions(_config(tmp_path / "gone.npz", "fedavg"), out, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    torn = out / "client_0.npz"
    torn.write_bytes(torn.read_bytes()[:200])
    with pytest.raises(ConfigError, match="client_0.npz: not a partition file"):
        load_partition(torn)


def test_the_serverapp_never_overwrites_a_run_directory(tmp_path, caplog) -> None:
    from flwr.app import Context, RecordDict

    from protofed.flower import serverapp

    class Untouchable:  # the check comes before any node is waited for
        def __getattr__(self, name: str):
            raise AssertionError(f"the grid was used ({name})")

    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text('{"kept": true}\n')
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    run_config = {"overrides": "train.rounds=1", "out": str(out), "nodes": 1, "wait-s": 1.0}
    context = Context(0, 0, {}, RecordDict(), run_config)
    with (
        caplog.at_level(logging.ERROR, "protofed.flower"),
        pytest.raises(ConfigError, match="already exists") as err,
    ):
        serverapp.main(Untouchable(), context)
    assert "\n" not in str(err.value) and "out=" in str(err.value)
    assert [r.getMessage() for r in caplog.records] == [f"protofed: {err.value}"]
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before
    # a file in the way is refused too; an empty folder is a fresh run directory
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="already exists"):
        serverapp.check_out(tmp_path / "file")
    with pytest.raises(ConfigError, match="already exists"):
        serverapp.create_run_dir(out, {}, {}, "")
    (tmp_path / "empty").mkdir()
    run = serverapp.create_run_dir(tmp_path / "empty", {"seed": 1}, {}, "table")
    assert (run.path / "config.yaml").is_file()


# deployment: a secured SuperLink and SuperNodes on loopback -----------------------------------
def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _wait_for_port(port: int, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"process {proc.pid} exited with {proc.returncode}"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on port {port} after {seconds} s")


def _stop(procs: list[subprocess.Popen]) -> list[psutil.Process]:
    """Terminate every started process and all it started, each by its PID; the survivors."""
    tree: list[psutil.Process] = []
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(proc.pid)
            tree += [root, *root.children(recursive=True)]
    for p in reversed(tree):  # children first
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(tree, timeout=15)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    _, alive = psutil.wait_procs(alive, timeout=10)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _pem(obj) -> bytes:
    from cryptography.hazmat.primitives import serialization

    if hasattr(obj, "private_bytes"):
        return obj.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    return obj.public_bytes(serialization.Encoding.PEM)


def _tls_files(folder: Path) -> dict[str, Path]:
    """A self-signed CA (`ca.crt`) and a server certificate for 127.0.0.1 and localhost signed
    by it (`server.pem`, key `server.key`): what openssl makes in Flower's TLS guide."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def cert(subject: str, key, issuer: x509.Name, issuer_key, ca: bool) -> x509.Certificate:
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(
                x509.SubjectAlternativeName(san), critical=False
            ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        return builder.sign(issuer_key, hashes.SHA256())

    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    server_key = ec.generate_private_key(ec.SECP384R1())
    ca = cert("protofed test CA", ca_key, name("protofed test CA"), ca_key, ca=True)
    server = cert("localhost", server_key, ca.subject, ca_key, ca=False)
    files = {"ca": folder / "ca.crt", "cert": folder / "server.pem", "key": folder / "server.key"}
    files["ca"].write_bytes(_pem(ca))
    files["cert"].write_bytes(_pem(server))
    files["key"].write_bytes(_pem(server_key))
    files["key"].chmod(0o600)
    return files


def _node_keys(folder: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's P-384 EC key pair as `ssh-keygen -t ecdsa -b 384 -N "" -f NAME` writes
    it: the OpenSSH private key `NAME` and the public key line `NAME.pub`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    private, public = folder / name, folder / f"{name}.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    private.chmod(0o600)
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    )
    return private, public


class _Secured:
    """A SuperLink with TLS and SuperNode authentication on loopback, the `flwr` connection
    `loop` to it ($FLWR_HOME/config.toml with `root-certificates`), and every process a test
    starts, each logged to a file in `folder`; `stop` ends them all by PID."""

    def __init__(self, folder: Path, node_ports: int) -> None:
        self.folder = folder
        self.tls = _tls_files(folder / "tls")
        self.link, self.gate_port, *self.node_ports = _free_ports(2 + node_ports)
        home = folder / "flwr_home"
        home.mkdir()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "loop"\n\n[superlink.loop]\n'
            f'address = "127.0.0.1:{self.link}"\nroot-certificates = "{self.tls["ca"]}"\n'
        )
        self.env = {
            **os.environ,
            **FLOWER_ENV,
            "FLWR_HOME": str(home),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        self.procs: list[subprocess.Popen] = []
        self.logs: list = []

    def launch(self, args: list[str], name: str, **extra: str) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "w")  # noqa: SIM115 - closed in stop()
        self.logs.append(log)
        proc = subprocess.Popen(
            [str(BIN / args[0]), *args[1:]],
            cwd=self.folder,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**self.env, **extra},
        )
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text()

    def superlink(self) -> subprocess.Popen:
        tls = self.tls
        proc = self.launch(
            [
                "flower-superlink",
                "--ssl-ca-certfile",
                str(tls["ca"]),
                "--ssl-certfile",
                str(tls["cert"]),
                "--ssl-keyfile",
                str(tls["key"]),
                "--enable-supernode-auth",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.link),
            ],
            "superlink",
        )
        _wait_for_port(self.link, proc, 60)
        return proc

    def gate(self) -> subprocess.Popen:
        """`protofed flower gate` in front of the SuperLink: what SuperNodes dial."""
        tls = self.tls
        proc = self.launch(
            [
                "protofed",
                "flower",
                "gate",
                "--listen",
                f"127.0.0.1:{self.gate_port}",
                "--superlink",
                f"127.0.0.1:{self.link}",
                "--ssl-certfile",
                str(tls["cert"]),
                "--ssl-keyfile",
                str(tls["key"]),
                "--ssl-ca-certfile",
                str(tls["ca"]),
            ],
            "gate",
        )
        _wait_for_port(self.gate_port, proc, 60)
        return proc

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "flwr"), *args],
            env=self.env,
            cwd=self.folder,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def register(self, public_keys: list[Path]) -> list[int]:
        """`flwr supernode register KEY.pub loop` for each key, at once; the node ids."""
        procs = [
            subprocess.Popen(
                [str(BIN / "flwr"), "supernode", "register", str(k), "loop", "--format", "json"],
                env=self.env,
                cwd=self.folder,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for k in public_keys
        ]
        answers = [p.communicate(timeout=120)[0] for p in procs]
        replies = [json.loads(a[a.index("{") :]) for a in answers]
        assert all(r["success"] for r in replies), answers
        return [int(r["node-id"]) for r in replies]

    def nodes(self) -> dict[int, str]:
        """The SuperLink's nodes (`flwr supernode ls`): node id -> status."""
        listed = self.flwr("supernode", "ls", "loop", "--format", "json")
        reply = json.loads(listed.stdout[listed.stdout.index("{") :])
        assert reply["success"], listed.stdout + listed.stderr
        return {int(n["node-id"]): n["status"] for n in reply["nodes"]}

    def supernode(self, name: str, key: Path, port: int, *more: str, **extra: str):
        return self.launch(
            [
                "flower-supernode",
                "--superlink",
                f"127.0.0.1:{self.gate_port}",  # the gate: SuperNodes never see the SuperLink
                "--root-certificates",
                str(self.tls["ca"]),
                "--auth-supernode-private-key",
                str(key),
                "--port",
                str(port),
                *more,
            ],
            name,
            **extra,
        )

    def stop(self) -> list[psutil.Process]:
        survivors = _stop(self.procs)
        for log in self.logs:
            log.close()
        return survivors


def test_deployment_on_loopback_with_three_supernodes(har, tmp_path) -> None:
    """TLS (self-signed CA) and SuperNode authentication: each node's key is registered with
    `flwr supernode register` before it starts, as a real federation would be set up."""
    overrides = (
        f"data.name=arrays data.path={har['3']} data.partition=natural seed=1 "
        "model.name=mlp model.hidden=[64] train.rounds=2 train.threads=1 "
        "eval.every=2 flower.min_replies=2"
    )
    cfg = load_config(None, overrides.split())
    parts = export_partitions(cfg, tmp_path / "parts")
    assert [load_partition(p).client for p in parts] == [0, 1, 2]
    flower = _Secured(tmp_path, node_ports=3)
    keys = [_node_keys(tmp_path / "tls", f"supernode{i}") for i in range(3)]
    out = tmp_path / "run"
    try:
        flower.superlink()
        flower.gate()
        registered = flower.register([public for _, public in keys])
        for i, (port, part, (private, _)) in enumerate(
            zip(flower.node_ports, parts, keys, strict=True)
        ):
            fault = {"PROTOFED_FLOWER_FAULT": "2:2"} if i == 2 else {}  # client 2 fails in round 2
            flower.supernode(
                f"supernode{i}", private, port, "--node-config", f'partition="{part}"', **fault
            )
        run_config = f'overrides="{overrides}" out="{out}" nodes=3 wait-s=90.0'
        submitted = flower.flwr("run", str(REPO / "flower_app"), "loop", "--run-config", run_config)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        deadline = time.monotonic() + 600
        while not (out / "summary.json").exists():
            assert time.monotonic() < deadline, flower.log("superlink")[-3000:]
            assert all(p.poll() is None for p in flower.procs), "a Flower process died"
            time.sleep(1)
        summary = json.loads((out / "summary.json").read_text())
        online = flower.nodes()
    finally:
        survivors = flower.stop()
    assert not survivors, [(p.pid, p.name()) for p in survivors]
    assert sorted(online) == sorted(registered) and set(online.values()) == {"online"}
    assert summary["engine"] == "flower-deployment" and summary["rounds"] == 2
    assert [(r["round"], r["client"]) for r in summary["flower"]["rejections"]] == [(2, 2)]
    assert "failed" in summary["flower"]["rejections"][0]["reason"]
    final = summary["final"]
    assert final["generalization"] is None  # needs all test data in one place
    assert 0.3 < final["personalization"]["acc"] <= 1 and 0.3 < final["global"]["acc"] <= 1
    partition = json.loads((out / "partition.json").read_text())
    assert partition["deployed_clients"] == [0, 1, 2] and len(partition["clients"]) == 3
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [2]


def test_a_supernode_whose_key_is_not_registered_is_refused(tmp_path) -> None:
    """A key registered, another not: the SuperNode holding the other one never joins."""
    flower = _Secured(tmp_path, node_ports=1)
    _, known = _node_keys(tmp_path / "tls", "known")
    stranger, _ = _node_keys(tmp_path / "tls", "stranger")
    t0 = time.monotonic()
    try:
        flower.superlink()
        flower.gate()
        (registered,) = flower.register([known])
        node = flower.supernode("stranger", stranger, flower.node_ports[0])
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.wait(timeout=45)
        exit_code = node.poll()
        listed = flower.nodes()
    finally:
        survivors = flower.stop()
    assert not survivors, [(p.pid, p.name()) for p in survivors]
    log = flower.log("stranger")
    assert exit_code not in (None, 0), log  # it gave up by itself: no retrying forever
    assert "Failed to activate SuperNode" in log, log
    assert "No SuperNode found with the given public key" in flower.log("superlink")
    assert listed == {registered: "registered"}  # the stranger is not there; nobody is online
    assert time.monotonic() - t0 < 60


MARKER_APP = {
    "pyproject.toml": """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "marker-app"
version = "0.1.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "stranger"

[tool.flwr.app.components]
serverapp = "marker:app"
clientapp = "marker:client"
""",
    "marker.py": '''"""Writes a file when imported: proof that a submitted run reached the SuperLink."""

import os
from pathlib import Path

from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

Path(os.environ["PROTOFED_TEST_MARKER"]).write_text("a submitted run was imported\\n")
app = ServerApp()
client = ClientApp()


@app.main()
def main(grid, context) -> None:
    pass
''',
}


def _non_loopback_ipv4() -> str | None:
    """An IPv4 address of this machine that is not loopback, if it has one."""
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def test_only_the_superlinks_machine_can_submit_runs(tmp_path) -> None:
    """The documented secure deployment (docs/flower.md): the SuperLink on loopback, the
    Fleet gate on the address SuperNodes dial. A stranger holding `ca.crt` (and one holding a
    registered SuperNode's key) reaches only the gate: `flwr run` through it fails and nothing
    runs, every Control and Runtime route is 404 there; the SuperLink's own port is closed on
    the machine's other addresses; a registered SuperNode joins through the gate; the
    operator, on the SuperLink's machine, submits the same app and it runs."""
    import httpx

    app = tmp_path / "marker_app"
    app.mkdir()
    for name, text in MARKER_APP.items():
        (app / name).write_text(text)
    marker = tmp_path / "marker.txt"
    flower = _Secured(tmp_path, node_ports=1)
    flower.env["PROTOFED_TEST_MARKER"] = str(marker)
    with open(Path(flower.env["FLWR_HOME"]) / "config.toml", "a") as f:  # the stranger's view
        f.write(
            f'\n[superlink.stranger]\naddress = "127.0.0.1:{flower.gate_port}"\n'
            f'root-certificates = "{flower.tls["ca"]}"\n'
        )
    private, public = _node_keys(tmp_path / "tls", "member")
    other = _non_loopback_ipv4()
    try:
        flower.superlink()
        flower.gate()
        (registered,) = flower.register([public])
        flower.supernode("member", private, flower.node_ports[0])
        stranger = flower.flwr("run", str(app), "stranger", timeout=120)
        verify = ssl.create_default_context(cafile=str(flower.tls["ca"]))
        with httpx.Client(verify=verify, timeout=30) as client:
            gate = f"https://127.0.0.1:{flower.gate_port}"
            statuses = {
                path: client.post(gate + path, content=b"").status_code
                for path in (
                    "/v1/control/start-run",
                    "/v1/control/list-runs",
                    "/v1/control/register-node",
                    "/v1/runtime/acquire-task",
                    "/v1/fleet/../control/start-run",
                )
            }
            statuses["GET /docs"] = client.get(gate + "/docs").status_code
            statuses["GET /v1/fleet/get-run"] = client.get(gate + "/v1/fleet/get-run").status_code
        if other is not None:
            with pytest.raises(OSError), socket.create_connection((other, flower.link), 5):
                pass
        deadline = time.monotonic() + 60
        while flower.nodes() != {registered: "online"}:
            assert time.monotonic() < deadline, flower.log("member")[-3000:]
            time.sleep(1)
        time.sleep(3)  # a run the stranger started would have imported the app by now
        runs_before = flower.flwr("ls", "loop", "--format", "json")
        assert not marker.exists(), "the stranger's run reached the SuperLink"
        operator = flower.flwr("run", str(app), "loop", timeout=120)
        deadline = time.monotonic() + 90
        while not marker.exists():
            assert time.monotonic() < deadline, flower.log("superlink")[-3000:]
            time.sleep(1)
    finally:
        survivors = flower.stop()
    assert not survivors, [(p.pid, p.name()) for p in survivors]
    said = stranger.stdout + stranger.stderr
    assert stranger.returncode != 0 and "404 Not Found" in said, said
    assert set(statuses.values()) == {404}, statuses
    gate_log = flower.log("gate")
    assert "refused POST /v1/control/start-run" in gate_log, gate_log
    listed = json.loads(runs_before.stdout[runs_before.stdout.index("{") :])
    assert listed["success"] and listed["runs"] == [], runs_before.stdout
    assert operator.returncode == 0, operator.stdout + operator.stderr


def test_the_gate_refuses_a_superlink_off_loopback_in_one_line(tmp_path) -> None:
    from typer.testing import CliRunner

    from protofed.cli import app as cli
    from protofed.flower.fleet_gate import FleetGate

    tls = _tls_files(tmp_path)
    with pytest.raises(ConfigError, match="loopback"):
        FleetGate("192.0.2.7:9093", tls["ca"])
    with pytest.raises(ConfigError, match="HOST:PORT"):
        FleetGate("127.0.0.1", tls["ca"])
    assert FleetGate("[::1]:9093", tls["ca"]).base == "https://[::1]:9093"
    files = [f"--ssl-{k}file={tls[v]}" for k, v in (("cert", "cert"), ("key", "key"))]
    result = CliRunner().invoke(
        cli,
        ["flower", "gate", *files, f"--ssl-ca-certfile={tls['ca']}", "--superlink=0.0.0.0:9093"],
    )
    text = (result.stderr or result.output).strip()
    assert result.exit_code == 2 and len(text.splitlines()) == 1, (result.exit_code, text)
    assert "loopback" in text and "Traceback" not in text


def test_two_nodes_claiming_one_client_are_both_left_out_in_one_line(caplog) -> None:
    """A duplicate (or foreign) node claiming a partition another node holds: the server
    cannot tell which is right, so both are left out, one warning names them, and the
    clients claimed once stay (the run goes on if enough remain: deploy's min_replies)."""
    from protofed.flower.transport import unique_claims

    claims = {0: [(11, {"client": 0})], 1: [(12, {"client": 1}), (13, {"client": 1})]}
    with caplog.at_level("WARNING", logger="protofed"):
        node_of, infos = unique_claims(claims)
    assert node_of == {0: 11} and list(infos) == [0]
    said = [r.getMessage() for r in caplog.records]
    assert said == ["client 1 is claimed by nodes 12, 13: all left out"]
