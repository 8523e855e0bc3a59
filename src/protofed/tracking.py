"""Live tracking: what follows a run while it runs, from the round loop's `on_round` calls.

The loop calls `on_round(round, info, record)` after every round (`runtime.loop.OnRound`):
`info` holds the round's train loss, server metrics and times, `record` the line it appended
to metrics.jsonl (None for a round that was not evaluated). `Tracking` consumes them:

- the loggers named by `--log` (`protofed.run(log=...)`): TensorBoard scalars in
  RUN/tensorboard/ (`tensorboard`), an MLflow run (`mlflow`, `mlflow=URI`), a Weights &
  Biases run (`wandb`, `wandb=PROJECT`), and any a plugin registers (`Logger`,
  `register_logger`, entry point group `protofed.loggers`);
- one plain line per evaluated round for a log file (`round 10/100  loss 0.4123  pers F1
  81.23%  ...  ETA 4m48s`), where stderr is not a terminal and no progress bar is drawn;
- the progress bar's status (the latest train loss and personalization F1).

It only reads what the loop hands it, so what it shows is what metrics.jsonl holds.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO, runtime_checkable

from protofed.core.caveats import SEEDED_METRIC
from protofed.core.results import RoundInfo, RoundRecord, Summary
from protofed.errors import ConfigError

TENSORBOARD = "tensorboard"
"""The run directory's folder of TensorBoard event files."""
MLRUNS = "mlruns"
"""The folder of the default local MLflow store (`--log mlflow`), beside the run directory:
one store for every run under the same output root."""
MLFLOW_RUN = "mlflow_run.json"
"""In the run directory: the MLflow run it logs to (its tracking URI and run id), so a
resumed run goes on logging into the same MLflow run."""
SCORES = {
    "personalization": "personalization",
    "generalization": "generalization",
    "global": "global",
    "val": "validation",
}
"""metrics.jsonl's score sections -> their TensorBoard tag prefix."""


# the logger interface ------------------------------------------------------------------------
@dataclass(frozen=True)
class RunStart:
    """What a logger is told when a run (or a resumed session of it) starts."""

    run_dir: Path  # the run directory (absolute)
    total: int  # the run's rounds
    first_round: int  # 1 for a new run, else the first round this session runs
    config: dict[str, Any]  # the run's resolved config (config.yaml), nested


@runtime_checkable
class Logger(Protocol):
    """A `--log` destination. Built from the option's value (`--log NAME=VALUE`, else None)
    when the options are checked, before anything is written: the constructor checks that its
    packages are installed (a one-line ConfigError naming the extra) and writes nothing.

    `start(run)` once the run is built; `log_round(scalars, step)` after every round (the
    scalars by TensorBoard tag, `scalars()`; step: the round); `close(summary)` at the end,
    with the run's `Summary` when it finished, None when it stopped (interrupted, failed)."""

    def start(self, run: RunStart) -> None: ...

    def log_round(self, scalars: Mapping[str, float], step: int) -> None: ...

    def close(self, summary: Summary | None) -> None: ...


LoggerFactory = Callable[[str | None], Logger]
LOGGERS: dict[str, LoggerFactory] = {}
"""Every `--log` destination by name: the built-in ones, then plugins' (`load_loggers`)."""


def register_logger(name: str) -> Callable[[Any], Any]:
    """Decorator: a `Logger` class (or a factory `(value: str | None) -> Logger`) known to
    `--log` as `name`. A plugin's module does this and declares it in its pyproject.toml:

        [project.entry-points."protofed.loggers"]
        wandb = "mypackage.wandb_logger"   # a module that uses @protofed.tracking.register_logger

    (docs/tracking.md shows a Weights & Biases logger as an example)."""
    from protofed import plugins

    if not re.fullmatch(r"[a-z][a-z0-9_-]*", name):
        raise ConfigError(f"a logger name is lowercase letters, digits, _ and - (got {name!r})")
    return plugins.registrar("loggers", LOGGERS, name, lambda factory: factory)


def load_loggers() -> dict[str, LoggerFactory]:
    """Every logger, installed plugins' included (`protofed.plugins`)."""
    from protofed import plugins

    def register(obj: Any) -> None:  # an entry point that names a class with a `name`
        name = getattr(obj, "name", None)
        if not isinstance(name, str):
            raise TypeError(f"{obj!r} has no `name`: decorate it with register_logger(name)")
        register_logger(name)(obj)

    plugins.load("loggers", register)
    return LOGGERS


