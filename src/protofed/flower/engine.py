"""The Flower engine: the one round loop, with a transport that talks over Flower's Grid.

`FlowerTransport` fills the loop's one seam differently from the built-in engine: `fit`
sends each sampled client its message (`algorithm.configure`, per client) as a Flower
Message and validates the replies (`validation`), and `client_models` asks every client for
its personalized model, because client states live on the clients (`Context.state`), not
on the server. Sampling, seeding, aggregation, byte counts, the evaluation protocol and the
run directory are the loop's own code, so the same config and seed give the same numbers
(tests check it against golden files).

`run_simulations` runs loops on Flower's simulation engine (Ray, one virtual SuperNode per
client, `partition-id` = client id), evaluated on the server (`ServerSideEvaluation`).
`deploy` builds the loop of a deployed ServerApp (`serverapp.py`): the server holds no
data, learns the federation from the SuperNodes' partition headers, samples among the
clients present and has each client evaluate itself (`ClientSideEvaluation`).

Differences from the built-in engine, all by design:
- no checkpoints: client states live on the nodes (`FlowerTransport.states` is None), so a
  killed run cannot be resumed;
- a rejected reply is left out of the round (logged); the round fails only when fewer than
  `flower.min_replies` replies remain; the bytes sent to a rejected client still count;
- the summary adds `flower` (rejected replies per round, start-up time).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from protofed import plugins
from protofed.config import ExperimentConfig
from protofed.core.types import MODEL, Arrays, Records, Reply, nbytes
from protofed.data.federated import SPLITS, ClientData, FederatedData
from protofed.data.sources import data_root
from protofed.errors import ConfigError, RunStopped
from protofed.evaluation import scores_from_counts, summarize
from protofed.flower import wire
from protofed.flower.reaper import Reaper
from protofed.flower.validation import Rejected, ReplyValidator
from protofed.runs import RunDir
from protofed.runtime import (
    Prepared,
    RoundLoop,
    ServerSideEvaluation,
    build_model_and_algorithm,
    prepare,
)
from protofed.runtime.loop import OnRound
from protofed.runtime.prepare import resolve_device

log = logging.getLogger("protofed.flower")

FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}


STOP = threading.Event()
"""Set when the process is interrupted: the ServerApp thread's waits end within a poll."""


def exchange(grid: Grid, messages: list[Message], timeout_s: float | None) -> list[Message]:
    """`grid.send_and_receive` that also ends when `STOP` is set (Ctrl-C, SIGTERM), and sends
    nothing once it is.

    Flower runs the ServerApp in a thread of its own that waits for replies; after the main
    thread is interrupted no reply comes, and without this the process would wait forever.
    """
    if STOP.is_set():  # asked to stop: start no client work
        raise RunStopped("interrupted")
    ids = set(grid.push_messages(messages))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    replies: list[Message] = []
    while ids:
        if STOP.is_set():
            raise RunStopped("interrupted")
        if deadline is not None and time.monotonic() >= deadline:
            break
        got = list(grid.pull_messages(ids))
        replies += got
        ids.difference_update(m.metadata.reply_to_message_id for m in got)
        if ids:
            time.sleep(0.05)
    return replies


def discover(
    grid: Grid,
    config_json: str,
    expected: int,
    wait_s: float = 60.0,
    timeout_s: float | None = None,
) -> tuple[dict[int, int], dict[int, dict]]:
    """Which node holds which client: wait for `expected` nodes, then ask each ("query").

    Returns client id -> node id, and client id -> the node's answer (its partition header
    in deployment). A node that fails to answer (say, a partition of another experiment) is
    left out with a logged reason; two nodes claiming one client are an error.
    """
    deadline = time.monotonic() + wait_s
    nodes = list(grid.get_node_ids())
    while len(nodes) < expected and time.monotonic() < deadline:
        if STOP.is_set():
            raise RunStopped("interrupted")
        time.sleep(0.5)
        nodes = list(grid.get_node_ids())
    if len(nodes) < expected:
        raise RuntimeError(
            f"{len(nodes)} Flower node(s) connected within {wait_s:.0f} s, {expected} expected"
        )
    task = wire.task(wire.QUERY, 0, -1, config_json)
    messages = [
        Message(RecordDict({wire.TASK: task}), node, wire.QUERY, group_id="query") for node in nodes
    ]
    node_of: dict[int, int] = {}
    infos: dict[int, dict] = {}
    for reply in exchange(grid, messages, timeout_s):
        node = reply.metadata.src_node_id
        if reply.has_error():
            log.warning("node %s is left out: %s", node, reply.error.reason)
            continue
        info = json.loads(str(reply.content.config_records[wire.INFO]["json"]))
        cid = int(info["client"])
        if cid in node_of:
            raise RuntimeError(f"two nodes ({node_of[cid]}, {node}) hold client {cid}")
        node_of[cid], infos[cid] = node, info
    return node_of, infos


