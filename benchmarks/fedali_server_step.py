"""FedAli's server step (K-means of the clients' local prototypes) on real rounds.

Runs FedAli on UCI-HAR (configs/fedali_uci_har_natural.yaml: 30 natural clients, HART with
ALP layers of 2048 ... 64 prototypes; here 1 local epoch, `train.threads=1`, evaluation every
round) twice with the same seed: once with `algorithm.kmeans_backend=sklearn` (the float64
reference), once with `torch` (`protofed.prototypes.lloyd`). It prints:

1. the per-round split of each run: client training, server step (of which K-means) and
   evaluation, seconds, and the K-means share of the round;
2. the agreement table: in the sklearn run, every ALP layer's K-means is also run with the
   torch backend on the very same banks (alternated, so the machine's load hits both):
   seconds of each, inertia ratio torch / sklearn, mean and max distance of matched
   centroids (same start, so centroid j of one run is matched to centroid j of the other),
   label agreement;
3. the downstream scores of both runs per round (personalized and global macro F1).

Usage: python benchmarks/fedali_server_step.py [--rounds 3] [--data-dir ../shared/data]
Writes benchmarks/out/fedali_server_step.json (or --out). The rest of FedAli's overhead
(training time, memory, bytes against FedAvg) is experiments/scripts/fedali_overhead.py.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from protofed.algorithms import fedali
from protofed.config import load_config
from protofed.core.results import RoundInfo, RoundRecord
from protofed.prototypes import kmeans
from protofed.runtime import prepare, simulate

CONFIG = "configs/fedali_uci_har_natural.yaml"


def agreement(points: torch.Tensor, k: int, **kw) -> tuple[tuple, dict]:
    """scikit-learn's and torch's K-means on the same points; returns sklearn's result."""
    t0 = time.perf_counter()
    ref = kmeans(points, k, backend="sklearn", **{n: v for n, v in kw.items() if n != "backend"})
    t1 = time.perf_counter()
    new = kmeans(points, k, **{**kw, "backend": "torch"})
    t2 = time.perf_counter()
    x = points.double()

    def inertia(result: tuple) -> float:
        centroids, labels = result
        return float(((x - centroids.double()[labels]) ** 2).sum())

    gap = (ref[0].double() - new[0].double()).norm(dim=1)
    row = {
        "k": k,
        "points": len(points),
        "sklearn_s": t1 - t0,
        "torch_s": t2 - t1,
        "inertia_ratio": inertia(new) / inertia(ref),
        "centroid_dist_mean": float(gap.mean()),
        "centroid_dist_max": float(gap.max()),
        "centroid_norm_mean": float(ref[0].double().norm(dim=1).mean()),
        "label_agreement": float((ref[1] == new[1]).double().mean()),
    }
    return ref, row


def run(backend: str, rounds: int, data_dir: str, seed: int) -> dict:
    """One FedAli run; per round: the time split, the scores, the K-means calls."""
    calls: list[dict] = []

    def timed(points: torch.Tensor, k: int, **kw):
        if backend == "sklearn":  # the reference run also measures the torch backend
            result, row = agreement(points, k, **kw)
        else:
            t0 = time.perf_counter()
            result = kmeans(points, k, **kw)
            row = {"k": k, "points": len(points), "torch_s": time.perf_counter() - t0}
        calls.append(row)
        return result

    cfg = load_config(
        CONFIG,
        [
            f"data.dir={data_dir}",
            f"seed={seed}",
            f"train.rounds={rounds}",
            "train.local_epochs=1",
            "train.threads=1",
            "eval.every=1",
            f"algorithm.kmeans_backend={backend}",
        ],
    )
    per_round: list[dict] = []

    def on_round(r: int, info: RoundInfo, record: RoundRecord | None) -> None:
        calls_of_round = [c for c in calls if "round" not in c]
        for c in calls_of_round:
            c["round"] = r
        own = "sklearn_s" if backend == "sklearn" else "torch_s"
        per_round.append(
            {
                "round": r,
                "train_s": info.train_s,
                "server_s": info.aggregate_s,
                "kmeans_s": sum(c[own] for c in calls_of_round),
                "eval_s": record.time.eval_s if record else 0.0,
                "pers_f1": record.personalization.f1 if record else None,
                "global_f1": record.global_.f1 if record and record.global_ else None,
            }
        )

    original = fedali.kmeans
    fedali.kmeans = timed
    try:
        simulate(prepare(cfg)).run(on_round=on_round)
    finally:
        fedali.kmeans = original
    return {"backend": backend, "rounds": per_round, "kmeans_calls": calls}


def print_tables(results: dict) -> None:
    print("\nper-round split (s): client training | server step (K-means) | evaluation")
    print(
        f"{'backend':8} {'round':>5} {'train':>7} {'server':>7} {'kmeans':>7} {'eval':>6} "
        f"{'server %':>8} {'pers F1':>8} {'global F1':>9}"
    )
    for res in results["runs"]:
        for p in res["rounds"]:
            total = p["train_s"] + p["server_s"] + p["eval_s"]
            gf1 = "-" if p["global_f1"] is None else f"{p['global_f1']:.4f}"
            print(
                f"{res['backend']:8} {p['round']:5d} {p['train_s']:7.1f} {p['server_s']:7.1f} "
                f"{p['kmeans_s']:7.2f} {p['eval_s']:6.1f} {100 * p['server_s'] / total:7.1f}% "
                f"{p['pers_f1']:8.4f} {gf1:>9}"
            )
    print("\nagreement on the reference run's banks (same start; torch vs sklearn float64)")
    print(
        f"{'round':>5} {'k':>5} {'points':>6} {'sklearn s':>9} {'torch s':>8} {'speedup':>7} "
        f"{'inertia ratio':>13} {'mean dist':>9} {'max dist':>9} {'|c| mean':>8} {'labels':>7}"
    )
    for c in results["runs"][0]["kmeans_calls"]:
        print(
            f"{c['round']:5d} {c['k']:5d} {c['points']:6d} {c['sklearn_s']:9.2f} "
            f"{c['torch_s']:8.3f} {c['sklearn_s'] / c['torch_s']:7.1f} "
            f"{c['inertia_ratio']:13.7f} {c['centroid_dist_mean']:9.2e} "
            f"{c['centroid_dist_max']:9.2e} {c['centroid_norm_mean']:8.2f} "
            f"{c['label_agreement']:7.4f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/out/fedali_server_step.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {
        "config": CONFIG,
        "machine": platform.processor() or platform.machine(),
        "torch_threads": 1,
        "rounds": args.rounds,
        "seed": args.seed,
        "runs": [run(b, args.rounds, args.data_dir, args.seed) for b in ("sklearn", "torch")],
    }
    ref, new = results["runs"]
    share = lambda res: statistics.median(  # noqa: E731
        p["server_s"] / (p["train_s"] + p["server_s"] + p["eval_s"]) for p in res["rounds"]
    )
    results["median_server_share"] = {"sklearn": share(ref), "torch": share(new)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print_tables(results)
    print(
        f"\nmedian server share of a round: sklearn {100 * share(ref):.1f} %, "
        f"torch {100 * share(new):.1f} %"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
