"""The built-in engine: the round loop over the in-process transport, and its run directory."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any

from protofed.config import ExperimentConfig, build_config
from protofed.core.results import RoundRecord
from protofed.errors import ConfigError, RunComplete
from protofed.runs import CHECKPOINT, PARTITION, PARTITION_TXT, RunDir, check_digest, json_text
from protofed.runtime.fingerprint import check_fingerprint, fingerprint, states_fault
from protofed.runtime.in_process import InProcessTransport, PooledTransport
from protofed.runtime.loop import RoundLoop
from protofed.runtime.parallel import resolve_workers
from protofed.runtime.prepare import Prepared, clients_per_round, prepare, with_data_root
from protofed.runtime.provenance import read_provenance
from protofed.runtime.scoring import ServerSideEvaluation
from protofed.runtime.stacking import use_stacked


def refuse_secure_aggregation(cfg: ExperimentConfig) -> None:
    """Secure aggregation hides each reply from the server in a sum; in one process the
    server holds every reply, so the built-in engine refuses it (before any file is made)."""
    if cfg.privacy.enabled and cfg.privacy.secure_aggregation:
        raise ConfigError(
            "privacy.secure_aggregation runs on Flower only (--engine flower, or a "
            "deployment): the built-in engine holds every client's reply in one process"
        )


def simulate(
    prepared: Prepared, run_dir: RunDir | None = None, stacked: bool | None = None
) -> RoundLoop:
    """A round loop that trains every client in this process (`train.workers` processes;
    unset, one per usable core: `resolve_workers`), or all of a round's clients at once
    where `stacked`: `use_stacked`'s decision, made here where not given."""
    refuse_secure_aggregation(prepared.cfg)
    if stacked is None:
        stacked = use_stacked(prepared.cfg, prepared.algorithm, prepared.model)
    train = prepared.cfg.train
    transport: InProcessTransport
    if prepared.algorithm.pools_data:  # never stacked: `use_stacked` refuses it
        transport = PooledTransport(prepared)
    else:
        workers = resolve_workers(train, clients_per_round(train, len(prepared.fed.clients)))
        transport = InProcessTransport(prepared, workers, stacked)
    scoring = ServerSideEvaluation(prepared, transport, pool=transport.pool)
    return RoundLoop(prepared, transport, scoring, run_dir)


def recorded_count(prepared: Prepared) -> Prepared:
    """`prepared` with `data.num_clients` the clients it built: a natural partition of 5
    groups writes `num_clients: 5` into config.yaml, and `clients: all` where it took every
    group (data.num_clients and data.clients unset), so that the count is a record, not a
    draw of 5 groups. The checkpoint's fingerprint is made from this config too, so a new run
    resumes against the count it recorded; a run written before (its config.yaml without
    `clients`, read as `clients: all` by `RunDir.config`) resumes as well."""
    data, built = prepared.cfg.data, len(prepared.fed.clients)
    every = data.clients is None and data.num_clients is None
    if data.partition != "natural" or (data.num_clients == built and not every):
        return prepared
    cfg = prepared.cfg.model_copy(deep=True)
    if every:
        cfg.data.clients = "all"
    cfg.data.num_clients = built
    return dataclasses.replace(prepared, cfg=cfg)


def start(cfg: ExperimentConfig, out: str | Path, overwrite: bool = False) -> RoundLoop:
    """Validate and build everything, then create the run directory."""
    refuse_secure_aggregation(cfg)
    prepared = recorded_count(prepare(cfg))
    stacked = use_stacked(prepared.cfg, prepared.algorithm, prepared.model)  # refused: no files
    run = RunDir.create(
        out,
        prepared.cfg.to_dict(),
        prepared.fed.summary(),
        prepared.fed.counts_table(),
        overwrite=overwrite,
    )
    return simulate(prepared, run, stacked)


