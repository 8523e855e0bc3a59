"""What a checkpoint must match to be resumed: the config, the data and protofed's version.

A run directory can be edited between a kill and `--resume` (config.yaml, the data files,
an upgrade of protofed). Continuing would then give a hybrid run under the new name, so the
checkpoint records a fingerprint and a resume that does not match it stops, naming what
changed.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from protofed.config import EXECUTION_KEYS, PrivacyConfig, flatten
from protofed.core.types import Arrays, records_fault
from protofed.errors import ConfigError
from protofed.runs import protofed_version
from protofed.runtime.prepare import Prepared
from protofed.runtime.provenance import file_sha256

LEFT_OUT_AT_DEFAULT: dict[str, Any] = {
    "eval.generalization_samples": None,
    "train.precision": "fp32",
    "eval.client_model": "received",
    "eval.f1_labels": "true",
    "data.members": ["hhar", "wisdm"],
    "model.alp.normalize_only": False,
    "model.alp.sinkhorn_order": "rows_last",
    "model.alp.update": "topk",
    "model.hart.head_dim": None,
    "model.hart.attention_dropout": 0.0,
    "model.hart.mlp_dropout": 0.0,
    "model.hart.mlp_activation": "gelu",
    "model.hart.embedding_activation": "relu",
    "eval.unseen_clients": 0,
    "eval.finetune_epochs": 0,
    "model.hart.drop_path": 0.3,
    "model.hart.head_dropout": 0.3,
    "train.stacked": "auto",
    "data.clients": None,
    **{f"privacy.{key}": value for key, value in PrivacyConfig().model_dump(mode="json").items()},
}
"""Keys added after checkpoints existed, left out while at the default that keeps their old
behaviour, so those checkpoints still resume (tests/test_runs.py resumes a run written before
the newest of them; a key added without an entry here fails it). (An unset generalization_samples keeps it only
for test unions up to 20,000 samples: a larger run from before resumes scored on a sample.)"""


LEFT_OUT_AS_BEFORE: dict[str, Any] = {"data.clients": "all"}
"""Keys added after checkpoints existed, also left out at a value that reads a config the
way runs before them did: `data.clients: all` (every natural group, data.num_clients not
read) is what `RunDir.config` gives a natural run written before the key, and what a new
natural run over every group records."""


def fingerprint(prepared: Prepared) -> dict[str, str]:
    """The config (execution keys left out), the data's sha256 and protofed's version.

    `pretrain.*` only configures `protofed pretrain`; `model.init` counts by its file's
    sha256 (entry "init", present only when set, so older checkpoints still match), not by
    its path: a file overwritten under the same name must not resume silently.
    Keys of `LEFT_OUT_AT_DEFAULT` count only away from their default, so checkpoints written
    before they existed still match.
    """
    config = {
        k: v
        for k, v in flatten(prepared.cfg.to_dict()).items()
        if k not in EXECUTION_KEYS
        and k != "model.init"
        and not k.startswith("pretrain.")
        and not (k in LEFT_OUT_AT_DEFAULT and v == LEFT_OUT_AT_DEFAULT[k])
        and not (k in LEFT_OUT_AS_BEFORE and v == LEFT_OUT_AS_BEFORE[k])
    }
    out = {
        "config": json.dumps(config, sort_keys=True),
        "data": prepared.fed.fingerprint(),
        "protofed": protofed_version(),
    }
    if prepared.cfg.model.init is not None:
        out["init"] = file_sha256(Path(prepared.cfg.model.init))
    return out


def check_fingerprint(
    saved: dict[str, Any], current: dict[str, Any], run_dir: Path, server_round: int | None
) -> None:
    """A one-line error naming what differs from the checkpoint, if anything does."""
    try:
        old = json.loads(saved.get("config", "{}"))
    except (AttributeError, TypeError, ValueError):
        old = None
    if not isinstance(old, dict) or not all(isinstance(v, str) for v in saved.values()):
        raise ConfigError(
            f"{run_dir}: the checkpoint's fingerprint is not as protofed writes it; start the "
            "run again with --force"
        )
    changes: list[str] = []
    if saved.get("protofed") != current["protofed"]:
        changes.append(f"protofed {saved.get('protofed')} -> {current['protofed']}")
    new = json.loads(current["config"])
    old = {k: v for k, v in old.items() if k not in EXECUTION_KEYS}  # older lists were shorter
    for key in sorted(set(old) | set(new)):
        if old.get(key, "<unset>") != new.get(key, "<unset>"):
            changes.append(f"{key} {old.get(key, '<unset>')!r} -> {new.get(key, '<unset>')!r}")
    if saved.get("data") != current["data"]:
        changes.append("the data (its files or their partition)")
    if saved.get("init") != current.get("init"):
        changes.append("model.init (the pre-trained checkpoint's contents)")
    if changes:
        shown = "; ".join(changes[:4]) + (
            f"; and {len(changes) - 4} more" if len(changes) > 4 else ""
        )
        raise ConfigError(
            f"{run_dir}: cannot resume, changed since the checkpoint of round {server_round}: "
            f"{shown} (restore them, or start the run again with --force)"
        )


def states_fault(
    ckpt: dict[str, Any], server: Mapping[str, Collection[str]], model: Arrays
) -> str | None:
    """What in a checkpoint's states is not as protofed writes them, or None.

    The checkpoint contract every algorithm keeps (docs/architecture.md; checked when each
    checkpoint is written, and for every built-in algorithm by
    `test_every_algorithms_checkpoint_passes_the_resume_check`): the server's state keeps
    the records it started with and their names, and every tensor named like a model
    weight has that weight's shape. A hand-edited file would otherwise fail rounds later in
    a raw error (a shape, a string where a tensor was) or, with a weight taken out, resume
    silently on a default. `server`: the records the server's state starts with and their
    names (its starting `Records` will do); `model`: the model's initial weights.
    """
    progress, metrics = ckpt.get("progress"), ckpt.get("metrics")
    if not isinstance(progress, dict) or type(progress.get("server_round")) is not int:
        return "'progress.server_round' is not a round number"
    if bad := [k for k, v in progress.items() if not isinstance(v, int | float)]:
        return f"'progress.{bad[0]}' is not a number"
    if not (
        isinstance(metrics, dict)
        and type(metrics.get("bytes")) is int
        and isinstance(metrics.get("sha256"), str)
    ):
        return "'metrics' is not a position in metrics.jsonl"
    clients, trained = ckpt.get("clients", {}), ckpt.get("trained", {})
    for key, per_client in (("clients", clients), ("trained", trained)):
        if not isinstance(per_client, dict):
            return f"'{key}' is not a mapping of clients"
        for client in per_client:
            try:
                int(client)
            except (TypeError, ValueError):
                return f"'{key}.{client}' is not a client id"
    named: list[tuple[str, Any]] = [("server", ckpt.get("server"))]
    named += [(f"client {c}'s state", state) for c, state in clients.items()]
    named.append(("trained models", trained))  # client id -> weights: records in form
    for what, records in named:
        if fault := records_fault(records, what):
            return fault
        for record, arrays in records.items():
            for name, tensor in arrays.items():
                if name in model and tensor.shape != model[name].shape:
                    shape, expected = tuple(tensor.shape), tuple(model[name].shape)
                    return f"{what} '{record}.{name}' has shape {shape}, the model's {expected}"
    for record, arrays in server.items():
        if record not in ckpt["server"]:
            return f"server record '{record}' is missing"
        if missing := [n for n in arrays if n not in ckpt["server"][record]]:
            return f"server '{record}.{missing[0]}' is missing"
    return None
