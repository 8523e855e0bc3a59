"""The Flower engine: the built-in round loop, with replies obtained over Flower's Grid.

`FlowerSimulation` is `runtime.simulation.Simulation` with its one seam filled differently:
`fit_clients` sends each sampled client its message (`algorithm.configure`, per client) as a
Flower Message and validates the replies (`validation`), and `client_models` asks every
client for its personalized model, because client states live on the clients
(`Context.state`), not on the server. Sampling, seeding, aggregation, byte counts, the
evaluation protocol and the run directory are the built-in engine's own code, so the same
config and seed give the same numbers (a test checks it).

`run_simulation` runs it on Flower's simulation engine (Ray, one virtual SuperNode per
client, `partition-id` = client id). `FlowerDeployment` runs it in a deployed ServerApp
(`serverapp.py`): the server holds no data, learns the federation from the SuperNodes'
partition headers, samples among the clients present and has each client evaluate itself
(per-class counts: personalization and validation on its own splits, the global model on its
test split; generalization needs every client's data in one place and is not reported).

Differences from the built-in engine, all by design:
- no checkpoints: client states live on the nodes, so a killed run cannot be resumed;
- a rejected reply is left out of the round (logged); the round fails only when fewer than
  `flower.min_replies` replies remain; the bytes sent to a rejected client still count;
- the summary adds `engine` and `flower` (rejected replies per round).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from protofed.algorithms.base import Arrays, Reply
from protofed.config import ExperimentConfig
from protofed.data.federated import SPLITS, ClientData, FederatedData
from protofed.data.sources import data_root
from protofed.errors import ConfigError
from protofed.evaluation import _aggregate, scores_from_counts
from protofed.flower import wire
from protofed.flower.validation import Rejected, ReplyValidator
from protofed.runs import RunDir
from protofed.runtime.parallel import nbytes
from protofed.runtime.simulation import (
    Prepared,
    Simulation,
    build_model_and_algorithm,
    prepare,
    resolve_device,
)

log = logging.getLogger("protofed.flower")

FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}


def discover(
    grid: Grid, config_json: str, expected: int, wait_s: float = 60.0,
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
        time.sleep(0.5)
        nodes = list(grid.get_node_ids())
    if len(nodes) < expected:
        raise RuntimeError(f"{len(nodes)} Flower node(s) connected within {wait_s:.0f} s, "
                           f"{expected} expected")
    task = wire.task(wire.QUERY, 0, -1, config_json)
    messages = [Message(RecordDict({wire.TASK: task}), node, wire.QUERY, group_id="query")
                for node in nodes]
    node_of: dict[int, int] = {}
    infos: dict[int, dict] = {}
    for reply in grid.send_and_receive(messages, timeout=timeout_s):
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


class RoundFailed(RuntimeError):
    """Fewer valid replies than `flower.min_replies`: the round cannot be aggregated."""


class FlowerSimulation(Simulation):
    checkpoints = False
    engine = "flower-simulation"

    def __init__(self, prepared: Prepared, run: RunDir | None = None) -> None:
        super().__init__(prepared, run)
        if self.pooled is not None:
            raise ConfigError(f"'{self.algorithm.name}' pools all data in one client: "
                              "run it on the built-in engine")
        simulated = not isinstance(self, FlowerDeployment)
        if simulated and self.cfg.train.device != "cpu" and self.cfg.flower.client_gpus == 0:
            raise ConfigError(f"train.device={self.cfg.train.device} on Flower: set "
                              "flower.client_gpus (GPUs per ClientApp, e.g. 0.5)")
        if self.cfg.flower.min_replies > self.per_round():
            raise ConfigError(
                f"flower.min_replies={self.cfg.flower.min_replies} exceeds the "
                f"{self.per_round()} clients sampled per round"
            )
        self.grid: Grid | None = None
        self.node_of: dict[int, int] = {}  # client id -> Flower node id
        self.validator = ReplyValidator.for_model(self.model.state_dict())
        self.rejected: list[dict] = []  # {"round", "client", "reason"}
        self.startup_s = 0.0  # Flower's start-up and the node discovery, before round 1
        self.config_json = wire.config_json(self._client_config())

    def _client_config(self) -> ExperimentConfig:
        """The config the clients build from: with the data root resolved, as the server's."""
        cfg = self.cfg.model_copy(deep=True)
        cfg.data.dir = str(data_root(cfg.data).resolve())
        if cfg.data.path:
            cfg.data.path = str(Path(cfg.data.path).expanduser().resolve())
        return cfg

    # talking to nodes ----------------------------------------------------------------------
    def _send(self, kind: str, contents: dict[int, RecordDict], group: str) -> dict[int, Message]:
        """Send one message per client; the replies that came back, by client."""
        assert self.grid is not None, "not attached to a Flower Grid"
        messages = [
            Message(content, self.node_of[cid], kind, group_id=group)
            for cid, content in contents.items()
        ]
        client_of = {node: cid for cid, node in self.node_of.items()}
        replies = self.grid.send_and_receive(messages, timeout=self.cfg.flower.timeout_s)
        return {client_of[r.metadata.src_node_id]: r for r in replies}

    def _content(self, kind: str, round: int, cid: int, arrays: Arrays, mode: str = "",
                 extra: dict | None = None, records: dict | None = None) -> RecordDict:
        """One client's message. `records` caches the serialized arrays by message object:
        clients sent the same message (FedAvg's global model) share one ArrayRecord."""
        if records is None:
            record = wire.to_record(arrays)
        elif id(arrays) in records:
            record = records[id(arrays)][1]
        else:
            record = wire.to_record(arrays)
            records[id(arrays)] = (arrays, record)  # holding `arrays` keeps its id unique
        content = RecordDict({
            wire.ARRAYS: record,
            wire.TASK: wire.task(kind, round, cid, self.config_json, mode),
        })
        for name, record in (extra or {}).items():
            content[name] = record
        return content

    # the seam --------------------------------------------------------------------------------
    def fit_clients(self, round: int, clients: list[int]) -> Iterator[tuple[Reply, int]]:
        messages = {cid: self.algorithm.configure(self.server, cid, round) for cid in clients}
        records: dict = {}
        contents = {cid: self._content(wire.TRAIN, round, cid, m, records=records)
                    for cid, m in messages.items()}
        answers = self._send(wire.TRAIN, contents, str(round))
        del contents
        replies: list[Reply] = []
        rejected: list[Rejected] = []
        for cid in clients:
            answer = answers.get(cid)
            try:
                if answer is None:
                    raise ValueError("no reply (timed out or the node is gone)")
                if answer.has_error():
                    raise ValueError(f"the client failed: {answer.error.reason}")
                arrays = wire.from_record(
                    answer.content.array_records[wire.ARRAYS], self.cfg.train.device
                )
                metrics = wire.from_metrics(answer.content.metric_records[wire.METRICS])
            except (ValueError, KeyError) as err:
                rejected.append(Rejected(cid, str(err).strip("'\"")))
                continue
            replies.append(Reply(cid, arrays, metrics))
        kept, invalid = self.validator.check_round(replies, messages)
        for r in [*rejected, *invalid]:
            log.warning("round %d: reply of client %d rejected: %s", round, r.client, r.reason)
            self.rejected.append({"round": round, "client": r.client, "reason": r.reason})
            self.progress.down_bytes += nbytes(messages[r.client])  # it was sent all the same
        if len(kept) < self.cfg.flower.min_replies:
            raise RoundFailed(f"round {round}: {len(kept)} valid repl(ies) of {len(clients)}, "
                              f"flower.min_replies={self.cfg.flower.min_replies}")
        for reply in kept:
            yield reply, nbytes(messages[reply.client])

    def client_models(self, round: int) -> Callable[[int], Arrays]:
        """Every client's personalized model, fetched from the clients in one exchange."""
        n = self.num_clients
        messages = {i: self.algorithm.configure(self.server, i, round + 1) for i in range(n)}
        records: dict = {}
        contents = {i: self._content(wire.EVALUATE, round, i, m, mode="weights", records=records)
                    for i, m in messages.items()}
        answers = self._send(wire.EVALUATE, contents, f"eval-{round}")
        models: dict[int, Arrays] = {}
        for i in range(n):
            answer = answers.get(i)
            if answer is None or answer.has_error():
                why = "no reply" if answer is None else answer.error.reason
                raise RuntimeError(f"round {round}: client {i} did not return its model ({why})")
            sent = messages[i]
            kept = [str(k) for k in answer.content.config_records[wire.INFO]["from_message"]]
            changed = wire.from_record(answer.content.array_records[wire.ARRAYS],
                                       self.cfg.train.device)
            model = {**{k: sent[k] for k in kept}, **changed}
            reason = self.validator.check_one(model, {}, {})
            if reason is None and model.keys() != self.validator.model.keys():
                reason = f"its model lacks {sorted(self.validator.model.keys() - model.keys())[:3]}"
            if reason is not None:
                raise RuntimeError(f"round {round}: client {i}'s model is invalid: {reason}")
            models[i] = model
        return models.__getitem__

    # the loop --------------------------------------------------------------------------------
    def run(self, on_round=None) -> dict:
        """Run on Flower's simulation engine (Ray): one virtual SuperNode per client."""
        result = run_simulations([self], on_round)[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def summary(self, total_s: float) -> dict:
        per_round: dict[int, int] = {}
        for r in self.rejected:
            per_round[r["round"]] = per_round.get(r["round"], 0) + 1
        return {
            **super().summary(total_s),
            "engine": self.engine,
            "flower": {"rejected": len(self.rejected), "rejected_per_round": per_round,
                       "rejections": self.rejected[:100], "startup_s": self.startup_s},
        }


def run_simulations(
    sims: list[FlowerSimulation], on_round=None
) -> list[dict | Exception]:
    """Run experiments one after the other in one session of Flower's simulation engine.

    Starting Ray is most of a short run's cost; a sweep (or a test) pays it once. The
    session has as many virtual SuperNodes as the largest federation (node i = client i);
    each experiment's client states are kept apart in `Context.state` (wire.state_key).
    Returns each experiment's summary, or the exception that stopped it (the next one still
    runs). Every process the session started (Ray's raylet, GCS, actors) is waited for by
    its PID when it ends, and killed if it does not exit.
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
            for sim in sims:
                t_sim = time.perf_counter()
                try:
                    sim.grid = grid
                    sim.node_of, _ = discover(grid, sim.config_json, sim.num_clients,
                                              timeout_s=sim.cfg.flower.timeout_s)
                    sim.node_of = {c: n for c, n in sim.node_of.items() if c < sim.num_clients}
                    missing = sorted(set(range(sim.num_clients)) - set(sim.node_of))
                    if missing:
                        raise RuntimeError(f"clients {missing[:5]} have no node")
                    sim.startup_s = time.perf_counter() - (t_session if not results else t_sim)
                    results.append(sim._run(on_round))
                except Exception as err:  # noqa: BLE001 - reported to the caller, per experiment
                    log.error("experiment %s stopped: %s", sim.algorithm.name, err)
                    results.append(err)
        finally:
            spawned.extend(psutil.Process().children(recursive=True))

    first = sims[0].cfg.flower
    backend = {
        "client_resources": {"num_cpus": first.client_cpus, "num_gpus": first.client_gpus},
        "init_args": {"logging_level": "ERROR", "log_to_driver": False},
    }
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(logging.WARNING)
    t_session = time.perf_counter()
    try:
        run_simulation(server_app=server_app, client_app=client_app,
                       num_supernodes=max(s.num_clients for s in sims), backend_config=backend)
    finally:
        flwr_logger.setLevel(level)
        _, alive = psutil.wait_procs(spawned, timeout=30)
        for proc in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(alive, timeout=10)
    if len(results) != len(sims):
        raise RuntimeError("the Flower simulation ended early (see the log above)")
    return results


def start(cfg: ExperimentConfig, out: str | Path, overwrite: bool = False) -> FlowerSimulation:
    """Like `runtime.simulation.start`, for the Flower simulation engine."""
    prepared = prepare(cfg)
    sim = FlowerSimulation(prepared)  # validates the Flower settings before any file exists
    sim.run_dir = RunDir.create(out, cfg.to_dict(), prepared.fed.summary(),
                                prepared.fed.counts_table(), overwrite=overwrite)
    return sim


# deployment -----------------------------------------------------------------------------------
def _empty(shape: tuple[int, ...], name: str, group: int | None) -> ClientData:
    x, y = torch.empty((0, *shape)), torch.empty(0, dtype=torch.long)
    return ClientData(name, group, *(t for _ in SPLITS for t in (x, y)))


class FlowerDeployment(FlowerSimulation):
    """The server of a deployed federation: no data, the clients present, client-side scores."""

    engine = "flower-deployment"

    def __init__(self, prepared: Prepared, present: list[int], summary: dict,
                 run: RunDir | None = None) -> None:
        self.present = present  # the client ids with a node, sorted; sampled among these
        self.partition_summary = summary
        super().__init__(prepared, run)

    @classmethod
    def connect(cls, cfg: ExperimentConfig, grid: Grid, nodes: int, wait_s: float) -> FlowerDeployment:
        """Ask the nodes who they are, then build the server side from their headers."""
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
            dataset=fed_header["dataset"], num_classes=fed_header["num_classes"],
            class_names=fed_header["class_names"], input_shape=shape, kind=fed_header["kind"],
            clients=[_empty(shape, headers[c]["entry"]["name"], headers[c]["entry"]["group"])
                     for c in present],
            counts=np.array([headers[c]["counts"] for c in present], dtype=np.int64),
            meta=fed_header["meta"],
        )
        model, algorithm = build_model_and_algorithm(
            cfg, shape, fed.num_classes, int(fed_header["num_clients"]), device
        )
        summary = {**fed_header, "clients": [headers[c]["entry"] for c in present],
                   "counts": fed.counts.tolist(), "deployed_clients": present}
        engine = cls(Prepared(cfg, fed, model, algorithm), present, summary)
        engine.grid, engine.node_of = grid, {c: node_of[c] for c in present}
        return engine

    def _client_config(self) -> ExperimentConfig:
        return self.cfg  # the nodes hold their data; nothing to resolve on the server

    def fit_clients(self, round: int, clients: list[int]) -> Iterator[tuple[Reply, int]]:
        yield from super().fit_clients(round, [self.present[i] for i in clients])

    def evaluate(self, round: int) -> dict:
        """Each client scores itself; the server adds per-class counts (see module doc)."""
        t0 = time.perf_counter()
        global_model = self.algorithm.global_model(self.server)
        extra = {} if global_model is None else {wire.GLOBAL: wire.to_record(global_model)}
        records: dict = {}
        contents = {
            cid: self._content(wire.EVALUATE, round, cid,
                               self.algorithm.configure(self.server, cid, round + 1),
                               mode="scores", extra=extra, records=records)
            for cid in self.present
        }
        answers = self._send(wire.EVALUATE, contents, f"eval-{round}")
        c = self.fed.num_classes
        nan = np.full((3, c), -1, dtype=np.int64)
        counts: dict[str, list[np.ndarray]] = {"pers.test": [], "pers.val": [], "global.test": []}
        for cid in self.present:
            answer = answers.get(cid)
            got: Arrays = {}
            if answer is not None and not answer.has_error():
                try:
                    got = wire.from_record(answer.content.array_records[wire.ARRAYS])
                except (ValueError, KeyError) as err:
                    log.warning("round %d: client %d's scores rejected: %s", round, cid, err)
            elif answer is not None:
                log.warning("round %d: client %d failed to evaluate: %s", round, cid,
                            answer.error.reason)
            for key in counts:
                value = got.get(key)
                ok = value is not None and tuple(value.shape) == (3, c) and bool((value >= 0).all())
                counts[key].append(value.numpy() if ok else nan)
        scores = {}
        for key in ("pers.test", "pers.val"):
            stack = np.stack(counts[key]).astype(float)
            stack[stack < 0] = np.nan  # a client without scores counts as missing
            acc, f1 = scores_from_counts(stack[:, 0], stack[:, 1], stack[:, 2])
            scores[key] = (acc, f1)
        result: dict[str, Any] = {
            "personalization": _aggregate(*scores["pers.test"]),
            "generalization": None,
            "val": _aggregate(*scores["pers.val"]),
            "global": None,
            "clients": {
                "pers_acc": scores["pers.test"][0].tolist(), "pers_f1": scores["pers.test"][1].tolist(),
                "gen_acc": [], "gen_f1": [],
                "val_acc": scores["pers.val"][0].tolist(), "val_f1": scores["pers.val"][1].tolist(),
                "client_ids": self.present,
            },
        }
        if global_model is not None:
            rows = np.stack([g for g in counts["global.test"] if (g >= 0).all()] or [nan])
            if (rows >= 0).all():
                total = rows.sum(0)
                acc, f1 = scores_from_counts(total[None, 0], total[None, 1], total[None, 2])
                _, per_client = scores_from_counts(rows[:, 0], rows[:, 1], rows[:, 2])
                result["global"] = {"acc": float(acc[0]), "f1": float(f1[0]),
                                    "f1_std": float(np.nanstd(per_client))}
        dt = time.perf_counter() - t0
        self.progress.eval_s += dt
        result["eval_s"] = dt
        return result

    def run(self, on_round=None) -> dict:
        return self._run(on_round)
