"""Sweeps: a grid of experiments times seeds, run side by side, resumable (docs/sweeps.md).

    spec = load_spec("experiments/sweeps/fedsub_claims_cpu.yaml")
    for run in spec.expand():          # every experiment, validated, before anything runs
        print(run.name, run.changes)
    result = run_sweep(spec, "runs/fedsub_claims", workers=2)

Each run is a child process (`python -m protofed run NAME.yaml --out DIR/NAME -q`, or
`protofed run --resume DIR/NAME` where a killed run left a checkpoint), so a run the sweep
starts is exactly the run the CLI makes, and a crash of one run never takes the others down.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import hashlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from protofed import plugins
from protofed.config import (
    EXECUTION_KEYS,
    ExperimentConfig,
    apply_overrides,
    build_config,
    flatten,
    load_raw,
    set_key,
)
from protofed.core.files import ATOMIC_NAME_MAX, NAME_MAX, atomic_write_text, writing
from protofed.errors import ConfigError
from protofed.runs import CHECKPOINT, CONFIG, LOCK, SUMMARY, RunDir, protofed_version

SWEEP_FILE = "sweep.yaml"
EXIT_OK, EXIT_FAILED, EXIT_USER, EXIT_DIVERGED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
_SAFE = re.compile(r"[^A-Za-z0-9._=+,-]+")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


# the spec --------------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


Grid = dict[str, list[Any]]


class Variant(_Strict):
    """One named entry of `runs:`: its own overrides, and optionally its own config, grid and
    seeds (each replaces the top-level one for this entry)."""

    name: str = Field(min_length=1)
    config: str | None = None
    folder: str | None = None  # this entry's folder template (else the top-level one)
    set: dict[str, Any] = Field(default_factory=dict)
    grid: Grid | None = None
    seeds: list[int] | None = Field(None, min_length=1)


class SweepRun(NamedTuple):
    """One expanded experiment: its folder name, its validated config, and what this run
    sets that the base does not (variant, grid values, seed)."""

    name: str
    config: ExperimentConfig
    changes: dict[str, Any]


class SweepSpec(_Strict):
    """A sweep: `base` on top of `config`, times `grid`, times `seeds` (times `runs`)."""

    config: str | None = None
    base: dict[str, Any] = Field(default_factory=dict)
    grid: Grid = Field(default_factory=dict)
    seeds: list[int] | None = Field(None, min_length=1)
    folder: str | None = None  # the run folders' name template ({dotted.key}, {seed}, {run})
    runs: list[Variant] | None = Field(None, min_length=1)
    overrides: list[str] = Field(default_factory=list)  # `-s key=value`, applied last
    _source: Path | None = PrivateAttr(None)  # the spec file (relative paths start there)

    @property
    def source(self) -> str:
        return str(self._source) if self._source is not None else "sweep spec"

    def with_overrides(self, overrides: list[str]) -> SweepSpec:
        """The spec with `-s key=value` overrides added (they win over everything else)."""
        out = self.model_copy(update={"overrides": [*self.overrides, *overrides]})
        out._source = self._source
        return out

    def resolve_path(self, path: str) -> Path:
        """A `config:` path: relative to the spec file's folder, else to the current folder."""
        p = Path(path).expanduser()
        if not p.is_absolute() and self._source is not None:
            beside = self._source.parent / p
            if beside.is_file() or not p.is_file():
                p = beside
        if not p.is_file():
            raise ConfigError(
                f"{self.source}: config file not found: {path} (relative paths are read from "
                "the spec's folder, then the current folder)"
            )
        return p.absolute()

    def variants(self) -> list[Variant]:
        return self.runs or [Variant(name="-")]

    def expand(self) -> list[SweepRun]:
        """Every run, named and validated (config, algorithm, model, data set names; no data
        is read); the first problem is a one-line ConfigError naming the run and the key."""
        keys = {k for v in self.variants() for k in (v.grid if v.grid is not None else self.grid)}
        for item in self.overrides:
            key = item.split("=", 1)[0].strip()
            if key in keys or key == "seed" and self._seeds_given():
                raise ConfigError(f"-s {key}: the sweep varies this key; change the spec instead")
        overridden = flatten(apply_overrides({}, list(self.overrides)), keep_empty=False)
        ranked: list[tuple[int, SweepRun]] = []  # every run's first seed first, then as listed
        for variant in self.variants():
            grid = variant.grid if variant.grid is not None else self.grid
            seeds = variant.seeds if variant.seeds is not None else self.seeds
            _check_grid(grid, self.source)
            raw = load_raw(self.resolve_path(c) if (c := variant.config or self.config) else None)
            with _naming(self.source, "base"):
                for key, value in flatten(self.base, keep_empty=False).items():
                    set_key(raw, key, value)
            combos = list(itertools.product(*grid.values())) or [()]
            for (rank, seed), combo in itertools.product(enumerate(seeds or [None]), combos):
                changes: dict[str, Any] = dict(variant.set)  # like -s: a mapping replaces
                changes.update(zip(grid, combo, strict=True))
                if seed is not None:
                    changes["seed"] = seed
                label = self._label(variant, changes)
                run_raw = copy.deepcopy(raw)
                with _naming(self.source, f"run {label}"):
                    for key, value in changes.items():
                        set_key(run_raw, key, value)
                    apply_overrides(run_raw, self.overrides)
                    cfg = build_config(run_raw)
                    check_config(cfg)
                    name = self._name(variant, grid, combo, seed, cfg)
                shown = {k: overridden.get(k, v) for k, v in changes.items()}  # what it runs
                ranked.append((rank, SweepRun(name, cfg, shown)))
        runs = [run for _, run in sorted(ranked, key=lambda item: item[0])]  # stable
        _check_names(runs, self.source)
        return runs

    def _seeds_given(self) -> bool:
        return self.seeds is not None or any(v.seeds is not None for v in self.variants())

    def _label(self, variant: Variant, changes: Mapping[str, Any]) -> str:
        head = [] if self.runs is None else [variant.name]
        return " ".join([*head, describe(changes)]).strip() or "(base)"

    def _name(
        self,
        variant: Variant,
        grid: Grid,
        combo: tuple[Any, ...],
        seed: int | None,
        cfg: ExperimentConfig,
    ) -> str:
        """From the `folder` template, else the variant's name, the grid values and `s<seed>`."""
        template = variant.folder if variant.folder is not None else self.folder
        if template is not None:
            flat = flatten(cfg.to_dict(), keep_empty=False)

            def value(match: re.Match[str]) -> str:
                key = match.group(1)
                if key == "run":
                    return "/".join(_safe(part) for part in variant.name.split("/"))
                if key not in flat:
                    raise ConfigError(f"folder: '{{{key}}}' is neither a config key nor {{run}}")
                return _safe(_text(flat[key]))

            name = _PLACEHOLDER.sub(value, template)
        else:
            parts = [] if self.runs is None else ["/".join(map(_safe, variant.name.split("/")))]
            for key, v in zip(grid, combo, strict=True):
                text = _text(v)
                parts.append(
                    _safe(text if isinstance(v, str) else f"{key.rsplit('.', 1)[-1]}={text}")
                )
            if seed is not None:
                parts.append(f"s{seed}")
            name = "_".join(parts) or "run"
        segments = name.split("/")
        if any(s in ("", ".", "..") or s.startswith(".") for s in segments) or name in (
            "sweep",
            SWEEP_FILE,
        ):
            raise ConfigError(
                f"folder '{name}' is not a usable folder name (a part is empty, starts with "
                "a dot, or is reserved)"
            )
        # the last part has its config written beside it (atomically: <part>.yaml)
        limits = [NAME_MAX] * (len(segments) - 1) + [ATOMIC_NAME_MAX - len(".yaml")]
        for segment, limit in zip(segments, limits, strict=True):
            if len(segment.encode()) > limit:
                raise ConfigError(
                    f"folder '{segment[:40]}...' is {len(segment.encode())} bytes, over the "
                    f"{limit} a file name can have here: give `folder:` a shorter template"
                )
        return name