def _split(item: str) -> tuple[str, str | None]:
    name, sep, value = item.partition("=")
    return name.strip(), (value.strip() if sep else None)


def log_kinds(values: str | Sequence[str] | None) -> tuple[str, ...]:
    """`--log` values (repeated, or comma-separated; `NAME` or `NAME=VALUE`) checked before
    any file is written: an unknown one, or one whose package is missing, is a one-line
    error. Returns them normalized, one a destination."""
    if values is None:
        return ()
    items = [values] if isinstance(values, str) else list(values)
    kinds: list[str] = []
    for item in items:
        for kind in (k.strip() for k in str(item).split(",")):
            if not kind:
                continue
            name, value = _split(kind)
            if name not in LOGGERS:
                load_loggers()
            if name not in LOGGERS:
                valid = ", ".join(sorted(LOGGERS))
                raise ConfigError(f"unknown --log '{name}' (valid: {valid})")
            LOGGERS[name](value)  # checks its packages and value; writes nothing
            normalized = name if value is None else f"{name}={value}"
            if normalized not in kinds:
                kinds.append(normalized)
    return tuple(kinds)


def build_loggers(kinds: Sequence[str]) -> list[Logger]:
    """The loggers of `log_kinds(...)`'s destinations."""
    loggers = []
    for kind in kinds:
        name, value = _split(kind)
        if name not in LOGGERS:
            load_loggers()
        if name not in LOGGERS:
            raise ConfigError(f"unknown --log '{name}' (valid: {', '.join(sorted(LOGGERS))})")
        loggers.append(LOGGERS[name](value))
    return loggers


def require_package(kind: str, module: str) -> None:
    """A one-line error naming the extra to install (named as `--log KIND` and its package)
    when `module`, which `--log KIND` writes through, cannot be imported."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(
            f"--log {kind} needs the {kind} package: pip install 'protofed[{kind}]' ({reason})"
        ) from None


def _number(value: Any) -> float | None:
    """A finite number, or None (a missing score, a NaN written as null, a flag)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def scalars(
    info: RoundInfo, record: RoundRecord | None, round_s: float | None = None
) -> dict[str, float]:
    """The round's scalars by TensorBoard tag.

    Every round: `train/loss`, `server/<metric>`, `time/train_s`, `time/guard_s`,
    `time/aggregate_s` and `time/round_s` (wall clock since the previous round). An evaluated round adds every score
    of its metrics.jsonl line (`personalization/f1`, `generalization/acc`, `global/f1`,
    `validation/f1_std`, ...), `comm/up_bytes` and `comm/down_bytes` (totals so far) and
    `time/eval_s`. Missing or non-finite values are left out.
    """
    values: dict[str, Any] = {
        "train/loss": info.train_loss,
        "time/train_s": info.train_s,
        "time/guard_s": info.guard_s,
        "time/aggregate_s": info.aggregate_s,
        "time/round_s": round_s,
    }
    values.update({f"server/{k}": v for k, v in info.server.items()})
    if record is not None:
        line = record.to_json()  # the tags are metrics.jsonl's keys
        for section, prefix in SCORES.items():
            values.update({f"{prefix}/{k}": v for k, v in (line.get(section) or {}).items()})
        values.update({f"comm/{k}": v for k, v in line["comm"].items()})
        values["time/eval_s"] = record.time.eval_s
    return {tag: number for tag, v in values.items() if (number := _number(v)) is not None}


def duration(seconds: float) -> str:
    """12s, 4m48s, 1h02m: an ETA as a log line shows it."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _pct(value: Any) -> str:
    number = _number(value)
    return "-" if number is None else f"{100 * number:.2f}%"


class RoundClock:
    """Wall-clock seconds per round and the time left, from the rounds this process ran."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.rounds = 0

    def tick(self) -> float:
        """A round ended: the seconds it took (since the previous tick, or the start)."""
        now = time.perf_counter()
        took, self.last = now - self.last, now
        self.rounds += 1
        return took

    @property
    def per_round(self) -> float:
        return (self.last - self.start) / max(self.rounds, 1)

    def eta_s(self, server_round: int, total: int) -> float:
        return (total - server_round) * self.per_round