@contextlib.contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """Give back the SIGTERM and SIGINT handlers found on entry when the block ends.

    `ray.init` installs a SIGTERM handler that raises SystemExit and never restores the one
    it replaced; processes forked later (the built-in engine's worker pool) would inherit it.
    Only the main thread can set handlers, so elsewhere this does nothing.
    """
    main = threading.current_thread() is threading.main_thread()
    found = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        yield
    finally:
        for signum, handler in found.items():
            if handler is not None:  # None: set outside Python, cannot be set back from here
                signal.signal(signum, handler)


def _request_stop(signum: int, frame: object) -> None:
    """The first Ctrl-C or SIGTERM asks the session to stop; the next one interrupts at once.

    Interrupting the main thread inside Flower's Simulation Runtime makes it shut Ray down
    while its worker threads may still wait on an actor's reply; the process then hung with
    every thread in a futex wait (seen in 4 of 5 suite runs, tests/test_reliability.py).
    Asking instead ends the ServerApp's waits (`STOP`), so Flower stops its workers once the
    clients in training reply, then shuts Ray down with no call in flight.
    """
    if STOP.is_set():
        raise KeyboardInterrupt
    STOP.set()
    with contextlib.suppress(OSError):  # a handler may not take logging's locks
        os.write(2, b"stopping once the clients in training reply (again: stop at once)\n")


def _start_ray(init_args: dict[str, Any]) -> None:
    """Start Ray here, as Flower's Ray backend would, so `_request_stop` can follow it.

    `ray.init` replaces the SIGTERM handler; started by Flower, it would do so inside
    `run_simulation`, where this thread can no longer set its own. Flower then finds Ray
    running and uses it (it ends it with the session). The ClientApps import protofed in
    Ray's workers, which need this process's `sys.path` (Flower passes it the same way).
    """
    import ray

    if ray.is_initialized():
        return
    paths = [*sys.path, *filter(None, [os.environ.get("PYTHONPATH")])]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    init_args = {"include_dashboard": False, **init_args}
    ray.init(runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}}, **init_args)


class RoundFailed(RunStopped):
    """Fewer valid replies than `flower.min_replies`: the round cannot be aggregated."""


def check_settings(prepared: Prepared, per_round: int, simulated: bool) -> None:
    """The Flower settings against the experiment, before any file exists."""
    cfg = prepared.cfg
    if prepared.pooled is not None:
        raise ConfigError(
            f"'{prepared.algorithm.name}' pools all data in one client: run it on the built-in engine"
        )
    if simulated and cfg.train.device != "cpu" and cfg.flower.client_gpus == 0:
        raise ConfigError(
            f"train.device={cfg.train.device} on Flower: set flower.client_gpus (GPUs per ClientApp, e.g. 0.5)"
        )
    if cfg.flower.min_replies > per_round:
        raise ConfigError(
            f"flower.min_replies={cfg.flower.min_replies} exceeds the {per_round} clients sampled per round"
        )
    if simulated and cfg.flower.ray_address is not None:
        check_ray_address(cfg.flower.ray_address)


RAY_PROBE_S = 5.0
"""How long `check_ray_address` waits for a cluster's head to accept a connection."""