def _text(value: Any) -> str:
    """A value as a user writes it (YAML flow style: true, 0.01, [16, 8])."""
    if isinstance(value, str):
        return value
    return (
        yaml.safe_dump(value, default_flow_style=True, width=10**6)
        .strip()
        .removesuffix("...")
        .strip()
    )


def _safe(text: str) -> str:
    """A folder-name part: what is not a letter, digit or ._=+,- becomes one '-'."""
    return _SAFE.sub("-", text).strip("-") or "-"


@contextlib.contextmanager
def _naming(source: str, where: str) -> Iterator[None]:
    try:
        yield
    except ConfigError as exc:
        raise ConfigError(f"{source}: {where}: {exc}") from None


def _check_grid(grid: Any, source: str) -> None:
    for key, values in grid.items():
        if key == "seed":
            raise ConfigError(f"{source}: grid 'seed': list the seeds under `seeds:`")
        if key in EXECUTION_KEYS:
            raise ConfigError(
                f"{source}: grid '{key}' is an execution key (it changes how fast, not what a "
                "run computes): set it for the whole sweep with -s"
            )
        if not values:
            raise ConfigError(f"{source}: grid '{key}' is empty (it would make no runs)")
        seen = [json.dumps(v, sort_keys=True, default=str) for v in values]
        if len(set(seen)) < len(seen):
            raise ConfigError(f"{source}: grid '{key}' lists a value twice")


