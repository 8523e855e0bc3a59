"""The built-in engine: one process simulates every client, round after round.

Data flow, one way: config -> federated data -> model -> algorithm -> rounds (sample, send,
fit, aggregate) -> evaluation -> run directory -> summary. The engine owns everything an
algorithm must not: per-client state, the sampling stream, seeding, byte counts and timing.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch

from protofed.algorithms import Algorithm, Arrays, Reply, Setting, build_algorithm
from protofed.config import ExperimentConfig
from protofed.data.federated import ClientData, FederatedData, build_federated
from protofed.errors import ConfigError
from protofed.evaluation import Evaluator, select_round
from protofed.models import build_model
from protofed.models.base import FedModel
from protofed.runs import RunDir, strict_json
from protofed.runtime.dynamic import DynamicClasses
from protofed.runtime.parallel import WorkerPool, fit_client, nbytes
from protofed.core.seeding import MODEL_INIT, derive_seed, sample_clients


def _clone(arrays: Arrays) -> Arrays:
    return {k: v.detach().clone() for k, v in arrays.items()}


def resolve_device(name: str) -> torch.device:
    """`train.device` as a torch device, checked against what this machine has."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"invalid value for 'train.device': {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} but no CUDA device is available here")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"train.device={name}: only cpu and cuda are supported")
    return device


@dataclass
class Prepared:
    """Everything validated and built before any file is written."""

    cfg: ExperimentConfig
    fed: FederatedData
    model: FedModel
    algorithm: Algorithm
    dynamic: DynamicClasses | None = None  # data.dynamic: the per-round views of client data


def prepare(cfg: ExperimentConfig) -> Prepared:
    """Load data, build the model and the algorithm: every config error surfaces here."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    device = resolve_device(cfg.train.device)
    fed = build_federated(cfg.data, cfg.seed)
    if device.type != "cpu":
        fed.clients = [c.to(device) for c in fed.clients]
    model, algorithm = build_model_and_algorithm(
        cfg, fed.input_shape, fed.num_classes, len(fed.clients), device
    )
    dynamic = DynamicClasses.build(cfg.data.dynamic, fed, cfg.seed)
    if dynamic is not None:
        if algorithm.pools_data:
            raise ConfigError(f"data.dynamic is not supported by '{cfg.algorithm.name}' (pooled data)")
        fed.meta["dynamic"] = dynamic.describe()
    return Prepared(cfg, fed, model, algorithm, dynamic)


def build_model_and_algorithm(
    cfg: ExperimentConfig, input_shape: tuple[int, ...], num_classes: int, num_clients: int,
    device: torch.device,
) -> tuple[FedModel, Algorithm]:
    """The seeded initial model and the algorithm built on it.

    Deterministic in the config: the server and every client (a Flower SuperNode that holds
    only its own data) build the same initial weights and the same `Setting`.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(cfg.seed, MODEL_INIT))
        model = build_model(cfg.model, input_shape, num_classes)
    model.to(device)
    setting = Setting(
        num_clients=num_clients,
        num_classes=num_classes,
        train=cfg.train,
        init_model=_clone(model.state_dict()),
        seed=cfg.seed,
    )
    algorithm = build_algorithm(cfg.algorithm.name, cfg.algorithm.hyperparameters(), setting)
    return model, algorithm


def _pooled(fed: FederatedData) -> ClientData:
    """All clients' training data as one client (the `centralized` reference)."""
    cat = torch.cat
    cs = fed.clients
    return ClientData(
        name="pooled",
        group=None,
        train_x=cat([c.train_x for c in cs]),
        train_y=cat([c.train_y for c in cs]),
        val_x=cat([c.val_x for c in cs]),
        val_y=cat([c.val_y for c in cs]),
        test_x=cat([c.test_x for c in cs]),
        test_y=cat([c.test_y for c in cs]),
    )


@dataclass
class Progress:
    """Counters that survive a resume (they are checkpointed)."""

    round: int = 0
    up_bytes: int = 0
    down_bytes: int = 0
    train_s: float = 0.0
    eval_s: float = 0.0
    aggregate_s: float = 0.0
    client_updates: int = 0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "round": self.round,
            "up_bytes": self.up_bytes,
            "down_bytes": self.down_bytes,
            "train_s": self.train_s,
            "eval_s": self.eval_s,
            "aggregate_s": self.aggregate_s,
            "client_updates": self.client_updates,
        }


