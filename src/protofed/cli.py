"""The command line: `protofed run`, `pretrain`, `list`, `info`, `report`, `sweep`, `partition`,
`embed`, `data`, `flower`.

User errors print one line on stderr and exit with code 2; nothing is written before the
config, the data and the model have all been validated.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, NoReturn

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
from rich.table import Table
from rich.text import Text

from protofed.errors import ConfigError, RunComplete, RunStopped

app = typer.Typer(
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


def _fail(message: str) -> None:
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
        _fail(str(exc))
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        _fail(f"{where}{exc.strerror or exc}")
    except EOFError as exc:  # else click would turn it into "Aborted!"
        _fail(f"a file ended early ({exc or 'unexpected end of file'})")


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


def _config(config: Path | None, overrides: list[str], data_dir: Path | None):
    from protofed.config import load_config

    extra = list(overrides)
    if data_dir is not None:
        extra.append(f"data.dir={data_dir}")
    return load_config(config, extra)


def _prefix(out: Path, example: str) -> Path:
    """`--out` as a file prefix (OUT.md, OUT.png): `.`, `..` or `/` name no file. (A folder
    of the prefix's name may exist: the files go beside it, as the printed paths say.)"""
    if out.name in ("", ".", ".."):
        raise ConfigError(f"--out: {out} is a folder; give a file prefix such as {out / example}")
    return out


def _diverged(summary: dict, then: str) -> NoReturn:
    """A diverged run's one line (what diverged; `then`), and its exit code."""
    err_console.print(
        f"[bold red]diverged:[/] {summary['diverged']}; {then}", highlight=False, soft_wrap=True
    )
    raise typer.Exit(code=EXIT_DIVERGED)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}"


SummaryView = tuple[Table, str, list[str]]


def summary_view(summary: dict) -> SummaryView:
    """The scores table, the time and traffic line, the warnings (built before printing, so
    a damaged summary.json fails before anything is shown)."""
    sel = summary["selected"]
    table = Table(
        title=f"{summary['algorithm']} on {summary['dataset']}: "
        f"{summary['num_clients']} clients, {summary['rounds']} rounds",
        caption=f"%, mean ± std across clients; last = round {summary['final']['round']}, "
        f"sel = round {sel['round']} ({sel['rule']} rule)",
    )
    table.add_column("score", no_wrap=True)
    for when in ("last", "sel"):
        table.add_column(f"{when} acc", justify="right", no_wrap=True)
        table.add_column(f"{when} F1", justify="right", no_wrap=True)
    for key in ("personalization", "generalization", "global"):
        cells = []
        for part in (summary["final"][key], sel[key]):
            if part is None:
                cells += ["-", "-"]
            else:
                cells += [_pct(part["acc"]), f"{_pct(part['f1'])} ± {_pct(part['f1_std'])}"]
        table.add_row(key, *cells)
    t, c = summary["time"], summary["comm"]
    cost = (
        f"time {t['total_s']:.1f} s (train {t['train_s']:.1f}, eval {t['eval_s']:.1f}); "
        f"communication up {c['up_bytes'] / 1e6:.2f} MB, down {c['down_bytes'] / 1e6:.2f} MB"
    )
    return table, cost, [str(w) for w in summary.get("warnings", [])]


def print_summary(view: SummaryView, run_dir: Path | None = None) -> None:
    table, cost, warnings = view
    console.print(table)
    console.print(cost, highlight=False)
    for warning in warnings:
        err_console.print(f"[bold yellow]warning:[/] {warning}", highlight=False)
    if run_dir is not None:
        console.print(f"run directory: {run_dir}", highlight=False)


def _progress_bar(show: bool) -> Progress:
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