def _check_names(runs: list[SweepRun], source: str) -> None:
    """Two runs in one folder, or one run's folder inside another's, are spec errors."""
    by_name: dict[str, SweepRun] = {}
    for run in runs:
        other = by_name.get(run.name)
        if other is not None:
            diff = differing_keys([other, run])
            what = (
                f"they differ in {', '.join(sorted(diff[0]))}"
                if diff[0]
                else "their configs are the same"
            )
            raise ConfigError(
                f"{source}: two runs are named '{run.name}' ({what}): give `folder:` a "
                "placeholder that tells them apart, or drop the duplicate"
            )
        by_name[run.name] = run
    for name in by_name:
        for i in range(1, name.count("/") + 1):
            parent = name.rsplit("/", i)[0]
            if parent in by_name:
                raise ConfigError(
                    f"{source}: run '{parent}' would hold run '{name}' inside its folder"
                )


def check_config(cfg: ExperimentConfig) -> None:
    """What can be checked without data: the algorithm and its hyperparameters, the model and
    the data set names (runtime.prepare checks the rest when the run starts)."""
    from protofed.algorithms import parse_params
    from protofed.data import load_plugins as datasets
    from protofed.models import ALP_MODELS
    from protofed.models import load_plugins as models

    parse_params(cfg.algorithm.name, cfg.algorithm.hyperparameters())
    if cfg.model.name not in models():
        raise ConfigError(f"unknown model.name '{cfg.model.name}' (known: {', '.join(models())})")
    if cfg.model.alp.enabled and cfg.model.name not in ALP_MODELS:
        raise ConfigError(f"model.alp.enabled=true needs {' or '.join(ALP_MODELS)}")
    if cfg.data.name not in datasets():
        raise ConfigError(f"unknown data.name '{cfg.data.name}' (known: {', '.join(datasets())})")


def differing_keys(runs: list[SweepRun]) -> list[dict[str, Any]]:
    """Per run, the resolved config keys whose values differ between the runs."""
    flats = [flatten(r.config.to_dict(), keep_empty=False) for r in runs]
    keys = sorted({k for f in flats for k in f})
    varying = [k for k in keys if len({json.dumps(f.get(k), sort_keys=True) for f in flats}) > 1]
    return [{k: f[k] for k in varying if k in f} for f in flats]


