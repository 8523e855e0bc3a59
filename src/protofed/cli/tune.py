"""`protofed tune`: a method's parameters chosen on validation data, then several seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from protofed.cli.common import DataDir, Overrides, console, experiment_config, pct, user_errors


def tune(
    config: Annotated[Path, typer.Argument(help="Experiment config YAML.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder: trials, seeds, tune.json.")],
    param: Annotated[
        list[str],
        typer.Option("--param", "-p", help="A key and its values to search: KEY=V1,V2,..."),
    ] = [],  # noqa: B006
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="Seeds the chosen runs.")] = 3,
    trials: Annotated[
        int | None, typer.Option("--trials", min=1, help="Trials (default: the whole grid).")
    ] = None,
    sampler: Annotated[str, typer.Option("--sampler", help="grid or tpe (Optuna's).")] = "grid",
    set_: Overrides = [],  # noqa: B006
    data_dir: DataDir = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty --out.")] = False,
) -> None:
    """Search a method's parameters on validation F1 only, then run the chosen setting with
    seeds 0 .. SEEDS-1 and report their test scores (docs/sweeps.md, "Tuning").

    Each trial is scored by its best validation personalization F1 over the evaluated rounds;
    test scores never enter the choice. Exit code 2: a bad key, value or option, nothing run.
    """
    from protofed.tune import parse_space
    from protofed.tune import tune as run_tune

    with user_errors():
        cfg = experiment_config(config, set_, data_dir)
        space = parse_space(param)
        result = run_tune(
            cfg, space, out, seeds=seeds, trials=trials, sampler=sampler, overwrite=force
        )
    table = Table(title="trials (validation personalization F1, best round)")
    for key in space:
        table.add_column(key)
    table.add_column("val F1", justify="right")
    for trial in result.trials:
        mark = " *" if trial.params == result.chosen else ""
        table.add_row(*(str(trial.params[k]) for k in space), pct(trial.val_f1) + mark)
    console.print(table)
    chosen = ", ".join(f"{k}={v}" for k, v in result.chosen.items())
    console.print(
        f"chosen on validation: {chosen}; test personalization F1 over {len(result.seeds)} "
        f"seeds: {pct(result.test_mean)} ± {pct(result.test_std)}; {out / 'tune.json'}",
        highlight=False,
    )