class Simulation:
    checkpoints: ClassVar[bool] = True  # False where client states live elsewhere (Flower)

    def __init__(self, prepared: Prepared, run: RunDir | None = None) -> None:
        self.p = prepared
        self.cfg = prepared.cfg
        self.fed = prepared.fed
        self.algorithm = prepared.algorithm
        self.model = prepared.model
        self.run_dir = run
        self.num_clients = len(self.fed.clients)
        self.server: Arrays = self.algorithm.init_server()
        self.states: dict[int, Arrays] = {}
        self.progress = Progress()
        self.history: list[dict] = []
        self.evaluator = Evaluator(  # all of every client's data (evaluator_for: the round's)
            self.fed, self.model, self.cfg.eval.batch_size, self.cfg.eval.generalization
        )
        self._staged: tuple[int, Evaluator] | None = None
        self.pooled = _pooled(self.fed) if self.algorithm.pools_data else None
        self.pool: WorkerPool | None = None

    def evaluator_for(self, round: int) -> Evaluator:
        """The evaluator of `round`'s data: with data.dynamic, the clients' views that round
        (rebuilt when the schedule gives classes back), else `self.evaluator`."""
        dyn = self.p.dynamic
        if dyn is None:
            return self.evaluator
        stage = dyn.stage(round)
        if self._staged is None or self._staged[0] != stage:
            view = dyn.federated(self.fed, round)
            self._staged = (stage, Evaluator(
                view, self.model, self.cfg.eval.batch_size, self.cfg.eval.generalization
            ))
        return self._staged[1]

    # state ------------------------------------------------------------------------------
    def state_of(self, client: int) -> Arrays:
        return self.states.get(client, {})

    def per_round(self) -> int:
        t = self.cfg.train
        if t.clients_per_round is not None:
            return min(t.clients_per_round, self.num_clients)
        return max(1, math.ceil(t.client_fraction * self.num_clients - 1e-9))

    def checkpoint(self) -> dict:
        return {
            "progress": self.progress.as_dict(),
            "server": self.server,
            "clients": {str(i): s for i, s in self.states.items()},
        }

    def restore(self, ckpt: dict) -> None:
        prog = ckpt["progress"]
        self.progress = Progress(**{k: prog[k] for k in Progress().as_dict()})
        self.server = ckpt["server"]
        self.states = {int(i): s for i, s in ckpt["clients"].items()}

    # the engine's seam: how replies are obtained, how client models are reached ----------
    def fit_clients(self, round: int, clients: list[int]) -> Iterator[tuple[Reply, int]]:
        """Each sampled client's reply and the bytes sent to it, lazily, in sampling order.

        The one thing engines differ in: the built-in engine trains the clients here
        (serially or in its worker pool) and keeps their states; the Flower engine
        (`protofed.flower`) sends messages instead, and leaves out replies it rejects.
        Sampling, aggregation, byte counts, evaluation and the run directory are shared.
        """
        if self.pool is not None:
            jobs = [(cid, self.state_of(cid)) for cid in clients]
            results = self.pool.run(self.server, round, jobs)
        else:
            results = (
                fit_client(self.p, self.pooled, self.server, cid, round, self.state_of(cid))
                for cid in clients
            )
        for cid, (arrays, metrics, new_state, down, *_) in zip(clients, results, strict=True):
            if new_state:
                self.states[cid] = new_state
            else:
                self.states.pop(cid, None)
            yield Reply(cid, arrays, metrics), down

    def client_models(self, round: int) -> Callable[[int], Arrays]:
        """Client i's personalized weights after `round`, for the server-side evaluation."""

        def client_model(i: int) -> Arrays:
            return self.algorithm.client_model(
                self.algorithm.configure(self.server, i, round + 1), self.state_of(i)
            )

        return client_model

    # one round --------------------------------------------------------------------------
    def _replies(self, round: int, clients: list[int], timer: dict) -> Iterator[Reply]:
        """Train the round's clients lazily, as the aggregation consumes the replies."""
        t0 = time.perf_counter()
        for reply, down in self.fit_clients(round, clients):
            if reply.client >= 0:  # the pooled reference client is not a federation: nothing is sent
                self.progress.down_bytes += down
                self.progress.up_bytes += nbytes(reply.arrays)
            self.progress.client_updates += 1
            timer["train"] += time.perf_counter() - t0
            yield reply
            t0 = time.perf_counter()

    def run_round(self, round: int) -> dict:
        clients = [-1] if self.pooled is not None else sample_clients(
            self.cfg.seed, round, self.num_clients, self.per_round()
        )
        timer = {"train": 0.0}
        losses: list[tuple[float, float]] = []

        def recorded() -> Iterator[Reply]:
            for r in self._replies(round, clients, timer):
                if "loss" in r.metrics:
                    losses.append((r.metrics["loss"], r.num_examples))
                yield r

        t0 = time.perf_counter()
        stream = recorded()
        self.server = self.algorithm.aggregate(self.server, stream, round)
        for _ in stream:  # every sampled client trains, even if aggregate stopped reading
            pass
        elapsed = time.perf_counter() - t0
        self.progress.train_s += timer["train"]
        self.progress.aggregate_s += elapsed - timer["train"]
        self.progress.round = round
        weight = sum(w for _, w in losses)
        return {
            "clients": clients,
            "train_loss": sum(v * w for v, w in losses) / weight if weight else None,
            "train_s": timer["train"],
            "aggregate_s": elapsed - timer["train"],
        }

    def evaluate(self, round: int) -> dict:
        t0 = time.perf_counter()

        scores = self.evaluator_for(round).evaluate(
            self.client_models(round), self.algorithm.global_model(self.server)
        )
        dt = time.perf_counter() - t0
        self.progress.eval_s += dt
        scores["eval_s"] = dt
        return scores

    # the loop ---------------------------------------------------------------------------
    def run(self, on_round=None) -> dict:
        workers = self.cfg.train.workers
        if workers > 1 and self.pooled is None and self.cfg.train.device == "cpu":
            self.pool = WorkerPool(self.p, self.pooled, workers)
        try:
            return self._run(on_round)
        finally:
            if self.pool is not None:
                self.pool.close()
                self.pool = None

    def _run(self, on_round=None) -> dict:
        cfg = self.cfg
        t_start = time.perf_counter()
        total_before = self.progress.train_s + self.progress.eval_s + self.progress.aggregate_s
        for r in range(self.progress.round + 1, cfg.train.rounds + 1):
            info = self.run_round(r)
            record = None
            if r % cfg.eval.every == 0 or r == cfg.train.rounds:
                scores = self.evaluate(r)
                record = {
                    "round": r,
                    "train_loss": info["train_loss"],
                    "personalization": scores["personalization"],
                    "generalization": scores["generalization"],
                    "global": scores["global"],
                    "val": scores["val"],
                    "time": {"train_s": info["train_s"], "aggregate_s": info["aggregate_s"],
                             "eval_s": scores["eval_s"]},
                    "comm": {"up_bytes": self.progress.up_bytes,
                             "down_bytes": self.progress.down_bytes},
                    "clients": scores["clients"],
                }
                record = strict_json(record)  # the same record in memory and on disk
                self.history.append(record)
                if self.run_dir is not None:
                    self.run_dir.append_metrics(record)
            if self.run_dir is not None and self.checkpoints and (
                r % cfg.train.checkpoint_every == 0 or r == cfg.train.rounds
            ):
                self.run_dir.save_checkpoint(self.checkpoint())
            if on_round is not None:
                on_round(r, info, record)
        summary = self.summary(total_before + time.perf_counter() - t_start)
        if self.run_dir is not None:
            self.run_dir.write_json("summary.json", summary)
        return summary

    def summary(self, total_s: float) -> dict:
        cfg = self.cfg
        if not self.history:
            raise RuntimeError("no round was evaluated")
        final = self.history[-1]
        chosen = select_round(self.history, cfg.eval.selection, cfg.eval.metric)
        rounds = self.progress.round

        def scores(rec: dict) -> dict:
            return {k: rec[k] for k in ("personalization", "generalization", "global")}

        return {
            "algorithm": self.algorithm.name,  # "fedavg+ala" when the ALA plug-in is on
            "dataset": cfg.data.name,
            "model": cfg.model.name,
            "num_clients": self.num_clients,
            "seed": cfg.seed,
            "rounds": rounds,
            "final": {"round": final["round"], **scores(final)},
            "selected": {"round": chosen["round"], "rule": cfg.eval.selection, **scores(chosen)},
            "comm": {
                "up_bytes": self.progress.up_bytes,
                "down_bytes": self.progress.down_bytes,
                "up_bytes_per_round": self.progress.up_bytes / max(rounds, 1),
                "down_bytes_per_round": self.progress.down_bytes / max(rounds, 1),
            },
            "time": {
                "total_s": total_s,
                "train_s": self.progress.train_s,
                "aggregate_s": self.progress.aggregate_s,
                "eval_s": self.progress.eval_s,
                "train_s_per_round": self.progress.train_s / max(rounds, 1),
                "client_updates_per_s": self.progress.client_updates / max(self.progress.train_s, 1e-9),
            },
        }


def start(cfg: ExperimentConfig, out: str | Path, overwrite: bool = False) -> Simulation:
    """Validate and build everything, then create the run directory."""
    prepared = prepare(cfg)
    run = RunDir.create(out, cfg.to_dict(), prepared.fed.summary(), prepared.fed.counts_table(),
                        overwrite=overwrite)
    return Simulation(prepared, run)


def resume(path: str | Path) -> Simulation:
    """Re-open a run directory and continue from its checkpoint."""
    from protofed.config import build_config

    run = RunDir.open(path)
    cfg = build_config(run.config())
    sim = Simulation(prepare(cfg), run)
    ckpt = run.load_checkpoint(map_location=cfg.train.device)
    if ckpt is not None:
        sim.restore(ckpt)
        sim.history = run.truncate_metrics(sim.progress.round)
    else:
        run.truncate_metrics(0)
    return sim


def default_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
