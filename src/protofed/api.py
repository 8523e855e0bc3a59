"""protofed as a Python library: run an experiment, open a run, get its models back.

    import protofed
    run = protofed.run("configs/quickstart.yaml", train={"rounds": 5})
    run.summary.final["personalization"]["f1"]
    run.history                 # pandas DataFrame: one row per evaluated round and client
    model = run.client_model(3) # client 3's personalized model, a ready torch.nn.Module
    again = protofed.load_run(run.path)

Every run, from Python or from the CLI, writes the same run directory (config.yaml,
partition.json, metrics.jsonl, checkpoint.pt, summary.json), and `Run` reads only that
directory: a run made on another machine or by the CLI opens the same way.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from protofed.config import ExperimentConfig, build_config, load_raw, set_key
from protofed.core.files import check_writable
from protofed.errors import ConfigError, RunComplete
from protofed.runs import CHECKPOINT, METRICS, PARTITION, PROVENANCE, SUMMARY, RunDir, reading

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from protofed.algorithms import Algorithm
    from protofed.models.base import FedModel
    from protofed.runtime.loop import RoundLoop

ConfigLike = str | Path | Mapping[str, Any] | ExperimentConfig | None


def resolve_config(config: ConfigLike = None, **overrides: Any) -> ExperimentConfig:
    """An experiment config from a YAML path, a nested dict or a config object, plus overrides.

    Overrides are keyword arguments: a dotted key (`**{"train.rounds": 3}`), a section given
    as a dict (`train={"rounds": 3}`, merged into that section) or a top-level value
    (`seed=1`). Errors are `ConfigError`s that name the key.
    """
    if isinstance(config, ExperimentConfig):
        raw = config.to_dict()
    elif isinstance(config, Mapping):
        raw = _deep_copy(config)
    elif config is None or isinstance(config, str | Path):
        raw = load_raw(config)
    else:
        raise ConfigError(
            f"config must be a YAML path, a dict or an ExperimentConfig, not {type(config).__name__}"
        )
    for key, value in overrides.items():
        if "." in key:
            set_key(raw, key, value)
        elif isinstance(value, Mapping):
            section = raw.setdefault(key, {})
            if not isinstance(section, dict):
                raise ConfigError(f"override '{key}': not a section")
            _merge(section, value)
        else:
            raw[key] = value
    return build_config(raw)


def _deep_copy(mapping: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in mapping.items()}


def _merge(into: dict[str, Any], update: Mapping[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = _deep_copy(value) if isinstance(value, Mapping) else value


@dataclass(frozen=True)
class Summary:
    """A run's `summary.json`, typed. `as_dict()` gives the file's contents back.

    `status` is "complete", or "diverged" when a reply or the server state held NaN or
    infinity (`diverged` says where; `final` and `selected` are None if no round was scored).
    """

    algorithm: str
    dataset: str
    model: str
    engine: str
    num_clients: int
    seed: int
    rounds: int
    final: dict[str, Any] | None
    selected: dict[str, Any] | None
    comm: dict[str, Any]
    time: dict[str, Any]
    status: str = "complete"
    warnings: list[str] = field(default_factory=list)  # e.g. validation never beat chance
    extra: dict[str, Any] = field(default_factory=dict)  # engine-specific entries (Flower's)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Summary:
        """From summary.json's dict; keys this version does not know go to `extra`."""
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        values = {k: data[k] for k in known if k in data}
        values.setdefault("engine", "builtin")
        return cls(**values, extra={k: v for k, v in data.items() if k not in known})

    def as_dict(self) -> dict[str, Any]:
        """summary.json's dict again (`extra` merged back, empty `warnings` left out)."""
        out = asdict(self)
        skip = {"extra", *(("warnings",) if not self.warnings else ())}
        return {**{k: v for k, v in out.items() if k not in skip}, **out["extra"]}


