"""One client's data in one file, for a SuperNode that holds only its own partition.

`export_partitions` cuts a config's federated data (the same partition and train/val/test
split as any engine, from `data.*` and `seed`) into `client_<i>.npz`, one per client, plus
`federation.json` and `partition.txt` for the operator. A file holds the client's six
tensors and a small header: its client id, the federation's description (data set, classes,
input shape, number of clients), its own row of the partition table, and a fingerprint of
the data config and seed, so a SuperNode started with a partition of another experiment
refuses to train. Written with `np.savez`, read with `np.load(allow_pickle=False)`.
"""

from __future__ import annotations

import functools
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from protofed.config import ExperimentConfig
from protofed.core.files import atomic_write, atomic_write_text, npz_fault
from protofed.data.federated import SPLITS, ClientData, FederatedData, build_federated
from protofed.errors import ConfigError
from protofed.flower.wire import data_fingerprint

_TENSORS = [f"{s}_{k}" for s in SPLITS for k in ("x", "y")]
FEDERATION = "federation.json"
_CLIENT_FILE = re.compile(r"client_\d+\.npz")


def federation_header(fed: FederatedData) -> dict[str, Any]:
    """What every partition of a federation shares (fed.summary() without the per-client rows)."""
    return {k: v for k, v in fed.summary().items() if k not in ("clients", "counts")}


def _client_files(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if _CLIENT_FILE.fullmatch(p.name)]


def _save_partition(handle: BinaryIO, own: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """One client's file: its header (JSON, as a 0-d string array) and its tensors."""
    # Any: numpy's stub lets `**` reach savez's `allow_pickle: bool`, so named arrays passed
    # as `**dict[str, ndarray]` do not type-check
    contents: dict[str, Any] = {"header": np.array(json.dumps(own)), **arrays}
    np.savez(handle, **contents)


def export_partitions(cfg: ExperimentConfig, out: str | Path, force: bool = False) -> list[Path]:
    """Write `client_<i>.npz` for every client of `cfg`'s federation into `out`, each file
    complete or absent. A folder with anything in it is refused; with `force` an earlier
    export's files are replaced and its extra clients removed once the new data are built
    (3 new clients beside 10 old ones would pass for 10), other files are left alone."""
    if cfg.data.dynamic.enabled:
        raise ConfigError("data.dynamic needs every client's data in one process: simulation only")
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--out: {folder} is a file, not a folder")
    earlier = _client_files(folder) if folder.is_dir() else []
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise ConfigError(f"--out: {folder} is not empty; use --force to replace an export")
    fed = build_federated(cfg.data, cfg.seed)  # before a byte is replaced: bad data keep it
    folder.mkdir(parents=True, exist_ok=True)
    header = federation_header(fed)
    summary = fed.summary()
    fingerprint = data_fingerprint(cfg)
    paths = []
    for i, client in enumerate(fed.clients):
        path = folder / f"client_{i}.npz"
        own = {
            "client": i,
            "entry": summary["clients"][i],
            "counts": summary["counts"][i],
            "fingerprint": fingerprint,
            "federation": header,
        }
        arrays = {name: getattr(client, name).cpu().numpy() for name in _TENSORS}
        atomic_write(path, functools.partial(_save_partition, own=own, arrays=arrays))
        paths.append(path)
    for stale in set(earlier) - set(paths):
        stale.unlink()  # an earlier export's clients beyond this one's
    atomic_write_text(folder / FEDERATION, json.dumps(summary, indent=2) + "\n")
    atomic_write_text(folder / "partition.txt", fed.counts_table() + "\n")
    return paths


@dataclass
class Partition:
    """One client's data as a SuperNode holds it."""

    client: int
    data: ClientData
    entry: dict[str, Any]  # its row of partition.json: name, group, split sizes
    counts: list[int]  # its row of the clients x classes table
    fingerprint: str
    federation: dict[str, Any]  # dataset, kind, num_clients, num_classes, input_shape, ...

    @property
    def num_clients(self) -> int:
        return int(self.federation["num_clients"])

    @property
    def num_classes(self) -> int:
        return int(self.federation["num_classes"])

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.federation["input_shape"])


def load_partition(path: str | Path) -> Partition:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"partition file not found: {p}")
    try:
        with np.load(p, allow_pickle=False) as f:
            header = json.loads(str(f["header"]))
            tensors = {name: torch.from_numpy(np.array(f[name])) for name in _TENSORS}
        entry = header["entry"]
        data = ClientData(entry["name"], entry["group"], **tensors)
        return Partition(
            int(header["client"]),
            data,
            entry,
            header["counts"],
            header["fingerprint"],
            header["federation"],
        )
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:
        raise ConfigError(
            f"{p}: not a partition file of protofed flower export ({npz_fault(exc)})"
        ) from None
