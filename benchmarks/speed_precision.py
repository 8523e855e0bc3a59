"""Seconds per round and final scores, train.precision fp32 against bf16.

Two works on UCI-HAR natural clients, FedAvg, one process with one thread (`train.threads=1`,
`train.workers=1`), the variants interleaved repeat by repeat in one sitting, medians:
  pfllib_harcnn_b10: PFLlib's HAR work (harcnn, 9 channels, SGD 0.005, batch 10, 30 clients,
      see speed_fedavg_uci_har.py). fp32 takes the autograd-free path (training/fused.py),
      bf16 the autograd loop, so fp32 with `train.fused=false` (the same loop in fp32) is
      measured too: bf16 against it is the cost of autocast alone.
  hart_fedavg: HART, the FedAli backbone (configs/fedali_uci_har_natural.yaml's data and
      training: 6 channels, Adam 1e-4, batch 64) with FedAvg and no ALP layers, 1 local epoch
      and 10 clients a round, so that a round takes seconds, not minutes, on a CPU.
Scores are the last round's (evaluated once, at the end): global accuracy and macro F1, and
the mean personalization F1.

On `--device cuda` bf16 autocasts on the GPU (the fused step is CPU-only, so fp32 and
fp32_autograd are the same loop there).

Usage: python benchmarks/speed_precision.py [--rounds 3] [--repeats 2] [--data-dir ../shared/data]
       [--only pfllib_harcnn_b10|hart_fedavg] [--device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from protofed.config import load_config
from protofed.runtime import prepare, simulate

ROOT = Path(__file__).resolve().parents[1]
WORKS = {
    "pfllib_harcnn_b10": (
        None,
        [
            "data.name=uci_har",
            "data.partition=natural",
            "algorithm.name=fedavg",
            "model.name=harcnn",
            "data.channels=all",
            "data.predefined_split=true",
            "data.split=[0.75,0,0.25]",
            "train.optimizer=sgd",
            "train.momentum=0",  # PFLlib's plain SGD (UCI-HAR's data-set default is 0.9)
            "train.lr=0.005",
            "train.batch_size=10",
            "train.local_epochs=1",
            "train.client_fraction=1.0",
        ],
        {
            "fp32": ["train.precision=fp32"],
            "fp32_autograd": ["train.precision=fp32", "train.fused=false"],
            "bf16": ["train.precision=bf16"],
        },
    ),
    "hart_fedavg": (
        str(ROOT / "configs" / "fedali_uci_har_natural.yaml"),
        [
            "algorithm.name=fedavg",
            "model.alp.enabled=false",
            "train.local_epochs=1",
            "train.clients_per_round=10",
        ],
        {"fp32": ["train.precision=fp32"], "bf16": ["train.precision=bf16"]},
    ),
}


def measure(
    path: str | None, overrides: list[str], rounds: int, data_dir: str, device: str = "cpu"
) -> dict:
    cfg = load_config(
        path,
        [
            *overrides,
            f"train.rounds={rounds}",
            f"data.dir={data_dir}",
            f"train.device={device}",
            "train.threads=1",
            "train.workers=1",
            f"eval.every={rounds}",
        ],
    )
    sim = simulate(prepare(cfg))
    train_s: list[float] = []
    eval_s: list[float] = []

    def on_round(r, info, record):
        train_s.append(info.train_s + info.guard_s + info.aggregate_s)
        if record:
            eval_s.append(record.time.eval_s)

    summary = sim.run(on_round=on_round).to_json()
    final = summary["final"]
    return {
        "train_s": statistics.median(train_s),
        "eval_s": sum(eval_s),
        "global_acc": final["global"]["acc"],
        "global_f1": final["global"]["f1"],
        "pers_f1": final["personalization"]["f1"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--only", choices=sorted(WORKS), default=None)
    ap.add_argument("--device", default="cpu", help="train.device: cpu or cuda")
    args = ap.parse_args()
    for work, (path, base, variants) in WORKS.items():
        if args.only and work != args.only:
            continue
        runs: dict[str, list[dict]] = {k: [] for k in variants}
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            for name, extra in variants.items():
                res = measure(path, [*base, *extra], args.rounds, args.data_dir, args.device)
                runs[name].append(res)
                print(f"  {work} {name}: {res}", flush=True)
        took = time.perf_counter() - t0
        ref = statistics.median(r["train_s"] for r in runs["fp32"])
        print(f"\n{work}  (train s/round: median over {args.repeats} interleaved repeats of the")
        print(f"median of {args.rounds} rounds; {args.device}, threads=1, workers=1; {took:.0f} s)")
        print(
            f"{'precision':<15}{'s/round':>9}{'x fp32':>8}{'eval s':>8}"
            f"{'glob acc':>10}{'glob F1':>9}{'pers F1':>9}"
        )
        for name, rs in runs.items():
            m = statistics.median(r["train_s"] for r in rs)
            last = rs[-1]  # scores are the same every repeat (seeded)
            print(
                f"{name:<15}{m:>9.3f}{m / ref:>8.2f}{statistics.median(r['eval_s'] for r in rs):>8.2f}"
                f"{last['global_acc']:>10.4f}{last['global_f1']:>9.4f}{last['pers_f1']:>9.4f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
