"""The ClientApp: any registered algorithm's client side, behind Flower's Message API.

One ClientApp serves every algorithm: it decodes the message (`wire`), takes the client's
state from `Context.state`, runs the algorithm's `fit` through the same code as the built-in
engine (`runtime.run_fit`: the client's generator and dropout seeds are keyed by seed, round
and client, so it trains exactly as it would there), stores the new state back in
`Context.state` and replies with the algorithm's records, its metrics and `num_examples`.

Where a client's data comes from (the node's `node_config`, set by whoever runs the node):
- `partition="/path/client_3.npz"`: a file written by `protofed flower export`,
  holding only that client's data (deployment: one SuperNode per client). The node reads
  this file and nothing else: the data paths of the config the server sends (`data.path`,
  `data.dir`) are never opened (they only enter the fingerprint the file is checked against);
- `partition-id=3` (what Flower's simulation engine sets): the node builds the federated
  data from the experiment config (same partition and split as every engine) and takes
  client 3. Simulation only (the ClientApp runs in a Ray actor of Flower's simulation
  engine): a deployed SuperNode given `partition-id` refuses, since the server would then
  choose which files on the node's machine are read.
What a node builds (data, model, algorithm) is cached per process for the experiment it
serves: Ray's actors keep it across messages; a deployed SuperNode starts a process per
message and rebuilds it from its partition file.

Fault drills (`PROTOFED_FLOWER_FAULT`, see `_fault`) make a client misbehave for real.

Message types: "query" (who are you: client id, partition header), "train" (fit; under
`privacy.secure_aggregation` Flower's `secaggplus_mod` runs the SecAgg+ stages around it and
the reply is the clipped reply's summand, masked: flower/secagg.py) and
"evaluate": in mode "weights" (simulation) the client returns its personalized model
(`client_model`; with `eval.client_model=trained` the model it kept in `Context.state`, beside
its state, right after its last training) for the server's evaluation, sending only the
weights that are not tensors of the message; in mode "scores" (deployment) it evaluates that model on its own test and
validation splits, and the global model on its test split, and returns per-class counts.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from protofed.algorithms import Algorithm
from protofed.config import ExperimentConfig
from protofed.core.types import Arrays, Records
from protofed.data.federated import ClientData
from protofed.errors import ConfigError
from protofed.evaluation import class_counts
from protofed.flower import wire
from protofed.flower.partitions import Partition, federation_header, load_partition
from protofed.flower.secagg import secagg_when_asked, summand_content
from protofed.models.base import FedModel
from protofed.privacy import released_examples
from protofed.privacy.central import summand
from protofed.runtime import Prepared, build_model_and_algorithm, prepare, run_fit
from protofed.runtime.in_process import keeps_trained
from protofed.runtime.prepare import resolve_device
from protofed.training.client import load_weights
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

    def data(self, cid: int, server_round: int) -> ClientData:
        if self.partition is not None:
            if cid != self.partition.client:
                raise ValueError(f"this node holds client {self.partition.client}, not {cid}")
            return self.partition.data
        assert self.prepared is not None
        return self.prepared.client_data(cid, server_round)

    def info(self, node_config: dict[str, Any]) -> dict[str, Any]:
        """The answer to "query": which client this node is, and its partition's header."""
        if self.partition is not None:
            p = self.partition
            return {
                "client": p.client,
                "fingerprint": p.fingerprint,
                "entry": private_entry(p.entry) if self.cfg.privacy.enabled else p.entry,
                "counts": None if self.cfg.privacy.enabled else p.counts,
                "federation": p.federation,
            }
        assert self.prepared is not None
        cid, fed = int(node_config[PARTITION_ID_KEY]), self.prepared.fed
        summary = fed.summary()
        if not 0 <= cid < len(fed.clients):
            return {"client": cid}  # a node beyond this federation (a shared simulation session)
        private = self.cfg.privacy.enabled
        return {
            "client": cid,
            "fingerprint": wire.data_fingerprint(self.cfg),
            "entry": private_entry(summary["clients"][cid]) if private else summary["clients"][cid],
            "counts": None if private else summary["counts"][cid],
            "federation": federation_header(fed),
        }


