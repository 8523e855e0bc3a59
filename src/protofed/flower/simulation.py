"""The Flower engine's simulation: round loops run on Flower's simulation engine (Ray).

One virtual SuperNode per client (`partition-id` = client id), evaluated on the server
(`ServerSideEvaluation`, every client's model fetched from its node). `start` prepares one
experiment and its run directory, `run_simulation_loop` runs it; `run_simulations` runs
several in one session, so Ray starts once. The process side (Ray, signals, clean-up) is
`session`'s.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import psutil
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from protofed import plugins
from protofed.config import ExperimentConfig
from protofed.core.results import Summary
from protofed.data.sources import data_root
from protofed.errors import RunStopped
from protofed.flower import wire
from protofed.flower.reaper import Reaper
from protofed.flower.session import (
    FLOWER_ENV,
    StopDeadline,
    backend_config,
    end_processes,
    quiet_flower_logs,
    shut_ray_down,
    signal_handlers_kept,
    stop_on_signals,
)
from protofed.flower.settings import check_settings
from protofed.flower.transport import STOP, FlowerTransport, discover
from protofed.runs import RunDir
from protofed.runtime import Prepared, RoundLoop, ServerSideEvaluation, prepare
from protofed.runtime.engine import recorded_count
from protofed.runtime.loop import OnRound

log = logging.getLogger("protofed.flower")


def client_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The config the simulated clients build from: the data root resolved, as the server's."""
    cfg = cfg.model_copy(deep=True)
    cfg.data.dir = str(data_root(cfg.data).resolve())
    if cfg.data.path:
        cfg.data.path = str(Path(cfg.data.path).expanduser().resolve())
    return cfg


def simulation_loop(prepared: Prepared, run_dir: RunDir | None = None) -> RoundLoop:
    """The round loop on Flower's simulation engine (attached to a Grid by `run_simulations`)."""
    transport = FlowerTransport(
        prepared, wire.config_json(client_config(prepared.cfg)), "flower-simulation"
    )
    loop = RoundLoop(
        prepared,
        transport,
        ServerSideEvaluation(prepared, transport),
        run_dir,
        summary_extra=transport.summary,
    )
    check_settings(prepared, loop.per_round(), simulated=True)
    return loop


def attach_to_nodes(grid: Grid, transport: FlowerTransport, num_clients: int) -> None:
    """Find the node of each of the experiment's clients (node i = client i) and attach the
    transport to them; a session sized for a larger federation has nodes to spare."""
    node_of, _ = discover(
        grid, transport.config_json, num_clients, timeout_s=transport.cfg.flower.timeout_s
    )
    node_of = {c: node for c, node in node_of.items() if c < num_clients}
    missing = sorted(set(range(num_clients)) - set(node_of))
    if missing:
        raise RunStopped(f"clients {missing[:5]} have no node")
    transport.attach(grid, node_of)


class Experiments:
    """The ServerApp's side of a session: each loop attached to the nodes and run in turn.

    Flower runs the ServerApp in a thread of its own; what it leaves (`results`, the
    processes it saw, `spawned`) is read by the caller once the session ends.
    """

    def __init__(self, loops: list[RoundLoop], on_round: OnRound | None) -> None:
        self.loops = loops
        self.on_round = on_round
        self.results: list[Summary | Exception] = []
        self.spawned: list[psutil.Process] = []
        self.session_start = 0.0  # the first experiment's start-up counts Flower's own

    def server_app(self) -> ServerApp:
        app = ServerApp()

        @app.main()
        def main(grid: Grid, context: Context) -> None:
            self.run_all(grid)

        return app

    def run_all(self, grid: Grid) -> None:
        try:
            for loop in self.loops:
                self.results.append(self.run_one(grid, loop))
        finally:
            self.spawned.extend(psutil.Process().children(recursive=True))

    def run_one(self, grid: Grid, loop: RoundLoop) -> Summary | Exception:
        """One experiment's summary, or the exception that stopped it (reported, not raised)."""
        t_loop = time.perf_counter()
        transport = loop.transport
        assert isinstance(transport, FlowerTransport), "not a Flower round loop"
        try:
            attach_to_nodes(grid, transport, len(loop.prepared.fed.clients))  # unseen too
            transport.startup_s = time.perf_counter() - (
                self.session_start if not self.results else t_loop
            )
            return loop.run(self.on_round)
        except Exception as err:  # noqa: BLE001 - reported to the caller, per experiment
            if not STOP.is_set():  # a signal's stop is said once, by the caller
                log.error("experiment %s stopped: %s", loop.algorithm.name, err)
            return err


