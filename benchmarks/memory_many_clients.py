"""Peak memory of one round with many clients (1,000 by default; mlp on the synthetic set).

Per-client state holds only what an algorithm must keep: FedAvg keeps nothing per client, and
replies are aggregated as a stream, so no per-client model copies are ever resident. `local` is
the opposite extreme (one model per client is its whole point) and is measured for contrast.

Usage: python benchmarks/memory_many_clients.py [--clients 10000]
       -> benchmarks/out/memory_many_clients.json
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

import psutil

from protofed.config import load_config
from protofed.runtime import prepare, simulate


def one(algorithm: str, clients: int) -> dict:
    cfg = load_config(
        None,
        [
            "data.name=synthetic",
            "data.partition=iid",
            f"data.num_clients={clients}",
            "model.name=mlp",
            f"algorithm.name={algorithm}",
            "train.rounds=1",
            "train.batch_size=32",
            "eval.generalization=false",
            "train.workers=1",  # every client in this process: its memory is what is measured
        ],
    )
    proc = psutil.Process()
    sim = simulate(prepare(cfg))
    before = proc.memory_info().rss
    sim.run()
    model_bytes = sum(
        t.numel() * t.element_size() for t in sim.prepared.model.state_dict().values()
    )
    state_bytes = sum(
        t.numel() * t.element_size()
        for s in sim.transport.states.values()
        for r in s.values()
        for t in r.values()
    )
    return {
        "algorithm": algorithm,
        "clients": clients,
        "model_bytes": model_bytes,
        "per_client_state_bytes": state_bytes,
        "rss_before_round_mb": before / 2**20,
        "rss_after_round_mb": proc.memory_info().rss / 2**20,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--algorithm", help="measure one algorithm in this process")
    args = parser.parse_args()
    if args.algorithm:  # one algorithm per process, so peak RSS is its own
        print(json.dumps(one(args.algorithm, args.clients)))
        return
    import subprocess

    results = []
    for name in ("fedavg", "local"):
        out = subprocess.run(
            [sys.executable, __file__, "--algorithm", name, "--clients", str(args.clients)],
            capture_output=True,
            text=True,
            check=True,
        )
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]))
    path = Path(__file__).parent / "out" / "memory_many_clients.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
