"""Peak memory of one round with 1,000 clients (mlp on the synthetic set).

Per-client state holds only what an algorithm must keep: FedAvg keeps nothing per client, and
replies are aggregated as a stream, so no 1,000 model copies are ever resident. `local` is
the opposite extreme (one model per client is its whole point) and is measured for contrast.

Usage: python benchmarks/memory_many_clients.py  -> benchmarks/out/memory_many_clients.json
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import psutil

from protofed.config import load_config
from protofed.runtime import prepare, simulate


def one(algorithm: str) -> dict:
    cfg = load_config(
        None,
        [
            "data.name=synthetic",
            "data.partition=iid",
            "data.num_clients=1000",
            "model.name=mlp",
            f"algorithm.name={algorithm}",
            "train.rounds=1",
            "train.batch_size=32",
            "eval.generalization=false",
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
        "clients": 1000,
        "model_bytes": model_bytes,
        "per_client_state_bytes": state_bytes,
        "rss_before_round_mb": before / 2**20,
        "rss_after_round_mb": proc.memory_info().rss / 2**20,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    algorithm = sys.argv[1] if len(sys.argv) > 1 else None
    if algorithm:  # one algorithm per process, so peak RSS is its own
        print(json.dumps(one(algorithm)))
        return
    import subprocess

    results = []
    for name in ("fedavg", "local"):
        out = subprocess.run(
            [sys.executable, __file__, name], capture_output=True, text=True, check=True
        )
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]))
    path = Path(__file__).parent / "out" / "memory_many_clients.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