def resume(path: str | Path, data_dir: str | Path | None = None) -> RoundLoop:
    """Re-open a run directory and continue from its checkpoint.

    The data are read from `data_dir` when given, else from $PROTOFED_DATA when set, else
    from the absolute data.dir the run recorded (a run moved to another machine finds its
    data through either of the first two). The run must be what the checkpoint recorded:
    the same config (execution keys aside), data and protofed version, and metrics.jsonl
    intact up to the checkpoint's round; anything else is a one-line error and nothing is
    written. The directory is locked for the resumed run. A complete run raises
    `RunComplete`, also when another process finished it while this one started.
    """
    run = RunDir.open(path)
    if run.complete:  # finished: read only, no lock taken
        raise RunComplete(f"{run.path} is complete: nothing to resume")
    # Locked before anything is read: a run that finishes while this one loads its data
    # must not be reopened and its summary rewritten.
    run.lock()
    try:
        if run.complete:  # finished by another process before the lock was taken
            raise RunComplete(f"{run.path} is complete: nothing to resume")
        engine = run.info().get("engine", "builtin")
        if engine != "builtin":
            raise ConfigError(
                f"{run.path} was run on the {engine} engine, whose client states live with "
                "the clients: it cannot resume (start it again with --force)"
            )
        cfg = build_config(run.config())
        data_dir = data_dir if data_dir is not None else os.environ.get("PROTOFED_DATA") or None
        if data_dir is not None:
            cfg = with_data_root(cfg, Path(data_dir).expanduser().absolute())
        prepared = prepare(cfg)
        loop = simulate(prepared, run)
    except BaseException:
        run.unlock()
        raise
    try:
        ckpt = run.load_checkpoint(map_location=cfg.train.device, verify=False)
        server_round = None
        if ckpt is not None:  # else killed before its first checkpoint: start again
            progress = ckpt["progress"]
            server_round = progress.get("server_round") if isinstance(progress, dict) else None
            check_fingerprint(ckpt["fingerprint"], fingerprint(prepared), run.path, server_round)
            if fault := states_fault(ckpt, loop.server, prepared.algorithm.setting.init_model):
                raise ConfigError(
                    f"{run.path / CHECKPOINT}: {fault}; start the run again with --force"
                )
            if type(server_round) is not int:
                raise ConfigError(
                    f"{run.path / CHECKPOINT}: no round recorded in its progress; start the "
                    "run again with --force"
                )
            check_digest(run.path / CHECKPOINT, ckpt)  # after the checks that name an entry
            run.check_metrics(ckpt["metrics"], server_round)
        partition = check_partition(run, prepared, ckpt, server_round)
        read_provenance(run)  # as the session will read it
        # every check passed: only now is anything written
        run.remove_temporaries()
        restore_partition(run, prepared, partition)
        if ckpt is None or type(server_round) is not int:
            run.reset_metrics()
            return loop
        kept = run.restore_metrics(ckpt["metrics"], server_round)
        loop.history = [RoundRecord.from_json(record) for record in kept]
        loop.restore(ckpt)
    except BaseException:
        loop.transport.close()
        run.unlock()
        raise
    return loop


def check_partition(
    run: RunDir, prepared: Prepared, ckpt: dict[str, Any] | None, server_round: int | None
) -> bytes | None:
    """partition.json is what the checkpoint recorded (its sha256, under the fingerprint's
    `partition`; checkpoints written before it are not checked), or exactly what the
    federation just built gives (a file this check restored, on a data root that moved);
    an edited one is a one-line error. Returns the bytes to restore it with where it is
    missing (None: it is there), writing nothing."""
    fresh = json_text(prepared.fed.summary()).encode()
    path = run.path / PARTITION
    if not path.is_file():
        return fresh
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    saved = ckpt.get("fingerprint") if ckpt is not None else None
    recorded = saved.get("partition") if isinstance(saved, dict) else None
    digest = hashlib.sha256(data).hexdigest()
    if recorded is not None and digest != recorded and data != fresh:
        raise ConfigError(
            f"{path}: edited since the checkpoint of round {server_round} (its sha256 is not "
            "the one recorded); restore it, or delete it (a resume writes it again from the "
            "data), or start the run again with --force"
        )
    run.partition_sha256 = digest
    return None


def restore_partition(run: RunDir, prepared: Prepared, fresh: bytes | None) -> None:
    """partition.json (and partition.txt) written again from the federation where missing."""
    if fresh is not None:
        run.write_partition(prepared.fed.summary())
    if not (run.path / PARTITION_TXT).is_file():
        run.write_text(PARTITION_TXT, prepared.fed.counts_table())
