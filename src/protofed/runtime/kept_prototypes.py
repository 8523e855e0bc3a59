"""Class prototypes kept across rounds for figures (`eval.keep_prototypes_every`).

Every k evaluated rounds (and after the last round) the run writes
`RUN/prototypes/round_<rrrr>.npz`: for each named set, `<name>` (k, D) float32 rows and
`<name>_classes` (k,) int64 class ids, only the classes present. The names:

- `global`: the server's prototypes, as the algorithm's `prototypes` hook gives them;
- `client_<i>`: client i's local prototypes: the server's copy where it keeps one (PFPL's
  bank), else the class means of client i's personalized model's features on its training
  split after the round (what FedProto's clients compute and send, eq. 2).

Only algorithms whose hook answers (the prototype methods) keep anything. Keeping reads the
state and never writes it, so a run's numbers are the same with and without it; a resumed run
keeps the files already written. Files are `.npz` read back with `allow_pickle=False`.
"""

from __future__ import annotations

import copy
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from protofed.config import ExperimentConfig
from protofed.core.files import atomic_write, npz_fault
from protofed.core.types import Arrays, Records
from protofed.errors import ConfigError
from protofed.prototypes import embedding_means
from protofed.runtime.prepare import Prepared
from protofed.training.client import load_weights

FOLDER = "prototypes"
CLASSES = "_classes"


def keeps(cfg: ExperimentConfig, server_round: int) -> bool:
    """Whether `server_round` (an evaluated round) keeps its prototypes."""
    k = cfg.eval.keep_prototypes_every
    return k > 0 and (server_round % (k * cfg.eval.every) == 0 or server_round == cfg.train.rounds)


def round_file(run_dir: Path, server_round: int) -> Path:
    return Path(run_dir) / FOLDER / f"round_{server_round:04d}.npz"


def _rows(means: torch.Tensor, counts: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    present = torch.nonzero(counts.detach().cpu() > 0).flatten()
    rows = means.detach().cpu().float().reshape(len(counts), -1)[present]
    return rows.numpy(), present.numpy().astype(np.int64)


def collect(
    prepared: Prepared,
    server: Records,
    server_round: int,
    client_models: Callable[[int], Arrays] | None,
) -> dict[str, np.ndarray] | None:
    """The named prototype sets after `server_round`, or None for methods without."""
    sets = prepared.algorithm.prototypes(server)
    if sets is None:
        return None
    out: dict[str, np.ndarray] = {}
    for name, (means, counts) in sets.items():
        out[name], out[name + CLASSES] = _rows(means, counts)
    if client_models is not None:  # the client states live here: local prototypes
        model = copy.deepcopy(prepared.model)
        num_classes = prepared.fed.num_classes
        for i in range(len(prepared.fed.clients)):
            if f"client_{i}" in sets:
                continue
            load_weights(model, client_models(i))
            data = prepared.client_data(i, server_round)
            means, counts = embedding_means(model, data.train_x, data.train_y, num_classes)
            out[f"client_{i}"], out[f"client_{i}{CLASSES}"] = _rows(means, counts)
    return out


def keep(
    prepared: Prepared,
    run_dir: Path,
    server: Records,
    server_round: int,
    client_models: Callable[[int], Arrays] | None,
) -> Path | None:
    """Write `server_round`'s prototypes (atomically); None where the method has none."""
    arrays = collect(prepared, server, server_round, client_models)
    if arrays is None:
        return None
    arrays["round"] = np.asarray(server_round, dtype=np.int64)
    return atomic_write(round_file(run_dir, server_round), lambda h: np.savez(h, **arrays))  # type: ignore[arg-type]  # numpy's stub takes any ** for allow_pickle


_ROUND = re.compile(r"round_(\d+)\.npz")


def read_kept(run_dir: str | Path) -> dict[int, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Every kept round: {round: {name: (rows (k, D), class ids (k,))}}, rounds in order.

    A run that kept none is a `ConfigError` that says how to keep them.
    """
    folder = Path(run_dir) / FOLDER
    files = sorted(
        (int(m.group(1)), p)
        for p in (folder.iterdir() if folder.is_dir() else [])
        if (m := _ROUND.fullmatch(p.name))
    )
    if not files:
        raise ConfigError(
            f"{run_dir} kept no prototypes: run with -s eval.keep_prototypes_every=K "
            "(a prototype method: fedproto, pfpl, feddpa, fedpac, protohar, fednh)"
        )
    kept: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for r, path in files:
        try:
            with np.load(path, allow_pickle=False) as data:
                names = [k for k in data.files if k != "round" and not k.endswith(CLASSES)]
                kept[r] = {n: (data[n], data[n + CLASSES]) for n in names}
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise ConfigError(f"{path}: not a kept-prototypes file ({npz_fault(exc)})") from None
    return kept
