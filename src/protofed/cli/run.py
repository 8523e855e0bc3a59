"""`protofed run` (a new run, or `--resume` of a stopped one) and `protofed pretrain`: thin
layers over `protofed.run`, `protofed.resume` and `protofed.pretrain` that draw the progress,
take SIGTERM as Ctrl-C and print the outcome."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TextIO, TypedDict

import typer

from protofed.cli.common import (
    EXIT_INTERRUPTED,
    ConfigFile,
    DataDir,
    Overrides,
    console,
    err_console,
    experiment_config,
    progress_bar,
    show_progress,
    terminate_as_interrupt,
    user_errors,
)
from protofed.cli.summary import finished_view, print_summary
from protofed.errors import ConfigError

if TYPE_CHECKING:
    from rich.progress import TaskID

    from protofed.api import RunInterrupted, Started


class Hooks(TypedDict):
    """The callbacks and stream a run is followed with (`protofed.run`'s keywords)."""

    on_start: Callable[[Started], None]
    on_round: Callable[..., None]
    lines: TextIO | None


class RoundsDisplay:
    """How a run shows its progress: a bar on a terminal (its status: the latest loss and
    personalization F1), else plain lines on stderr (a log file), else nothing (--quiet).
    The bar, and SIGTERM taken as Ctrl-C, hold from the run's start (`start`, the API's
    `on_start`) to the end of the `with` block; the API's summary warnings are left to the
    printed summary."""

    LINE_EVERY_S = 10.0  # without a terminal: a line at least this often (`unevaluated_line`)

    def __init__(self, quiet: bool) -> None:
        self.show = show_progress(quiet)
        self.lines = sys.stderr if not quiet and not self.show else None
        self.bar = progress_bar(self.show)
        self.started: Started | None = None
        self._task: TaskID | None = None
        self._stack = contextlib.ExitStack()
        self._last_line = 0.0  # perf_counter() of the last plain line

    def start(self, started: Started) -> None:
        """The API's `on_start`: the bar, and SIGTERM as Ctrl-C, from here on."""
        self.started = started
        self._stack.enter_context(self.bar)
        self._stack.enter_context(terminate_as_interrupt())
        self._task = self.bar.add_task(
            started.algorithm, total=started.rounds, completed=started.done, status=""
        )

    def update(self, server_round: int, _info: object = None, record: object = None) -> None:
        """The API's `on_round`: the bar at the round, with the tracking's status; or, with
        no bar, a plain line for a round not evaluated (`unevaluated_line`)."""
        if self.started is None:
            return
        if self._task is not None:
            status = self.started.tracking.status
            self.bar.update(self._task, completed=server_round, status=status)
        if self.lines is not None:
            self.unevaluated_line(server_round, evaluated=record is not None)

    def unevaluated_line(self, server_round: int, evaluated: bool) -> None:
        """Without a terminal the tracking writes a line per evaluated round only, so a run
        that evaluates late (eval.every) said nothing for minutes: a line with the round, the
        loss, the time per round and the ETA after this session's first round, then whenever
        `LINE_EVERY_S` passed since the last line, evaluated or not."""
        from protofed.tracking import duration

        assert self.started is not None and self.lines is not None
        tracking = self.started.tracking
        clock = tracking.clock  # already ticked for this round
        if evaluated:  # the tracking wrote its line, with the scores
            self._last_line = clock.last
            return
        if clock.rounds > 1 and clock.last - self._last_line < self.LINE_EVERY_S:
            return
        self._last_line = clock.last
        per = clock.per_round
        loss = "-" if tracking.loss is None else f"{tracking.loss:.4f}"
        line = "  ".join(
            [
                f"round {server_round}/{self.started.rounds}",
                f"loss {loss}",
                f"{per:.1f} s/round" if per >= 1 else f"{per:.2f} s/round",
                f"ETA {duration(clock.eta_s(server_round, self.started.rounds))}",
            ]
        )
        try:
            print(line, file=self.lines, flush=True)
        except (OSError, ValueError):  # the pipe's reader went away: the run goes on
            self.lines = None

    def __enter__(self) -> RoundsDisplay:
        from protofed.api import SummaryWarning

        self._stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore", SummaryWarning)  # printed with the summary instead
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stack.__exit__(*exc_info)

    def hooks(self) -> Hooks:
        """What `protofed.run` and `protofed.resume` are followed with."""
        return Hooks(on_start=self.start, on_round=self.update, lines=self.lines)


def _exit_interrupted(stop: RunInterrupted) -> NoReturn:
    """Where the run stopped and how to go on, and exit code 130."""
    from protofed.api import interrupted_after

    if stop.resumable:
        hint = f"continue with: protofed run --resume {stop.path}"
    else:  # the client states lived in Flower's ClientApps: gone with them
        hint = "a Flower run cannot resume; start it again with --force"
    where = interrupted_after(stop.server_round, stop.resumes_from if stop.resumable else None)
    err_console.print(f"{where}; {hint}", highlight=False)
    raise typer.Exit(code=EXIT_INTERRUPTED) from None


def run(
    config: Annotated[
        Path | None, typer.Argument(help="Experiment YAML (defaults if omitted).")
    ] = None,
    set_: Overrides = [],  # noqa: B006
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run directory.")] = None,
    data_dir: DataDir = None,
    resume_dir: Annotated[
        Path | None, typer.Option("--resume", help="Continue a killed run.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite a non-empty --out.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    engine: Annotated[
        str,
        typer.Option(
            "--engine", help="builtin, or flower (Flower's simulation engine; docs/flower.md)."
        ),
    ] = "builtin",
    log: Annotated[
        list[str],
        typer.Option(
            "--log",
            help="Also log to: tensorboard (RUN/tensorboard/), mlflow (a store in mlruns/ "
            "beside RUN), mlflow=URI (a tracking server), wandb[=PROJECT] (Weights & Biases), "
            "or a plugin's logger; docs/tracking.md.",
        ),
    ] = [],  # noqa: B006
) -> None:
    """Run one experiment and write its run directory."""
    from protofed import api
    from protofed.engines import engine_named
    from protofed.tracking import log_kinds

    with user_errors():
        log_kinds(log)  # every option checked before the config is read
        chosen = engine_named(engine, "--engine")
        chosen.require()
        if resume_dir is None:
            cfg = experiment_config(config, set_, data_dir)
            started = _follow(
                lambda display: api.run(
                    cfg, out, engine=engine, overwrite=force, log=log, **display.hooks()
                ),
                quiet,
            )
            _print_finished(started, None)
            return
        if not chosen.resumable:
            raise ConfigError(f"{chosen.cannot_resume}: no --resume")
        if config is not None or set_:
            raise ConfigError("--resume takes the run directory's own config; drop CONFIG and -s")
        started = _follow(
            lambda display: api.resume(resume_dir, data_dir=data_dir, log=log, **display.hooks()),
            quiet,
        )
        _print_finished(started, resume_dir)


def _follow(go: Callable[[RoundsDisplay], object], quiet: bool) -> Started | None:
    """`go(display)`: `protofed.run` or `protofed.resume`, followed on the display; Ctrl-C or
    SIGTERM ends it with where it stopped. What it started; None if there was nothing to run
    (a resume of a run already complete)."""
    from protofed.api import RunInterrupted
    from protofed.runs import SUMMARY

    with RoundsDisplay(quiet) as display:
        try:
            go(display)
        except KeyboardInterrupt as stop:  # RunInterrupted, or a signal after the rounds
            started = display.started
            if started is None or not (started.path / SUMMARY).is_file():
                if isinstance(stop, RunInterrupted):
                    _exit_interrupted(stop)
                raise
            # the summary was written: the run completed, and its summary is printed
    return display.started


def _print_finished(started: Started | None, resume_dir: Path | None) -> None:
    """The summary of the run just finished, or of the run `--resume` found complete; a
    diverged run's line and exit code instead."""
    if started is not None:
        print_summary(finished_view(started.path, f"run directory: {started.path}"), started.path)
    elif resume_dir is not None:  # nothing was left to run
        view = finished_view(
            resume_dir,
            f"nothing to resume in {resume_dir} (start it again with other settings and --force)",
        )
        console.print(f"{resume_dir} is already complete.")
        print_summary(view, resume_dir)


PRETRAIN_RESUME_HELP = (
    "Continue an interrupted pre-training from the state kept beside --out after every epoch "
    "(OUT.state.safetensors); start afresh if there is none."
)


def pretrain(
    config: ConfigFile = None,
    set_: Overrides = [],  # noqa: B006
    out: Annotated[Path, typer.Option("--out", "-o", help="Checkpoint file to write.")] = Path(
        "runs/pretrain/encoder.safetensors"
    ),
    data_dir: DataDir = None,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite an existing --out; start over.")
    ] = False,
    resume: Annotated[bool, typer.Option("--resume", help=PRETRAIN_RESUME_HELP)] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Pre-train HART's encoder and ALP prototypes as a masked autoencoder on the unlabeled
    windows of the other HAR sets (FedAli 5.4; docs/pretraining.md); use with -s model.init=OUT."""
    from protofed.api import pretrain as run_pretraining

    with user_errors():
        cfg = experiment_config(config, set_, data_dir)
        show = show_progress(quiet)
        with (
            progress_bar(show) as bar,
            terminate_as_interrupt(),
        ):
            task = bar.add_task("pretrain", total=cfg.pretrain.epochs, status="")
            epochs: list[int] = []  # those done here
            started: list[str] = []

            def on_start(description: str) -> None:
                started.append(description)
                err_console.print(description, highlight=False, soft_wrap=True)

            def on_epoch(epoch: int, loss: float) -> None:
                epochs.append(epoch)
                bar.update(task, completed=epoch, status=f"loss {loss:.4f}")
                if not show and not quiet:
                    print(f"epoch {epoch}/{cfg.pretrain.epochs} loss {loss:.4f}", file=sys.stderr)

            try:
                run_pretraining(
                    cfg, out, overwrite=force, resume=resume, on_epoch=on_epoch, on_start=on_start
                )
            except KeyboardInterrupt:
                from protofed.training.pretrain import state_path

                if epochs:
                    kept = f"the state after epoch {epochs[-1]} is kept: continue with --resume"
                elif state_path(out).exists():
                    kept = "the kept state is unchanged: continue with --resume"
                else:
                    kept = "nothing written"
                err_console.print(f"interrupted: {kept}", highlight=False)
                raise typer.Exit(code=EXIT_INTERRUPTED) from None
    if not started:
        console.print(f"{out} is already complete.", highlight=False)
    console.print(
        f"checkpoint: {out}; start a run from it with -s model.init={out}",
        highlight=False,
    )
