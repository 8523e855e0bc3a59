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


@flower_app.command()
def gate(
    ssl_certfile: Annotated[
        Path, typer.Option("--ssl-certfile", help="Certificate for the address SuperNodes dial.")
    ],
    ssl_keyfile: Annotated[Path, typer.Option("--ssl-keyfile", help="Its private key.")],
    ssl_ca_certfile: Annotated[
        Path, typer.Option("--ssl-ca-certfile", help="CA that signed the SuperLink's certificate.")
    ],
    listen: Annotated[
        str, typer.Option("--listen", help="HOST:PORT the SuperNodes reach (the network's).")
    ] = "0.0.0.0:9092",
    superlink: Annotated[
        str, typer.Option("--superlink", help="The SuperLink's HOST:PORT, on loopback.")
    ] = "127.0.0.1:9093",
) -> None:
    """Pass the SuperNodes' Fleet API to a SuperLink on loopback, and nothing else.

    Run submission (the Control API, `flwr run`) and the Runtime API stay on the SuperLink's
    loopback port: reachable from its own machine only. Every other request gets 404.
    """
    with user_errors():
        from protofed.flower import require_flower

        require_flower()
        from protofed.flower.fleet_gate import build_gate, serve_gate, split_address

        split_address(listen, "--listen")
        app = build_gate(superlink, ssl_certfile, ssl_keyfile, ssl_ca_certfile)
    console.print(
        f"Fleet gate on {listen} -> {superlink} (POST /v1/fleet/... only)", highlight=False
    )
    with user_errors():
        serve_gate(app, listen, ssl_certfile, ssl_keyfile)
