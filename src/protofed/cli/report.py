"""`protofed report`: finished runs compared, printed and written as Markdown and CSV."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from protofed.cli.common import console, err_console, file_prefix, user_errors

# the figures' options (docs/reporting.md#figures---plot)
LabelOption = Annotated[
    list[str] | None,
    typer.Option(
        "--label",
        help="--plot: KEY=TEXT names a group TEXT in the figures; KEY is a group's label "
        "or a pattern of its run folders' names (fedali*). Repeat it.",
    ),
]
BandOption = Annotated[
    str,
    typer.Option(
        "--band",
        help="--plot: the band around each curve: auto (ci when every group has n >= 3, "
        "else std), std (± sample std), ci (95 % CI of the mean), none.",
    ),
]
StyleOption = Annotated[
    str,
    typer.Option(
        "--style", help="--plot: screen, paper (one column, 3.3 in) or paper-wide (7 in)."
    ),
]
TitleOption = Annotated[
    str | None, typer.Option("--title", help="--plot: the figures' title; '' for none.")
]


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
    label: LabelOption = None,
    band: BandOption = "auto",
    style: StyleOption = "screen",
    title: TitleOption = None,
) -> None:
    """Compare finished runs: mean ± std over seeds per group, printed and written as Markdown
    and CSV (docs/reporting.md). Unfinished runs are listed as skipped."""
    from protofed.core.files import atomic_write_text, check_writable
    from protofed.report import (
        STD_NOTE,
        collect,
        group_runs,
        parse_which,
        summarize,
        to_csv,
        to_markdown,
    )

    with user_errors():
        out = file_prefix(out, "report")
        when = parse_which(which)
        skipped: list[tuple[Path, str]] = []
        rows = collect(dirs, when, skipped, domains)
        groups = group_runs(rows, group_by)
        table_rows = rows if group_by == "none" else summarize(groups)
        for path, reason in skipped:
            err_console.print(f"skipped {path}: {reason}", highlight=False, soft_wrap=True)
        spread = "one run per row" if group_by == "none" else f"mean ± {STD_NOTE}"
        table, wide = _scores_table(table_rows, when, spread, out)
        drawn = _draw(plot, groups, label or [], band, style, title)  # before any file
        md, csv_path = out.with_name(out.name + ".md"), out.with_name(out.name + ".csv")
        for path in (md, csv_path):  # every place probed first: a blocked one writes nothing
            check_writable(path)
        if drawn is not None:
            from protofed.plots.curves import check_figures_writable

            check_figures_writable(drawn, out)
        atomic_write_text(md, to_markdown(table_rows, when))  # before the table: a failed
        atomic_write_text(csv_path, to_csv(table_rows))  # write is then the one line shown
        wide.print(table)
        written = [md, csv_path]
        if drawn is not None:
            from protofed.plots.curves import caption, write_captions, write_figures

            figs = write_figures(drawn, out, when)
            written += [*figs, write_captions(caption(groups, drawn, band, when), out, figs)]
    console.print("wrote " + ", ".join(str(p) for p in written), highlight=False)


def _draw(
    plot: bool, groups: list[Any], label: list[str], band: str, style: str, title: str | None
) -> dict[str, Any] | None:
    """The figures of `--plot` (drawn before any file is written: a run they cannot draw, or
    a `--label` that names no group, writes nothing), None without `--plot`."""
    from protofed.errors import ConfigError
    from protofed.report import parse_labels

    if not plot:
        if label or band != "auto" or style != "screen" or title is not None:
            raise ConfigError("--label, --band, --style and --title draw figures: add --plot")
        return None
    from protofed.plots.curves import figures

    labels = parse_labels(label, groups)
    return figures(groups, labels=labels, band=band, style=style, title=title)


def _scores_table(
    rows: list[dict[str, Any]], when: str | int, spread: str, out: Path
) -> tuple[Table, Console]:
    """The printed table of the report's rows, and a console wide enough that no number
    column is squeezed (a long label folds onto lines instead)."""
    from protofed.report import PRINTED, cells

    head, body = cells(rows, PRINTED)
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
    return table, Console(width=max(console.width, min(needed, max(240, fixed))))
