"""How long one epoch of FedAli's MAE pre-training takes (docs/pretraining.md).

The paper's HART (6 blocks, d = 192, ALP banks 2048 ... 64) on the pooled windows of the HAR
sets other than the target, batch 64, AdamW: times `--steps` optimizer steps after two
warm-up steps, reports the median step and the epoch it implies, and with `--full` times a
whole epoch too.

    .venv/bin/python benchmarks/pretrain_epoch.py --data-dir ../shared/data --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from protofed.config import load_config
from protofed.training.pretrain import Pretraining


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/fedali_hhar_natural.yaml")
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--full", action="store_true", help="also time one whole epoch")
    parser.add_argument("--alp", default="true", help="model.alp.enabled")
    args = parser.parse_args()
    cfg = load_config(
        args.config,
        [
            f"data.dir={args.data_dir}",
            f"train.threads={args.threads}",
            f"model.alp.enabled={args.alp}",
            "pretrain.epochs=1",
        ],
    )
    job = Pretraining.build(cfg)
    print(job.describe())
    x, bs = job.pool.x, cfg.pretrain.batch_size
    steps_per_epoch = -(-len(x) // bs)
    job.mae.train()
    times = []
    for step in range(args.steps + 2):
        batch = x[torch.randint(len(x), (bs,))]
        start = time.perf_counter()
        loss = job.mae(batch)
        job.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        job.optimizer.step()
        if step >= 2:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    rows = [
        ("windows", f"{len(x)}"),
        ("steps per epoch (batch 64)", f"{steps_per_epoch}"),
        (f"median step over {args.steps} (s)", f"{median:.3f}"),
        ("min / max step (s)", f"{min(times):.3f} / {max(times):.3f}"),
        ("implied epoch (s)", f"{median * steps_per_epoch:.0f}"),
    ]
    if args.full:
        start = time.perf_counter()
        job.run()
        rows.append(("measured epoch (s)", f"{time.perf_counter() - start:.0f}"))
    width = max(len(k) for k, _ in rows)
    print(f"threads {torch.get_num_threads()}, ALP {cfg.model.alp.enabled}")
    for key, value in rows:
        print(f"{key:<{width}}  {value:>10}")


if __name__ == "__main__":
    main()
