"""What crosses between the ServerApp and the ClientApps: named arrays, scalars, a little config.

An algorithm's messages, replies and states are flat dicts of tensors (`Arrays`) and scalar
metrics, so they map one to one onto Flower's records: tensors onto an `ArrayRecord` (each
array serialized by Flower as a NumPy `.npy` buffer, loaded with `allow_pickle=False`),
metrics onto a `MetricRecord`, and the task (kind, round, client, the experiment config as
JSON) onto a `ConfigRecord`. Nothing is pickled: an array whose dtype NumPy cannot load
without pickle (object arrays) fails to decode and the reply is rejected.

Record names inside a message's `RecordDict`:

    protofed.arrays   ArrayRecord   the algorithm's message (down) or reply (up)
    protofed.global   ArrayRecord   deployment evaluation: the server's model, if any
    protofed.task     ConfigRecord  kind, round, client, mode, config (JSON)
    protofed.metrics  MetricRecord  the reply's scalar metrics
    protofed.info     ConfigRecord  a client's answer to "which client are you?"

and in a ClientApp's `Context.state`: `protofed.state.<experiment>` (the client's algorithm
state, `state_key`).
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord

from protofed.algorithms.base import Arrays, Metrics
from protofed.config import ExperimentConfig, build_config

ARRAYS, GLOBAL, TASK, METRICS, INFO, STATE = (
    "protofed.arrays", "protofed.global", "protofed.task", "protofed.metrics", "protofed.info",
    "protofed.state",
)
# the message types (Flower's "train" and "evaluate"; "query" asks a node who it is)
TRAIN, EVALUATE, QUERY = "train", "evaluate", "query"


def to_record(arrays: Arrays) -> ArrayRecord:
    """Named tensors as an ArrayRecord (copied to CPU; names and order kept)."""
    record = ArrayRecord()
    for name, tensor in arrays.items():
        record[name] = Array(tensor.detach().cpu().contiguous().numpy())
    return record


def from_record(record: ArrayRecord, device: torch.device | str = "cpu") -> Arrays:
    """An ArrayRecord as named tensors. Raises ValueError on anything but plain NumPy arrays."""
    out: Arrays = {}
    for name, array in record.items():
        try:
            value = array.numpy()  # np.load(..., allow_pickle=False)
        except (TypeError, ValueError) as err:
            raise ValueError(f"array '{name}' does not decode without pickle ({err})") from None
        if value.dtype.hasobject or value.dtype.kind not in "biuf":
            raise ValueError(f"array '{name}' has unsupported dtype {value.dtype}")
        if tuple(value.shape) != tuple(array.shape) or str(value.dtype) != array.dtype:
            raise ValueError(f"array '{name}' disagrees with its declared dtype or shape")
        out[name] = torch.from_numpy(np.array(value, copy=True)).to(device)
    return out


def to_metrics(metrics: Metrics) -> MetricRecord:
    return MetricRecord({k: float(v) for k, v in metrics.items()})


def from_metrics(record: MetricRecord) -> Metrics:
    """Scalar metrics; lists and non-finite values are rejected (ValueError)."""
    out: Metrics = {}
    for key, value in record.items():
        if isinstance(value, list) or not math.isfinite(float(value)):
            raise ValueError(f"metric '{key}' is not a finite scalar ({value!r})")
        out[key] = float(value)
    return out


def config_json(cfg: ExperimentConfig) -> str:
    return json.dumps(cfg.to_dict(), sort_keys=True)


def config_from_json(text: str) -> ExperimentConfig:
    return build_config(json.loads(text))


def data_fingerprint(cfg: ExperimentConfig) -> str:
    """What fixes a client's partition: the data section and the seed (not data.dir)."""
    data = {k: v for k, v in cfg.to_dict()["data"].items() if k != "dir"}
    text = json.dumps({"data": data, "seed": cfg.seed}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def state_key(config: str) -> str:
    """Where a client keeps its state in `Context.state`: one key per experiment, so
    experiments sharing a simulation session (`engine.run_simulations`) never mix states."""
    return f"{STATE}.{hashlib.sha256(config.encode()).hexdigest()[:12]}"


def task(kind: str, round: int, client: int, config: str, mode: str = "") -> ConfigRecord:
    return ConfigRecord(
        {"kind": kind, "round": int(round), "client": int(client), "config": config, "mode": mode}
    )