def describe(changes: Mapping[str, Any]) -> str:
    """`key=value ...` as a user writes it on the command line (YAML values)."""
    return " ".join(f"{k}={_text(v)}" for k, v in changes.items())


def load_spec(path: str | Path) -> SweepSpec:
    """Read and check a sweep spec (YAML); a problem is a one-line ConfigError naming the key."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"sweep spec not found: {p}")
    raw = load_raw(p)
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{p}: {_spec_error(err)}") from None
    spec._source = p.absolute()
    return spec


def _spec_error(err: ValidationError) -> str:
    first = err.errors()[0]
    key = ".".join(str(part) for part in first["loc"]) or "spec"
    if first["type"] == "extra_forbidden":
        model = Variant if first["loc"][0] == "runs" else SweepSpec
        return f"unknown key '{key}' (valid: {', '.join(model.model_fields)})"
    if "grid" in first["loc"] and first["type"] in ("list_type", "dict_type"):
        what = "a mapping of keys to lists" if first["type"] == "dict_type" else "a list of values"
        where = "grid" if first["type"] == "dict_type" else f"grid '{first['loc'][-1]}'"
        return f"{where}: {what} is expected (got {first.get('input')!r})"
    got = first.get("input")
    shown = "" if isinstance(got, dict) else f" (got {got!r})"
    return f"invalid value for '{key}': {first['msg']}{shown}"


def check_machine(runs: list[SweepRun], data_dir: str | Path | None, source: str) -> None:
    """What this machine must have before the first run starts: the devices, and the files of
    every data set fetched from a public source (else each run would fail the same way)."""
    from protofed.data import catalog, data_root
    from protofed.runtime.prepare import resolve_device

    devices: set[str] = set()
    datasets: set[tuple[str, Path]] = set()
    for run in runs:
        data = run.config.data
        if data_dir is not None:
            data = data.model_copy(update={"dir": str(Path(data_dir).expanduser().absolute())})
        root = data_root(data)
        with _naming(source, f"run {run.name}"):
            if run.config.train.device not in devices:
                resolve_device(run.config.train.device)
                devices.add(run.config.train.device)
            fetched = data.name in catalog.SOURCES or data.name in catalog.COMPOSITE
            if fetched and (data.name, root) not in datasets:
                if catalog.status(data.name, root)[0] == "no":
                    raise ConfigError(
                        f"data set '{data.name}' is not in {root} (fetch it with protofed "
                        f"data fetch {data.name}, or give --data-dir or PROTOFED_DATA)"
                    )
                datasets.add((data.name, root))


def select_runs(runs: list[SweepRun], only: list[str] | None) -> list[SweepRun]:
    """The runs whose names match one of the glob patterns `only` (all of them if None)."""
    if not only:
        return runs
    chosen = [r for r in runs if any(fnmatch.fnmatchcase(r.name, p) for p in only)]
    if not chosen:
        raise ConfigError(f"--only {' '.join(only)} matches no run of this sweep")
    return chosen


# the sweep folder ------------------------------------------------------------------------
def config_digest(cfg: ExperimentConfig | Mapping[str, Any]) -> str:
    """What makes two runs the same experiment: the resolved config, its execution keys left
    out (config.EXECUTION_KEYS: the same data in another folder, more workers). A natural
    partition over every group (data.clients and data.num_clients unset, or `clients: all`,
    which a run records with the count it built) counts as `clients: all` whatever
    data.num_clients says."""
    data = cfg.to_dict() if isinstance(cfg, ExperimentConfig) else copy.deepcopy(dict(cfg))
    for key in EXECUTION_KEYS:
        section_name, name = key.split(".", 1)
        if isinstance(data.get(section_name), dict):
            data[section_name].pop(name, None)
    if isinstance(data.get("data"), dict):
        section = data["data"]
        if section.get("partition") == "natural" and (
            section.get("clients") == "all"
            or (section.get("clients") is None and section.get("num_clients") is None)
        ):
            section["clients"] = "all"
            section.pop("num_clients", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _record(spec: SweepSpec, runs: list[SweepRun]) -> dict[str, Any]:
    """sweep.yaml: the spec as resolved (config paths absolute, `-s` included) and, per run,
    what it sets and the digest of its config."""
    resolved = spec.model_dump(exclude_none=True)
    for entry in (resolved, *resolved.get("runs", [])):
        if "config" in entry:
            entry["config"] = str(spec.resolve_path(entry["config"]))
    return {
        "spec": spec.source,
        "protofed": protofed_version(),
        "resolved": resolved,
        "runs": {
            r.name: {"changes": r.changes, "config_sha256": config_digest(r.config)} for r in runs
        },
    }


def _same_as_written(out: Path, name: str, digest: str) -> bool:
    """Whether a run whose recorded digest differs is still the same experiment: a newer
    protofed adds config keys, so the digest of an unchanged spec moves. The run's config as
    the sweep wrote it (RUN.yaml), read by this version (added keys take their defaults),
    decides; a run the folder holds nothing of cannot mix two specs."""
    written = out / f"{name}.yaml"
    if not written.is_file():
        return not (out / name).exists()
    try:
        return config_digest(build_config(yaml.safe_load(written.read_text()))) == digest
    except (ConfigError, OSError, yaml.YAMLError, TypeError):
        return False


def check_folder(out: Path, spec: SweepSpec, runs: list[SweepRun], force: bool) -> None:
    """Refuse a folder made from another spec, or one that is not a sweep's, unless `force`."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    record = out / SWEEP_FILE
    if not record.is_file():
        if out.is_dir() and any(out.iterdir()) and not force:
            raise ConfigError(
                f"{out} is not empty and holds no {SWEEP_FILE}: not a sweep folder "
                "(choose another --out, or --force to run the sweep in it)"
            )
        return
    try:
        old = yaml.safe_load(record.read_text()) or {}
        old_runs = {k: v["config_sha256"] for k, v in old["runs"].items()}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        raise ConfigError(f"{record}: not a sweep record (remove it, or use --force)") from None
    new_runs = {r.name: config_digest(r.config) for r in runs}
    if old_runs == new_runs or force:
        return
    added = sorted(set(new_runs) - set(old_runs))
    removed = sorted(set(old_runs) - set(new_runs))
    changed = sorted(
        k
        for k in set(new_runs) & set(old_runs)
        if new_runs[k] != old_runs[k] and not _same_as_written(out, k, new_runs[k])
    )
    if not (changed or added or removed):
        return
    what = [
        f"{word}: {', '.join(x[:3])}{', ...' if len(x) > 3 else ''}"
        for x, word in ((changed, "changed"), (added, "added"), (removed, "removed"))
        if x
    ]
    raise ConfigError(
        f"{out} was made from a different sweep spec ({'; '.join(what)}): use another "
        "--out, or --force to go on with this spec (runs whose config is unchanged are kept, "
        "changed ones start again)"
    )