def _run_session(experiments: Experiments) -> bool:
    """The experiments in one session of Flower's simulation engine; whether it was asked to
    stop (a signal: the session then ended cleanly, the runs did not finish).

    Every process the session started (Ray's raylet, GCS, actors) is waited for by its PID
    when it ends, and killed if it does not exit; the `Reaper` kills them if this process
    is SIGKILLed.
    """
    from flwr.simulation import run_simulation

    from protofed.flower.clientapp import app as client_app

    loops = experiments.loops
    server_app = experiments.server_app()
    backend = backend_config(loops[0].cfg.flower)
    with quiet_flower_logs():
        experiments.session_start = time.perf_counter()
        STOP.clear()
        with (
            signal_handlers_kept(),
            Reaper() as reaper,  # if this process is SIGKILLed, Ray's processes die with it
            StopDeadline(spared=reaper.pid) as deadline,  # a signal ends it within seconds
        ):
            try:
                stop_on_signals(backend["init_args"])
                with deadline.running():
                    run_simulation(
                        server_app=server_app,
                        client_app=client_app,
                        num_supernodes=max(len(loop.prepared.fed.clients) for loop in loops),
                        backend_config=backend,
                    )
                stopped = STOP.is_set()  # a signal during the clean-up below stops nothing
            except BaseException:  # Ctrl-C, SIGTERM: end the ServerApp thread's wait, then Ray
                STOP.set()
                raise
            finally:
                shut_ray_down()
                spawned = experiments.spawned
                spawned.extend(psutil.Process().children(recursive=True))  # thread not done
                started = [p for p in set(spawned) if p.pid != reaper.pid]
                # stopped: Flower has shut Ray down, so what is left is killed now
                end_processes(started, at_once=STOP.is_set())
    return stopped


def run_simulations(
    loops: list[RoundLoop], on_round: OnRound | None = None
) -> list[Summary | Exception]:
    """Run experiments one after the other in one session of Flower's simulation engine.

    Starting Ray is most of a short run's cost; a sweep (or a test) pays it once. The
    session has as many virtual SuperNodes as the largest federation (node i = client i);
    each experiment's client states are kept apart in `Context.state` (wire.state_key).
    Returns each experiment's summary, or the exception that stopped it (the next one still
    runs); raises KeyboardInterrupt when a signal stopped the session.

    With `flower.ray_address` the session attaches to that Ray cluster instead (its actors
    spread over the cluster's nodes) and starts no Ray process: the cluster's processes are
    not this process's descendants, so neither the clean-up nor the `Reaper` (both touch
    descendants only) ever kills them. Without it the session starts its own instance
    (`address="local"`), never one it found (RAY_ADDRESS, the last `ray start`).
    """
    for key, value in FLOWER_ENV.items():
        os.environ.setdefault(key, value)
    experiments = Experiments(loops, on_round)
    if _run_session(experiments):
        raise KeyboardInterrupt
    if len(experiments.results) != len(loops):
        raise RunStopped("the Flower simulation ended early (see the log above)")
    return experiments.results


def run_simulation_loop(loop: RoundLoop, on_round: OnRound | None = None) -> Summary:
    """One experiment in its own Flower simulation session: its summary, or its error."""
    result = run_simulations([loop], on_round)[0]
    if isinstance(result, BaseException):
        raise result
    return result


def start(cfg: ExperimentConfig, out: str | Path, overwrite: bool = False) -> RoundLoop:
    """Like `runtime.start`, for Flower's simulation engine (run it with
    `run_simulation_loop`)."""
    plugins.require_visible_elsewhere(cfg, "Flower's nodes")
    prepared = recorded_count(prepare(cfg))  # config.yaml: the clients a partition built
    loop = simulation_loop(prepared)  # validates the Flower settings before any file exists
    loop.run_dir = RunDir.create(
        out,
        prepared.cfg.to_dict(),
        prepared.fed.summary(),
        prepared.fed.counts_table(),
        overwrite=overwrite,
        engine=loop.transport.name,
    )
    return loop