def check_ray_address(address: str) -> None:
    """`flower.ray_address` checked before any file exists: Ray itself waits on an address
    nothing answers at, or fails once the run directory was made; and its own `auto`, with
    no `ray start` cluster to find, attaches to any Ray instance running here, another
    run's included. As in Ray, `auto` means RAY_ADDRESS when set; a HOST:PORT is used as
    it is."""
    target, where = address, f"flower.ray_address={address}"
    if address == "auto":
        if os.environ.get("RAY_ADDRESS"):
            target = os.environ["RAY_ADDRESS"]
            where += f" (RAY_ADDRESS={target})"
        else:
            from ray._private.utils import read_ray_address  # the last `ray start` here

            target = read_ray_address() or ""
            if not target:
                raise ConfigError(
                    f"{where}: no `ray start` cluster on this machine and RAY_ADDRESS unset "
                    "(Ray would attach to any instance it finds): start one, or name it as "
                    "HOST:PORT"
                )
    host, colon, port = target.removeprefix("ray://").rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:6379
    if not (colon and host and port.isdecimal()):
        raise ConfigError(f"{where}: '{target}' is not HOST:PORT, 'auto' or ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=RAY_PROBE_S).close()
    except OSError as exc:
        raise ConfigError(
            f"{where}: nothing answers at {target} ({exc.strerror or type(exc).__name__}); "
            "start the cluster (`ray start --head`), or leave the key unset for a Ray of "
            "the run's own"
        ) from None


def client_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The config the simulated clients build from: the data root resolved, as the server's."""
    cfg = cfg.model_copy(deep=True)
    cfg.data.dir = str(data_root(cfg.data).resolve())
    if cfg.data.path:
        cfg.data.path = str(Path(cfg.data.path).expanduser().resolve())
    return cfg


class FlowerTransport:
    """Messages over Flower's Grid; the client states stay on the clients (`Context.state`).

    `fit` sends each sampled client its message (`algorithm.configure`, per client) and
    validates the replies (`validation`); `client_models` asks every client for its
    personalized model. A rejected reply is left out of the round (logged); the round fails
    only when fewer than `flower.min_replies` replies remain.
    """

    states = None  # on the clients: a Flower run cannot be checkpointed here
    trained = None  # eval.client_model=trained: kept on the clients too (Context.state)

    def __init__(self, prepared: Prepared, config_json: str, name: str) -> None:
        self.prepared = prepared
        self.algorithm = prepared.algorithm
        self.cfg = prepared.cfg
        self.config_json = config_json
        self.name = name
        self.grid: Grid | None = None
        self.node_of: dict[int, int] = {}  # client id -> Flower node id
        self.validator = ReplyValidator.for_model(prepared.model.state_dict())
        self.rejected: list[dict] = []  # {"round", "client", "reason"}
        # what the server knows of each client's training set (its data in simulation, the
        # partition headers in deployment): a reply may not claim more examples
        self.train_sizes: dict[int, int] = {
            i: len(c.train_y) for i, c in enumerate(prepared.fed.clients)
        }
        self.startup_s = 0.0  # Flower's start-up and the node discovery, before round 1

    def attach(self, grid: Grid, node_of: dict[int, int]) -> None:
        self.grid, self.node_of = grid, node_of

    # talking to nodes ----------------------------------------------------------------------
    def send(self, kind: str, contents: dict[int, RecordDict], group: str) -> dict[int, Message]:
        """Send one message per client; the replies that came back, by client."""
        assert self.grid is not None, "not attached to a Flower Grid"
        messages = [
            Message(content, self.node_of[cid], kind, group_id=group)
            for cid, content in contents.items()
        ]
        client_of = {node: cid for cid, node in self.node_of.items()}
        replies = exchange(self.grid, messages, self.cfg.flower.timeout_s)
        return {client_of[r.metadata.src_node_id]: r for r in replies}

    def content(
        self,
        kind: str,
        server_round: int,
        cid: int,
        message: Records,
        mode: str = "",
        extra: dict | None = None,
        cache: dict | None = None,
    ) -> RecordDict:
        """One client's message. `cache` keeps serialized records by record object: clients
        sent the same record (FedAvg's global model) share one ArrayRecord."""
        content = RecordDict(
            {wire.TASK: wire.task(kind, server_round, cid, self.config_json, mode)}
        )
        for name, arrays in message.items():
            if cache is None:
                content[name] = wire.to_records({name: arrays})[name]
            else:
                if id(arrays) not in cache:  # holding `arrays` keeps its id unique
                    cache[id(arrays)] = (arrays, wire.to_records({name: arrays})[name])
                content[name] = cache[id(arrays)][1]
        for name, record in (extra or {}).items():
            content[name] = record
        return content

    # the transport ---------------------------------------------------------------------------
    def fit(
        self, server: Records, server_round: int, clients: list[int]
    ) -> Iterator[tuple[Reply, int]]:
        messages = {cid: self.algorithm.configure(server, cid, server_round) for cid in clients}
        cache: dict = {}
        contents = {
            cid: self.content(wire.TRAIN, server_round, cid, m, cache=cache)
            for cid, m in messages.items()
        }
        answers = self.send(wire.TRAIN, contents, str(server_round))
        del contents, cache
        replies: list[Reply] = []
        rejected: list[Rejected] = []
        for cid in clients:
            answer = answers.get(cid)
            try:
                if answer is None:
                    raise ValueError("no reply (timed out or the node is gone)")
                if answer.has_error():
                    raise ValueError(f"the client failed: {answer.error.reason}")
                records = wire.from_records(answer.content, self.cfg.train.device)
                metrics = wire.from_metrics(answer.content.metric_records[wire.METRICS])
                examples = metrics.pop(wire.NUM_EXAMPLES)
                known = self.train_sizes.get(cid)
                if known is not None and examples > known:
                    raise ValueError(
                        f"num_examples {examples:g} exceeds the {known} training samples "
                        "the server knows the client has"
                    )
            except (ValueError, KeyError) as err:
                rejected.append(Rejected(cid, str(err).strip("'\"")))
                continue
            replies.append(Reply(cid, records, metrics, examples))
        kept, invalid = self.validator.check_round(replies, messages)
        rejected = sorted([*rejected, *invalid], key=lambda r: r.client)
        for r in rejected:
            log.warning(
                "round %d: reply of client %d rejected: %s", server_round, r.client, r.reason
            )
            self.rejected.append({"round": server_round, "client": r.client, "reason": r.reason})
        if len(kept) < self.cfg.flower.min_replies:
            raise RoundFailed(
                f"round {server_round}: {len(kept)} valid repl(ies) of {len(clients)}, "
                f"flower.min_replies={self.cfg.flower.min_replies}"
            )
        sent = {cid: nbytes(m) for cid, m in messages.items()}
        # a rejected client was sent its message all the same: its bytes count with the first
        # kept reply's (the loop counts bytes down per reply it sees)
        unanswered = sum(sent[r.client] for r in rejected)
        for i, reply in enumerate(kept):
            yield reply, sent[reply.client] + (unanswered if i == 0 else 0)

    def client_models(self, server: Records, server_round: int) -> Callable[[int], Arrays]:
        """Every client's personalized model, fetched from the clients in one exchange."""
        clients = sorted(self.node_of)
        messages = {i: self.algorithm.configure(server, i, server_round + 1) for i in clients}
        cache: dict = {}
        contents = {
            i: self.content(wire.EVALUATE, server_round, i, m, mode="weights", cache=cache)
            for i, m in messages.items()
        }
        answers = self.send(wire.EVALUATE, contents, f"eval-{server_round}")
        models: dict[int, Arrays] = {}
        for i in clients:
            answer = answers.get(i)
            if answer is None or answer.has_error():
                why = "no reply" if answer is None else answer.error.reason
                raise RuntimeError(
                    f"round {server_round}: client {i} did not return its model ({why})"
                )
            sent = messages[i]
            info = answer.content.config_records[wire.INFO]
            kept = {
                str(k): str(src).split("/", 1)
                for k, src in zip(info["from_message"], info["sources"], strict=True)
            }
            changed = wire.from_record(
                answer.content.array_records[wire.SCORES], self.cfg.train.device
            )
            model = {**{k: sent[rec][name] for k, (rec, name) in kept.items()}, **changed}
            reason = self.validator.check_one({MODEL: model}, {}, {})
            expected = {k.split("/", 1)[1] for k in self.validator.model}
            if reason is None and model.keys() != expected:
                reason = f"its model lacks {sorted(expected - model.keys())[:3]}"
            if reason is not None:
                raise RuntimeError(f"round {server_round}: client {i}'s model is invalid: {reason}")
            models[i] = model
        return models.__getitem__

    def close(self) -> None:
        """Nothing to release: the Flower session (or the deployment) owns the nodes."""

    def summary(self) -> dict:
        per_round: dict[int, int] = {}
        for r in self.rejected:
            per_round[r["round"]] = per_round.get(r["round"], 0) + 1
        return {
            "flower": {
                "rejected": len(self.rejected),
                "rejected_per_round": per_round,
                "rejections": self.rejected[:100],
                "startup_s": self.startup_s,
            }
        }


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


def run_simulations(
    loops: list[RoundLoop], on_round: OnRound | None = None
) -> list[dict | Exception]:
    """Run experiments one after the other in one session of Flower's simulation engine.

    Starting Ray is most of a short run's cost; a sweep (or a test) pays it once. The
    session has as many virtual SuperNodes as the largest federation (node i = client i);
    each experiment's client states are kept apart in `Context.state` (wire.state_key).
    Returns each experiment's summary, or the exception that stopped it (the next one still
    runs). Every process the session started (Ray's raylet, GCS, actors) is waited for by
    its PID when it ends, and killed if it does not exit.

    With `flower.ray_address` the session attaches to that Ray cluster instead (its actors
    spread over the cluster's nodes) and starts no Ray process: the cluster's processes are
    not this process's descendants, so neither this clean-up nor the `Reaper` (both touch
    descendants only) ever kills them. Without it the session starts its own instance
    (`address="local"`), never one it found (RAY_ADDRESS, the last `ray start`).
    """
    import psutil
    from flwr.simulation import run_simulation

    from protofed.flower.clientapp import app as client_app

    for key, value in FLOWER_ENV.items():
        os.environ.setdefault(key, value)
    results: list[dict | Exception] = []
    spawned: list[psutil.Process] = []
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context) -> None:
        try:
            for loop in loops:
                t_loop = time.perf_counter()
                transport = loop.transport
                assert isinstance(transport, FlowerTransport), "not a Flower round loop"
                try:
                    n = loop.num_clients
                    node_of, _ = discover(
                        grid, transport.config_json, n, timeout_s=loop.cfg.flower.timeout_s
                    )
                    node_of = {c: node for c, node in node_of.items() if c < n}
                    missing = sorted(set(range(n)) - set(node_of))
                    if missing:
                        raise RunStopped(f"clients {missing[:5]} have no node")
                    transport.attach(grid, node_of)
                    transport.startup_s = time.perf_counter() - (
                        t_session if not results else t_loop
                    )
                    results.append(loop.run(on_round))
                except Exception as err:  # noqa: BLE001 - reported to the caller, per experiment
                    log.error("experiment %s stopped: %s", loop.algorithm.name, err)
                    results.append(err)
        finally:
            spawned.extend(psutil.Process().children(recursive=True))

    first = loops[0].cfg.flower
    backend = {
        "client_resources": {"num_cpus": first.client_cpus, "num_gpus": first.client_gpus},
        "init_args": {
            "logging_level": "ERROR",
            "log_to_driver": False,
            "address": first.ray_address or "local",
        },
    }
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(logging.WARNING)
    t_session = time.perf_counter()
    STOP.clear()
    with (
        signal_handlers_kept(),
        Reaper() as reaper,
    ):  # if this process is SIGKILLed, Ray's processes die with it
        try:
            if threading.current_thread() is threading.main_thread():
                _start_ray(backend["init_args"])
                for signum in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(signum, _request_stop)
            run_simulation(
                server_app=server_app,
                client_app=client_app,
                num_supernodes=max(loop.num_clients for loop in loops),
                backend_config=backend,
            )
            stopped = STOP.is_set()  # a signal during the clean-up below stops nothing
        except BaseException:  # Ctrl-C, SIGTERM: end the ServerApp thread's wait, then Ray
            STOP.set()
            raise
        finally:
            import ray

            if ray.is_initialized():  # started here, but Flower failed before its backend
                ray.shutdown()  # (which ends Ray itself): no call can be in flight
            flwr_logger.setLevel(level)
            spawned.extend(psutil.Process().children(recursive=True))  # thread not done
            started = [p for p in set(spawned) if p.pid != reaper.pid]
            # stopped: Flower has shut Ray down, so what is left is killed now
            _, alive = psutil.wait_procs(started, timeout=0 if STOP.is_set() else 30)
            for proc in alive:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
            psutil.wait_procs(alive, timeout=10)
    if stopped:  # asked to stop: the session ended cleanly, the runs did not finish
        raise KeyboardInterrupt
    if len(results) != len(loops):
        raise RunStopped("the Flower simulation ended early (see the log above)")
    return results


