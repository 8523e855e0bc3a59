"""ALA's extra cost per round: time, and bytes communicated (which must not grow at all).

FedAvg and FedAvg + ALA (`-s algorithm.ala.enabled=true`, the same numbers as `fedala`) on the
same config, seed and rounds. Round 1 has no ALA (no client has a local model yet), round 2 is
every client's start phase (W trained until its loss settles), later rounds train W one epoch.
Times are per round of training (evaluation excluded), as wall seconds and as this process's
CPU seconds (single-threaded, so CPU seconds do not depend on what else shares the machine);
`ala_s` is the time spent inside ALA itself (building theta_hat and training W).

Usage: python benchmarks/ala_overhead.py [--config configs/fedala_mnist_pathological.yaml]
           [--rounds 4] [--data-dir ../shared/data] [-s key=value ...]
Writes benchmarks/out/ala_overhead.json (and prints it).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from protofed.algorithms.common import ala as ala_module
from protofed.config import load_config
from protofed.runtime import prepare, simulate

ROOT = Path(__file__).resolve().parents[1]


class AlaClock:
    """Wraps `ala.adapt` (looked up at call time by the plug-in) to time it and keep its metrics."""

    def __init__(self) -> None:
        self.real = ala_module.adapt
        self.seconds = 0.0
        self.cpu = 0.0
        self.metrics: list[dict] = []

    def __call__(self, *args, **kwargs):
        t, c = time.perf_counter(), time.process_time()
        out = self.real(*args, **kwargs)
        self.seconds += time.perf_counter() - t
        self.cpu += time.process_time() - c
        self.metrics.append(out[2])
        return out

    def take(self) -> tuple[float, float, list[dict]]:
        out = (self.seconds, self.cpu, self.metrics)
        self.seconds, self.cpu, self.metrics = 0.0, 0.0, []
        return out


def measure(overrides: list[str], config: str, rounds: int) -> dict:
    cfg = load_config(
        config,
        [
            *overrides,
            f"train.rounds={rounds}",
            "train.threads=1",
            "train.workers=1",
            f"eval.every={rounds}",
            "eval.generalization=false",
        ],
    )
    sim = simulate(prepare(cfg))
    clock = AlaClock()
    ala_module.adapt = clock
    per_round = []
    try:
        for r in range(1, rounds + 1):
            before = (sim.progress.up_bytes, sim.progress.down_bytes)
            t, c = time.perf_counter(), time.process_time()
            sim.run_round(r)
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            ala_s, ala_cpu, metrics = clock.take()
            epochs = [m["ala_epochs"] for m in metrics if m]
            per_round.append(
                {
                    "round": r,
                    "train_s": wall,
                    "train_cpu_s": cpu,
                    "ala_s": ala_s,
                    "ala_cpu_s": ala_cpu,
                    "ala_clients": len(epochs),
                    "ala_start_clients": sum(1 for m in metrics if m and m["ala_start"]),
                    "ala_epochs_mean": statistics.fmean(epochs) if epochs else 0.0,
                    "ala_epochs_max": max(epochs) if epochs else 0.0,
                    "ala_weights": next((m["ala_weights"] for m in metrics if m), 0.0),
                    "up_bytes": sim.progress.up_bytes - before[0],
                    "down_bytes": sim.progress.down_bytes - before[1],
                }
            )
    finally:
        ala_module.adapt = clock.real
    scores = sim.evaluate(rounds)
    return {
        "algorithm": sim.algorithm.name,
        "per_round": per_round,
        "personalization_acc_after": scores["personalization"]["acc"],
    }


def _mean(rows: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in rows) if rows else float("nan")


def compare(plain: dict, ala: dict) -> dict:
    """Overhead per phase: round 1 (no ALA), round 2 (start phase), rounds 3+ (one W epoch)."""
    phases = {"round_1_no_ala": [1], "round_2_start_phase": [2]}
    rounds = [r["round"] for r in plain["per_round"]]
    if len(rounds) > 2:
        phases["later_rounds"] = rounds[2:]
    out = {}
    for phase, which in phases.items():
        p = [r for r in plain["per_round"] if r["round"] in which]
        a = [r for r in ala["per_round"] if r["round"] in which]
        if not p:
            continue
        out[phase] = {
            "fedavg_train_cpu_s": _mean(p, "train_cpu_s"),
            "ala_train_cpu_s": _mean(a, "train_cpu_s"),
            "extra_cpu_s": _mean(a, "train_cpu_s") - _mean(p, "train_cpu_s"),
            "extra_cpu_pct": 100 * (_mean(a, "train_cpu_s") / _mean(p, "train_cpu_s") - 1),
            "inside_ala_cpu_s": _mean(a, "ala_cpu_s"),
            "fedavg_train_wall_s": _mean(p, "train_s"),
            "ala_train_wall_s": _mean(a, "train_s"),
            "ala_epochs_mean": _mean(a, "ala_epochs_mean"),
        }
    bytes_equal = all(
        (p["up_bytes"], p["down_bytes"]) == (a["up_bytes"], a["down_bytes"])
        for p, a in zip(plain["per_round"], ala["per_round"], strict=True)
    )
    out["bytes_per_round"] = {
        "fedavg_up": _mean(plain["per_round"], "up_bytes"),
        "fedavg_down": _mean(plain["per_round"], "down_bytes"),
        "ala_up": _mean(ala["per_round"], "up_bytes"),
        "ala_down": _mean(ala["per_round"], "down_bytes"),
        "extra_bytes": _mean(ala["per_round"], "up_bytes")
        + _mean(ala["per_round"], "down_bytes")
        - _mean(plain["per_round"], "up_bytes")
        - _mean(plain["per_round"], "down_bytes"),
        "identical_every_round": bytes_equal,
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "fedala_mnist_pathological.yaml"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument(
        "-s",
        "--set",
        dest="overrides",
        action="append",
        default=[],
        help="extra config override, e.g. -s algorithm.ala.p=2",
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "ala_overhead.json"))
    args = ap.parse_args()
    base = [f"data.dir={args.data_dir}", "algorithm.name=fedavg", *args.overrides]
    plain = measure(base, args.config, args.rounds)
    ala = measure([*base, "algorithm.ala.enabled=true"], args.config, args.rounds)
    result = {
        "config": str(Path(args.config).resolve().relative_to(ROOT)),
        "overrides": args.overrides,
        "rounds": args.rounds,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "threads": 1,
            "note": "CPU seconds are this process's; wall seconds depend on what else ran on the machine",
        },
        "summary": compare(plain, ala),
        "fedavg": plain,
        "fedavg_ala": ala,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