@app.command()
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
        typer.Option("--log", help="Also log to: tensorboard (RUN/tensorboard/, docs/tracking.md)"),
    ] = [],  # noqa: B006
) -> None:
    """Run one experiment and write its run directory."""
    from protofed.runtime import resume, start
    from protofed.tracking import Tracking, log_kinds

    run_loop = None  # how the loop runs: its own `run`, or inside a Flower simulation session
    with user_errors():
        logs = log_kinds(log)
        if engine not in ("builtin", "flower"):
            raise ConfigError(f"unknown --engine '{engine}' (builtin or flower)")
        if engine == "flower":
            from protofed.flower import require_flower

            require_flower()
            from protofed.flower.engine import (
                run_simulation_loop,
                start,  # noqa: F811 - same signature, Flower engine
            )

            run_loop = run_simulation_loop
        if resume_dir is not None:
            if engine == "flower":
                raise ConfigError("Flower runs keep client states on the nodes: no --resume")
            if config is not None or set_:
                raise ConfigError(
                    "--resume takes the run directory's own config; drop CONFIG and -s"
                )
            from protofed.runs import SUMMARY, RunDir, reading

            try:
                loop = resume(resume_dir, data_dir)
            except RunComplete:  # finished, maybe by another process while this one started
                existing = RunDir.open(resume_dir)
                with reading(existing.path / SUMMARY):
                    summary = existing.read_json(SUMMARY)
                    if summary.get("status") == "diverged":  # over: its state is not finite
                        _diverged(
                            summary,
                            f"nothing to resume in {resume_dir} "
                            "(start it again with other settings and --force)",
                        )
                    view = summary_view(summary)
                console.print(f"{resume_dir} is already complete.")
                print_summary(view, resume_dir)
                return
            out = resume_dir
        else:
            cfg = _config(config, set_, data_dir)
            if out is None:
                stamp = time.strftime("%Y%m%d-%H%M%S")
                out = Path("runs") / f"{cfg.algorithm.name}-{cfg.data.name}-{stamp}"
            loop = start(cfg, out, overwrite=force)

        total = loop.cfg.train.rounds
        show = not quiet and sys.stderr.isatty() or os.environ.get("PROTOFED_PROGRESS") == "1"
        lines = sys.stderr if not quiet and not show else None  # a log file: plain lines
        with (
            _progress_bar(show) as bar,
            Tracking(out, total, loop.progress.server_round, logs, lines) as tracking,
            terminate_as_interrupt(),
        ):
            task = bar.add_task(
                loop.cfg.algorithm.name,
                total=total,
                completed=loop.progress.server_round,
                status="",
            )

            def on_round(r: int, info: dict, record: dict | None) -> None:
                tracking(r, info, record)
                bar.update(task, completed=r, status=tracking.status)

            try:
                summary = loop.run(on_round) if run_loop is None else run_loop(loop, on_round)
            except KeyboardInterrupt:
                done = loop.progress.server_round
                if loop.checkpoints:
                    hint = f"continue with: protofed run --resume {out}"
                else:  # the client states lived in Flower's ClientApps: gone with them
                    hint = "a Flower run cannot resume; start it again with --force"
                err_console.print(f"interrupted after round {done}; {hint}", highlight=False)
                raise typer.Exit(code=EXIT_INTERRUPTED) from None
    if summary.get("status") == "diverged":
        _diverged(summary, f"run directory: {out}")
    print_summary(summary_view(summary), out)


@app.command()
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
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue an interrupted pre-training from the state kept beside --out "
            "after every epoch (OUT.state.safetensors); start afresh if there is none.",
        ),
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Pre-train HART's encoder and ALP prototypes as a masked autoencoder on the unlabeled
    windows of the other HAR sets (FedAli 5.4; docs/pretraining.md); use with -s model.init=OUT."""
    from protofed.api import pretrain as run_pretraining

    with user_errors():
        cfg = _config(config, set_, data_dir)
        show = not quiet and sys.stderr.isatty() or os.environ.get("PROTOFED_PROGRESS") == "1"
        with (
            _progress_bar(show) as bar,
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


@app.command("list")
def list_() -> None:
    """Every algorithm, data set, partitioner and model, one line each (plugins included)."""
    from protofed import algorithms, data, models
    from protofed.data import PARTITIONERS
    from protofed.plugins import provider

    def lines(kind: str, described: dict[str, str]) -> dict[str, str]:
        """Each entry's line, with the distribution that provides it where a plugin does."""
        out = {}
        for name, line in described.items():
            dist = provider(kind, name)
            out[name] = line if dist is None else f"{line} (plugin: {dist})"
        return out

    for title, items in (
        (
            "algorithms",
            lines("algorithms", {k: v.summary for k, v in algorithms.load_plugins().items()}),
        ),
        ("datasets", lines("datasets", {k: v.description for k, v in data.load_plugins().items()})),
        (
            "partitioners",
            {k: v[0] if isinstance(v, tuple) else v.description for k, v in PARTITIONERS.items()},
        ),
        ("models", lines("models", {k: v.description for k, v in models.load_plugins().items()})),
    ):
        table = Table(title=title, show_header=False, box=None, title_justify="left")
        table.add_column(style="bold cyan")
        table.add_column()
        for name, line in items.items():
            table.add_row(name, line)
        console.print(table)


