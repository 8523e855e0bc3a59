"""`protofed flower export`: helpers to deploy protofed on Flower (docs/flower.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from protofed.cli.common import (
    ConfigFile,
    DataDir,
    Overrides,
    console,
    experiment_config,
    user_errors,
)

flower_app = typer.Typer(
    no_args_is_help=True, help="protofed on Flower: deployment helpers (docs/flower.md)."
)


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

        paths = export_partitions(experiment_config(config, set_, data_dir), out, force=force)
    console.print(
        f"wrote {len(paths)} partition files, federation.json and partition.txt to {out}",
        highlight=False,
    )
