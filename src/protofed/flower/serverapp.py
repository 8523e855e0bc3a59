"""The deployed ServerApp: `flwr run flower_app <superlink>` runs an experiment on SuperNodes.

Its run config (`[tool.flwr.app.config]` of flower_app/pyproject.toml, or `--run-config`):

    experiment   the experiment YAML, as a path on the SuperLink's machine ("" = defaults)
    overrides    `-s` style overrides, space separated: "train.rounds=5 algorithm.name=ditto"
    out          the run directory on the SuperLink's machine ("" = runs/flower-<algo>-<time>);
                 one that exists and is not empty is refused, never overwritten
    nodes        wait until this many SuperNodes are connected
    wait-s       ... for at most this many seconds

The server holds no data: it learns the federation from the SuperNodes' partition files
(`protofed flower export`), runs the built-in round loop over the Grid
(`deployment.deploy`) and writes the run directory as every engine does, with
client-side evaluation (docs/flower.md says what is reported).
"""

from __future__ import annotations

import logging
import shlex
import time
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from protofed.config import load_config
from protofed.errors import ConfigError
from protofed.flower.deployment import deploy
from protofed.flower.transport import FlowerTransport
from protofed.runs import RunDir

log = logging.getLogger("protofed.flower")

app = ServerApp()


def check_out(out: str | Path) -> Path:
    """`out` as the run directory of a new run: refused (ConfigError, one line, nothing
    touched) when it exists and is not an empty folder. A deployed run is never written over
    another: the ServerApp has no --force."""
    path = Path(out)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ConfigError(
            f"run directory {path} already exists and is not empty: a deployed run never "
            "overwrites one; set another out= in --run-config"
        )
    return path


def create_run_dir(
    out: str | Path,
    config: dict[str, Any],
    partition: dict[str, Any],
    table: str,
    engine: str = "flower-deployment",
) -> RunDir:
    """The new run directory at `out`, checked again (another run may have taken it since)."""
    check_out(out)
    return RunDir.create(out, config, partition, table, overwrite=False, engine=engine)


@app.main()
def main(grid: Grid, context: Context) -> None:
    t0 = time.perf_counter()
    rc = context.run_config
    experiment = str(rc.get("experiment", "")) or None
    cfg = load_config(experiment, shlex.split(str(rc.get("overrides", ""))))
    out = str(rc.get("out", "")) or str(
        Path("runs") / f"flower-{cfg.algorithm.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    try:
        check_out(out)  # before waiting for any node
        loop, partition = deploy(
            cfg, grid, nodes=int(rc.get("nodes", 1)), wait_s=float(rc.get("wait-s", 60.0))
        )
        loop.run_dir = create_run_dir(
            out, cfg.to_dict(), partition, loop.prepared.fed.counts_table()
        )
    except ConfigError as err:
        log.error("protofed: %s", err)  # one line; Flower marks the run failed with it
        raise
    transport = loop.transport
    assert isinstance(transport, FlowerTransport), "deploy builds a Flower round loop"
    transport.startup_s = time.perf_counter() - t0  # waiting for nodes, discovery
    summary = loop.run().to_json()
    if summary["status"] == "diverged":
        log.error("protofed: diverged: %s; run directory %s", summary["diverged"], out)
        return
    pers = summary["final"]["personalization"]
    print(
        f"protofed: {summary['algorithm']} on {loop.num_clients} SuperNodes, "
        f"{summary['rounds']} rounds: personalization acc {pers['acc']:.4f}, "
        f"{summary['flower']['rejected']} repl(ies) rejected; run directory {out}",
        flush=True,
    )
