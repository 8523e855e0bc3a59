"""ALA's extra cost per round: time, split by phase, and bytes communicated (which must not grow).

FedAvg and FedAvg + ALA (`-s algorithm.ala.enabled=true`, the same numbers as `fedala`) on the
same config, seed and rounds, built side by side in one process and run round by round in
turn (FedAvg's round r, then ALA's round r), so both see the same load on a shared machine.
Round 1 has no ALA (no client has a local model yet), round 2 is every client's start phase
(W trained until its loss settles), later rounds train W one epoch.

Every round is split into its phases, as this process's CPU seconds (single-threaded, so they
depend little on what else runs; wall seconds are kept too):
- `train`: the clients' side (for FedAvg + ALA, ALA included), `ala`: the part inside ALA
  (building theta_hat and training W), `aggregate`: the server's side of the round;
- `eval`: the round's evaluation with the config's `eval.*` (generalization on by default:
  every distinct client model predicts the union of all test sets), and `eval_pers`: the same
  evaluation without generalization (each model only on its own client's data).
FedAvg's clients all hold the global model, so FedAvg predicts once; a personalized method
predicts once per client. `--eval-also ditto fedrep` adds, after one round of training each,
the evaluation cost of other personalized methods for comparison.

Usage: python benchmarks/ala_overhead.py [--config configs/fedala_mnist_pathological.yaml]
           [--rounds 4] [--data-dir ../shared/data] [--eval-also ditto fedrep] [-s key=value ...]
Writes benchmarks/out/ala_overhead.json (and prints its summary).
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


class FitClock:
    """Wraps a transport's `fit` (the clients' side of a round) to count its CPU seconds."""

    def __init__(self, transport) -> None:
        self.real = transport.fit
        self.cpu = 0.0
        transport.fit = self

    def __call__(self, *args, **kwargs):
        replies = iter(self.real(*args, **kwargs))
        while True:
            c = time.process_time()
            try:
                reply = next(replies)
            except StopIteration:
                self.cpu += time.process_time() - c
                return
            self.cpu += time.process_time() - c
            yield reply

    def take(self) -> float:
        out, self.cpu = self.cpu, 0.0
        return out


def timed(fn, *args):
    t, c = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - t, time.process_time() - c


def build(overrides: list[str], config: str, rounds: int, data_dir: str):
    cfg = load_config(
        config,
        [
            f"data.dir={data_dir}",
            *overrides,
            f"train.rounds={rounds}",
            "train.threads=1",
            "train.workers=1",
        ],
    )
    torch.set_num_threads(1)
    sim = simulate(prepare(cfg))
    return sim, FitClock(sim.transport)


def run_round(sim, fit_clock: FitClock, ala_clock: AlaClock, r: int) -> dict:
    """One round, split into its phases, then its evaluation (with and without generalization)."""
    before = (sim.progress.up_bytes, sim.progress.down_bytes)
    ala_clock.take()
    fit_clock.take()
    _, wall, cpu = timed(sim.run_round, r)
    train_cpu = fit_clock.take()
    ala_s, ala_cpu, metrics = ala_clock.take()
    evaluator = sim.evaluation.evaluator
    scores, eval_wall, eval_cpu = timed(sim.evaluate, r)
    generalization, evaluator.generalization = evaluator.generalization, False
    try:
        _, pers_wall, pers_cpu = timed(sim.evaluate, r)
    finally:
        evaluator.generalization = generalization
    epochs = [m["ala_epochs"] for m in metrics if m]
    return {
        "round": r,
        "round_s": wall,
        "round_cpu_s": cpu,
        "train_cpu_s": train_cpu,
        "aggregate_cpu_s": cpu - train_cpu,
        "ala_s": ala_s,
        "ala_cpu_s": ala_cpu,
        "eval_s": eval_wall,
        "eval_cpu_s": eval_cpu,
        "eval_generalization": generalization,
        "eval_pers_s": pers_wall,
        "eval_pers_cpu_s": pers_cpu,
        "personalization_acc": scores["personalization"]["acc"],
        "ala_clients": len(epochs),
        "ala_start_clients": sum(1 for m in metrics if m and m["ala_start"]),
        "ala_epochs_mean": statistics.fmean(epochs) if epochs else 0.0,
        "ala_epochs_max": max(epochs) if epochs else 0.0,
        "ala_weights": next((m["ala_weights"] for m in metrics if m), 0.0),
        "up_bytes": sim.progress.up_bytes - before[0],
        "down_bytes": sim.progress.down_bytes - before[1],
    }


def measure(base: list[str], config: str, rounds: int, data_dir: str) -> tuple[dict, dict]:
    """FedAvg and FedAvg + ALA, round by round in turn."""
    sims = {
        "fedavg": build(base, config, rounds, data_dir),
        "fedavg_ala": build([*base, "algorithm.ala.enabled=true"], config, rounds, data_dir),
    }
    rows: dict[str, list[dict]] = {name: [] for name in sims}
    clock = AlaClock()
    ala_module.adapt = clock
    try:
        for r in range(1, rounds + 1):
            for name, (sim, fit_clock) in sims.items():
                rows[name].append(run_round(sim, fit_clock, clock, r))
    finally:
        ala_module.adapt = clock.real
    plain, ala = (
        {"algorithm": sims[name][0].algorithm.name, "per_round": rows[name]} for name in sims
    )
    return plain, ala


def eval_also(names: list[str], base: list[str], config: str, data_dir: str) -> dict:
    """Evaluation cost of other methods after one round of training (their models differ)."""
    out = {}
    for name in names:
        sim, fit_clock = build([*base, f"algorithm.name={name}"], config, 1, data_dir)
        row = run_round(sim, fit_clock, AlaClock(), 1)
        out[name] = {k: row[k] for k in row if k.startswith(("eval", "train", "round"))}
    return out


def _mean(rows: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in rows) if rows else float("nan")


def compare(plain: dict, ala: dict) -> dict:
    """Each phase's cost: round 1 (no ALA), round 2 (start phase), rounds 3+ (one W epoch)."""
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

        def ratio(key: str, p=p, a=a) -> float:
            return _mean(a, key) / _mean(p, key)

        out[phase] = {
            "fedavg_train_cpu_s": _mean(p, "train_cpu_s"),
            "ala_train_cpu_s": _mean(a, "train_cpu_s"),
            "train_ratio": ratio("train_cpu_s"),
            "inside_ala_cpu_s": _mean(a, "ala_cpu_s"),
            "ala_epochs_mean": _mean(a, "ala_epochs_mean"),
            "fedavg_aggregate_cpu_s": _mean(p, "aggregate_cpu_s"),
            "ala_aggregate_cpu_s": _mean(a, "aggregate_cpu_s"),
            "fedavg_round_cpu_s": _mean(p, "round_cpu_s"),
            "ala_round_cpu_s": _mean(a, "round_cpu_s"),
            "round_ratio": ratio("round_cpu_s"),
            "fedavg_eval_cpu_s": _mean(p, "eval_cpu_s"),
            "ala_eval_cpu_s": _mean(a, "eval_cpu_s"),
            "eval_ratio": ratio("eval_cpu_s"),
            "fedavg_eval_pers_cpu_s": _mean(p, "eval_pers_cpu_s"),
            "ala_eval_pers_cpu_s": _mean(a, "eval_pers_cpu_s"),
            "evaluated_round_ratio": (_mean(a, "round_cpu_s") + _mean(a, "eval_cpu_s"))
            / (_mean(p, "round_cpu_s") + _mean(p, "eval_cpu_s")),
            "fedavg_round_wall_s": _mean(p, "round_s"),
            "ala_round_wall_s": _mean(a, "round_s"),
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
        "--eval-also",
        nargs="*",
        default=[],
        metavar="ALGORITHM",
        help="also time the evaluation of these methods after one round (e.g. ditto fedrep)",
    )
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
    base = ["algorithm.name=fedavg", *args.overrides]
    plain, ala = measure(base, args.config, args.rounds, args.data_dir)
    summary = compare(plain, ala)
    if args.eval_also:
        summary["eval_also_after_round_1"] = eval_also(
            args.eval_also, args.overrides, args.config, args.data_dir
        )
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
        "summary": summary,
        "fedavg": plain,
        "fedavg_ala": ala,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