@dataclass
class RunState:
    """What is on disk for one run, and so what the sweep does with it."""

    action: str  # skip (complete), resume, start, restart (start over what is there), busy, changed
    detail: str = ""


def run_state(path: Path, cfg: ExperimentConfig, force: bool = False) -> RunState:
    """complete -> skip; a checkpoint of the same config -> resume; held by another process
    -> busy; a run of another config -> changed (restart with `force`); else start (afresh
    over a folder left without a checkpoint)."""
    if (path / LOCK).exists():
        probe = RunDir(path)
        try:
            probe.lock()
        except ConfigError as exc:
            return RunState("busy", str(exc))
        finally:
            probe.unlock()
    if not (path / CONFIG).is_file():
        others = [p for p in path.iterdir() if p.name != LOCK] if path.is_dir() else []
        return RunState("restart" if others else "start")
    try:  # through build_config: keys a newer protofed added take their defaults
        same = config_digest(build_config(RunDir(path).config())) == config_digest(cfg)
    except ConfigError:
        same = False
    if not same:
        if force:
            return RunState("restart", "its config differs from the spec's")
        return RunState("changed", "its config differs from the spec's (--force runs it again)")
    if (path / SUMMARY).is_file():
        return RunState("skip", "complete")
    if (path / CHECKPOINT).is_file():
        return RunState("resume")
    return RunState("restart", "killed before its first checkpoint")


