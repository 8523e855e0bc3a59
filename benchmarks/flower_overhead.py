"""Per-round overhead of the Flower simulation engine against the built-in engine.

FedAvg on UCI-HAR natural clients (30 subjects = 30 clients), cnn1d on the 6 default
channels, SGD 0.05, batch 64, 1 local epoch, every client every round, evaluation every
round (the server-side protocol: personalization, generalization, global). Three runs of
the same config and seed:
  builtin_serial   the built-in engine, one process, one thread;
  builtin_workers  the built-in engine, train.workers=2 (two single-threaded processes);
  flower           `--engine flower`: Flower's simulation engine, Ray, one CPU per ClientApp
                   (two at a time on two cores), clients' states in Context.state.
Reported per round (rounds 2..R; round 1 carries Flower's start-up, reported apart): wall
seconds, of which training (send, fit, receive, aggregate) and evaluation, and the CPU
seconds of all processes (the server and its workers or Ray's processes), which a busy
machine inflates far less than wall time. The final metrics of the three
runs must agree within 1e-4 (they do: the engines share the round loop).

Usage: python benchmarks/flower_overhead.py [--rounds 10] [--data-dir ../shared/data]
Writes benchmarks/out/flower_overhead.json (and prints it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import time
from pathlib import Path

import psutil
import torch

from protofed.config import load_config
from protofed.flower.simulation import run_simulation_loop, simulation_loop
from protofed.runtime import prepare, simulate

COMMON = [
    "data.name=uci_har",
    "data.partition=natural",
    "data.channels=default",
    "model.name=cnn1d",
    "algorithm.name=fedavg",
    "train.optimizer=sgd",
    "train.lr=0.05",
    "train.batch_size=64",
    "train.local_epochs=1",
    "train.client_fraction=1.0",
    "train.threads=1",
    "eval.every=1",
]
RUNS = {
    "builtin_serial": ("builtin", []),
    "builtin_workers": ("builtin", ["train.workers=2"]),
    "flower": ("flower", ["flower.client_cpus=1"]),
}


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and every process below it (Ray's raylet,
    GCS and actors; the built-in engine's workers): a cost that a busy machine does not
    inflate the way it inflates wall time."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:4])  # user, system, and those of reaped children
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += sum(child.cpu_times()[:2])
    return total


def measure(name: str, rounds: int, data_dir: str) -> dict:
    engine, extra = RUNS[name]
    cfg = load_config(None, [*COMMON, *extra, f"train.rounds={rounds}", f"data.dir={data_dir}"])
    t0 = time.perf_counter()
    prepared = prepare(cfg)
    sim = (simulation_loop if engine == "flower" else simulate)(prepared)
    setup_s = time.perf_counter() - t0
    per_round: list[dict] = []
    marks = [(time.perf_counter(), cpu_seconds())]

    def on_round(r, info, record):
        now, cpu = time.perf_counter(), cpu_seconds()
        per_round.append(
            {
                "round": r,
                "train_s": info.train_s + info.guard_s + info.aggregate_s,
                "eval_s": record.time.eval_s if record else 0.0,
                "wall_s": now - marks[-1][0],
                "cpu_s": cpu - marks[-1][1],
            }
        )
        marks.append((now, cpu))

    t1 = time.perf_counter()
    summary = (
        run_simulation_loop(sim, on_round) if engine == "flower" else sim.run(on_round=on_round)
    ).to_json()
    wall = time.perf_counter() - t1
    steady = per_round[1:] or per_round  # round 1 carries Flower's start-up
    n = len(steady)
    train_s = sum(p["train_s"] for p in steady) / n
    eval_s = sum(p["eval_s"] for p in steady) / n
    return {
        "run": name,
        "rounds": rounds,
        "setup_s": setup_s,
        "startup_s": per_round[0]["wall_s"] - per_round[0]["train_s"] - per_round[0]["eval_s"],
        "wall_s": wall,
        "seconds_per_round": sum(p["wall_s"] for p in steady) / n,
        "train_s_per_round": train_s,
        "eval_s_per_round": eval_s,
        "cpu_s_per_round": sum(p["cpu_s"] for p in steady) / n,
        "final": summary["final"],
        "comm": summary["comm"],
        "per_round": per_round,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument(
        "--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data")
    )
    ap.add_argument("--only", choices=sorted(RUNS), action="append")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "flower_overhead.json"))
    args = ap.parse_args()
    results = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "load_before": os.getloadavg(),
        },
        "runs": [],
    }
    for name in RUNS:
        if args.only and name not in args.only:
            continue
        res = measure(name, args.rounds, args.data_dir)
        results["runs"].append(res)
        print(
            json.dumps({k: v for k, v in res.items() if k not in ("final", "comm", "per_round")}),
            flush=True,
        )
    runs = {r["run"]: r for r in results["runs"]}
    if "flower" in runs and len(runs) > 1:
        ref = runs.get("builtin_workers") or runs["builtin_serial"]
        diff = max(
            abs(runs["flower"]["final"][part][k] - ref["final"][part][k])
            for part in ("personalization", "generalization", "global")
            for k in ref["final"][part]
        )
        results["max_metric_difference"] = diff
        results["overhead_s_per_round"] = {
            "wall": runs["flower"]["seconds_per_round"] - ref["seconds_per_round"],
            "train": runs["flower"]["train_s_per_round"] - ref["train_s_per_round"],
            "eval": runs["flower"]["eval_s_per_round"] - ref["eval_s_per_round"],
            "cpu": runs["flower"]["cpu_s_per_round"] - ref["cpu_s_per_round"],
            "against": ref["run"],
        }
        print(
            json.dumps({k: results[k] for k in ("max_metric_difference", "overhead_s_per_round")})
        )
    results["machine"]["load_after"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
