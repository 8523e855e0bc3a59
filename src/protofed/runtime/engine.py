"""The built-in engine: the round loop over the in-process transport, and its run directory."""

from __future__ import annotations

import os
from pathlib import Path

from protofed.config import ExperimentConfig, build_config
from protofed.runs import RunDir
from protofed.runtime.local import InProcessTransport
from protofed.runtime.loop import RoundLoop
from protofed.runtime.prepare import Prepared, prepare, with_data_root
from protofed.runtime.scoring import ServerSideEvaluation


def simulate(prepared: Prepared, run_dir: RunDir | None = None) -> RoundLoop:
    """A round loop that trains every client in this process (`train.workers` processes)."""
    transport = InProcessTransport(prepared, prepared.cfg.train.workers)
    return RoundLoop(prepared, transport, ServerSideEvaluation(prepared, transport), run_dir)


def start(cfg: ExperimentConfig, out: str | Path, overwrite: bool = False) -> RoundLoop:
    """Validate and build everything, then create the run directory."""
    prepared = prepare(cfg)
    run = RunDir.create(
        out,
        prepared.cfg.to_dict(),
        prepared.fed.summary(),
        prepared.fed.counts_table(),
        overwrite=overwrite,
    )
    return simulate(prepared, run)


def resume(path: str | Path, data_dir: str | Path | None = None) -> RoundLoop:
    """Re-open a run directory and continue from its checkpoint.

    The data are read from `data_dir` when given, else from $PROTOFED_DATA when set, else
    from the absolute data.dir the run recorded (a run moved to another machine finds its
    data through either of the first two).
    """
    run = RunDir.open(path)
    cfg = build_config(run.config())
    data_dir = data_dir if data_dir is not None else os.environ.get("PROTOFED_DATA") or None
    if data_dir is not None:
        cfg = with_data_root(cfg, Path(data_dir).expanduser().absolute())
    loop = simulate(prepare(cfg), run)
    ckpt = run.load_checkpoint(map_location=cfg.train.device)
    if ckpt is not None:
        loop.restore(ckpt)
        loop.history = run.truncate_metrics(loop.progress.server_round)
    else:
        run.truncate_metrics(0)
    return loop