# running ---------------------------------------------------------------------------------
@dataclass
class RunOutcome:
    name: str
    # complete, skipped, diverged, failed, busy, changed, interrupted, stopped (time limit)
    status: str
    seconds: float | None = None
    pers_f1: float | None = None
    returncode: int | None = None
    log: Path | None = None
    detail: str = ""


@dataclass
class SweepResult:
    outcomes: list[RunOutcome] = field(default_factory=list)
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        """130 interrupted; 1 a run failed, was stopped at the time limit, is held by another
        process or holds another config; 3 a run diverged; else 0."""
        statuses = {o.status for o in self.outcomes}
        if self.interrupted:
            return EXIT_INTERRUPTED
        if statuses & {"failed", "busy", "changed", "interrupted", "stopped"}:
            return EXIT_FAILED
        return EXIT_DIVERGED if "diverged" in statuses else EXIT_OK


def _summary(path: Path) -> tuple[str, float | None, float | None]:
    """status, final personalization F1 and total seconds from summary.json."""
    try:
        s = json.loads((path / SUMMARY).read_text())
    except (OSError, ValueError):
        return "failed", None, None
    f1 = ((s.get("final") or {}).get("personalization") or {}).get("f1")
    return s.get("status", "complete"), f1, (s.get("time") or {}).get("total_s")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """The child gets SIGINT (it checkpoints and stops) if the sweep dies, even by SIGKILL."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG


@dataclass
class _Child:
    run: SweepRun
    proc: subprocess.Popen[bytes]
    started: float
    log: Path
    signalled: int = 0
    timed_out: bool = False


def run_sweep(
    spec: SweepSpec,
    out: str | Path,
    workers: int = 1,
    *,
    force: bool = False,
    data_dir: str | Path | None = None,
    time_limit: float | None = None,
    only: list[str] | None = None,
    on_start: Callable[[str, str], None] | None = None,
    on_done: Callable[[RunOutcome], None] | None = None,
    python: str = sys.executable,
    log: str | Sequence[str] | None = None,
) -> SweepResult:
    """Run every run of `spec` under `out`, `workers` at a time, skipping finished ones and
    resuming killed ones. SIGINT/SIGTERM stop the children cleanly (they checkpoint); a second
    one kills them. `time_limit`: seconds a run may take in this invocation before it is
    stopped the same way (status "stopped"; the next invocation resumes it). `only`: glob
    patterns of run names to run now (the folder still belongs to the whole spec). Every
    config is validated before anything is written or started. `log`: each run's `--log`
    (`protofed.run(log=...)`); "mlflow" puts every run in one store, `out`/mlruns/
    (`tracking.sweep_logs`)."""
    from protofed.tracking import log_kinds, sweep_logs

    logs = sweep_logs(log_kinds(log), Path(out))
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1 (got {workers})")
    if time_limit is not None and not time_limit > 0:  # also refuses nan
        raise ConfigError(f"--time-limit must be positive (got {time_limit})")
    out = Path(out)
    runs, states = _prepare(spec, out, force, data_dir, only)
    scheduler = SweepScheduler(
        out,
        states,
        workers,
        data_dir=data_dir,
        time_limit=time_limit,
        on_start=on_start,
        on_done=on_done,
        python=python,
        log=logs,
    )
    return scheduler.run(runs)


def _prepare(
    spec: SweepSpec,
    out: Path,
    force: bool,
    data_dir: str | Path | None,
    only: list[str] | None,
) -> tuple[list[SweepRun], dict[str, RunState]]:
    """Validate every run, check the folder and the machine, and write the sweep's record
    and each selected run's config: (the runs to run now, what is on disk for each)."""
    every = spec.expand()
    for r in every:
        plugins.require_visible_elsewhere(r.config, "a sweep's runs")
    check_folder(out, spec, every, force)
    runs = select_runs(every, only)
    check_machine(runs, data_dir, spec.source)
    states = {r.name: run_state(out / r.name, r.config, force) for r in runs}
    with writing(out):
        out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        out / SWEEP_FILE, _header(spec) + yaml.safe_dump(_record(spec, every), sort_keys=False)
    )
    for r in runs:
        atomic_write_text(
            out / f"{r.name}.yaml", yaml.safe_dump(r.config.to_dict(), sort_keys=False)
        )
    return runs, states