def run_simulation_loop(loop: RoundLoop, on_round: OnRound | None = None) -> dict:
    """One experiment in its own Flower simulation session: its summary, or its error."""
    result = run_simulations([loop], on_round)[0]
    if isinstance(result, BaseException):
        raise result
    return result


def start(cfg: ExperimentConfig, out: str | Path, overwrite: bool = False) -> RoundLoop:
    """Like `runtime.start`, for Flower's simulation engine (run it with
    `run_simulation_loop`)."""
    plugins.require_visible_elsewhere(cfg, "Flower's nodes")
    prepared = prepare(cfg)
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


# deployment -----------------------------------------------------------------------------------
def _empty(shape: tuple[int, ...], name: str, group: int | None) -> ClientData:
    x, y = torch.empty((0, *shape)), torch.empty(0, dtype=torch.long)
    return ClientData(name, group, *(t for _ in SPLITS for t in (x, y)))


class ClientSideEvaluation:
    """A deployment's evaluation: each client scores itself, the server adds per-class counts.

    Personalization and validation on each client's own splits, the global model on each
    client's test split; generalization needs every client's data in one place and is not
    reported.
    """

    def __init__(self, prepared: Prepared, transport: FlowerTransport, present: list[int]) -> None:
        self.prepared = prepared
        self.transport = transport
        self.present = present

    def evaluate(self, server: Records, server_round: int) -> dict:
        algorithm = self.prepared.algorithm
        global_model = algorithm.global_model(server)
        extra = {} if global_model is None else {wire.GLOBAL: wire.to_record(global_model)}
        cache: dict = {}
        contents = {
            cid: self.transport.content(
                wire.EVALUATE,
                server_round,
                cid,
                algorithm.configure(server, cid, server_round + 1),
                mode="scores",
                extra=extra,
                cache=cache,
            )
            for cid in self.present
        }
        answers = self.transport.send(wire.EVALUATE, contents, f"eval-{server_round}")
        c = self.prepared.fed.num_classes
        nan = np.full((3, c), -1, dtype=np.int64)
        counts: dict[str, list[np.ndarray]] = {"pers.test": [], "pers.val": [], "global.test": []}
        for cid in self.present:
            answer = answers.get(cid)
            got: Arrays = {}
            if answer is not None and not answer.has_error():
                try:
                    got = wire.from_record(answer.content.array_records[wire.SCORES])
                except (ValueError, KeyError) as err:
                    log.warning("round %d: client %d's scores rejected: %s", server_round, cid, err)
            elif answer is not None:
                log.warning(
                    "round %d: client %d failed to evaluate: %s",
                    server_round,
                    cid,
                    answer.error.reason,
                )
            for key in counts:
                value = got.get(key)
                ok = value is not None and tuple(value.shape) == (3, c) and bool((value >= 0).all())
                counts[key].append(value.numpy() if ok else nan)
        scores = {}
        rule = self.prepared.cfg.eval.f1_labels
        for key in ("pers.test", "pers.val"):
            stack = np.stack(counts[key]).astype(float)
            stack[stack < 0] = np.nan  # a client without scores counts as missing
            acc, f1 = scores_from_counts(stack[:, 0], stack[:, 1], stack[:, 2], rule)
            scores[key] = (acc, f1)
        result: dict[str, Any] = {
            "personalization": summarize(*scores["pers.test"]),
            "generalization": None,
            "val": summarize(*scores["pers.val"]),
            "global": None,
            "clients": {
                "pers_acc": scores["pers.test"][0].tolist(),
                "pers_f1": scores["pers.test"][1].tolist(),
                "gen_acc": [],
                "gen_f1": [],
                "val_acc": scores["pers.val"][0].tolist(),
                "val_f1": scores["pers.val"][1].tolist(),
                "client_ids": self.present,
            },
        }
        if global_model is not None:
            rows = np.stack([g for g in counts["global.test"] if (g >= 0).all()] or [nan])
            if (rows >= 0).all():
                total = rows.sum(0)
                acc, f1 = scores_from_counts(total[None, 0], total[None, 1], total[None, 2], rule)
                _, per_client = scores_from_counts(rows[:, 0], rows[:, 1], rows[:, 2], rule)
                result["global"] = {
                    "acc": float(acc[0]),
                    "f1": float(f1[0]),
                    "f1_std": float(np.nanstd(per_client)),
                }
        return result


