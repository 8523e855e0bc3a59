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
        help="KEY=TEXT names a group TEXT in the table and the figures; KEY is a group's "
        "label or a pattern of its run folders' names (fedali*). Repeat it.",
    ),
]
PanelsOption = Annotated[
    str | None,
    typer.Option(
        "--panels",
        help="--plot: the learning curves' panels, a comma list of pers_f1, gen_f1, "
        "global_f1, unseen_f1, train_loss (default: each one recorded).",
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
    panels: PanelsOption = None,
    compare: Annotated[
        tuple[str, str] | None,
        typer.Option(
            "--compare",
            help="A B: A - B over seeds, paired by seed, with a 95 % CI, a paired t-test and "
            "(n >= 6) Wilcoxon; also written to OUT-compare.md and .json. A, B: groups' labels.",
        ),
    ] = None,
    cd: Annotated[
        bool,
        typer.Option(
            "--cd",
            help="Rank the groups over data sets (or seeds on one data set): Friedman test, "
            "Nemenyi CD diagram in OUT-cd.png/pdf, ranks in OUT-cd.md.",
        ),
    ] = False,
    metric: Annotated[
        str, typer.Option("--metric", help="--compare, --cd: the column compared.")
    ] = "pers_f1",
) -> None:
    """Compare finished runs: mean ± std over seeds per group, printed and written as Markdown
    and CSV (docs/reporting.md). Unfinished runs are listed as skipped. --compare A B and --cd
    test whether the groups' differences hold up over the seeds."""
    from protofed.core.files import atomic_write_text, check_writable
    from protofed.report import (
        STD_NOTE,
        collect,
        group_runs,
        parse_labels,
        parse_which,
        summarize,
        table_labels,
        to_csv,
        to_markdown,
    )

    with user_errors():
        out = file_prefix(out, "report")
        when = parse_which(which)
        skipped: list[tuple[Path, str]] = []
        rows = collect(dirs, when, skipped, domains)
        groups = group_runs(rows, group_by)
        labels = parse_labels(label or [], groups)
        names = table_labels(groups, labels)
        if group_by == "none":  # copies: the figures match --label against the run names
            table_rows = [dict(r, run=n) for r, n in zip(rows, names, strict=True)]
        else:
            table_rows = [dict(r, group=n) for r, n in zip(summarize(groups), names, strict=True)]
        for path, reason in skipped:
            err_console.print(f"skipped {path}: {reason}", highlight=False, soft_wrap=True)
        spread = "one run per row" if group_by == "none" else f"mean ± {STD_NOTE}"
        table, wide = _scores_table(table_rows, when, spread, out)
        drawn = _draw(plot, groups, labels, (band, style, title, panels))  # before any file
        decided, results = _decide(groups, (names, labels), compare, cd, metric, out)
        md, csv_path = out.with_name(out.name + ".md"), out.with_name(out.name + ".csv")
        for path in (md, csv_path, *decided):  # every place probed first: a blocked one
            check_writable(path)  # writes nothing
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
        written += _write_decided(decided, results, style)
    console.print("wrote " + ", ".join(str(p) for p in written), highlight=False)


def _decide(
    groups: list[Any],
    naming: tuple[list[str], dict[str, str]],
    compare: tuple[str, str] | None,
    cd: bool,
    metric: str,
    out: Path,
) -> tuple[dict[Path, Any], list[Any]]:
    """`--compare` and `--cd`, computed before any file is written: {file: its content} and
    the results to print."""
    from protofed.errors import ConfigError
    from protofed.report import paired_comparison, rank_table, relabel

    if metric != "pers_f1" and compare is None and not cd:
        raise ConfigError("--metric chooses the column of --compare or --cd: add one")
    names, labels = naming  # the table's labels; the figures' from `labels`
    files: dict[Path, Any] = {}
    results: list[Any] = []
    if compare is not None:
        result = paired_comparison(groups, names, compare[0], compare[1], metric)
        files[out.with_name(out.name + "-compare.md")] = result.to_markdown()
        files[out.with_name(out.name + "-compare.json")] = result.to_json()
        results.append(result)
    if cd:
        table = rank_table(groups, names, metric)
        files[out.with_name(out.name + "-cd.md")] = table.to_markdown()
        short = relabel(groups, labels) if table.block_kind == "seed" else None
        for suffix in (".png", ".pdf"):
            files[out.with_name(out.name + "-cd" + suffix)] = (table, short)
        results.append(table)
    return files, results


def _write_decided(files: dict[Path, Any], results: list[Any], style: str) -> list[Path]:
    """Print the statistics of `_decide`, write their files (the diagram as PNG and PDF)."""
    from protofed.core.files import atomic_write_text
    from protofed.plots import save_figure

    written: list[Path] = []
    for path, content in files.items():
        if path.suffix in (".md", ".json"):
            atomic_write_text(path, content)
            written.append(path)
        elif path.suffix == ".png":
            from protofed.plots.cd import cd_diagram

            table, short = content
            fig = cd_diagram(table, style=style, labels=short)
            written += save_figure(fig, path.with_suffix(""))
    for result in results:
        for line in result.lines():
            console.print(line, highlight=False, soft_wrap=True)
    return written


def _draw(
    plot: bool, groups: list[Any], labels: dict[str, str], how: tuple[str, str, str | None, Any]
) -> dict[str, Any] | None:
    """The figures of `--plot` (drawn before any file is written: a run they cannot draw, or
    an unknown panel, writes nothing), None without `--plot`. `how`: band, style, title,
    panels."""
    from protofed.errors import ConfigError

    band, style, title, panels = how
    if not plot:
        if band != "auto" or style != "screen" or title is not None or panels is not None:
            raise ConfigError("--band, --style, --title and --panels draw figures: add --plot")
        return None
    from protofed.plots.curves import figures, parse_panels

    chosen = None if panels is None else parse_panels(panels)
    return figures(groups, labels=labels, band=band, style=style, title=title, panels=chosen)


def _scores_table(
    rows: list[dict[str, Any]], when: str | int, spread: str, out: Path
) -> tuple[Table, Console]:
    """The printed table of the report's rows, as wide as the terminal (`console.width`): a
    long label folds onto lines and no number column is squeezed; where the columns do not
    fit, each `mean ± std` cell folds onto two lines (the mean, then `± std`), and where
    they still do not, the least read columns (`DROP_FIRST`) are left out, which the caption
    names (the Markdown and CSV files have every column)."""
    from protofed.report import DROP_FIRST, PRINTED, cells

    head, body = cells(rows, PRINTED)
    labels = ("group", "run", "algorithm", "dataset", "status")

    def width(col: int, fold: bool) -> int:
        texts = [head[col], *(line[col] for line in body)]
        if head[col] in labels:
            return min(max(map(len, texts)), 24)
        if fold:  # `12.58 ± 13.83` as `12.58` over `± 13.83`
            texts = [part for t in texts for part in t.replace(" ± ", "\n± ").split("\n")]
        return max(map(len, texts))

    def needed(keep: list[int], fold: bool) -> int:  # rich: 3 a column, 4 the borders
        return sum(width(i, fold) + 3 for i in keep) + 4

    keep = list(range(len(head)))
    fold = needed(keep, False) > console.width
    dropped: list[str] = []
    for name in DROP_FIRST:
        if needed(keep, fold) <= console.width:
            break
        if name in head:
            keep.remove(head.index(name))
            dropped.append(name)
    title = (
        f"{'round ' + str(when) if isinstance(when, int) else when + ' round'}: "
        f"scores in % (mean over clients), {spread}; MB and s per round"
    )
    caption = f"every column: {out.name}.md and .csv"
    if dropped:
        caption += f" (left out here for the terminal's width: {', '.join(dropped)})"
    table = Table(title=title, caption=caption)
    for i in keep:
        if head[i] in labels:  # a long label (runs differing in many keys) folds onto lines
            table.add_column(head[i], justify="left", overflow="fold", min_width=width(i, fold))
        else:  # numbers keep their width: never squeezed to nothing by a long label
            table.add_column(head[i], justify="right", no_wrap=True, min_width=width(i, fold))
    for line in body:  # a folder named `run[lr]` is text
        cells_ = [line[i] for i in keep]
        if fold:
            cells_ = [
                c if head[i] in labels else c.replace(" ± ", "\n± ")
                for c, i in zip(cells_, keep, strict=True)
            ]
        table.add_row(*(Text(cell) for cell in cells_))
    return table, Console(width=max(console.width, needed(keep, fold)))