@dataclass
class SweepScheduler:
    """The worker pool of a sweep: each run a child process, `workers` at a time.

    Runs already complete, held by another process or holding another config are reported
    without starting (`pending`); the rest are started or resumed (`launch`), stopped with
    SIGINT at the time limit or on the sweep's first SIGINT/SIGTERM (SIGKILL on the second),
    and reported as they end (`reap`). Outcomes keep the order of the runs.
    """

    out: Path
    states: dict[str, RunState]  # what is on disk for each run (`run_state`)
    workers: int
    data_dir: str | Path | None = None
    time_limit: float | None = None
    on_start: Callable[[str, str], None] | None = None
    on_done: Callable[[RunOutcome], None] | None = None
    python: str = sys.executable
    log: tuple[str, ...] = ()  # each run's --log (`tracking.log_kinds`)
    result: SweepResult = field(default_factory=SweepResult, init=False)
    queue: list[SweepRun] = field(default_factory=list, init=False)  # not started yet, in order
    running: list[_Child] = field(default_factory=list, init=False)
    signals: int = field(default=0, init=False)  # SIGINT/SIGTERM the sweep received

    def run(self, runs: list[SweepRun]) -> SweepResult:
        """Every run's outcome: until all have ended, or the running ones after a signal."""
        self.queue = self.pending(runs)
        env = self.child_env()  # the same for every child
        with _signals(self.interrupt):
            while (self.queue and not self.signals) or self.running:
                while self.queue and not self.signals and len(self.running) < self.workers:
                    r = self.queue.pop(0)
                    if (why := self.taken(r)) is not None:
                        log = self.out / f"{r.name}.log"
                        self.report(RunOutcome(r.name, "busy", log=log, detail=why))
                        continue
                    self.launch(r, env)
                time.sleep(0.1)
                self.stop_overdue()
                self.reap()
        self.result.interrupted = bool(self.signals)
        order = {r.name: i for i, r in enumerate(runs)}
        self.result.outcomes.sort(key=lambda o: order[o.name])
        return self.result

    def pending(self, runs: list[SweepRun]) -> list[SweepRun]:
        """The runs to start or resume; the others are reported now, without running."""
        todo: list[SweepRun] = []
        for r in runs:
            state = self.states[r.name]
            if state.action not in ("skip", "busy", "changed"):
                todo.append(r)
                continue
            status, f1 = state.action, None
            if state.action == "skip":  # a diverged run stays diverged: not run again
                status, f1, _ = _summary(self.out / r.name)
                status = "skipped" if status == "complete" else status
            detail = "" if state.action == "skip" else state.detail
            log = self.out / f"{r.name}.log"
            self.report(RunOutcome(r.name, status, None, f1, log=log, detail=detail))
        return todo

    def taken(self, r: SweepRun) -> str | None:
        """Why `r` must not start now, though it was to when the sweep looked: another
        sweep on the same folder (`--only`) has started it since (its lock is held, or a
        run new then has its config.yaml now). None: launch it."""
        path = self.out / r.name
        if (path / LOCK).exists():
            probe = RunDir(path)
            try:
                probe.lock()
            except ConfigError as exc:
                return str(exc)
            finally:
                probe.unlock()
        if self.states[r.name].action == "start" and (path / CONFIG).is_file():
            return "started by another process since this sweep looked at it"
        return None

    def child_env(self) -> dict[str, str]:
        """The children's environment: the CPU's threads shared among the workers."""
        env = dict(os.environ)
        if self.workers > 1 and "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // self.workers))
        return env

    def command(self, r: SweepRun) -> list[str]:
        """The CLI call that runs `r`: resumed from its checkpoint, or from its config."""
        path = self.out / r.name
        action = self.states[r.name].action
        cmd = [self.python, "-m", "protofed", "run"]
        if action == "resume":
            cmd += ["--resume", str(path)]
        else:
            cmd += [str(self.out / f"{r.name}.yaml"), "--out", str(path)]
            if action == "restart":
                cmd.append("--force")
        if self.data_dir is not None:
            cmd += ["--data-dir", str(self.data_dir)]
        for kind in self.log:
            cmd += ["--log", kind]
        cmd.append("-q")
        return cmd

    def launch(self, r: SweepRun, env: dict[str, str]) -> None:
        """Start `r`'s child, its output appended to `NAME.log` under a line saying how."""
        cmd, log = self.command(r), self.out / f"{r.name}.log"
        action = self.states[r.name].action
        with writing(log):
            log.parent.mkdir(parents=True, exist_ok=True)
            handle = open(log, "a")  # noqa: SIM115 - closed below, once the child has a copy
        with handle:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            handle.write(f"# {stamp} protofed sweep ({action}): {' '.join(cmd)}\n")
            handle.flush()
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # Ctrl-C reaches the sweep only; it tells each child once
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        self.running.append(_Child(r, proc, time.monotonic(), log))
        if self.on_start:
            self.on_start(r.name, action)

    def interrupt(self, signum: int, frame: object) -> None:
        """SIGINT/SIGTERM: SIGINT to every running child the first time, SIGKILL after."""
        self.signals += 1
        for child in self.running:
            if child.proc.poll() is None:
                sig = signal.SIGINT if self.signals == 1 else signal.SIGKILL
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(sig)
                child.signalled = self.signals

    def stop_overdue(self) -> None:
        """SIGINT to each child past the time limit, or launched as a signal came."""
        for child in self.running:
            late = (
                self.time_limit is not None and time.monotonic() - child.started > self.time_limit
            )
            missed = self.signals > 0  # a child launched as the signal came
            if (late or missed) and not child.signalled and child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGINT)
                child.signalled, child.timed_out = 1, not missed

    def reap(self) -> None:
        """Report every child that has ended."""
        for child in [c for c in self.running if c.proc.poll() is not None]:
            self.running.remove(child)
            self.report(_finished(child, self.out))

    def report(self, outcome: RunOutcome) -> None:
        self.result.outcomes.append(outcome)
        if self.on_done:
            self.on_done(outcome)


def _finished(child: _Child, out: Path) -> RunOutcome:
    rc = child.proc.returncode
    seconds = time.monotonic() - child.started
    path = out / child.run.name
    if (path / SUMMARY).is_file() and rc in (0, EXIT_DIVERGED):
        status, f1, _ = _summary(path)
        return RunOutcome(child.run.name, status, seconds, f1, rc, child.log)
    if child.timed_out:
        status, detail = "stopped", "time limit; run the sweep again to resume it"
    elif child.signalled:
        status, detail = "interrupted", ""
    else:
        status, detail = "failed", _last_line(child.log)
    return RunOutcome(child.run.name, status, seconds, None, rc, child.log, detail)


def _last_line(log: Path) -> str:
    """The child's last words (its one-line error, or the last line of a traceback)."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


@contextlib.contextmanager
def _signals(handler: Callable[[int, object], None]) -> Iterator[None]:
    """SIGINT and SIGTERM go to `handler` while the sweep runs (main thread only)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _header(spec: SweepSpec) -> str:
    return (
        f"# Written by protofed sweep from {spec.source}: the spec as resolved and, per run, "
        "what it sets and its config's digest.\n# A later sweep into this folder must expand "
        "to the same runs (or be given --force).\n"
    )
