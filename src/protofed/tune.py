"""`protofed tune`: a method's own parameters chosen on validation data, then run with seeds.

The search runs one experiment per trial (Optuna: its grid sampler over the whole grid, or
TPE for `trials` draws from it) and scores each by its best validation personalization F1
over the evaluated rounds, never a test score. The chosen setting then runs once per seed;
their test scores (the round the validation rule selects, `eval.selection=val`) are what is
reported. Everything lands in `out`: `trial_<n>/` and `seed_<s>/` run folders and
`tune.json` (the space, every trial's parameters and validation score, the chosen values,
the seeds' scores).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from protofed.api import ConfigLike, Run, resolve_config, run
from protofed.core.files import atomic_write_text
from protofed.core.results import RoundRecord
from protofed.errors import ConfigError

Scalar = bool | int | float | str
TUNE_FILE = "tune.json"


@dataclass(frozen=True)
class Trial:
    number: int
    params: dict[str, Scalar]
    val_f1: float  # the best validation personalization F1 over the evaluated rounds


@dataclass(frozen=True)
class TuneResult:
    space: dict[str, list[Scalar]]
    trials: list[Trial]
    chosen: dict[str, Scalar]
    seeds: list[int]
    test_f1: list[float]  # per seed: personalization F1 at the validation-selected round

    @property
    def test_mean(self) -> float:
        return float(np.mean(self.test_f1))

    @property
    def test_std(self) -> float:
        return float(np.std(self.test_f1, ddof=1)) if len(self.test_f1) > 1 else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["test_mean"], out["test_std"] = self.test_mean, self.test_std
        return out


def parse_space(items: Sequence[str]) -> dict[str, list[Scalar]]:
    """`KEY=V1,V2,...` items as {key: values}: each value YAML (`0.1`, `true`, `sgd`); a list
    or a mapping is refused (Optuna's grid holds scalars), in one line naming the item."""
    space: dict[str, list[Scalar]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip() or not text.strip():
            raise ConfigError(f"--param {item!r}: expected KEY=V1,V2,...")
        values = [yaml.safe_load(v) for v in text.split(",")]
        for value in values:
            if not isinstance(value, bool | int | float | str):
                raise ConfigError(f"--param {key}: {value!r} is not a number, word or boolean")
        if key in space:
            raise ConfigError(f"--param {key}: given twice")
        space[key.strip()] = values
    if not space:
        raise ConfigError("--param: give at least one KEY=V1,V2,... to search")
    return space


def _val_f1(finished: Run) -> float:
    """The best validation personalization F1 (mean over clients) of a finished run."""
    history = [RoundRecord.from_json(line) for line in finished.dir.history()]
    scores = [r.val.f1 for r in history if r.val.f1 is not None]
    if not scores:
        raise ConfigError("tune: the runs record no validation F1 (data.split with a val part)")
    return float(max(scores))


def tune(
    config: ConfigLike,
    space: Mapping[str, list[Scalar]],
    out: str | Path,
    *,
    seeds: int = 3,
    trials: int | None = None,
    sampler: str = "grid",
    overwrite: bool = False,
) -> TuneResult:
    """Search `space` on validation scores, then run the chosen setting with `seeds` seeds
    (0 .. seeds - 1). Every combination is validated before the first run."""
    try:
        import optuna
    except ImportError:
        raise ConfigError("protofed tune needs Optuna: pip install 'protofed[tune]'") from None

    base = resolve_config(config)
    for combo in product(*space.values()):  # a bad key or value: one line, nothing run
        resolve_config(base, **dict(zip(space, combo, strict=True)))
    folder = Path(out)
    if folder.exists() and any(folder.iterdir()) and not overwrite:
        raise ConfigError(f"--out: {folder} is not empty; use --force to replace it")
    folder.mkdir(parents=True, exist_ok=True)
    grid_size = math.prod(len(v) for v in space.values())
    if sampler == "grid":
        chosen_sampler: optuna.samplers.BaseSampler = optuna.samplers.GridSampler(
            dict(space), seed=base.seed
        )
        count = grid_size if trials is None else min(trials, grid_size)
    elif sampler == "tpe":
        chosen_sampler = optuna.samplers.TPESampler(seed=base.seed)
        count = trials if trials is not None else grid_size
    else:
        raise ConfigError(f"--sampler: {sampler!r} is not grid or tpe")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=chosen_sampler)
    done: list[Trial] = []

    def objective(trial: optuna.Trial) -> float:
        params: dict[str, Scalar] = {}
        for key, values in space.items():
            params[key] = trial.suggest_categorical(key, values)  # type: ignore[assignment]
        trial_cfg = resolve_config(base, **params)
        finished = run(trial_cfg, folder / f"trial_{trial.number}", overwrite=True)
        score = _val_f1(finished)
        done.append(Trial(trial.number, dict(params), score))
        return score

    study.optimize(objective, n_trials=count)
    best = max(done, key=lambda t: (t.val_f1, -t.number))  # ties: the first trial
    test: list[float] = []
    for seed in range(seeds):
        seed_cfg = resolve_config(base, seed=seed, **best.params)
        finished = run(seed_cfg, folder / f"seed_{seed}", overwrite=True)
        selected = finished.summary.selected
        f1 = None if selected is None else selected.personalization.f1
        test.append(float("nan") if f1 is None else float(f1))
    result = TuneResult(dict(space), done, dict(best.params), list(range(seeds)), test)
    atomic_write_text(folder / TUNE_FILE, json.dumps(result.to_json(), indent=2) + "\n")
    return result