def epsilon_text(epsilon: float, seeded: bool) -> str:
    """The privacy spent, as a progress line shows it: marked where the noise was seeded
    (privacy.noise=seeded; the round's `SEEDED_METRIC`), which is no guarantee."""
    return f"ε {epsilon:.3g}" + (" (seeded noise: not a guarantee)" if seeded else "")


def plain_line(server_round: int, total: int, record: RoundRecord, clock: RoundClock) -> str:
    """One evaluated round as one line of text, for `tail -f` on a log file."""
    parts = [f"round {server_round}/{total}"]
    loss = _number(record.train_loss)
    parts.append(f"loss {'-' if loss is None else f'{loss:.4f}'}")
    parts.append(f"pers F1 {_pct(record.personalization.f1)}")
    for part, label in ((record.generalization, "gen"), (record.global_, "global")):
        if part is not None:
            parts.append(f"{label} F1 {_pct(part.f1)}")
    if record.epsilon is not None:
        parts.append(epsilon_text(record.epsilon, bool(record.server.get(SEEDED_METRIC))))
    per = clock.per_round
    parts.append(f"{per:.1f} s/round" if per >= 1 else f"{per:.2f} s/round")
    parts.append(f"ETA {duration(clock.eta_s(server_round, total))}")
    return "  ".join(parts)


class TensorBoardLog:
    """TensorBoard event files in `folder`, one step per round, flushed after every round.

    A run that starts at round 1 (new, or restarted from scratch) removes older event files
    of its folder; a resumed run appends a new file with `purge_step` = its first round, so
    TensorBoard drops what an interrupted session logged after the checkpoint it resumed
    from and shows each round once, as metrics.jsonl does.
    """

    def __init__(self, folder: Path, first_round: int) -> None:
        require_package("tensorboard", "torch.utils.tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        if first_round <= 1 and folder.is_dir():
            for stale in folder.glob("events.out.tfevents.*"):
                stale.unlink()
        self.writer = SummaryWriter(
            log_dir=str(folder), purge_step=first_round if first_round > 1 else None
        )

    def add(self, server_round: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, server_round)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@register_logger("tensorboard")
class TensorBoardLogger:
    """`--log tensorboard`: TensorBoard scalars in RUN/tensorboard/ (`TensorBoardLog`)."""

    name = "tensorboard"

    def __init__(self, value: str | None = None) -> None:
        if value is not None:
            raise ConfigError(f"--log tensorboard takes no value (got tensorboard={value})")
        require_package("tensorboard", "torch.utils.tensorboard")
        self.log: TensorBoardLog | None = None

    def start(self, run: RunStart) -> None:
        self.log = TensorBoardLog(run.run_dir / TENSORBOARD, run.first_round)

    def log_round(self, scalars: Mapping[str, float], step: int) -> None:
        if self.log is not None:
            self.log.add(step, scalars)

    def close(self, summary: Summary | None) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None


def mlflow_store(root: Path) -> str:
    """The local MLflow store of the runs under `root`: a SQLite file, root/mlruns/mlflow.db
    (MLflow's own file store is in maintenance mode and refused by default since MLflow 3)."""
    return f"sqlite:///{(root.absolute() / MLRUNS / 'mlflow.db').as_posix()}"


def mlflow_uri(run_dir: Path) -> str:
    """The default local MLflow store of a run: `mlflow_store` of the folder that holds the
    run directory (ROOT/mlruns/mlflow.db for ROOT/RUN), so the runs under one output root
    share one store and one MLflow UI. A sweep names its --out's store instead
    (`sweep_logs`), so nested run folders share it too."""
    return mlflow_store(run_dir.absolute().parent)


def sweep_logs(kinds: Sequence[str], out: Path) -> tuple[str, ...]:
    """A sweep's `--log` destinations as its runs get them: plain `mlflow` becomes
    `mlflow=` the sweep's own store, `out`/mlruns/ (unless $MLFLOW_TRACKING_URI names one),
    so every run of the sweep, however deep its folder, logs into one store."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return tuple(kinds)
    return tuple(f"mlflow={mlflow_store(out)}" if k == "mlflow" else k for k in kinds)


def _sqlite_folder(uri: str) -> Path | None:
    """The folder of a local SQLite store's file (sqlite:///path/mlflow.db), else None."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return Path(path).parent if path and path != ":memory:" else None


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive flock on folder/.lock (where fcntl exists): the runs of a sweep that
    share a new store create its tables and its experiment one at a time."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(folder / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_MLFLOW_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")