class Run:
    """A finished (or interrupted) experiment, read from its run directory."""

    def __init__(self, path: str | Path) -> None:
        self.dir = RunDir.open(path)
        self.path: Path = self.dir.path
        self._built: tuple[FedModel, Algorithm] | None = None
        self._checkpoint: dict | None = None

    def __repr__(self) -> str:
        state = "complete" if self.dir.complete else "incomplete"
        return f"Run({str(self.path)!r}, {state})"

    # what the run directory says -----------------------------------------------------------
    @property
    def config(self) -> ExperimentConfig:
        """The resolved config the run used (config.yaml), validated."""
        return build_config(self.dir.config())

    @property
    def summary(self) -> Summary:
        """The final and selected scores, cost and warnings (summary.json); a ConfigError
        while the run is unfinished."""
        if not self.dir.complete:
            raise ConfigError(
                f"{self.path} has no {SUMMARY}: the run did not finish "
                f"(continue it: protofed.resume or protofed run --resume {self.path})"
            )
        summary = self.dir.read_json(SUMMARY)
        with reading(self.path / SUMMARY):
            return Summary.from_dict(summary)

    @property
    def provenance(self) -> dict[str, Any] | None:
        """provenance.json: versions, git commit, machine, the data files' sha256, and each
        session's command and times (docs/tracking.md); None for runs made before it existed."""
        if not (self.path / PROVENANCE).is_file():
            return None
        return self.dir.read_json(PROVENANCE)

    @property
    def client_names(self) -> list[str]:
        """Each client's name by id (a subject, a user, a domain), from partition.json."""
        part = self.dir.read_json(PARTITION)
        with reading(self.path / PARTITION):
            return [c["name"] for c in part["clients"]]

    @property
    def history(self) -> pd.DataFrame:
        """One row per evaluated round and client: its personalization, generalization and
        validation scores, with the round's global score, train loss and server metrics."""
        import pandas as pd

        names = self.client_names
        rows = []
        with reading(self.path / METRICS):
            for record in self.dir.history():
                per = record["clients"]
                ids = per.get("client_ids") or list(range(len(per["pers_acc"])))
                glob = record.get("global") or {}
                for j, cid in enumerate(ids):
                    row = {
                        "round": record["round"],
                        "client": cid,
                        "client_name": names[cid],
                        "pers_acc": per["pers_acc"][j],
                        "pers_f1": per["pers_f1"][j],
                        "gen_acc": per["gen_acc"][j] if per["gen_acc"] else None,
                        "gen_f1": per["gen_f1"][j] if per["gen_f1"] else None,
                        "val_acc": per["val_acc"][j],
                        "val_f1": per["val_f1"][j],
                        "global_acc": glob.get("acc"),
                        "global_f1": glob.get("f1"),
                        "train_loss": record["train_loss"],
                    }
                    row.update({f"server.{k}": v for k, v in (record.get("server") or {}).items()})
                    rows.append(row)
        return pd.DataFrame(rows)

    # models ------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where its models load: the run's `train.device` where this machine has it, else
        the CPU (a GPU run's models read where there is no GPU)."""
        import torch

        from protofed.runtime.prepare import resolve_device

        name = self.config.train.device
        if name.startswith("cuda") and not torch.cuda.is_available():
            return torch.device("cpu")
        return resolve_device(name)

    def _model_and_algorithm(self) -> tuple[FedModel, Algorithm]:
        """The model and algorithm as the run built them, from its partition header (no data
        is loaded)."""
        if self._built is None:
            from protofed.runtime import build_model_and_algorithm

            cfg = self.config
            part = self.dir.read_json(PARTITION)
            with reading(self.path / PARTITION):
                shape = tuple(int(n) for n in part["input_shape"])
                classes, clients = int(part["num_classes"]), int(part["num_clients"])
            self._built = build_model_and_algorithm(cfg, shape, classes, clients, self.device)
        return self._built

    def _state(self) -> dict:
        if self._checkpoint is None:
            ckpt = self.dir.load_checkpoint(map_location=self.device)
            if ckpt is None:
                raise ConfigError(
                    f"{self.path} has no {CHECKPOINT}: models can be loaded only from runs "
                    "whose client states were kept by this process (the built-in engine; a "
                    "Flower run keeps them on the clients)"
                )
            from protofed.runtime.fingerprint import states_fault

            _, algorithm = self._model_and_algorithm()
            initial = algorithm.setting.init_model
            if fault := states_fault(ckpt, algorithm.init_server(), initial):
                raise ConfigError(
                    f"{self.path / CHECKPOINT}: {fault} (the file was edited, or written by "
                    "another protofed version)"
                )
            self._checkpoint = ckpt
        return self._checkpoint

    def _module(self, weights: Mapping[str, torch.Tensor]) -> torch.nn.Module:
        import copy

        model, _ = self._model_and_algorithm()
        module = copy.deepcopy(model)
        module.load_state_dict(dict(weights))
        return module.eval()

    def client_model(self, client: int) -> torch.nn.Module:
        """Client `client`'s personalized model after the last checkpointed round (in eval
        mode): the model the run scored it with, so with `eval.client_model=trained` the one
        it kept after its last training (what it receives, if it never trained)."""
        _, algorithm = self._model_and_algorithm()
        ckpt = self._state()
        part = self.dir.read_json(PARTITION)
        with reading(self.path / PARTITION):
            num = int(part["num_clients"])
        if not 0 <= client < num:
            raise ConfigError(f"client {client} is not in this run (0..{num - 1})")
        trained = ckpt.get("trained", {}).get(str(client))  # kept only under `trained`
        if trained is not None:
            return self._module(trained)
        last = int(ckpt["progress"]["server_round"])
        message = algorithm.configure(ckpt["server"], client, last + 1)
        state = ckpt["clients"].get(str(client), {})
        return self._module(algorithm.client_model(message, state))

    def global_model(self) -> torch.nn.Module | None:
        """The server's model after the last checkpointed round, or None for methods without."""
        _, algorithm = self._model_and_algorithm()
        weights = algorithm.global_model(self._state()["server"])
        return None if weights is None else self._module(weights)


def load_run(path: str | Path) -> Run:
    """Open a run directory written by `protofed.run` or `protofed run`."""
    return Run(path)


def run(
    config: ConfigLike = None,
    out: str | Path | None = None,
    *,
    engine: str = "builtin",
    overwrite: bool = False,
    on_round: Callable[[int, dict, dict | None], None] | None = None,
    log: str | Sequence[str] = (),
    **overrides: Any,
) -> Run:
    """Run one experiment and return its `Run`.

    `config`: a YAML path, a nested dict, an `ExperimentConfig` or None (the defaults);
    `overrides` as in `resolve_config`. `out`: the run directory (default:
    `runs/<algorithm>-<dataset>-<time>`); an existing non-empty one is an error unless
    `overwrite`. `engine`: "builtin" or "flower" (Flower's simulation engine). `log`:
    "tensorboard" also writes TensorBoard scalars to `out`/tensorboard/ (docs/tracking.md).
    `on_round(round, info, record)`: called after every round (`record`: the evaluated
    round's metrics.jsonl line, else None). The summary's warnings (e.g. validation never
    beat chance) are also issued as RuntimeWarnings.
    """
    from protofed.tracking import log_kinds

    cfg = resolve_config(config, **overrides)
    logs = log_kinds(log)
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = Path("runs") / f"{cfg.algorithm.name}-{cfg.data.name}-{stamp}"
    if engine == "builtin":
        from protofed.runtime import start

        loop = start(cfg, out, overwrite=overwrite)
        run_loop = loop.run
    elif engine == "flower":
        from protofed.flower import require_flower

        require_flower()
        from protofed.flower.engine import run_simulation_loop
        from protofed.flower.engine import start as start_flower

        loop = start_flower(cfg, out, overwrite=overwrite)
        run_loop = functools.partial(run_simulation_loop, loop)
    else:
        raise ConfigError(f"unknown engine '{engine}' (builtin or flower)")
    return _drive(loop, run_loop, out, logs, on_round)


def pretrain(
    config: ConfigLike = None,
    out: str | Path = "runs/pretrain/encoder.safetensors",
    *,
    overwrite: bool = False,
    resume: bool = False,
    on_epoch: Callable[[int, float], None] | None = None,
    on_start: Callable[[str], None] | None = None,
    **overrides: Any,
) -> Path:
    """Pre-train HART's encoder and ALP prototypes as a masked autoencoder on the unlabeled
    windows of the HAR sets other than the config's (FedAli 5.4, docs/pretraining.md) and
    write the checkpoint to `out`; start any run from it with `model.init=<out>`.

    After every epoch the whole state is kept beside `out` (`state_path(out)`, removed at
    the end): `resume=True` continues an interrupted pre-training from it, to the same
    checkpoint an uninterrupted one writes; with no state it starts afresh, and with `out`
    already written by the same settings it returns at once. `overwrite=True` starts over.
    `on_start(description)` gets what will be trained on (not called when `out` is already
    complete), `on_epoch(epoch, loss)` follows the training. `out` is written at the end."""
    from protofed.training.pretrain import (
        Pretraining,
        check_complete,
        read_state,
        save_checkpoint,
        state_path,
    )

    cfg = resolve_config(config, **overrides)
    out = Path(out)
    state = state_path(out)
    if overwrite and resume:
        raise ConfigError("--force starts over and --resume continues: choose one")
    check_writable(out)
    check_writable(state)
    if out.exists() and not overwrite:
        if not resume:
            raise ConfigError(f"{out} exists (replace it with --force, or overwrite=True)")
        check_complete(out, cfg)
        state.unlink(missing_ok=True)  # left by a kill between writing `out` and removing it
        return out
    if state.exists() and not (resume or overwrite):
        raise ConfigError(
            f"{state} holds an unfinished pre-training: continue it with --resume "
            "(resume=True), or start over with --force (overwrite=True)"
        )
    kept = read_state(state, cfg) if resume and state.exists() else None
    job = Pretraining.build(cfg)
    if kept is not None:
        job.restore(state, *kept)
    elif overwrite:
        state.unlink(missing_ok=True)
    if on_start is not None:
        done = f"; resuming after epoch {len(job.losses)}" if job.losses else ""
        on_start(job.describe() + done)
    job.run(on_epoch, on_state=lambda tensors: save_checkpoint(state, tensors))
    save_checkpoint(out, job.checkpoint())
    state.unlink(missing_ok=True)
    return out


def resume(
    path: str | Path,
    *,
    data_dir: str | Path | None = None,
    on_round: Callable[[int, dict, dict | None], None] | None = None,
    log: str | Sequence[str] = (),
) -> Run:
    """Continue a run that stopped before its summary (killed, interrupted) from its last
    checkpoint; it ends with the numbers an uninterrupted run would have. A finished run is
    returned as it is. `data_dir`: where the data are now, if not where the run recorded
    (else $PROTOFED_DATA). A Flower run cannot resume: its client states lived on the nodes.
    """
    from protofed.runtime import resume as resume_loop
    from protofed.tracking import log_kinds

    logs = log_kinds(log)
    try:
        loop = resume_loop(path, data_dir)
    except RunComplete:  # finished, maybe by another process while this one started
        return Run(path)
    return _drive(loop, loop.run, path, logs, on_round)


def _drive(
    loop: RoundLoop,
    run_loop: Callable[[Callable[[int, dict, dict | None], None]], dict],
    out: str | Path,
    logs: Sequence[str],
    on_round: Callable[[int, dict, dict | None], None] | None,
) -> Run:
    """Run the loop to its end with tracking and the caller's callback; warn what the
    summary warns (the CLI prints it)."""
    from protofed.tracking import Tracking

    with Tracking(out, loop.cfg.train.rounds, loop.progress.server_round, logs) as tracking:

        def each(r: int, info: dict, record: dict | None) -> None:
            tracking(r, info, record)
            if on_round is not None:
                on_round(r, info, record)

        run_loop(each)
    finished = Run(out)
    for warning in finished.summary.warnings:
        warnings.warn(warning, RuntimeWarning, stacklevel=3)
    return finished
