"""A round's clients stacked against one client at a time: seconds a round, client-steps a
second and the fraction of the device's fp32 peak, in one run (issue: a round's clients
trained together on one GPU).

Usage:
  python benchmarks/gpu_throughput.py [--device cuda|cpu] [--rounds 5] [--quick]
                                      [--only fedavg_har fedali_hart fedavg_cifar10_100]
                                      [--peak-tflops T] [--profile] [--data-dir ../shared/data]
                                      [--out FILE]

The works:
  fedavg_har          PFLlib's HAR work: FedAvg, UCI-HAR natural clients (30 subjects, all
                      9 channels, PFLlib's 75/25 split), harcnn, plain SGD lr 0.005, batch 10,
                      1 local epoch, every client every round (benchmarks/pfllib_side_by_side.py).
  fedali_hart         FedAli on HART with ALP, configs/fedali_uci_har_natural.yaml as it is
                      (Adam 1e-4, batch 64, 5 local epochs, 30 clients a round).
  fedavg_cifar10_100  FedAvg, CIFAR-10 (the 20k subset) over 100 Dirichlet-0.3 clients, 10 a
                      round, the `cnn`, SGD lr 0.01 momentum 0.9, batch 32, 1 local epoch
                      (configs/baselines_cifar10_dirichlet.yaml with 100 clients).
Each runs with train.stacked=false (one client at a time, train.workers=1) and, where the
algorithm and model can, with train.stacked=true; where they cannot, the line says why.

What is timed, per round: the round's training (every sampled client's `fit`, through the
in-process transport) and the server's aggregation, apart; evaluation is left out. Round 1
is a warm-up (CUDA context, cuDNN's algorithm search, first vmap traces) and reported apart;
the figures are medians over rounds 2..R. On CUDA every timer synchronises the device. --profile adds one more round each way under
torch.profiler: the share of its wall time the device was busy (low: the round is bound by
launching kernels, not by computing) and the ops with the most self time (the decomposition
to read where a target is missed).
Client-steps a second: the steps the round's clients took (their replies' `steps`) over the
training seconds. The fraction of peak: the training's FLOPs (3x a forward pass per example,
the forward counted by torch.utils.flop_counter on one batch) over the training seconds, over
--peak-tflops (default: the table below for H100/H200; on other devices only if given).

--quick (a minute or two on 2 CPU cores): 2 rounds, 3 clients a round (FedAli: 1, 1 local
epoch, ALP banks cut to [64]); the numbers then describe that smaller work, and say so.
CPU numbers are CPU numbers: they say nothing of a GPU's.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from protofed.config import load_config
from protofed.core.seeding import sample_clients
from protofed.core.types import Reply
from protofed.errors import ConfigError
from protofed.runtime import prepare, simulate
from protofed.runtime.in_process import stacked_reason
from protofed.runtime.loop import RoundLoop
from protofed.runtime.prepare import clients_per_round

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"

# fp32 peaks without tensor cores (TFLOPS), from NVIDIA's data sheets
PEAK_TFLOPS = {"H200": 67.0, "H100 PCIe": 51.0, "H100 NVL": 60.0, "H100": 67.0}

WORKS: dict[str, tuple[str | None, list[str]]] = {
    "fedavg_har": (
        None,
        [
            "data.name=uci_har",
            "data.partition=natural",
            "data.channels=all",
            "data.predefined_split=true",
            "data.split=[0.75,0,0.25]",
            "model.name=harcnn",
            "algorithm.name=fedavg",
            "train.optimizer=sgd",
            "train.lr=0.005",
            "train.momentum=0.0",  # PFLlib's plain SGD (UCI-HAR's data-set default is 0.9)
            "train.batch_size=10",
            "train.local_epochs=1",
            "train.client_fraction=1.0",
        ],
    ),
    "fedali_hart": ("configs/fedali_uci_har_natural.yaml", []),
    "fedavg_cifar10_100": (
        "configs/baselines_cifar10_dirichlet.yaml",
        ["data.num_clients=100", "train.clients_per_round=10", "algorithm.name=fedavg"],
    ),
}
QUICK = {
    "fedavg_har": ["train.clients_per_round=3"],
    "fedali_hart": [
        "train.clients_per_round=1",
        "train.local_epochs=1",
        "model.alp.prototypes=[64]",
    ],
    "fedavg_cifar10_100": ["train.clients_per_round=3"],
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_tflops(device: torch.device, given: float | None) -> float | None:
    if given is not None:
        return given
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in name), None)


def flops_per_example(loop: RoundLoop) -> float:
    """Training FLOPs of one example: 3x its forward pass (forward, then two products back)."""
    p = loop.prepared
    x = p.client_data(0, 1).train_x[: p.cfg.train.batch_size]
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        p.model.train()
        p.model(x)
    return 3.0 * counter.get_total_flops() / max(len(x), 1)


def time_rounds(loop: RoundLoop, rounds: int) -> tuple[list[dict], dict]:
    """Each round's training and aggregation seconds, steps and examples trained; and the
    server state after the last."""
    p, transport, algorithm = loop.prepared, loop.transport, loop.prepared.algorithm
    device = torch.device(p.cfg.train.device)
    per_round = clients_per_round(p.cfg.train, len(p.fed.clients))
    server, out = loop.server, []
    for r in range(1, rounds + 1):
        clients = sample_clients(p.cfg.seed, r, len(p.fed.clients), per_round)
        sync(device)
        start = time.perf_counter()
        deliveries = list(transport.fit(server, r, clients))
        sync(device)
        trained = time.perf_counter()
        replies: list[Reply] = [d.reply for d in deliveries]
        server = algorithm.aggregate(server, iter(replies), r).server
        sync(device)
        done = time.perf_counter()
        steps = sum(reply.metrics.get("steps", 0.0) for reply in replies)
        epochs = p.cfg.train.local_epochs
        examples = sum(epochs * len(p.client_data(c, r).train_y) for c in clients)
        out.append(
            {
                "train_s": trained - start,
                "aggregate_s": done - trained,
                "steps": steps,
                "examples": examples,
            }
        )
    return out, server


def profile_round(loop: RoundLoop, server: dict, server_round: int, top: int = 8) -> dict:
    """One more round's training under torch.profiler: where its time goes. On CUDA, the
    share of the wall time the device was busy (a launch-bound round keeps it idle) and the
    kernels launched; on both, the ops with the most self time."""
    from torch.profiler import ProfilerActivity, profile

    p = loop.prepared
    device = torch.device(p.cfg.train.device)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    per_round = clients_per_round(p.cfg.train, len(p.fed.clients))
    clients = sample_clients(p.cfg.seed, server_round, len(p.fed.clients), per_round)
    with profile(activities=activities) as prof:
        sync(device)
        start = time.perf_counter()
        for _ in loop.transport.fit(server, server_round, clients):
            pass
        sync(device)
        wall = time.perf_counter() - start
    events = prof.key_averages()

    def self_us(event: Any) -> float:
        if cuda:
            return float(getattr(event, "self_device_time_total", 0.0))
        return float(event.self_cpu_time_total)

    busiest = sorted(events, key=self_us, reverse=True)[:top]
    kernels = sum(
        e.count for e in events if cuda and float(getattr(e, "self_device_time_total", 0.0)) > 0
    )
    device_s = sum(self_us(e) for e in events) / 1e6 if cuda else None
    return {
        "wall_s": wall,
        "device_busy": None if device_s is None else device_s / wall,
        "device_ops": kernels if cuda else None,
        "top": [(e.key, self_us(e) / 1e6, e.count) for e in busiest],
    }


def measure(name: str, args: argparse.Namespace, stacked: bool) -> dict:
    config, overrides = WORKS[name]
    settings = [
        *overrides,
        *(QUICK[name] if args.quick else []),
        f"train.rounds={args.rounds}",
        f"train.device={args.device}",
        "train.workers=1",
        f"train.stacked={'true' if stacked else 'false'!r}",
        f"data.dir={args.data_dir}",
    ]
    loop = simulate(prepare(load_config(ROOT / config if config else None, settings)))
    try:
        rounds, server = time_rounds(loop, args.rounds)
        per_example = flops_per_example(loop)
        profiled = profile_round(loop, server, args.rounds + 1) if args.profile else None
    finally:
        loop.transport.close()
    timed = rounds[1:] or rounds
    train_s = statistics.median(r["train_s"] for r in timed)
    agg_s = statistics.median(r["aggregate_s"] for r in timed)
    steps = statistics.median(r["steps"] for r in timed)
    flops = per_example * statistics.median(r["examples"] for r in timed)
    peak = peak_tflops(torch.device(args.device), args.peak_tflops)
    return {
        "stacked": stacked,
        "first_round_s": rounds[0]["train_s"] + rounds[0]["aggregate_s"],
        "round_s": train_s + agg_s,
        "train_s": train_s,
        "aggregate_s": agg_s,
        "client_steps_per_s": steps / train_s,
        "train_tflops": flops / train_s / 1e12,
        "fraction_of_peak": None if peak is None else flops / train_s / (peak * 1e12),
        "profile": profiled,
    }


def why_not_stacked(name: str, args: argparse.Namespace) -> str | None:
    config, overrides = WORKS[name]
    settings = [*overrides, *(QUICK[name] if args.quick else []), f"data.dir={args.data_dir}"]
    prepared = prepare(load_config(ROOT / config if config else None, settings))
    return stacked_reason(prepared.cfg, prepared.algorithm, prepared.model)


def line(name: str, result: dict) -> str:
    mode = "stacked" if result["stacked"] else "one at a time"
    frac = result["fraction_of_peak"]
    peak = "n/a" if frac is None else f"{100 * frac:.3f} %"
    return (
        f"{name:20s} {mode:14s} {result['round_s']:8.3f} s/round "
        f"(train {result['train_s']:.3f}, aggregate {result['aggregate_s']:.3f}; "
        f"round 1 {result['first_round_s']:.2f})  "
        f"{result['client_steps_per_s']:9.1f} client-steps/s  "
        f"{result['train_tflops']:.4f} TFLOPS  peak {peak}"
    )


def profile_lines(profiled: dict) -> str:
    busy = profiled["device_busy"]
    head = f"    profiled round: {profiled['wall_s']:.3f} s"
    if busy is not None:
        head += f", device busy {100 * busy:.1f} %, {profiled['device_ops']} device ops"
    rows = [f"      {seconds:8.4f} s {count:7d}x  {key}" for key, seconds, count in profiled["top"]]
    return "\n".join([head, *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a minute on a CPU (see above)")
    parser.add_argument("--only", nargs="*", choices=list(WORKS), default=list(WORKS))
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument(
        "--profile", action="store_true", help="one more round under torch.profiler, each way"
    )
    parser.add_argument("--data-dir", default=str(DATA))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "gpu_throughput.json"))
    args = parser.parse_args()
    if args.quick:
        args.rounds = min(args.rounds, 2)
    device = torch.device(args.device)
    described = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    )
    print(f"device: {args.device} ({described or platform.machine()}), torch {torch.__version__}")
    print(f"rounds: {args.rounds} (medians over rounds 2..R){', --quick' if args.quick else ''}")
    report: dict = {
        "device": args.device,
        "device_name": described,
        "quick": args.quick,
        "works": {},
    }
    for name in args.only:
        results = [measure(name, args, stacked=False)]
        reason = why_not_stacked(name, args)
        if reason is None:
            results.append(measure(name, args, stacked=True))
        for result in results:
            print(line(name, result), flush=True)
            if result["profile"] is not None:
                print(profile_lines(result["profile"]), flush=True)
        if reason is not None:
            print(f"{name:20s} not stacked: {reason}")
        elif len(results) == 2:
            speedup = results[0]["round_s"] / results[1]["round_s"]
            print(f"{name:20s} stacked / one at a time: {speedup:.2f}x a round")
        report["works"][name] = {"results": results, "not_stacked": reason}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"written: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    try:
        main()
    except ConfigError as err:
        raise SystemExit(f"error: {err}") from None