def mlflow_key(key: str) -> str:
    """A param or metric name MLflow accepts (letters, digits, `_-. /`; others become `_`)."""
    return _MLFLOW_KEY.sub("_", key)


def flat_params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{"train": {"lr": 0.1}} -> {"train.lr": "0.1"}: a config as MLflow params."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[mlflow_key(name)] = text[:6000]  # MLflow's limit on a param's value
    return out


def summary_scalars(summary: Summary) -> dict[str, float]:
    """A finished run's reported scores as metrics: `final/personalization/f1`,
    `selected/global/acc`, ... (fractions, as every other score)."""
    out: dict[str, float] = {}
    for when, reported in (("final", summary.final), ("selected", summary.selected)):
        if reported is None:
            continue
        line = reported.to_json()
        for section in ("personalization", "generalization", "global"):
            for k, v in (line.get(section) or {}).items():
                if (number := _number(v)) is not None:
                    out[f"{when}/{section}/{k}"] = number
    return out


@register_logger("mlflow")
class MlflowLogger:
    """`--log mlflow`: an MLflow run in the local store of the run's output root
    (`mlflow_uri`: ROOT/mlruns/mlflow.db beside ROOT/RUN, artifacts in ROOT/mlruns/artifacts),
    shared by every run under ROOT (a sweep's runs: its --out's store, `sweep_logs`); `--log mlflow=URI`, else $MLFLOW_TRACKING_URI: in the
    tracking server or store at URI (http://host:5000, sqlite:///path, ...). The experiment
    is $MLFLOW_EXPERIMENT_NAME, else "protofed"; the MLflow run is named after the run
    directory.

    It gets the config as params (flattened keys: `train.lr`), every round's scalars under
    TensorBoard's tags (`personalization/f1`, step = the round) and, at the end, the summary's
    reported scores (`summary_scalars`). A resumed run logs into the same MLflow run
    (RUN/mlflow_run.json; without URI and $MLFLOW_TRACKING_URI, into the store it recorded):
    MLflow keeps every value logged, so rounds an interrupted session logged after its last
    checkpoint appear twice at their step."""

    name = "mlflow"

    def __init__(self, value: str | None = None) -> None:
        if value is not None and not value:
            raise ConfigError("--log mlflow=URI: the URI is empty")
        require_package("mlflow", "mlflow")
        self.uri = value
        self.client: Any = None
        self.run_id: str | None = None

    def start(self, run: RunStart) -> None:
        import logging

        for quiet in ("mlflow.store.db.utils", "alembic"):  # the new store's schema notes
            logging.getLogger(quiet).setLevel(logging.WARNING)
        kept = run.run_dir / MLFLOW_RUN
        before: dict[str, Any] = {}
        if run.first_round > 1 and kept.is_file():
            try:
                before = json.loads(kept.read_text())
            except (OSError, ValueError):
                before = {}
            if not isinstance(before, dict):
                before = {}
        uri = self.uri or os.environ.get("MLFLOW_TRACKING_URI") or None
        recorded = before.get("tracking_uri")
        if uri is None and isinstance(recorded, str) and recorded:
            uri = recorded  # a resume goes on in its store (RUN/mlruns/ for older runs)
        if uri is None:
            uri = mlflow_uri(run.run_dir)
        folder = _sqlite_folder(uri)
        if folder is None:
            self._start(run, uri, before, artifacts=None)
            return
        with _locked(folder):  # the runs of a sweep start at once: one creates the store
            self._start(run, uri, before, (folder.absolute() / "artifacts").as_uri())

    def _start(
        self, run: RunStart, uri: str, before: Mapping[str, Any], artifacts: str | None
    ) -> None:
        from mlflow.tracking import MlflowClient

        self.client = client = MlflowClient(tracking_uri=uri)
        if before.get("tracking_uri") == uri and isinstance(before.get("run_id"), str):
            self.run_id = before["run_id"]
            client.update_run(self.run_id, status="RUNNING")
            return
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "protofed"
        found = client.get_experiment_by_name(experiment)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            experiment_id = client.create_experiment(experiment, artifact_location=artifacts)
        created = client.create_run(
            experiment_id,
            run_name=run.run_dir.name,
            tags={"protofed.run_dir": str(run.run_dir)},
        )
        self.run_id = created.info.run_id
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in flat_params(run.config).items()]
        for i in range(0, len(params), 100):  # MLflow takes 100 params a batch
            client.log_batch(self.run_id, params=params[i : i + 100])
        from protofed.core.files import atomic_write_text

        atomic_write_text(
            run.run_dir / MLFLOW_RUN,
            json.dumps({"tracking_uri": uri, "run_id": self.run_id}, indent=2) + "\n",
        )

    def _log(self, values: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        if self.client is None or self.run_id is None:
            return
        stamp = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(k), float(v), stamp, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):  # MLflow takes 1000 metrics a batch
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def log_round(self, scalars: Mapping[str, float], step: int) -> None:
        self._log(scalars, step)

    def close(self, summary: Summary | None) -> None:
        if self.client is None or self.run_id is None:
            return
        if summary is not None:
            self._log(summary_scalars(summary), summary.rounds)
            status = "FINISHED" if summary.status == "complete" else "FAILED"
        else:
            status = "KILLED"  # interrupted: a resume goes on in the same MLflow run
        self.client.set_terminated(self.run_id, status=status)
        self.client = None


