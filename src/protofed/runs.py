"""The run directory: everything a finished or killed run leaves behind.

    config.yaml      the resolved config (what `--resume` re-reads)
    partition.json   per-client split sizes and the clients x classes count matrix
    partition.txt    the same matrix, readable
    metrics.jsonl    one line per evaluated round, per-client values included
    checkpoint.pt    the latest round's server and client states (tensors only)
    summary.json     written last: the run is complete when it exists

Files are written to a temporary name and renamed, so a kill never leaves half a file.
Checkpoints hold only tensors, numbers and strings and load with `weights_only=True`.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch
import yaml

from protofed.errors import ConfigError

CONFIG, PARTITION, PARTITION_TXT = "config.yaml", "partition.json", "partition.txt"
METRICS, CHECKPOINT, SUMMARY = "metrics.jsonl", "checkpoint.pt", "summary.json"


def strict_json(obj: Any) -> Any:
    """NaN and infinity (a client without validation data) become null: strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    # creation / opening -----------------------------------------------------------------
    @classmethod
    def create(
        cls,
        path: str | Path,
        config: dict,
        partition: dict,
        partition_txt: str,
        overwrite: bool = False,
    ) -> RunDir:
        run = cls(path)
        if run.path.exists() and any(run.path.iterdir()):
            if not overwrite:
                raise ConfigError(
                    f"run directory {run.path} already exists and is not empty "
                    "(use --resume to continue it, --force to overwrite, or another --out)"
                )
            for name in (CONFIG, PARTITION, PARTITION_TXT, METRICS, CHECKPOINT, SUMMARY):
                (run.path / name).unlink(missing_ok=True)
        run.path.mkdir(parents=True, exist_ok=True)
        run.write_text(PARTITION_TXT, partition_txt)
        run.write_json(PARTITION, partition)
        run.write_text(METRICS, "")
        run.write_text(CONFIG, yaml.safe_dump(config, sort_keys=False))  # last: marks a valid run
        return run

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        run = cls(path)
        if not (run.path / CONFIG).is_file():
            raise ConfigError(f"{run.path} is not a run directory (no {CONFIG})")
        return run

    # plain files ------------------------------------------------------------------------
    def write_text(self, name: str, text: str) -> None:
        _atomic_write(self.path / name, lambda p: p.write_text(text))

    def write_json(self, name: str, obj: Any) -> None:
        self.write_text(name, json.dumps(strict_json(obj), indent=2, allow_nan=False) + "\n")

    def read_json(self, name: str) -> Any:
        return json.loads((self.path / name).read_text())

    def config(self) -> dict:
        return yaml.safe_load((self.path / CONFIG).read_text())

    # metrics ----------------------------------------------------------------------------
    def append_metrics(self, record: dict) -> None:
        with open(self.path / METRICS, "a") as f:
            f.write(json.dumps(strict_json(record), allow_nan=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def history(self, up_to_round: int | None = None) -> list[dict]:
        path = self.path / METRICS
        if not path.exists():
            return []
        records = []
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                break  # a line cut by a kill: everything before it is intact
            if up_to_round is not None and rec["round"] > up_to_round:
                break
            records.append(rec)
        return records

    def truncate_metrics(self, up_to_round: int) -> list[dict]:
        """Drop records after the checkpointed round (a resumed run recomputes them)."""
        records = self.history(up_to_round)
        self.write_text(METRICS, "".join(json.dumps(r) + "\n" for r in records))
        return records

    # checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self, state: dict) -> None:
        _atomic_write(self.path / CHECKPOINT, lambda p: torch.save(state, p))

    def load_checkpoint(self, map_location: str | None = None) -> dict | None:
        path = self.path / CHECKPOINT
        if not path.exists():
            return None
        return torch.load(path, weights_only=True, map_location=map_location)

    @property
    def complete(self) -> bool:
        return (self.path / SUMMARY).exists()
