"""Where a round's time goes, for the recipes people run (README: Where a round's time goes).

For fedavg, ditto, fedproto and fedala (configs/uci_har_natural.yaml: cnn1d, SGD momentum 0.9,
2 local epochs) and fedali (configs/fedali_uci_har_natural.yaml: HART with ALP layers, Adam,
here 1 local epoch) on UCI-HAR natural clients (30), every client every round, FedAvg on
PFLlib's HAR work (`fedavg_harcnn`: HARCNN, as benchmarks/pfllib_side_by_side.py), and FedDPA on
100 CIFAR-10 clients (configs/feddpa_cifar10_dirichlet0.3.yaml, 10 % a round), evaluation
every round: seconds per round split as metrics.jsonl splits them (medians over the rounds
after the first, which pays for the worker pool's start), rounds per hour with the recipe's
own `eval.every`, and the ratio of the training time to the model's FLOP floor on this
machine.

The split (`RoundTime`, in the process that runs the loop): `train_s`, waiting for and
receiving the clients' replies; `guard_s`, the non-finite checks of every reply and of the
aggregated state (`guard_share`: its part of a round); `aggregate_s`, the algorithm's own
aggregation; `eval_s`. With workers, the clients train while this process checks and
aggregates. The checkpoint (`RunDir.save_checkpoint`: digest, save, fsync; outside the
round's split, written after it; one every round here) is timed by wrapping it:
`checkpoint_s` (per round), `checkpoint_share`.

The floor is FLOPs / peak. FLOPs per round = the forward-and-backward FLOPs of one training
sample (counted by torch's FlopCounterMode on a batch of the run's size) x the samples a
round trains on (every client's train split x local epochs x the models each sample trains:
2 for Ditto's global and personal models). Peak = float32 matmul throughput (2048 x 2048,
one thread, as each worker has) measured in the same process x the run's workers. A ratio
of 1 would be training at the speed of a large matmul; small models and batches stay far
from it, and that distance is what a faster engine could still win.

On `--device cuda` the run trains in one process and the peak is the GPU's float32 matmul
(8192 x 8192, TF32 off).

Usage: python benchmarks/round_costs.py [--rounds 3] [--data-dir ../shared/data] [--only fedavg,...]
       [--device cuda] [--out benchmarks/out/round_costs.json]
Writes benchmarks/out/round_costs.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

import protofed
from protofed.api import resolve_config
from protofed.nn import linear
from protofed.runs import RunDir
from protofed.runtime import prepare

ROOT = Path(__file__).resolve().parents[1]
UCI = ROOT / "configs" / "uci_har_natural.yaml"
FEDALI = ROOT / "configs" / "fedali_uci_har_natural.yaml"
FEDDPA = ROOT / "configs" / "feddpa_cifar10_dirichlet0.3.yaml"

RECIPES: dict[str, tuple[Path, dict, int | None]] = {
    # name: (config, overrides, models trained per sample; None: no single count, no floor)
    "fedavg": (UCI, {"algorithm.name": "fedavg"}, 1),
    "ditto": (UCI, {"algorithm.name": "ditto"}, 2),
    "fedproto": (UCI, {"algorithm.name": "fedproto"}, 1),
    "fedala": (UCI, {"algorithm.name": "fedala"}, 1),
    "fedali": (FEDALI, {"train.local_epochs": 1}, 1),
    # PFLlib's HAR work (benchmarks/pfllib_side_by_side.py): HARCNN (2.25 M parameters, the
    # largest reply here: what the non-finite guard scans), all 9 channels, SGD without
    # momentum, lr 0.005, batch 10, 1 local epoch, the per-subject 75/25 split
    "fedavg_harcnn": (
        UCI,
        {
            "algorithm.name": "fedavg",
            "model.name": "harcnn",
            "data.channels": "all",
            "train.batch_size": 10,
            "train.lr": 0.005,
            "train.momentum": 0.0,
            "train.local_epochs": 1,
            "data.predefined_split": True,
            "data.split": [0.75, 0, 0.25],
        },
        1,
    ),
    # FedDPA's setting: 100 CIFAR-10 clients, 10 % a round, 5 local epochs, scored every 5th
    "feddpa_cifar10": (FEDDPA, {}, 1),
    # the same 100 clients with personalized models and protofed's default protocol (the
    # FedDPA config turns generalization off): FedRep's clients share the body (10 head
    # epochs, body frozen, then the body's epochs), Ditto's models are whole
    "fedrep_cifar10": (FEDDPA, {"algorithm.name": "fedrep", "eval.generalization": True}, None),
    "ditto_cifar10": (FEDDPA, {"algorithm.name": "ditto", "eval.generalization": True}, 2),
}


def peak_flops(size: int = 2048, repeats: int = 5, device: str = "cpu") -> float:
    """Float32 matmul FLOP/s, the best of `repeats`: one thread on the CPU, the whole GPU on
    cuda (a product 4x larger, TF32 off)."""
    gpu = device != "cpu"
    size = 4 * size if gpu else size  # a GPU needs a large product to reach its peak
    threads, tf32 = torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32
    torch.set_num_threads(threads if gpu else 1)
    torch.backends.cuda.matmul.allow_tf32 = False

    def product() -> None:
        a @ b
        if gpu:
            torch.cuda.synchronize(device)

    try:
        a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
        product()  # warm up
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            product()
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return 2 * size**3 / best


def flops_per_sample(cfg) -> tuple[float, int]:
    """Forward + backward FLOPs of one training sample, and the samples a round trains on."""
    prepared = prepare(cfg)
    model = prepared.model
    client = prepared.fed.clients[0]
    batch = min(cfg.train.batch_size, len(client.train_y))
    x, y = client.train_x[:batch], client.train_y[:batch]
    # FlopCounterMode does not see oneDNN's fused linear op (protofed.nn.linear), so the
    # count runs the same products on torch's own kernels: FedAli's ALP cosine products and
    # GLUs were missed (483 instead of 728 GFLOP a round on UCI-HAR) while oneDNN was in use
    counter = FlopCounterMode(display=False)
    with linear.onednn_products(False), counter:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
    samples = sum(len(c.train_y) for c in prepared.fed.clients)
    return counter.get_total_flops() / batch, samples * cfg.train.local_epochs


@contextlib.contextmanager
def timed(owner, name: str):
    """Time every call of `owner.name` (a function or a method) while the block runs; yields
    the list of call durations."""
    calls: list[float] = []
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            calls.append(time.perf_counter() - t0)

    setattr(owner, name, wrapper)
    try:
        yield calls
    finally:
        setattr(owner, name, original)


def measure(name: str, rounds: int, data_dir: str, workers: int, device: str = "cpu") -> dict:
    config, overrides, passes = RECIPES[name]
    settings = {
        **overrides,
        "train.rounds": rounds,
        "train.workers": workers,
        "train.threads": 1,
        "eval.every": 1,
        "data.dir": data_dir,
        "train.device": device,
        "train.checkpoint_every": 1,  # every round's write timed (auto would skip some)
    }
    cfg = resolve_config(str(config), **settings)
    every = resolve_config(str(config)).eval.every  # the recipe's own, for rounds per hour
    per_sample, samples = flops_per_sample(cfg)
    samples *= cfg.train.client_fraction  # the clients a round samples, in expectation
    with (
        tempfile.TemporaryDirectory() as out,
        timed(RunDir, "save_checkpoint") as checkpoint_calls,
    ):
        run = protofed.run(cfg, out=Path(out) / name, overwrite=True)
        records = list(run.dir.history())
    later = records[1:] or records  # round 1 also starts the worker pool
    split = {
        key: statistics.median(r["time"].get(key, 0.0) for r in later)
        for key in ("train_s", "guard_s", "aggregate_s", "eval_s")
    }
    round_flops = per_sample * samples * passes if passes else float("nan")
    # a GPU run trains in one process (train.workers is ignored there)
    peak = peak_flops() * workers if device == "cpu" else peak_flops(device=device)
    return {
        "algorithm": name,
        "device": device,
        "model": cfg.model.name,
        "optimizer": cfg.train.optimizer,
        "local_epochs": cfg.train.local_epochs,
        "rounds": rounds,
        **split,
        "eval_share": split["eval_s"] / sum(split.values()),
        "guard_share": split["guard_s"] / sum(split.values()),
        # one checkpoint a round (digest, torch.save, fsync): what one write costs
        "checkpoint_s": sum(checkpoint_calls) / rounds,
        "checkpoint_share": sum(checkpoint_calls) / rounds / sum(split.values()),
        "round_s": sum(split.values()),
        "rounds_per_hour": 3600
        / (split["train_s"] + split["guard_s"] + split["aggregate_s"] + split["eval_s"] / every),
        "eval_every": every,
        "gflop_per_round": round_flops / 1e9,
        "peak_gflops": peak / 1e9,
        "floor_s": round_flops / peak,
        "train_over_floor": split["train_s"] / (round_flops / peak),
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| recipe | model | train s | guard ms | aggregate s | eval s | round s | rounds/h"
        " | GFLOP/round | x floor | eval share | guard share | checkpoint s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['algorithm']} | {r['model']} | {r['train_s']:.2f} | "
            f"{1e3 * r['guard_s']:.1f} | {r['aggregate_s']:.2f} | "
            f"{r['eval_s']:.2f} | {r['round_s']:.2f} | {r['rounds_per_hour']:.0f} | "
            f"{r['gflop_per_round']:.1f} | "
            f"{r['train_over_floor']:.1f} | {100 * r['eval_share']:.0f} % | "
            f"{100 * r['guard_share']:.1f} % | {r['checkpoint_s']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", default=",".join(RECIPES))
    parser.add_argument("--device", default="cpu", help="train.device: cpu or cuda")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "round_costs.json"))
    args = parser.parse_args()
    rows = [
        measure(name, args.rounds, args.data_dir, args.workers, args.device)
        for name in args.only.split(",")
    ]
    result = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "gpu": torch.cuda.get_device_name() if args.device != "cpu" else None,
            "torch": torch.__version__,
        },
        "workers": args.workers if args.device == "cpu" else None,  # one process on a GPU
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(table(rows))


if __name__ == "__main__":
    main()