WANDB_RUN = "wandb_run.json"
"""In the run directory: the Weights & Biases run it logs to (project, id, mode), so a
resumed run goes on logging into the same W&B run."""


def wandb_mode() -> str:
    """$WANDB_MODE when set; else "online" where an API key is configured ($WANDB_API_KEY,
    or `wandb login`'s entry in ~/.netrc for $WANDB_BASE_URL), else "offline": a machine
    that was never logged in writes an offline run and reaches no network."""
    mode = os.environ.get("WANDB_MODE", "").strip()
    if mode:
        return mode
    if os.environ.get("WANDB_API_KEY", "").strip():
        return "online"
    try:
        from wandb.sdk.lib.wbauth.wbnetrc import read_netrc_auth

        host = os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
        return "online" if read_netrc_auth(host=host) else "offline"
    except Exception:  # another wandb version, an unreadable .netrc: stay offline
        return "offline"


@register_logger("wandb")
class WandbLogger:
    """`--log wandb`: a Weights & Biases run in project $WANDB_PROJECT, else "protofed";
    `--log wandb=PROJECT`: in PROJECT. Offline (`wandb_mode`) unless $WANDB_MODE says
    otherwise or an API key is configured; its files go to RUN/wandb/ ($WANDB_DIR/wandb/
    where that is set). The W&B run is named after the run directory.

    It gets the config (nested, as config.yaml), every round's scalars under TensorBoard's
    tags (step = the round) and, at the end, the summary's reported scores in the run's
    summary (`summary_scalars`: `final/personalization/f1`, ...). No console capture, no
    system metrics, no git or code snapshot. A resumed run logs into the same W&B run id
    (RUN/wandb_run.json, resume="allow")."""

    name = "wandb"

    def __init__(self, value: str | None = None) -> None:
        if value is not None and not value:
            raise ConfigError("--log wandb=PROJECT: the project is empty")
        require_package("wandb", "wandb")
        self.project = value
        self.run: Any = None

    def start(self, run: RunStart) -> None:
        import wandb

        kept = run.run_dir / WANDB_RUN
        project = self.project or os.environ.get("WANDB_PROJECT") or "protofed"
        run_id: str | None = None
        if run.first_round > 1 and kept.is_file():
            try:
                before = json.loads(kept.read_text())
            except (OSError, ValueError):
                before = {}
            if isinstance(before, dict) and before.get("project") == project:
                found = before.get("run_id")
                run_id = found if isinstance(found, str) and found else None
        if run_id is None:
            alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"  # as wandb's own ids
            run_id = "".join(secrets.choice(alphabet) for _ in range(8))
        wanted = {
            "console": "off",  # the progress bar and log lines stay protofed's
            "silent": True,
            "disable_git": True,
            "save_code": False,
            "x_disable_stats": True,  # no system metrics sampled
            "x_disable_meta": True,
            "x_disable_machine_info": True,
            "x_save_requirements": False,
        }
        known = getattr(wandb.Settings, "model_fields", None)
        settings = wandb.Settings(**{k: v for k, v in wanted.items() if not known or k in known})
        mode: Any = wandb_mode()  # a str: wandb's Literal accepts what WANDB_MODE may say
        folder = os.environ.get("WANDB_DIR") or str(run.run_dir)
        self.run = wandb.init(
            project=project,
            dir=folder,
            mode=mode,
            name=run.run_dir.name,
            id=run_id,
            resume="allow",
            config=run.config,
            settings=settings,
        )
        from protofed.core.files import atomic_write_text

        record = {"project": project, "run_id": run_id, "mode": mode}
        atomic_write_text(kept, json.dumps(record, indent=2) + "\n")

    def log_round(self, scalars: Mapping[str, float], step: int) -> None:
        if self.run is not None:
            self.run.log(dict(scalars), step=step)

    def close(self, summary: Summary | None) -> None:
        if self.run is None:
            return
        run, self.run = self.run, None
        if summary is not None:
            run.summary.update(summary_scalars(summary))
        complete = summary is not None and summary.status == "complete"
        run.finish(exit_code=0 if complete else 1)