def private_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A private node's partition row, as its discovery header sends it: its name and
    group (who it is, which the server knows anyway), never its sizes or class counts."""
    return {"name": entry.get("name"), "group": entry.get("group")}


_CACHE: dict[tuple[str, str], ClientSide] = {}


def in_simulation() -> bool:
    """Whether this ClientApp runs in Flower's simulation engine: in a Ray actor (a deployed
    SuperNode runs it in a plain `flwr-clientapp` process, where Ray is not even imported)."""
    ray = sys.modules.get("ray")
    return (
        ray is not None
        and ray.is_initialized()
        and ray.get_runtime_context().get_actor_id() is not None
    )


def client_side(config: str, node_config: dict[str, Any]) -> ClientSide:
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
            if not in_simulation():
                raise ConfigError(
                    f"node-config {PARTITION_ID_KEY}=... is for Flower's simulation engine: a "
                    "deployed SuperNode reads only its partition file (--node-config "
                    "'partition=\"<client_i.npz>\"'), never data paths sent by the server"
                )
            prepared = prepare(cfg)
            _CACHE[key] = ClientSide(cfg, prepared.model, prepared.algorithm, prepared=prepared)
        else:
            raise ConfigError(
                "the SuperNode needs --node-config 'partition=\"<client_i.npz>\"' "
                "(protofed flower export) or 'partition-id=<i>'"
            )
    return _CACHE[key]


def _state(context: Context, key: str, device: torch.device) -> Records:
    prefix = f"{key}/"
    return {
        name[len(prefix) :]: wire.from_record(record, device)
        for name, record in context.state.array_records.items()
        if name.startswith(prefix)
    }


def _set_state(context: Context, key: str, state: Records) -> None:
    prefix = f"{key}/"
    for name in [n for n in context.state if n.startswith(prefix)]:
        del context.state[name]
    for name, arrays in state.items():
        context.state[prefix + name] = wire.to_record(arrays)


def _trained_key(key: str) -> str:
    """Where a client keeps its model after training (`eval.client_model=trained`): beside
    its state, outside the state's prefix, so `fit` never sees it."""
    return f"{key}.trained"


def _trained(context: Context, key: str, device: torch.device) -> Arrays | None:
    record = context.state.array_records.get(_trained_key(key))
    return None if record is None else wire.from_record(record, device)


def _fault(cid: int, server_round: int) -> str | None:
    """Fault drills: PROTOFED_FLOWER_FAULT="client:round[:kind],..." in a node's environment
    makes that client misbehave in that round, for real, in the real ClientApp: `raise`
    (default), or reply with `nan` values, a wrong `shape`, a `missing` array, or `inflate`d
    (every weight times 1e6 and num_examples=1e12: a poisoning attempt). The server must
    leave the reply out and go on (tests/flower/test_flower.py; docs/flower.md)."""
    spec = os.environ.get("PROTOFED_FLOWER_FAULT", "")
    for item in filter(None, (s.strip() for s in spec.split(","))):
        c, r, *kind = item.split(":")
        if int(c) == cid and int(r) == server_round:
            return kind[0] if kind else "raise"
    return None


def _corrupt(records: Records, kind: str) -> Records:
    """The reply with its first record's first array spoiled as `kind` says."""
    record = next(iter(records))
    arrays = records[record]
    name = next(iter(arrays))
    bad = dict(arrays)
    if kind == "nan":
        bad[name] = arrays[name].clone().fill_(float("nan"))
    elif kind == "shape":
        bad[name] = arrays[name].reshape(-1)[:-1].clone()
    elif kind == "missing":
        del bad[name]
    elif kind == "inflate":
        bad = {k: v * 1e6 if v.is_floating_point() else v for k, v in arrays.items()}
    else:
        raise ValueError(f"unknown fault '{kind}' (raise, nan, shape, missing, inflate)")
    return {**records, record: bad}


