"""The ClientApp: any registered algorithm's client side, behind Flower's Message API.

One ClientApp serves every algorithm: it decodes the message (`wire`), takes the client's
state from `Context.state`, runs the algorithm's `fit` through the same code as the built-in
engine (`runtime.parallel.fit_message`: the client's generator and dropout seeds are keyed
by seed, round and client, so it trains exactly as it would there), stores the new state back
in `Context.state` and replies with arrays and scalar metrics.

Where a client's data comes from (the node's `node_config`):
- `partition="/path/client_3.npz"`: a file written by `python -m protofed.flower export`,
  holding only that client's data (deployment: one SuperNode per client);
- `partition-id=3` (what Flower's simulation engine sets): the node builds the federated
  data from the experiment config (same partition and split as every engine) and takes
  client 3.
What a node builds (data, model, algorithm) is cached per process for the experiment it
serves: Ray's actors keep it across messages; a deployed SuperNode starts a process per
message and rebuilds it from its partition file.

Fault drills (`PROTOFED_FLOWER_FAULT`, see `_fault`) make a client misbehave for real.

Message types: "query" (who are you: client id, partition header), "train" (fit) and
"evaluate": in mode "weights" (simulation) the client returns its personalized model
(`client_model`) for the server's evaluation, sending only the arrays that differ from the
message; in mode "scores" (deployment) it evaluates that model on its own test and
validation splits, and the global model on its test split, and returns per-class counts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from protofed.algorithms.base import Algorithm, Arrays
from protofed.config import ExperimentConfig
from protofed.data.federated import ClientData
from protofed.errors import ConfigError
from protofed.evaluation import class_counts
from protofed.flower import wire
from protofed.flower.partitions import Partition, federation_header, load_partition
from protofed.models.base import FedModel
from protofed.training.client import load_weights
from protofed.runtime.dynamic import client_data
from protofed.runtime.parallel import fit_message
from protofed.runtime.simulation import (
    Prepared,
    _pooled,
    build_model_and_algorithm,
    prepare,
    resolve_device,
)
from protofed.training.loop import predict

PARTITION_KEY, PARTITION_ID_KEY = "partition", "partition-id"


@dataclass
class ClientSide:
    """What a node needs to act as client(s) of one experiment."""

    cfg: ExperimentConfig
    model: FedModel
    algorithm: Algorithm
    prepared: Prepared | None = None  # simulation: every client's data
    partition: Partition | None = None  # deployment: this node's client only

    @cached_property
    def pooled(self) -> ClientData | None:
        return _pooled(self.prepared.fed) if self.prepared is not None else None

    def data(self, cid: int, round: int) -> ClientData:
        if self.partition is not None:
            if cid != self.partition.client:
                raise ValueError(f"this node holds client {self.partition.client}, not {cid}")
            return self.partition.data
        assert self.prepared is not None
        if cid < 0:
            assert self.pooled is not None
            return self.pooled
        return client_data(self.prepared.fed, self.prepared.dynamic, cid, round)

    def info(self, node_config: dict) -> dict[str, Any]:
        """The answer to "query": which client this node is, and its partition's header."""
        if self.partition is not None:
            p = self.partition
            return {"client": p.client, "fingerprint": p.fingerprint, "entry": p.entry,
                    "counts": p.counts, "federation": p.federation}
        assert self.prepared is not None
        cid, fed = int(node_config[PARTITION_ID_KEY]), self.prepared.fed
        summary = fed.summary()
        if not 0 <= cid < len(fed.clients):
            return {"client": cid}  # a node beyond this federation (a shared simulation session)
        return {"client": cid, "fingerprint": wire.data_fingerprint(self.cfg),
                "entry": summary["clients"][cid], "counts": summary["counts"][cid],
                "federation": federation_header(fed)}


_CACHE: dict[tuple[str, str], ClientSide] = {}


def client_side(config: str, node_config: dict) -> ClientSide:
    """The node's data, model and algorithm for the experiment `config` (JSON), cached."""
    source = str(node_config.get(PARTITION_KEY, ""))
    key = (config, source)
    if key not in _CACHE:
        _CACHE.clear()  # one experiment at a time per process
        cfg = wire.config_from_json(config)
        if source:
            partition = load_partition(Path(source).expanduser())
            if partition.fingerprint != wire.data_fingerprint(cfg):
                raise ConfigError(
                    f"{source} was exported from another data config or seed than this run's"
                )
            device = resolve_device(cfg.train.device)
            if cfg.train.threads:
                torch.set_num_threads(cfg.train.threads)
            partition.data = partition.data.to(device)
            model, algorithm = build_model_and_algorithm(
                cfg, partition.input_shape, partition.num_classes, partition.num_clients, device
            )
            _CACHE[key] = ClientSide(cfg, model, algorithm, partition=partition)
        elif PARTITION_ID_KEY in node_config:
            prepared = prepare(cfg)
            _CACHE[key] = ClientSide(cfg, prepared.model, prepared.algorithm, prepared=prepared)
        else:
            raise ConfigError(
                "the SuperNode needs --node-config 'partition=\"<client_i.npz>\"' "
                "(python -m protofed.flower export) or 'partition-id=<i>'"
            )
    return _CACHE[key]


