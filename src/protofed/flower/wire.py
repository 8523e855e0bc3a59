"""What crosses between the ServerApp and the ClientApps: named records, scalars, a little config.

An algorithm's messages, replies and states are `Records` (named records of tensors) plus
scalar metrics, so they map one to one onto Flower's `RecordDict`: each record onto an
`ArrayRecord` of the same name (each array serialized by Flower as a NumPy `.npy` buffer,
loaded with `allow_pickle=False`), metrics onto a `MetricRecord`, and the task (kind, round,
client, the experiment config as JSON) onto a `ConfigRecord`. Nothing is pickled: an array
whose dtype NumPy cannot load without pickle (object arrays) fails to decode and the reply
is rejected.

Names inside a message's `RecordDict`:

    <record>          ArrayRecord   the algorithm's records ("model", "protos", ...), down or up
    protofed.global   ArrayRecord   deployment evaluation: the server's model, if any
    protofed.scores   ArrayRecord   deployment evaluation: a client's per-class counts
    protofed.task     ConfigRecord  kind, round, client, mode, config (JSON)
    protofed.metrics  MetricRecord  the reply's scalar metrics (and `num_examples`)
    protofed.info     ConfigRecord  a client's answer to "which client are you?"

Algorithms' record names never start with `protofed.`. In a ClientApp's `Context.state`, the
client's state records live under `protofed.state.<experiment>/<record>` (`state_key`).
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from protofed.config import ExperimentConfig, build_config
from protofed.core.types import Arrays, Metrics, Records

RESERVED = "protofed."
GLOBAL, SCORES, TASK, METRICS, INFO, STATE = (
    "protofed.global",
    "protofed.scores",
    "protofed.task",
    "protofed.metrics",
    "protofed.info",
    "protofed.state",
)
NUM_EXAMPLES = "num_examples"  # the reply's training-set size, among its metrics
# the message types (Flower's "train" and "evaluate"; "query" asks a node who it is)
TRAIN, EVALUATE, QUERY = "train", "evaluate", "query"
SECAGG = "secagg"
"""A training task's mode under `privacy.secure_aggregation`: reply with the summand only."""


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


def to_records(records: Records) -> dict[str, ArrayRecord]:
    """An algorithm's records as ArrayRecords of the same names (for a RecordDict)."""
    for name in records:
        if name.startswith(RESERVED):
            raise ValueError(f"record name '{name}' is reserved (it starts with '{RESERVED}')")
    return {name: to_record(arrays) for name, arrays in records.items()}


def from_records(content: RecordDict, device: torch.device | str = "cpu") -> Records:
    """The algorithm's records of a message (every ArrayRecord not named `protofed.*`)."""
    return {
        name: from_record(record, device)
        for name, record in content.array_records.items()
        if not name.startswith(RESERVED)
    }


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
    experiments sharing a simulation session (`simulation.run_simulations`) never mix states."""
    return f"{STATE}.{hashlib.sha256(config.encode()).hexdigest()[:12]}"


def task(kind: str, server_round: int, client: int, config: str, mode: str = "") -> ConfigRecord:
    return ConfigRecord(
        {
            "kind": kind,
            "round": int(server_round),
            "client": int(client),
            "config": config,
            "mode": mode,
        }
    )


def task_int(task: ConfigRecord, key: str) -> int:
    """An integer field of a task (`round`, `client`); a list there is refused."""
    value = task[key]
    if isinstance(value, list):
        raise ValueError(f"the task's '{key}' is a list, not an integer")
    return int(value)
