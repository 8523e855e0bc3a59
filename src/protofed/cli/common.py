"""What every command shares: the Typer app, the consoles, the options several commands take,
the exit codes, and the handling of the faults a user can fix."""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import click
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from typer.core import TyperGroup

from protofed.errors import ConfigError, RunStopped

if TYPE_CHECKING:
    from protofed.config import ExperimentConfig


def reflow(text: str | None) -> str | None:
    """A docstring's paragraphs each on one line, so that the help wraps them on words at the
    terminal's width: Typer's rich help keeps the single line breaks of every paragraph but
    the first, and a narrow terminal then breaks each source line again mid-sentence. A
    paragraph that starts with click's `\\b` keeps its lines."""
    if not text:
        return text
    body, cut, rest = inspect.cleandoc(text).partition("\f")
    paragraphs = [p if p.startswith("\b") else " ".join(p.split()) for p in body.split("\n\n")]
    return "\n\n".join(paragraphs) + cut + rest


def reflow_help(command: click.Command) -> None:
    """`reflow` on the help of `command` and of every command under it."""
    command.help = reflow(command.help)
    for sub in getattr(command, "commands", {}).values():
        reflow_help(sub)


class ReflowGroup(TyperGroup):
    """The app's group: the help of every command reflowed (`reflow`) as it is built."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        reflow_help(self)


app = typer.Typer(
    cls=ReflowGroup,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Personalized federated learning on heterogeneous real-world data.",
)
console = Console()
err_console = Console(stderr=True)


# the options several commands share
Overrides = Annotated[list[str], typer.Option("--set", "-s", help="Override: section.key=value.")]
DataDir = Annotated[Path | None, typer.Option("--data-dir", help="Data root.")]
ConfigFile = Annotated[Path | None, typer.Argument(help="Experiment YAML.")]


EXIT_USER, EXIT_DIVERGED, EXIT_INTERRUPTED = 2, 3, 130


def fail(message: str) -> NoReturn:
    """The one line of a user error on stderr, and its exit code."""
    from rich.markup import escape  # "pip install 'protofed[flower]'" is text, not markup

    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=EXIT_USER)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Faults the user can fix end on one line with exit code 2, never in a traceback:
    bad input (ConfigError), a disk that is full or read-only, a vanished file, a run that
    cannot go on (RunStopped)."""
    try:
        yield
    except (ConfigError, RunStopped) as exc:
        fail(str(exc))
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        fail(f"{where}{exc.strerror or exc}")
    except EOFError as exc:  # else click would turn it into "Aborted!"
        fail(f"a file ended early ({exc or 'unexpected end of file'})")


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler's stop, `kill`) handled like Ctrl-C: the run stops resumably."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def experiment_config(
    config: Path | None, overrides: list[str], data_dir: Path | None
) -> ExperimentConfig:
    """The config file with the `-s` overrides and `--data-dir`, validated."""
    from protofed.config import load_config

    extra = list(overrides)
    if data_dir is not None:
        extra.append(f"data.dir={data_dir}")
    return load_config(config, extra)


def file_prefix(out: Path, example: str) -> Path:
    """`--out` as a file prefix (OUT.md, OUT.png): `.`, `..` or `/` name no file. (A folder
    of the prefix's name may exist: the files go beside it, as the printed paths say.)"""
    if out.name in ("", ".", ".."):
        raise ConfigError(f"--out: {out} is a folder; give a file prefix such as {out / example}")
    return out


def pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}"


def show_progress(quiet: bool) -> bool:
    """A bar on a terminal unless --quiet; PROTOFED_PROGRESS=1 draws it anywhere."""
    return not quiet and sys.stderr.isatty() or os.environ.get("PROTOFED_PROGRESS") == "1"


def progress_bar(show: bool) -> Progress:
    """The rounds' (or epochs') bar on stderr, with the status field a callback fills."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
        console=err_console,
        disable=not show,
        transient=False,
    )