def _state(context: Context, key: str, device: torch.device) -> Arrays:
    if key in context.state.array_records:
        return wire.from_record(context.state.array_records[key], device)
    return {}


def _set_state(context: Context, key: str, state: Arrays) -> None:
    if state:
        context.state[key] = wire.to_record(state)
    elif key in context.state:
        del context.state[key]


def _fault(cid: int, round: int) -> str | None:
    """Fault drills: PROTOFED_FLOWER_FAULT="client:round[:kind],..." in a node's environment
    makes that client misbehave in that round, for real, in the real ClientApp: `raise`
    (default), or reply with `nan` values, a wrong `shape`, or a `missing` array. The server
    must leave the reply out and go on (tests/test_flower.py; docs/flower.md)."""
    spec = os.environ.get("PROTOFED_FLOWER_FAULT", "")
    for item in filter(None, (s.strip() for s in spec.split(","))):
        c, r, *kind = item.split(":")
        if int(c) == cid and int(r) == round:
            return kind[0] if kind else "raise"
    return None


def _corrupt(arrays: Arrays, kind: str) -> Arrays:
    name = next(iter(arrays))
    bad = dict(arrays)
    if kind == "nan":
        bad[name] = arrays[name].clone().fill_(float("nan"))
    elif kind == "shape":
        bad[name] = arrays[name].reshape(-1)[:-1].clone()
    elif kind == "missing":
        del bad[name]
    else:
        raise ValueError(f"unknown fault '{kind}' (raise, nan, shape, missing)")
    return bad


app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    task = msg.content.config_records[wire.TASK]
    side = client_side(str(task["config"]), dict(context.node_config))
    info = ConfigRecord({"json": json.dumps(side.info(dict(context.node_config)))})
    return Message(RecordDict({wire.INFO: info}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    task = msg.content.config_records[wire.TASK]
    side = client_side(str(task["config"]), dict(context.node_config))
    cid, round = int(task["client"]), int(task["round"])
    fault = _fault(cid, round)
    if fault == "raise":
        raise RuntimeError(f"client {cid} fails in round {round} (PROTOFED_FLOWER_FAULT)")
    key = wire.state_key(str(task["config"]))
    device = resolve_device(side.cfg.train.device)
    message = wire.from_record(msg.content.array_records[wire.ARRAYS], device)
    arrays, metrics, new_state = fit_message(
        side.algorithm, side.model, side.cfg, side.data(cid, round), message, cid, round,
        _state(context, key, device),
    )
    _set_state(context, key, new_state)
    if fault is not None:
        arrays = _corrupt(arrays, fault)
    content = RecordDict({wire.ARRAYS: wire.to_record(arrays), wire.METRICS: wire.to_metrics(metrics)})
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    task = msg.content.config_records[wire.TASK]
    side = client_side(str(task["config"]), dict(context.node_config))
    cid, round = int(task["client"]), int(task["round"])
    device = resolve_device(side.cfg.train.device)
    message = wire.from_record(msg.content.array_records[wire.ARRAYS], device)
    state = _state(context, wire.state_key(str(task["config"])), device)
    model = side.algorithm.client_model(message, state)
    if str(task["mode"]) == "scores":
        records = _scores(side, cid, round, model, msg.content.array_records.get(wire.GLOBAL), device)
        return Message(RecordDict(records), reply_to=msg)
    # only what differs from the message: FedAvg's clients send nothing back, and the server
    # rebuilds the model from the very tensors it sent (so shared models are evaluated once)
    same = [k for k, v in model.items() if k in message and v is message[k]]
    changed = {k: v for k, v in model.items() if k not in same}
    content = RecordDict({
        wire.ARRAYS: wire.to_record(changed),
        wire.INFO: ConfigRecord({"from_message": same}),
    })
    return Message(content, reply_to=msg)


def _counts(side: ClientSide, weights: Arrays, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """(3, classes) true positives, support, predicted of `weights` on (x, y)."""
    load_weights(side.model, weights)
    pred = predict(side.model, x, side.cfg.eval.batch_size).cpu().numpy()
    true = y.cpu().numpy().astype(np.int64)
    c = side.algorithm.setting.num_classes
    tp, support, predicted = class_counts(true, pred, np.zeros(len(true), dtype=np.int64), 1, c)
    return np.stack([tp[0], support[0], predicted[0]]).astype(np.int64)


def _scores(side: ClientSide, cid: int, round: int, model: Arrays, global_record,
            device: torch.device) -> dict:
    """Deployment evaluation on the client's own data: per-class counts, nothing else."""
    data = side.data(cid, round)
    counts = {
        "pers.test": _counts(side, model, data.test_x, data.test_y),
        "pers.val": _counts(side, model, data.val_x, data.val_y),
    }
    if global_record is not None:
        counts["global.test"] = _counts(
            side, wire.from_record(global_record, device), data.test_x, data.test_y
        )
    return {wire.ARRAYS: wire.to_record({k: torch.from_numpy(v) for k, v in counts.items()})}