class Tracking:
    """Everything that consumes a round's record as the run goes; call it as `on_round`.

    `run_dir`: the run directory; `total`: the run's rounds; `done`: the rounds already run
    (a resume); `log`: `log_kinds(...)`; `lines`: where plain lines go (None: nowhere);
    `config`: the run's config (nested, as config.yaml) for the loggers that record it.
    `finish(summary)` hands the loggers the run's summary before `close`.
    """

    def __init__(
        self,
        run_dir: str | Path,
        total: int,
        done: int = 0,
        log: Sequence[str] = (),
        lines: TextIO | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.total = total
        self.lines = lines
        self.clock = RoundClock()
        self.loss: float | None = None
        self.pers_f1: float | None = None
        self.epsilon: float | None = None  # privacy spent so far (privacy.enabled)
        self.seeded = False  # privacy.noise=seeded: the epsilon is no guarantee
        self.summary: Summary | None = None
        self.loggers = build_loggers(log)
        start = RunStart(Path(run_dir).absolute(), total, done + 1, dict(config or {}))
        started: list[Logger] = []
        try:
            for logger in self.loggers:
                logger.start(start)
                started.append(logger)
        except BaseException:
            for logger in started:
                logger.close(None)
            raise

    @property
    def tensorboard(self) -> TensorBoardLog | None:
        """The TensorBoard writer, where `--log tensorboard` is on."""
        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):
                return logger.log
        return None

    def __call__(self, server_round: int, info: RoundInfo, record: RoundRecord | None) -> None:
        round_s = self.clock.tick()
        self.loss = _number(info.train_loss)
        self.epsilon = _number(info.server.get("epsilon"))
        self.seeded = bool(info.server.get(SEEDED_METRIC))
        if record is not None:
            self.pers_f1 = _number(record.personalization.f1)
        if self.loggers:
            values = scalars(info, record, round_s)
            for logger in self.loggers:
                logger.log_round(values, server_round)
        if self.lines is not None and record is not None:
            try:
                print(plain_line(server_round, self.total, record, self.clock), file=self.lines)
                self.lines.flush()
            except (OSError, ValueError):  # the pipe's reader went away: the run goes on
                self.lines = None

    @property
    def status(self) -> str:
        """The latest train loss and personalization F1, for a progress bar."""
        loss = "-" if self.loss is None else f"{self.loss:.4f}"
        spent = "" if self.epsilon is None else f"  {epsilon_text(self.epsilon, self.seeded)}"
        return f"loss {loss}  pers F1 {_pct(self.pers_f1)}{spent}"

    def finish(self, summary: Summary | None) -> None:
        """The run ended with `summary` (None: no summary, e.g. it was interrupted)."""
        self.summary = summary

    def close(self) -> None:
        loggers, self.loggers = self.loggers, []
        for logger in loggers:
            logger.close(self.summary)

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
