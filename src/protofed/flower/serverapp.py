"""The deployed ServerApp: `flwr run flower_app <superlink>` runs an experiment on SuperNodes.

Its run config (`[tool.flwr.app.config]` of flower_app/pyproject.toml, or `--run-config`):

    experiment   the experiment YAML, as a path on the SuperLink's machine ("" = defaults)
    overrides    `-s` style overrides, space separated: "train.rounds=5 algorithm.name=ditto"
    out          the run directory on the SuperLink's machine ("" = runs/flower-<algo>-<time>)
    nodes        wait until this many SuperNodes are connected
    wait-s       ... for at most this many seconds

The server holds no data: it learns the federation from the SuperNodes' partition files
(`protofed flower export`), runs the built-in round loop over the Grid
(`engine.deploy`) and writes the run directory as every engine does, with
client-side evaluation (docs/flower.md says what is reported).
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from protofed.config import load_config
from protofed.flower.engine import deploy
from protofed.runs import RunDir

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    t0 = time.perf_counter()
    rc = context.run_config
    experiment = str(rc.get("experiment", "")) or None
    cfg = load_config(experiment, shlex.split(str(rc.get("overrides", ""))))
    out = str(rc.get("out", "")) or str(
        Path("runs") / f"flower-{cfg.algorithm.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    loop, partition = deploy(
        cfg, grid, nodes=int(rc.get("nodes", 1)), wait_s=float(rc.get("wait-s", 60.0))
    )
    loop.run_dir = RunDir.create(
        out, cfg.to_dict(), partition, loop.prepared.fed.counts_table(), overwrite=True
    )
    loop.transport.startup_s = time.perf_counter() - t0  # waiting for nodes, discovery
    summary = loop.run()
    pers = summary["final"]["personalization"]
    print(
        f"protofed: {summary['algorithm']} on {loop.num_clients} SuperNodes, "
        f"{summary['rounds']} rounds: personalization acc {pers['acc']:.4f}, "
        f"{summary['flower']['rejected']} repl(ies) rejected; run directory {out}",
        flush=True,
    )