@app.command()
def info(
    name: Annotated[str, typer.Argument(help="An algorithm name (see `protofed list`).")],
) -> None:
    """An algorithm's reference and its hyperparameters with defaults and meaning.

    For an algorithm that takes the ALA plug-in, its `ala.*` keys too.
    """
    from protofed.algorithms import algorithm_class
    from protofed.algorithms.common.ala import ALA_KEY, AlaParams, supports_ala

    with user_errors():
        cls = algorithm_class(name)
    console.print(f"[bold]{cls.name}[/]: {cls.summary}", highlight=False)
    if cls.reference:
        console.print(f"reference: {cls.reference}", highlight=False)
    table = Table(
        title="hyperparameters (set with -s algorithm.<name>=<value>)", title_justify="left"
    )
    for col in ("name", "type", "default", "meaning"):
        table.add_column(col)
    for key, field in cls.Params.model_fields.items():
        table.add_row(
            key, _type_name(field.annotation), repr(field.default), field.description or ""
        )
    if not cls.Params.model_fields:
        table.add_row("-", "-", "-", "no hyperparameters")
    if supports_ala(cls):  # the ALA plug-in's keys, `enabled` first
        table.add_section()
        fields = AlaParams.model_fields
        for key in sorted(fields, key=lambda k: k != "enabled"):
            field = fields[key]
            table.add_row(
                f"{ALA_KEY}.{key}",
                _type_name(field.annotation),
                repr(field.default),
                f"ALA plug-in: {field.description or ''}",
            )
    console.print(table)


def _type_name(annotation) -> str:
    """int, float | None, 'hat' | 'trained': as a user writes the value."""
    from typing import Literal, get_args, get_origin

    if get_origin(annotation) is Literal:
        return " | ".join(repr(a) for a in get_args(annotation))
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


@app.command()
def report(
    dirs: Annotated[
        list[Path], typer.Argument(help="Run directories, or folders searched for them.")
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Write OUT.md, OUT.csv (and OUT-*.png/pdf).")
    ] = Path("report"),
    which: Annotated[
        str, typer.Option(help="'selected' round, 'final' round, or a round number.")
    ] = "selected",
    group_by: Annotated[
        str,
        typer.Option(
            "--group-by",
            help="auto (runs that differ only in the seed), none (one row per run), "
            "or config keys: algorithm.name,data.alpha",
        ),
    ] = "auto",
    plot: Annotated[
        bool, typer.Option("--plot", help="Also write the figures (docs/reporting.md).")
    ] = False,
    domains: Annotated[
        bool,
        typer.Option(
            "--domains", help="Add pers. accuracy per natural group (domain, site) of clients."
        ),
    ] = False,
) -> None:
    """Compare finished runs: mean ± std over seeds per group, printed and written as Markdown
    and CSV (docs/reporting.md). Unfinished runs are listed as skipped."""
    from protofed.core.files import atomic_write_text, check_writable
    from protofed.report import (
        PRINTED,
        STD_NOTE,
        cells,
        collect,
        group_runs,
        parse_which,
        summarize,
        to_csv,
        to_markdown,
    )

    with user_errors():
        out = _prefix(out, "report")
        when = parse_which(which)
        skipped: list = []
        rows = collect(dirs, when, skipped, domains)
        groups = group_runs(rows, group_by)
        table_rows = rows if group_by == "none" else summarize(groups)
        for path, reason in skipped:
            err_console.print(f"skipped {path}: {reason}", highlight=False, soft_wrap=True)
        head, body = cells(table_rows, PRINTED)
        spread = "one run per row" if group_by == "none" else f"mean ± {STD_NOTE}"
        title = (
            f"{'round ' + str(when) if isinstance(when, int) else when + ' round'}: "
            f"scores in % (mean over clients), {spread}; MB and s per round"
        )
        table = Table(title=title, caption=f"every column: {out.name}.md and .csv")
        widths = [max(len(c) for c in col) for col in zip(head, *body, strict=True)]
        labels = ("group", "run", "algorithm", "dataset")
        least = [min(w, 24) if col in labels else w for col, w in zip(head, widths, strict=True)]
        for col, width in zip(head, least, strict=True):
            if col in labels:  # a long label (runs differing in many keys) folds onto lines
                table.add_column(col, justify="left", overflow="fold", min_width=width)
            else:  # numbers keep their width: never squeezed to nothing by a long label
                table.add_column(col, justify="right", no_wrap=True, min_width=width)
        for line in body:
            table.add_row(*(Text(cell) for cell in line))  # a folder named `run[lr]` is text
        needed, fixed = (sum(w + 3 for w in ws) + 4 for ws in (widths, least))
        wide = Console(width=max(console.width, min(needed, max(240, fixed))))
        if plot:
            from protofed.plots.curves import check_figures_writable, figures, write_figures

            drawn = figures(groups)  # before any file: a run it cannot draw writes nothing
        md, csv_path = out.with_name(out.name + ".md"), out.with_name(out.name + ".csv")
        for path in (md, csv_path):  # every place probed first: a blocked one writes nothing
            check_writable(path)
        if plot:
            check_figures_writable(drawn, out)
        atomic_write_text(md, to_markdown(table_rows, when))  # before the table: a failed
        atomic_write_text(csv_path, to_csv(table_rows))  # write is then the one line shown
        wide.print(table)
        written = [md, csv_path]
        if plot:
            written += write_figures(drawn, out, when)
    console.print("wrote " + ", ".join(str(p) for p in written), highlight=False)


