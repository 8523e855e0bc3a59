"""`protofed data list | fetch | info`: the data sets, fetched from their public sources."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from protofed.cli.common import (
    EXIT_INTERRUPTED,
    DataDir,
    console,
    err_console,
    fail,
    terminate_as_interrupt,
    user_errors,
)

data_app = typer.Typer(
    no_args_is_help=True, help="Data sets: list, fetch from their public source, describe."
)


def _data_root(data_dir: Path | None) -> Path:
    from protofed.config import DataConfig
    from protofed.data import data_root

    if data_dir is not None and data_dir.exists() and not data_dir.is_dir():
        fail(f"--data-dir: {data_dir} is a file, not a folder")
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
        fail(f"unknown data set '{name}' (valid: {', '.join(datasets)})")
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
