"""The built-in engine: the round loop over the in-process transport, and its run directory."""

from __future__ import annotations

from pathlib import Path

from protofed.config import ExperimentConfig, build_config
from protofed.runs import RunDir
from protofed.runtime.local import InProcessTransport
from protofed.runtime.loop import RoundLoop
from protofed.runtime.prepare import Prepared, prepare
from protofed.runtime.scoring import ServerSideEvaluation


def simulate(prepared: Prepared, run_dir: RunDir | None = None) -> RoundLoop:
    """A round loop that trains every client in this process (`train.workers` processes)."""
    transport = InProcessTransport(prepared, prepared.cfg.train.workers)
    return RoundLoop(prepared, transport, ServerSideEvaluation(prepared, transport), run_dir)


def start(cfg: ExperimentConfig, out: str | Path, overwrite: bool = False) -> RoundLoop:
    """Validate and build everything, then create the run directory."""
    prepared = prepare(cfg)
    run = RunDir.create(
        out, cfg.to_dict(), prepared.fed.summary(), prepared.fed.counts_table(), overwrite=overwrite
    )
    return simulate(prepared, run)


def resume(path: str | Path) -> RoundLoop:
    """Re-open a run directory and continue from its checkpoint."""
    run = RunDir.open(path)
    cfg = build_config(run.config())
    loop = simulate(prepare(cfg), run)
    ckpt = run.load_checkpoint(map_location=cfg.train.device)
    if ckpt is not None:
        loop.restore(ckpt)
        loop.history = run.truncate_metrics(loop.progress.server_round)
    else:
        run.truncate_metrics(0)
    return loop
