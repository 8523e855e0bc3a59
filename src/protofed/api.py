"""protofed as a Python library: run an experiment, open a run, get its models back.

    import protofed
    run = protofed.run("configs/quickstart.yaml", train={"rounds": 5})
    run.summary.final.personalization.f1
    run.history                 # pandas DataFrame: one row per evaluated round and client
    model = run.client_model(3) # client 3's personalized model, a ready torch.nn.Module
    again = protofed.load_run(run.path)

    x, y = run.client_data(3, "test")   # the tensors client 3 was scored on
    run.predict(3, x)           # its personalized model's class predictions

Every run, from Python or from the CLI, writes the same run directory (config.yaml,
partition.json, metrics.jsonl, checkpoint.pt, summary.json), and `Run` reads only that
directory: a run made on another machine or by the CLI opens the same way.

Units: every score in the Python API is a fraction in [0, 1] (`Summary`, `RoundRecord`,
`Run.history`), as in metrics.jsonl and summary.json; the CLI's tables and `protofed
report` show the same scores in percent (they say so). Names: `Run.history`'s columns are
the report's where they mean the same thing (`pers_acc`, `pers_f1`, `gen_acc`, `gen_f1`,
`global_acc`, `global_f1`, `train_loss`, `round`; per client there, the mean over clients
in the report), and a `Summary` field maps to a report column as in `REPORT_COLUMNS`
(`summary.final.personalization.f1` is the report's `pers_f1` of the final round, in %
there; `summary.selected...` the selected round's, what `protofed report` shows by default).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from protofed.config import ExperimentConfig, build_config, load_raw, set_key
from protofed.core.files import check_writable, shared_memory_fault
from protofed.core.results import RoundRecord, Summary
from protofed.errors import ConfigError, RunComplete
from protofed.runs import (
    CHECKPOINT,
    METRICS,
    PARTITION,
    PROVENANCE,
    SUMMARY,
    RunDir,
    check_digest,
    reading,
)

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from protofed.algorithms import Algorithm
    from protofed.core.results import RoundInfo
    from protofed.data.federated import FederatedData
    from protofed.engines import Engine
    from protofed.models.base import FedModel
    from protofed.runtime.loop import OnRound, RoundLoop
    from protofed.tracking import Tracking

ConfigLike = str | Path | Mapping[str, Any] | ExperimentConfig | None

SPLITS = ("train", "val", "test")
"""The splits of a client's data (`Run.client_data`)."""
REPORT_COLUMNS: dict[str, str] = {
    "personalization.acc": "pers_acc",
    "personalization.f1": "pers_f1",
    "personalization.f1_std": "pers_f1_client_std",
    "generalization.acc": "gen_acc",
    "generalization.f1": "gen_f1",
    "generalization.f1_std": "gen_f1_client_std",
    "global_.acc": "global_acc",
    "global_.f1": "global_f1",
    "unseen.acc": "unseen_acc",
    "unseen.f1": "unseen_f1",
    "unseen.f1_std": "unseen_f1_client_std",
}
"""A `ReportedRound`'s score (`summary.final` or `summary.selected`, e.g.
`summary.final.personalization.f1`) -> the `protofed report` column that shows it (there in
%, here a fraction). `Run.history` uses the same names for each client's own scores.
`summary.final.unseen` (`UnseenScores`, eval.unseen_clients) holds the held-out clients'
scores: `.acc`/`.f1` their own models' (`.personalized`), `.global_` the global model's."""


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


