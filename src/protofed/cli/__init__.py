"""The command line: `protofed run`, `pretrain`, `list`, `info`, `report`, `sweep`, `partition`,
`embed`, `tune`, `data`, `flower`; one module per group of commands, registered here on the one
Typer app in the order `protofed --help` lists them.

User errors print one line on stderr and exit with code 2; nothing is written before the
config, the data and the model have all been validated.
"""

from __future__ import annotations

from typing import Annotated

import typer

from protofed.cli import catalog, data, figures, flower, report, run, sweep, tune
from protofed.cli.common import app, console
from protofed.core.process_owner import claim_for_cli


def _print_version(value: bool) -> None:
    if value:
        from protofed import __version__

        console.print(f"protofed {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Personalized federated learning on heterogeneous real-world data."""


app.command()(run.run)
app.command()(run.pretrain)
app.command("list")(catalog.list_)
app.command()(catalog.info)
app.command()(report.report)
app.command()(sweep.sweep)
app.command()(tune.tune)
app.command()(figures.partition)
app.command()(figures.embed)
app.add_typer(data.data_app, name="data")
app.add_typer(flower.flower_app, name="flower")

__all__ = ["app", "main"]


def main() -> None:  # pragma: no cover - entry point
    """`protofed` (and `python -m protofed`): the command line owns this process."""
    claim_for_cli()
    app(prog_name="protofed")