app = ClientApp(mods=[secagg_when_asked])  # Flower's SecAgg+ mod, for its own rounds only


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
    cid, server_round = wire.task_int(task, "client"), wire.task_int(task, "round")
    fault = _fault(cid, server_round)
    if fault == "raise":
        raise RuntimeError(f"client {cid} fails in round {server_round} (PROTOFED_FLOWER_FAULT)")
    key = wire.state_key(str(task["config"]))
    device = resolve_device(side.cfg.train.device)
    message = wire.from_records(msg.content, device)
    data = side.data(cid, server_round)
    result = run_fit(
        side.algorithm,
        side.model,
        side.cfg,
        data,
        message,
        cid,
        server_round,
        _state(context, key, device),
    )
    _set_state(context, key, result.state)
    if keeps_trained(side.cfg):
        trained = side.algorithm.trained_model(message, result)
        context.state[_trained_key(key)] = wire.to_record(trained)
    reply = result.reply if fault is None else _corrupt(result.reply, fault)
    if str(task["mode"]) == wire.SECAGG:  # secagg.py: the summand, masked by the mod
        privacy = side.cfg.privacy
        if not (privacy.enabled and privacy.secure_aggregation):
            raise ConfigError("a secure-aggregation round for a run without it is refused")
        layout, values = summand(reply, message, side.algorithm.setting.num_classes)
        return Message(summand_content(layout, values), reply_to=msg)
    examples = released_examples(side.cfg.privacy.enabled, len(data.train_y))
    examples = 1e12 if fault == "inflate" else examples
    metrics = {**result.metrics, wire.NUM_EXAMPLES: examples}
    content = RecordDict({**wire.to_records(reply), wire.METRICS: wire.to_metrics(metrics)})
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    task = msg.content.config_records[wire.TASK]
    side = client_side(str(task["config"]), dict(context.node_config))
    cid, server_round = wire.task_int(task, "client"), wire.task_int(task, "round")
    device = resolve_device(side.cfg.train.device)
    message = wire.from_records(msg.content, device)
    key = wire.state_key(str(task["config"]))
    model = _trained(context, key, device) if keeps_trained(side.cfg) else None
    if model is None:  # received, or a client that never trained (as the built-in engine)
        model = side.algorithm.client_model(message, _state(context, key, device))
    if str(task["mode"]) == "scores":
        privacy = side.cfg.privacy
        if privacy.enabled and not privacy.clear_evaluation:  # the node's own refusal too
            raise ConfigError(
                "privacy.clear_evaluation: this node will not send its per-class counts in "
                "the clear under privacy"
            )
        scores = _scores(
            side, cid, server_round, model, msg.content.array_records.get(wire.GLOBAL), device
        )
        return Message(RecordDict({wire.SCORES: scores}), reply_to=msg)
    if side.cfg.privacy.enabled and side.partition is not None:  # a deployed node
        raise ConfigError(
            "privacy.enabled: a deployed node does not send its personal model un-noised "
            "(evaluation mode 'weights' is for simulations, whose evaluator holds every "
            "client's data anyway)"
        )
    # only what is not a tensor of the message: FedAvg's clients send nothing back, and the
    # server rebuilds the model from the very tensors it sent (shared models evaluated once)
    sent = {id(t): f"{rec}/{name}" for rec, arrays in message.items() for name, t in arrays.items()}
    keys = [k for k, v in model.items() if id(v) in sent]
    changed = {k: v for k, v in model.items() if id(v) not in sent}
    content = RecordDict(
        {
            wire.SCORES: wire.to_record(changed),
            wire.INFO: ConfigRecord(
                {"from_message": keys, "sources": [sent[id(model[k])] for k in keys]}
            ),
        }
    )
    return Message(content, reply_to=msg)


def _counts(side: ClientSide, weights: Arrays, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """(3, classes) true positives, support, predicted of `weights` on (x, y)."""
    load_weights(side.model, weights)
    pred = predict(side.model, x, side.cfg.eval.batch_size).cpu().numpy()
    true = y.cpu().numpy().astype(np.int64)
    c = side.algorithm.setting.num_classes
    tp, support, predicted = class_counts(true, pred, np.zeros(len(true), dtype=np.int64), 1, c)
    return np.stack([tp[0], support[0], predicted[0]]).astype(np.int64)


def _scores(
    side: ClientSide,
    cid: int,
    server_round: int,
    model: Arrays,
    global_record: ArrayRecord | None,
    device: torch.device,
) -> ArrayRecord:
    """Deployment evaluation on the client's own data: per-class counts, nothing else."""
    data = side.data(cid, server_round)
    counts = {
        "pers.test": _counts(side, model, data.test_x, data.test_y),
        "pers.val": _counts(side, model, data.val_x, data.val_y),
    }
    if global_record is not None:
        counts["global.test"] = _counts(
            side, wire.from_record(global_record, device), data.test_x, data.test_y
        )
    return wire.to_record({k: torch.from_numpy(v) for k, v in counts.items()})
