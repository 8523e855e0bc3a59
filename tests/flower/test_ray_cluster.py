"""A Flower simulation on a two-node Ray cluster (`flower.ray_address`), on loopback.

Two `ray start` nodes on this machine (one CPU each, a temp dir and ports of their own), a
protofed run attached to them in a subprocess (the CLI, as a user runs it): its numbers
equal the built-in engine's, its two ClientApp actors ran on the two nodes, and the run
left the cluster up (protofed kills only what it started). The cluster is then stopped by
killing the processes of the two `ray start` sessions (never `ray stop`, which would stop
every Ray instance of the machine, other tests' included), and none may remain.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

# Flower's simulation and deployment engines: Ray, subprocesses, whole runs
pytestmark = pytest.mark.integration

pytest.importorskip("flwr")
pytest.importorskip("ray")

from protofed.config import load_config  # noqa: E402
from protofed.flower.session import FLOWER_ENV  # noqa: E402
from protofed.runtime import prepare, simulate  # noqa: E402

BIN = Path(sys.executable).parent
ENV = {**os.environ, **FLOWER_ENV, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": ""}
SETTINGS = [
    "data.name=digits",
    "data.num_clients=4",
    "data.partition=iid",
    "model.name=mlp",
    "model.hidden=[32]",
    "algorithm.name=fedavg",
    "train.rounds=2",
    "train.optimizer=adam",
    "train.lr=0.01",  # it learns in 2 rounds (global accuracy ~0.72): equality is not vacuous
    "train.threads=1",
    "seed=3",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sessions_processes(sids: set[int]) -> list[psutil.Process]:
    """The live processes of the given sessions: what the `ray start` calls spawned."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getsid(proc.pid) in sids and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def _ray_start(*args: str, sids: set[int]) -> None:
    """`ray start` in a session of its own: its daemons (GCS, raylet, agents, workers)
    inherit the session id, which is how they are found and stopped afterwards."""
    proc = subprocess.Popen(
        [str(BIN / "ray"), "start", *args, "--node-ip-address=127.0.0.1"],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    sids.add(proc.pid)  # the session leader's pid is the session id
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out[-2000:]


def _driver(port: int, code: str) -> object:
    """Run `code` (it sets `result`) in a fresh process attached to the cluster: the test
    process itself never connects, so the Flower sessions of other tests start their own."""
    script = (
        textwrap.dedent(f"""
        import json, ray
        ray.init(address="127.0.0.1:{port}", logging_level="ERROR", log_to_driver=False)
        """)
        + textwrap.dedent(code)
        + "\nprint('RESULT=' + json.dumps(result))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT=")][-1]
    return json.loads(line.removeprefix("RESULT="))


@pytest.fixture(scope="module")
def cluster():
    """A head and a second node on loopback, one CPU each; killed by session at the end."""
    temp = Path(tempfile.mkdtemp(prefix="pf-ray-", dir="/tmp"))  # short: socket paths
    port = _free_port()
    sids: set[int] = set()
    try:
        _ray_start(
            "--head",
            f"--port={port}",
            "--num-cpus=1",
            "--include-dashboard=false",
            f"--dashboard-port={_free_port()}",
            f"--ray-client-server-port={_free_port()}",
            f"--temp-dir={temp}",
            "--disable-usage-stats",
            sids=sids,
        )
        _ray_start(f"--address=127.0.0.1:{port}", "--num-cpus=1", sids=sids)
        yield {"port": port, "sids": sids}
    finally:
        procs = _sessions_processes(sids)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)  # Ray's agents ignore SIGTERM
        psutil.wait_procs(procs, timeout=10)
        left = _sessions_processes(sids)
        shutil.rmtree(temp, ignore_errors=True)
        assert not left, [(p.pid, p.name()) for p in left]


def test_a_simulation_on_two_ray_nodes_equals_the_builtin_engine(cluster, tmp_path) -> None:
    port = cluster["port"]
    nodes = _driver(port, "result = [n['NodeID'] for n in ray.nodes() if n['Alive']]")
    assert len(nodes) == 2

    out, log = tmp_path / "run", tmp_path / "run.log"
    with log.open("w") as sink:  # a file: a full pipe would block the run while it is polled
        run = subprocess.Popen(
            [str(BIN / "protofed"), "run", "--engine", "flower", "--out", str(out)]
            + [a for s in [*SETTINGS, f"flower.ray_address=127.0.0.1:{port}"] for a in ("-s", s)],
            env=ENV,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    started: set[str] = set()  # what the attached run started: its reaper, no Ray process
    with contextlib.suppress(psutil.Error):
        driver = psutil.Process(run.pid)
        while run.poll() is None:
            for child in driver.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    started.add(child.name())
            time.sleep(0.2)
    assert run.wait(timeout=120) == 0, log.read_text()[-3000:]
    assert not {n for n in started if "raylet" in n or "gcs" in n or n.startswith("ray::")}
    ours = json.loads((out / "summary.json").read_text())
    ref = simulate(prepare(load_config(None, SETTINGS))).run().to_json()  # as summary.json
    assert ours["engine"] == "flower-simulation" and ours["flower"]["rejected"] == 0
    assert ref["final"]["global"]["acc"] > 0.5
    for when in ("final", "selected"):
        assert ours[when]["round"] == ref[when]["round"]
        for part in ("personalization", "generalization", "global"):
            if ref[when][part] is None:
                assert ours[when][part] is None
                continue
            for key, value in ref[when][part].items():
                assert ours[when][part][key] == pytest.approx(value, abs=1e-4), (when, part, key)
    assert ours["comm"] == ref["comm"]

    # where the ClientApps ran: one actor on each node (one CPU each, flower.client_cpus=1);
    # the run's clean-up (and its reaper) left the cluster alone
    after = _driver(
        port,
        """
        # the GCS's actor table (dead actors included); the state API would need a dashboard
        table = ray._private.state.actors().values()
        result = {
            "actors": [
                (a["Address"]["NodeID"], a["State"])
                for a in table
                if a["ActorClassName"].endswith("ClientAppActor")
            ],
            "nodes": [n["NodeID"] for n in ray.nodes() if n["Alive"]],
        }
        """,
    )
    assert sorted(node for node, _ in after["actors"]) == sorted(nodes)
    assert {state for _, state in after["actors"]} == {"DEAD"}  # the run ended its actors
    assert sorted(after["nodes"]) == sorted(nodes)
    assert _sessions_processes(cluster["sids"])
