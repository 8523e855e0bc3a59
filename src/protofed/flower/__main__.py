"""`python -m protofed.flower export CONFIG --out DIR`: one partition file per SuperNode."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from protofed.cli import _config, _fail, console
from protofed.errors import ConfigError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="protofed on Flower: deployment helpers (docs/flower.md).")


@app.command()
def export(
    config: Annotated[Path | None, typer.Argument(help="Experiment YAML.")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for client_<i>.npz.")] = Path(
        "partitions"
    ),
    set_: Annotated[list[str], typer.Option("--set", "-s", help="Override: section.key=value.")] = [],  # noqa: B006
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="Data root.")] = None,
) -> None:
    """Write each client's train/val/test data to OUT/client_<i>.npz (same split as any run)."""
    from protofed.flower.partitions import export_partitions

    try:
        paths = export_partitions(_config(config, set_, data_dir), out)
    except ConfigError as exc:
        _fail(str(exc))
        return
    console.print(f"wrote {len(paths)} partition files, federation.json and partition.txt to {out}",
                  highlight=False)


@app.command(hidden=True)
def version() -> None:
    import flwr

    console.print(f"flwr {flwr.__version__}")


if __name__ == "__main__":  # pragma: no cover
    app()