@app.command()
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

    try:
        with user_errors():
            spec = load_spec(spec_file).with_overrides(set_)
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
            result = _sweep(spec, out, workers, force, data_dir, time_limit, only)
    except KeyboardInterrupt:
        err_console.print(f"interrupted; run the same command again to resume {out}")
        raise typer.Exit(code=EXIT_INTERRUPTED) from None
    if result.exit_code:
        raise typer.Exit(code=result.exit_code)


def _sweep(
    spec,  # protofed.sweep.SweepSpec (imported when the command runs)
    out: Path,
    workers: int,
    force: bool,
    data_dir: Path | None,
    limit: float | None,
    only: list[str],
):
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

        def done(o) -> None:
            if o.name in active:
                active.remove(o.name)
            f1 = "" if o.pers_f1 is None else f"  pers F1 {_pct(o.pers_f1)}"
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
            on_start=started,
            on_done=done,
        )
    table = Table(title=f"sweep {out}: {len(result.outcomes)} runs")
    for col in ("run", "status", "pers F1", "seconds"):
        table.add_column(col, justify="left" if col in ("run", "status") else "right")
    for o in result.outcomes:
        secs = "-" if o.seconds is None else f"{o.seconds:.0f}"
        table.add_row(o.name, o.status, _pct(o.pers_f1), secs)
    console.print(table)
    if result.interrupted:
        err_console.print(f"interrupted; run the same command again to resume {out}")
    return result


@app.command()
def partition(
    config: ConfigFile = None,
    set_: Overrides = [],  # noqa: B006
    data_dir: DataDir = None,
    plot: Annotated[
        bool, typer.Option("--plot", help="Also draw the heat map (OUT.png, OUT.pdf).")
    ] = False,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="--plot: file prefix of the figure.")
    ] = Path("partition"),
) -> None:
    """Print the clients x classes count matrix of a config's partition (no training)."""
    from protofed.data import build_federated

    with user_errors():
        if plot:
            out = _prefix(out, "partition")
        cfg = _config(config, set_, data_dir)
        fed = build_federated(cfg.data, cfg.seed)
        console.print(fed.counts_table(), highlight=False)
        if plot:
            from protofed.plots import save_figure
            from protofed.plots.partition import partition_figure

            paths = save_figure(partition_figure(fed), out)
            console.print(f"wrote {' and '.join(map(str, paths))}", highlight=False)