def deploy(cfg: ExperimentConfig, grid: Grid, nodes: int, wait_s: float) -> tuple[RoundLoop, dict]:
    """The server of a deployed federation: no data, the clients present, client-side scores.

    Asks the nodes who they are, then builds the server side from their partition headers.
    Returns the round loop and the partition summary for the run directory.
    """
    if cfg.data.dynamic.enabled:
        raise ConfigError("data.dynamic needs every client's data in one process: simulation only")
    node_of, infos = discover(grid, wire.config_json(cfg), nodes, wait_s, cfg.flower.timeout_s)
    headers = {cid: info for cid, info in infos.items() if "federation" in info}
    if not headers:
        raise RuntimeError("no node holds a partition file (node-config partition=...)")
    fp = wire.data_fingerprint(cfg)
    fed_header = next(iter(headers.values()))["federation"]
    for cid, info in sorted(headers.items()):
        if info["fingerprint"] != fp or info["federation"] != fed_header:
            raise RuntimeError(f"client {cid}'s partition comes from another experiment")
    present = sorted(headers)
    device = resolve_device(cfg.train.device)
    shape = tuple(fed_header["input_shape"])
    fed = FederatedData(
        dataset=fed_header["dataset"],
        num_classes=fed_header["num_classes"],
        class_names=fed_header["class_names"],
        input_shape=shape,
        kind=fed_header["kind"],
        clients=[
            _empty(shape, headers[c]["entry"]["name"], headers[c]["entry"]["group"])
            for c in present
        ],
        counts=np.array([headers[c]["counts"] for c in present], dtype=np.int64),
        meta=fed_header["meta"],
    )
    model, algorithm = build_model_and_algorithm(
        cfg, shape, fed.num_classes, int(fed_header["num_clients"]), device
    )
    summary = {
        **fed_header,
        "clients": [headers[c]["entry"] for c in present],
        "counts": fed.counts.tolist(),
        "deployed_clients": present,
    }
    prepared = Prepared(cfg, fed, model, algorithm)
    transport = FlowerTransport(prepared, wire.config_json(cfg), "flower-deployment")
    transport.train_sizes = {c: int(headers[c]["entry"]["train"]) for c in present}
    transport.attach(grid, {c: node_of[c] for c in present})
    loop = RoundLoop(
        prepared,
        transport,
        ClientSideEvaluation(prepared, transport, present),
        population=present,
        summary_extra=transport.summary,
    )
    check_settings(prepared, loop.per_round(), simulated=False)
    return loop, summary
