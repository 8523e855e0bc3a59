"""Seconds per round and client updates per second, FedAvg on UCI-HAR natural clients.

Two configurations (the core speed criterion):
  a) cnn1d on the 6 default channels, batch 64, SGD, 1 local epoch;
  b) the exact work of a PFLlib measurement on this machine class: all 9 channels, `harcnn`
     (2.25 M parameters), SGD lr 0.005, batch 10, 1 local epoch, 30 clients, evaluation every
     round. PFLlib: 6.7 s per round (4.4 s training, 2.2 s evaluation), 63 % after 50 rounds.

Usage: python benchmarks/speed_fedavg_uci_har.py [--rounds 50] [--data-dir ../shared/data] [--seed 0]
Writes benchmarks/out/speed_fedavg_uci_har.json (and prints it).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from protofed.config import load_config
from protofed.runtime import prepare, simulate

CONFIGS = {
    "a_cnn1d_6ch_b64": [
        "model.name=cnn1d",
        "data.channels=default",
        "train.batch_size=64",
        "train.lr=0.05",
    ],
    "b_harcnn_9ch_b10_pfllib": [
        "model.name=harcnn",
        "data.channels=all",
        "train.batch_size=10",
        "train.lr=0.005",
        "train.momentum=0",  # PFLlib's torch.optim.SGD(lr): no momentum
        "data.predefined_split=true",
        "data.split=[0.75,0,0.25]",  # PFLlib's 75/25 per subject
    ],
}
COMMON = [
    "data.name=uci_har",
    "data.partition=natural",
    "algorithm.name=fedavg",
    "train.optimizer=sgd",
    "train.local_epochs=1",
    "train.client_fraction=1.0",
    "eval.every=1",
    "train.workers=2",
]


def measure(name: str, overrides: list[str], rounds: int, data_dir: str, seed: int = 0) -> dict:
    cfg = load_config(
        None,
        [*COMMON, *overrides, f"train.rounds={rounds}", f"data.dir={data_dir}", f"seed={seed}"],
    )
    t0 = time.perf_counter()
    sim = simulate(prepare(cfg))
    setup_s = time.perf_counter() - t0
    per_round = []
    last = [0.0]

    def on_round(r, info, record):
        now = time.perf_counter()
        per_round.append(
            {
                "round": r,
                "wall_s": now - last[0],
                "train_s": info.train_s + info.guard_s + info.aggregate_s,
                "eval_s": record.time.eval_s if record else 0.0,
                "acc": record.global_.acc if record and record.global_ else None,
            }
        )
        last[0] = now

    last[0] = time.perf_counter()
    summary = sim.run(on_round=on_round).to_json()
    n = len(per_round)
    train_s = sum(p["train_s"] for p in per_round) / n
    eval_s = sum(p["eval_s"] for p in per_round) / n
    return {
        "config": name,
        "seed": seed,
        "rounds": rounds,
        "setup_s": setup_s,
        "seconds_per_round": train_s + eval_s,
        "train_s_per_round": train_s,
        "eval_s_per_round": eval_s,
        "client_updates_per_s": summary["time"]["client_updates_per_s"],
        "final_global_acc": summary["final"]["global"]["acc"],
        "final_personalization_acc": summary["final"]["personalization"]["acc"],
        "accuracy_by_round": [p["acc"] for p in per_round],
        # wall clock from the end of one round to the end of the next: everything a round does
        "round_wall_s": [p["wall_s"] for p in per_round],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument(
        "--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data")
    )
    ap.add_argument("--only", choices=sorted(CONFIGS), default=None)
    ap.add_argument(
        "--seed", type=int, default=0, help="the config's seed (data split, init, batches)"
    )
    ap.add_argument(
        "--out", default=str(Path(__file__).parent / "out" / "speed_fedavg_uci_har.json")
    )
    args = ap.parse_args()
    results = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "pfllib_reference": {
            "seconds_per_round": 6.7,
            "train_s": 4.4,
            "eval_s": 2.2,
            "acc_after_50": 0.63,
        },
        "runs": [],
    }
    for name, overrides in CONFIGS.items():
        if args.only and name != args.only:
            continue
        res = measure(name, overrides, args.rounds, args.data_dir, args.seed)
        results["runs"].append(res)
        print(
            json.dumps(
                {k: v for k, v in res.items() if k not in ("accuracy_by_round", "round_wall_s")}
            ),
            flush=True,
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
