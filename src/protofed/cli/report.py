"""`protofed report`: finished runs compared, printed and written as Markdown and CSV."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from protofed.cli.common import console, err_console, file_prefix, user_errors


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