@app.command()
def embed(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    client: Annotated[int, typer.Option("--client", help="Whose personalized model.")] = 0,
    other: Annotated[int, typer.Option("--other", help="How many other clients' data.")] = 3,
    other_data: Annotated[
        str | None,
        typer.Option(
            "--other-data",
            help="Instead of other clients: one user's windows of this other HAR data set "
            "(FedAli's Fig. 4).",
        ),
    ] = None,
    with_clients: Annotated[
        list[int] | None,
        typer.Option("--with", help="These other clients (repeat it), instead of --other's."),
    ] = None,
    own_models: Annotated[
        bool,
        typer.Option(
            "--own-models",
            help="Each client's own model on its own training data (FedAli's Fig. 5).",
        ),
    ] = False,
    prototypes: Annotated[
        bool,
        typer.Option("--prototypes", help="t-SNE of the prototypes the run kept, instead."),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="File prefix (default: embed_client<K> or embed_prototypes)."
        ),
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """t-SNE of a client's personalized embeddings of its own and other clients' test data
    (or another HAR data set's windows), or (--prototypes) of the class prototypes kept
    across rounds (docs/figures.md)."""
    with user_errors():
        from protofed.api import Run
        from protofed.plots import save_figure
        from protofed.plots.embed import draw_embedding, embedding_map, prototype_figure

        if out is not None:
            out = _prefix(out, "embed")
        run_ = Run(run_dir)
        said = ""
        if prototypes:
            fig, default = prototype_figure(run_), "embed_prototypes"
        else:
            m = embedding_map(
                run_,
                client,
                other,
                data_dir=data_dir,
                other_data=other_data,
                pick=with_clients,
                own_models=own_models,
            )
            fig = draw_embedding(m)
            default = f"embed_client{client}" + ("_own_models" if own_models else "")
            if m.agreement == m.agreement:  # not NaN: there are other points
                said = f" (the others' nearest own point of their class: {100 * m.agreement:.1f} %)"
        paths = save_figure(fig, out if out is not None else Path(default))
    console.print(f"wrote {' and '.join(map(str, paths))}{said}", highlight=False)


data_app = typer.Typer(
    no_args_is_help=True, help="Data sets: list, fetch from their public source, describe."
)
app.add_typer(data_app, name="data")


def _data_root(data_dir: Path | None) -> Path:
    from protofed.config import DataConfig
    from protofed.data import data_root

    if data_dir is not None and data_dir.exists() and not data_dir.is_dir():
        _fail(f"--data-dir: {data_dir} is a file, not a folder")
    return data_root(DataConfig(dir=None if data_dir is None else str(data_dir)))


def _megabytes(paths: list[Path]) -> str:
    total = sum(p.stat().st_size for p in paths if p.is_file())
    return f"{total / 1e6:.1f} MB" if paths else "-"


@data_app.command("list")
def data_list(data_dir: DataDir = None) -> None:
    """Every data set: present in the data root or not, size, source and licence."""
    from protofed.data import catalog, load_plugins

    root = _data_root(data_dir)
    table = Table(title=f"data sets (data root: {root})", title_justify="left")
    table.add_column("name", no_wrap=True)  # what `data fetch` takes: never cut
    for col in ("present", "size", "download", "source", "licence"):
        table.add_column(col, no_wrap=col in ("size", "download"), overflow="fold")
    for name, info in load_plugins().items():
        parts = catalog.COMPOSITE.get(name, (name,))
        if not all(p in catalog.SOURCES for p in parts):
            table.add_row(name, "-" if info.needs_root else "built in", "-", "-", info.source, "-")
            continue
        state, files = catalog.status(name, root)
        specs = [catalog.SOURCES[p] for p in parts]
        table.add_row(
            name,
            state,
            _megabytes(files),
            f"{sum(s.download_size for s in specs) / 1e6:,.0f} MB",
            specs[0].publisher if len(specs) == 1 else f"{', '.join(parts)}",
            specs[0].licence if len(specs) == 1 else "see its parts",
        )
    console.print(table)
    console.print("fetch one with: protofed data fetch NAME [--data-dir DIR]", highlight=False)


@data_app.command("fetch")
def data_fetch(
    names: Annotated[list[str], typer.Argument(help="Data set names (see `protofed data list`).")],
    data_dir: DataDir = None,
    raw: Annotated[
        Path | None,
        typer.Option("--raw", help="Convert the raw files already in this folder; no download."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Convert again over existing files.")
    ] = False,
) -> None:
    """Download, verify (checksum) and convert data sets into the data root.

    An interrupted download resumes where it stopped when run again.
    """
    from protofed.data import catalog

    root = _data_root(data_dir)
    try:
        with user_errors(), terminate_as_interrupt():
            for name in names:
                if name not in catalog.COMPOSITE:  # every name checked before any download
                    catalog.source(name)
            for name in names:
                written = catalog.fetch(name, root, raw_dir=raw, force=force)
                console.print(f"{name}: ready ({_megabytes(written)} in {root})", highlight=False)
    except KeyboardInterrupt:
        err_console.print("interrupted; run the same command again to resume the download")
        raise typer.Exit(code=EXIT_INTERRUPTED) from None


@data_app.command("info")
def data_info(
    name: Annotated[str, typer.Argument(help="A data set name.")], data_dir: DataDir = None
) -> None:
    """Where a data set comes from, what the converter does, and the defaults it runs with."""
    from protofed.config import DATASET_DEFAULTS
    from protofed.data import catalog, load_plugins
    from protofed.data.download import read_checksums

    datasets = load_plugins()
    if name not in datasets:
        _fail(f"unknown data set '{name}' (valid: {', '.join(datasets)})")
    root = _data_root(data_dir)
    info = datasets[name]
    say = console.print
    say(f"[bold]{name}[/]: {info.description}", highlight=False)
    if name in catalog.SOURCES or name in catalog.COMPOSITE:
        say(f"present in {root}: {catalog.status(name, root)[0]}", highlight=False)
    spec = catalog.SOURCES.get(name)
    if spec is not None:
        say(
            f"source: {spec.homepage}\nlicence: {spec.licence}\ncite: {spec.citation}",
            highlight=False,
        )
        recorded = read_checksums(spec.raw_dir(root, name))
        for remote in spec.files:
            check = remote.known_hash or (
                f"{recorded[remote.filename]} (recorded at first download)"
                if remote.filename in recorded
                else "none published: sha256 recorded at first download"
            )
            say(
                f"download: {remote.filename} <- {remote.urls[0]}\n  checksum: {check}",
                highlight=False,
            )
            for mirror in remote.urls[1:]:
                say(f"  mirror: {mirror}", highlight=False)
        say(f"converter: {' '.join((spec.convert.__doc__ or '').split())}", highlight=False)
        for rel in spec.produces:
            path = root / rel
            state = f"present, {path.stat().st_size / 1e6:.1f} MB" if path.is_file() else "absent"
            say(f"file: {path} ({state})", highlight=False)
        for alt, what in spec.alternatives:
            say(f"read instead when absent: {root / alt} ({what})", highlight=False)
        if spec.differs:
            say(f"differs: {spec.differs}", highlight=False)
    elif name in catalog.COMPOSITE:
        say(f"made of: {', '.join(catalog.COMPOSITE[name])} (fetching it fetches them)")
    else:
        say(f"source: {info.source}", highlight=False)
    defaults = DATASET_DEFAULTS.get(name)
    if defaults:
        shown = ", ".join(f"{k}={v}" for k, v in defaults.items())
        say(f"defaults where a config leaves them unset: {shown}", highlight=False)
    standardized = "on" if name == "arrays" else "off (the loader normalises)"
    say(f"data.standardize default: {standardized}", highlight=False)


flower_app = typer.Typer(
    no_args_is_help=True, help="protofed on Flower: deployment helpers (docs/flower.md)."
)
app.add_typer(flower_app, name="flower")


@flower_app.command()
def export(
    config: ConfigFile = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for client_<i>.npz.")] = Path(
        "partitions"
    ),
    set_: Overrides = [],  # noqa: B006
    data_dir: DataDir = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an earlier export in OUT.")
    ] = False,
) -> None:
    """Write each client's train/val/test data to OUT/client_<i>.npz (same split as any run)."""
    with user_errors():
        from protofed.flower import require_flower

        require_flower()
        from protofed.flower.partitions import export_partitions

        paths = export_partitions(_config(config, set_, data_dir), out, force=force)
    console.print(
        f"wrote {len(paths)} partition files, federation.json and partition.txt to {out}",
        highlight=False,
    )


def main() -> None:  # pragma: no cover - entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