class Run:
    """A finished (or interrupted) experiment, read from its run directory."""

    def __init__(self, path: str | Path) -> None:
        self.dir = RunDir.open(path)
        self.dir.verify_checksums()  # a finished run's summary and metrics, as written
        self.path: Path = self.dir.path
        self._built: tuple[FedModel, Algorithm] | None = None
        self._checkpoint: dict[str, Any] | None = None
        self._fed: FederatedData | None = None
        self._models: dict[int, torch.nn.Module] = {}

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
            return Summary.from_json(summary)

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
        validation scores, with the round's global score, train loss and server metrics.

        Scores are fractions in [0, 1] (None where not computed). The columns `round`,
        `pers_acc`, `pers_f1`, `gen_acc`, `gen_f1`, `global_acc`, `global_f1` and
        `train_loss` carry the names of `protofed report`'s columns (which show the mean
        over clients, in %); `val_acc`, `val_f1` (validation), `client`, `client_name` and
        `server.<metric>` have none there. With eval.unseen_clients, the rows are the
        training clients' and `unseen_acc`, `unseen_f1` the round's unseen score (the
        held-out clients' mean, as the report's columns)."""
        import pandas as pd

        names = self.client_names
        rows = []
        with reading(self.path / METRICS):
            for record in map(RoundRecord.from_json, self.dir.history()):
                per, glob = record.clients, record.global_
                for j, cid in enumerate(per.ids):
                    row = {
                        "round": record.round,
                        "client": cid,
                        "client_name": names[cid],
                        "pers_acc": per.pers_acc[j],
                        "pers_f1": per.pers_f1[j],
                        "gen_acc": per.gen_acc[j] if per.gen_acc else None,
                        "gen_f1": per.gen_f1[j] if per.gen_f1 else None,
                        "val_acc": per.val_acc[j],
                        "val_f1": per.val_f1[j],
                        "global_acc": glob.acc if glob is not None else None,
                        "global_f1": glob.f1 if glob is not None else None,
                        "train_loss": record.train_loss,
                    }
                    if record.unseen is not None:  # the held-out clients' mean, as global
                        row["unseen_acc"] = record.unseen.acc
                        row["unseen_f1"] = record.unseen.f1
                    row.update({f"server.{k}": v for k, v in record.server.items()})
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

    def _state(self) -> dict[str, Any]:
        if self._checkpoint is None:
            ckpt = self.dir.load_checkpoint(map_location=self.device, verify=False)
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
            check_digest(self.path / CHECKPOINT, ckpt)  # after the check that names an entry
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
        client = self._client(client)
        _, algorithm = self._model_and_algorithm()
        ckpt = self._state()
        trained = ckpt.get("trained", {}).get(str(client))  # kept only under `trained`
        if trained is not None:
            return self._module(trained)
        last = int(ckpt["progress"]["server_round"])
        message = algorithm.configure(ckpt["server"], client, last + 1)
        state = ckpt["clients"].get(str(client), {})
        return self._module(algorithm.client_model(message, state))

    # data and predictions ----------------------------------------------------------------
    def _federation(self, data_dir: str | Path | None) -> FederatedData:
        """The federation rebuilt as the run built it: its config (seeded), from its data root
        (or `data_dir`, else $PROTOFED_DATA), checked against partition.json's sizes."""
        import os

        if self._fed is not None and data_dir is None:
            return self._fed
        from protofed.data.federated import build_federated
        from protofed.runtime.prepare import with_data_root

        cfg = self.config
        where = data_dir if data_dir is not None else os.environ.get("PROTOFED_DATA") or None
        if where is not None:
            cfg = with_data_root(cfg, Path(where).expanduser().absolute())
        root = f"data root {cfg.data.dir}" if cfg.data.dir is not None else "the default data root"
        hint = "pass data_dir= where its data are now"
        try:
            fed = build_federated(cfg.data, cfg.seed)
        except (ConfigError, OSError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"{self.path}: cannot rebuild the clients' data from {root} ({reason}); {hint}"
            ) from None
        part = self.dir.read_json(PARTITION)
        with reading(self.path / PARTITION):
            recorded = [{s: int(c[s]) for s in SPLITS} for c in part["clients"]]
        if [c.sizes() for c in fed.clients] != recorded:
            raise ConfigError(
                f"{self.path}: the data under {root} split into other clients than "
                f"the run's ({PARTITION}): not the data it ran on; {hint}"
            )
        self._fed = fed
        return fed

    def client_data(
        self, client: int, split: str = "test", *, data_dir: str | Path | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The inputs and labels (x, y) that client `client` trained on (`split="train"`),
        selected rounds with (`"val"`) or was scored on (`"test"`), as CPU tensors.

        Rebuilt from the run's config and data root the way the run built them (the
        partition and the splits are seeded, so they are identical; checked against
        partition.json's sizes), loaded once per `Run`. `data_dir`: where the data are now,
        if not where the run recorded (else $PROTOFED_DATA). With `data.dynamic` the split
        is the whole of it (a round trained on part of it). A bad client or split, or data
        that cannot be loaded, is a one-line ConfigError.
        """
        if split not in SPLITS:
            raise ConfigError(f"split '{split}' is not one of {', '.join(SPLITS)}")
        client = self._client(client)
        data = self._federation(data_dir).clients[client]
        return getattr(data, f"{split}_x"), getattr(data, f"{split}_y")

    def predict(
        self, client: int, x: torch.Tensor, *, batch_size: int | None = None
    ) -> torch.Tensor:
        """Client `client`'s personalized model's (`client_model`) class predictions for the
        inputs `x` (a CPU int64 tensor, one label a row of `x`): in eval mode, without
        gradients, in batches of `batch_size` (default: the run's `eval.batch_size`) from the
        start of `x`, in fp32, the model's output's argmax.

        Models whose predictions depend on the batch (`FedModel.batch_dependent`, e.g.
        FedAli's ALP layers, which balance a Sinkhorn assignment over the batch) give other
        labels for another batching: to reproduce the run's personalization scores pass the
        client's own test split whole (`client_data(i, "test")`) with the default batch
        size, as the evaluation predicts it; a single sample, or inputs mixed with other
        clients', may be labelled differently."""
        import torch

        from protofed.training.loop import predict

        client = self._client(client)
        if not isinstance(x, torch.Tensor):
            raise ConfigError(f"predict takes a torch.Tensor of inputs, not {type(x).__name__}")
        if client not in self._models:
            self._models = {client: self.client_model(client)}  # the latest client's only
        model = self._models[client]
        size = batch_size if batch_size is not None else self.config.eval.batch_size
        if size < 1:
            raise ConfigError(f"batch_size must be at least 1 (got {size})")
        device = next(model.parameters()).device
        return predict(model, x.to(device, torch.float32), size).cpu()

    def _client(self, client: object) -> int:
        """`client` as a client id of this run: an int in 0..N-1 (a name, a string of digits,
        a bool or a float is a one-line ConfigError, not a TypeError from deep inside)."""
        num = self._num_clients()
        if isinstance(client, bool) or not isinstance(client, int):
            named = " (Run.client_names maps ids to names)" if isinstance(client, str) else ""
            raise ConfigError(
                f"client {client!r} is not a client id: an int in 0..{num - 1} expected{named}"
            )
        if not 0 <= client < num:
            raise ConfigError(f"client {client!r} is not in this run (0..{num - 1})")
        return client

    def _num_clients(self) -> int:
        part = self.dir.read_json(PARTITION)
        with reading(self.path / PARTITION):
            return int(part["num_clients"])

    def global_model(self) -> torch.nn.Module | None:
        """The server's model after the last checkpointed round, or None for methods without."""
        _, algorithm = self._model_and_algorithm()
        weights = algorithm.global_model(self._state()["server"])
        return None if weights is None else self._module(weights)


def load_run(path: str | Path) -> Run:
    """Open a run directory written by `protofed.run` or `protofed run`."""
    return Run(path)


@dataclass(frozen=True)
class Started:
    """What a run starts from, handed to `on_start` just before its first round (for a
    progress display: the rounds in all and those already run, e.g. by a resumed run)."""

    path: Path  # the run directory, as given
    algorithm: str
    rounds: int  # in all
    done: int  # already run before this session
    tracking: Tracking  # its `status`: the latest train loss and personalization F1


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run: which round it had finished, whether `resume` continues it,
    and from which round (the last checkpointed: `train.checkpoint_every`). A
    KeyboardInterrupt still, for whoever catches that."""

    def __init__(
        self, path: Path, server_round: int, resumable: bool, resumes_from: int | None = None
    ) -> None:
        how = f"continue with protofed.resume({str(path)!r})" if resumable else "cannot resume"
        super().__init__(f"{path}: {interrupted_after(server_round, resumes_from)}; {how}")
        self.path, self.server_round, self.resumable = path, server_round, resumable
        self.resumes_from = server_round if resumes_from is None else resumes_from


def interrupted_after(server_round: int, resumes_from: int | None) -> str:
    """ "interrupted after round N", and the round a resume starts from where it is earlier."""
    if resumes_from is None or resumes_from >= server_round:
        return f"interrupted after round {server_round}"
    if resumes_from == 0:
        return f"interrupted after round {server_round} (no round checkpointed yet)"
    return f"interrupted after round {server_round} (checkpointed after round {resumes_from})"


class SummaryWarning(RuntimeWarning):
    """A finished run's summary warns this (`Summary.warnings`, e.g. validation never beat
    chance); the CLI prints the summary's warnings itself and ignores these."""


def run(
    config: ConfigLike = None,
    out: str | Path | None = None,
    *,
    engine: str = "builtin",
    overwrite: bool = False,
    on_round: OnRound | None = None,
    on_start: Callable[[Started], None] | None = None,
    log: str | Sequence[str] = (),
    lines: TextIO | None = None,
    **overrides: Any,
) -> Run:
    """Run one experiment and return its `Run`.

    `config`: a YAML path, a nested dict, an `ExperimentConfig` or None (the defaults);
    `overrides` as in `resolve_config`. `out`: the run directory (default:
    `runs/<algorithm>-<dataset>-<time>`); an existing non-empty one is an error unless
    `overwrite`. `engine`: "builtin" or "flower" (Flower's simulation engine). `log`:
    "tensorboard" also writes TensorBoard scalars to `out`/tensorboard/, "mlflow" an MLflow run
    to the store mlruns/ beside `out` (shared by the runs under the same folder), "mlflow=URI"
    to the tracking server at URI, "wandb" a Weights & Biases run (offline unless an API key
    is configured) (several: a list; plugins add more: docs/tracking.md);
    `lines`: a stream (e.g. a log file's) that gets one plain line per evaluated round.
    `on_start(started)`: called once the run is built, before its first round.
    `on_round(round, info, record)`: called after every round (`record`: the evaluated
    round's metrics.jsonl line, else None). Ctrl-C raises `RunInterrupted`. The summary's
    warnings (e.g. validation never beat chance) are also issued as `SummaryWarning`s.
    """
    from protofed.engines import engine_named
    from protofed.tracking import log_kinds

    cfg = resolve_config(config, **overrides)
    logs = log_kinds(log)
    chosen = engine_named(engine)
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = Path("runs") / f"{cfg.algorithm.name}-{cfg.data.name}-{stamp}"
    loop = chosen.start(cfg, out, overwrite)
    return _drive(loop, chosen, out, logs, Callbacks(on_round, on_start, lines))


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

    def keep_state(tensors: dict[str, torch.Tensor]) -> None:
        save_checkpoint(state, tensors)

    job.run(on_epoch, on_state=keep_state)
    save_checkpoint(out, job.checkpoint())
    state.unlink(missing_ok=True)
    return out


def resume(
    path: str | Path,
    *,
    data_dir: str | Path | None = None,
    on_round: OnRound | None = None,
    on_start: Callable[[Started], None] | None = None,
    log: str | Sequence[str] = (),
    lines: TextIO | None = None,
) -> Run:
    """Continue a run that stopped before its summary (killed, interrupted) from its last
    checkpoint; it ends with the numbers an uninterrupted run would have. A finished run is
    returned as it is (`on_start` is then not called). `data_dir`: where the data are now,
    if not where the run recorded (else $PROTOFED_DATA). The callbacks and `lines` as in
    `run`. A Flower run cannot resume: its client states lived on the nodes.
    """
    from protofed.engines import BUILTIN, engine_named
    from protofed.tracking import log_kinds

    logs = log_kinds(log)
    engine = engine_named(BUILTIN)  # the resumable one: a run made on another is refused
    try:
        loop = engine.reopen(path, data_dir)
    except RunComplete:  # finished, maybe by another process while this one started
        return Run(path)
    return _drive(loop, engine, path, logs, Callbacks(on_round, on_start, lines))


@dataclass(frozen=True)
class Callbacks:
    """What the caller of `run` or `resume` follows the run with."""

    on_round: OnRound | None = None
    on_start: Callable[[Started], None] | None = None
    lines: TextIO | None = None  # one plain line per evaluated round


def _drive(
    loop: RoundLoop, engine: Engine, out: str | Path, logs: Sequence[str], calls: Callbacks
) -> Run:
    """Run the loop to its end on its engine with tracking and the caller's callbacks; a
    Ctrl-C becomes `RunInterrupted`; warn what the summary warns (the CLI prints it)."""
    from protofed.tracking import Tracking

    rounds, done = loop.cfg.train.rounds, loop.progress.server_round
    config = loop.cfg.to_dict()
    with Tracking(out, rounds, done, logs, calls.lines, config) as tracking:

        def each(server_round: int, info: RoundInfo, record: RoundRecord | None) -> None:
            tracking(server_round, info, record)
            if calls.on_round is not None:
                calls.on_round(server_round, info, record)

        if calls.on_start is not None:
            calls.on_start(Started(Path(out), loop.cfg.algorithm.name, rounds, done, tracking))
        try:
            engine.drive(loop, each)
        except KeyboardInterrupt as stop:
            if not (Path(out) / SUMMARY).is_file():
                checkpointed = loop.checkpointed_round
                raise RunInterrupted(
                    Path(out),
                    loop.progress.server_round,
                    loop.checkpoints,
                    done if checkpointed is None else checkpointed,
                ) from stop
            # the signal came after the summary was written: the run is complete
            from protofed.runtime.provenance import close_session

            close_session(RunDir(out), Run(out).summary)
        except RuntimeError as exc:  # a full /dev/shm: the last checkpoint stays resumable
            if (fault := shared_memory_fault(exc)) is None:
                raise
            raise fault from None
        finished = Run(out)
        tracking.finish(finished.summary)
    for warning in finished.summary.warnings:
        warnings.warn(warning, SummaryWarning, stacklevel=3)
    return finished
