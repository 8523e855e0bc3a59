"""Every algorithm on the GPU path: a short run on real data on `cuda` and on `cpu`, side by side.

CI has no GPU, so this is how the CUDA path is checked when a machine with one is at hand:
each registered algorithm runs ROUNDS rounds on UCI-HAR natural clients (4 clients a round,
`mlp`; `fedbn` on `cnn1dbn`; `fedali` on `hart` with small ALP banks) on both devices with the
same config and seed. A run that raises, or scores a non-finite value, fails. The two devices
do not give bit-identical numbers (different kernels, non-deterministic reductions on CUDA),
so the difference in personalization accuracy is reported, not asserted.

Usage: python benchmarks/gpu_smoke.py [--data-dir ../shared/data] [--rounds 3] [--out FILE] [--only NAME ...]
Writes benchmarks/out/gpu_smoke.json (or --out) and exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

import torch

from protofed.algorithms import ALGORITHMS
from protofed.config import load_config
from protofed.runtime import prepare, simulate

MODEL = {
    "fedbn": ["model.name=cnn1dbn"],
    "fedali": [
        "model.name=hart",
        "model.alp.enabled=true",
        "model.alp.prototypes=[32]",
        "train.optimizer=adam",
        "train.lr=0.001",
    ],
    "fedhome": ["model.name=mlp", "model.hidden=[64]", "algorithm.finetune_rounds=1"],
}


def run(name: str, device: str, data_dir: str, rounds: int) -> dict:
    cfg = load_config(
        None,
        [
            f"data.dir={data_dir}",
            "data.name=uci_har",
            "data.partition=natural",
            *MODEL.get(name, ["model.name=mlp", "model.hidden=[64]"]),
            f"train.rounds={rounds}",
            "train.clients_per_round=4",
            "train.local_epochs=1",
            "train.batch_size=32",
            "train.lr=0.05",
            "train.threads=1",
            f"eval.every={rounds}",
            "eval.generalization=false",
            f"algorithm.name={name}",
            f"train.device={device}",
        ],
    )
    t0 = time.perf_counter()
    summary = simulate(prepare(cfg)).run().to_json()
    final = summary["final"]
    acc = final["personalization"]["acc"]
    glob = final["global"]["acc"] if final["global"] else None
    if not math.isfinite(acc) or (glob is not None and not math.isfinite(glob)):
        raise RuntimeError(f"non-finite score: personalization {acc}, global {glob}")
    return {"pers_acc": acc, "global_acc": glob, "seconds": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/out/gpu_smoke.json")
    parser.add_argument("--only", nargs="*", default=None, help="these algorithms (default: all)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA device here: this benchmark checks the GPU path")
    torch.set_num_threads(1)
    results: dict[str, dict] = {}
    for name in args.only or sorted(ALGORITHMS):
        row: dict = {}
        for device in ("cuda", "cpu"):
            try:
                row[device] = run(name, device, args.data_dir, args.rounds)
            except Exception as exc:  # report every algorithm, then fail
                row[device] = {
                    "error": f"{type(exc).__name__}: {exc}",
                    "trace": traceback.format_exc(limit=3),
                }
        if "pers_acc" in row["cuda"] and "pers_acc" in row["cpu"]:
            row["pers_acc_diff"] = row["cuda"]["pers_acc"] - row["cpu"]["pers_acc"]
        results[name] = row
        status = "ok" if "pers_acc_diff" in row else "FAILED"
        print(
            f"{name:12s} {status:6s} "
            + " ".join(
                f"{d}: {row[d].get('pers_acc', row[d].get('error'))}" for d in ("cuda", "cpu")
            ),
            flush=True,
        )
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rounds": args.rounds,
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    failed = [n for n, r in results.items() if "pers_acc_diff" not in r]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
