"""`protofed sweep`: a grid of runs times seeds, side by side, resumable."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from protofed.cli.common import (
    EXIT_INTERRUPTED,
    DataDir,
    Overrides,
    console,
    err_console,
    pct,
    user_errors,
)

if TYPE_CHECKING:
    from protofed.sweep import RunOutcome, SweepResult, SweepSpec


def sweep(
    spec_file: Annotated[Path, typer.Argument(help="Sweep spec YAML (docs/sweeps.md).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Sweep folder: one run per folder.")],
    workers: Annotated[int, typer.Option("--workers", "-j", help="Runs at a time.")] = 1,
    set_: Overrides = [],  # noqa: B006
    data_dir: DataDir = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List and validate the runs; run nothing.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Go on in a folder made from another spec.")
    ] = False,
    time_limit: Annotated[
        float | None,
        typer.Option("--time-limit", help="Seconds per run, then it is stopped (resumable)."),
    ] = None,
    only: Annotated[
        list[str], typer.Option("--only", help="Run only the runs whose names match this glob.")
    ] = [],  # noqa: B006
    log: Annotated[
        list[str],
        typer.Option(
            "--log",
            help="Each run also logs to: tensorboard, mlflow (one store, OUT/mlruns/), "
            "mlflow=URI, wandb[=PROJECT] or a plugin's logger; docs/tracking.md.",
        ),
    ] = [],  # noqa: B006
) -> None:
    """Run a grid of experiments times seeds, WORKERS at a time; run it again to resume.

    Finished runs are skipped, killed ones resumed from their checkpoint. Exit codes: 0 every
    run complete, 1 a run failed, was stopped at --time-limit or is held by another process,
    2 a bad spec (nothing run), 3 a run diverged, 130 interrupted (docs/sweeps.md).
    """
    from protofed.sweep import (
        check_folder,
        describe,
        differing_keys,
        load_spec,
        run_state,
        select_runs,
    )
    from protofed.tracking import log_kinds

    try:
        with user_errors():
            spec = load_spec(spec_file).with_overrides(set_)
            log_kinds(log)  # a bad --log is an error before anything is written
            if dry_run:  # what a real sweep would do, as far as it can be known without data
                every = spec.expand()
                check_folder(out, spec, every, force)
                runs = select_runs(every, only)
                actions: dict[str, int] = {}
                for run_, diff in zip(runs, differing_keys(runs), strict=True):
                    action = run_state(out / run_.name, run_.config, force).action
                    actions[action] = actions.get(action, 0) + 1
                    state = f"[{action}] " if out.exists() else ""
                    console.print(
                        f"{run_.name}  {state}{describe(diff)}",
                        highlight=False,
                        markup=False,
                        soft_wrap=True,
                    )
                todo = ", ".join(f"{n} {a}" for a, n in actions.items()) if out.exists() else ""
                console.print(
                    f"{len(runs)} runs{f' ({todo})' if todo else ''}, every config valid "
                    "(dry run: nothing written)",
                    highlight=False,
                )
                return
            result = _sweep(spec, out, workers, force, data_dir, time_limit, only, log)
    except KeyboardInterrupt:
        err_console.print(f"interrupted; run the same command again to resume {out}")
        raise typer.Exit(code=EXIT_INTERRUPTED) from None
    if result.exit_code:
        raise typer.Exit(code=result.exit_code)


def _sweep(
    spec: SweepSpec,
    out: Path,
    workers: int,
    force: bool,
    data_dir: Path | None,
    limit: float | None,
    only: list[str],
    log: list[str],
) -> SweepResult:
    """Run the sweep with a line per finished run (and a bar on a terminal), then a table."""
    from protofed.sweep import run_sweep, select_runs

    total = len(select_runs(spec.expand(), only))
    with Progress(
        TextColumn("[bold]sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[running]}"),
        console=err_console,
        disable=not err_console.is_terminal,
    ) as bar:
        task = bar.add_task("sweep", total=total, running="")
        active: list[str] = []

        def started(name: str, action: str) -> None:
            active.append(name)
            bar.update(task, running=", ".join(active))

        def done(o: RunOutcome) -> None:
            if o.name in active:
                active.remove(o.name)
            f1 = "" if o.pers_f1 is None else f"  pers F1 {pct(o.pers_f1)}"
            secs = "" if o.seconds is None or o.status == "skipped" else f"  {o.seconds:.0f} s"
            why = f"  ({o.detail})" if o.detail else ""
            log = f"  log: {o.log}" if o.status == "failed" else ""
            line = f"{o.name}  {o.status}{f1}{secs}{why}{log}"
            bar.console.print(line, highlight=False, markup=False)
            bar.update(task, advance=1, running=", ".join(active))

        result = run_sweep(
            spec,
            out,
            workers,
            force=force,
            data_dir=data_dir,
            time_limit=limit,
            only=only,
            log=log,
            on_start=started,
            on_done=done,
        )
    table = Table(title=f"sweep {out}: {len(result.outcomes)} runs")
    for col in ("run", "status", "pers F1", "seconds"):
        table.add_column(col, justify="left" if col in ("run", "status") else "right")
    for o in result.outcomes:
        secs = "-" if o.seconds is None else f"{o.seconds:.0f}"
        table.add_row(o.name, o.status, pct(o.pers_f1), secs)
    console.print(table)
    if result.interrupted:
        err_console.print(f"interrupted; run the same command again to resume {out}")
    return result
