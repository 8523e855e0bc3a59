"""Evaluation seconds with distinct client models predicting together (eval.stacked_models).

One round's evaluation (personalization, generalization on the whole test union, validation)
of `--models` distinct client models of one architecture, each a perturbation of the initial
weights, timed with `eval.stacked_models` = 1 (one model at a time) and the values of
`--stacked`, interleaved over `--repeats` sittings (on a GPU after one untimed pass of each:
the first pass pays CUDA's start-up, 0.86 against 0.15 s on an H200); the scores must be equal, or the script
stops. Works: the FedAvg CNN on 100 CIFAR-10 clients (configs/feddpa_cifar10_dirichlet0.3.yaml,
Ditto's evaluation in that setting) and cnn1d on UCI-HAR's 30 subjects
(configs/uci_har_natural.yaml), on the run's `train.device` (`--device cuda` where there is
one).

Usage: python benchmarks/stacked_evaluation.py [--work cifar10_cnn] [--models 20]
       [--stacked 4,16] [--repeats 2] [--threads 2] [--device cpu] [--data-dir ../shared/data]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from protofed.api import resolve_config
from protofed.runtime import prepare
from protofed.runtime.scoring import build_evaluator

ROOT = Path(__file__).resolve().parents[1]
WORKS = {
    "cifar10_cnn": ROOT / "configs" / "feddpa_cifar10_dirichlet0.3.yaml",
    "uci_har_cnn1d": ROOT / "configs" / "uci_har_natural.yaml",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", choices=sorted(WORKS), default="cifar10_cnn")
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--stacked", default="4,16")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = resolve_config(
        str(WORKS[args.work]),
        **{"data.dir": args.data_dir, "train.device": args.device, "eval.generalization": True},
    )
    prepared = prepare(cfg)
    n = len(prepared.fed.clients)
    generator = torch.Generator().manual_seed(0)
    base = {k: v.detach().cpu() for k, v in prepared.model.state_dict().items()}
    distinct = [
        {
            k: v + 0.01 * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
            for k, v in base.items()
        }
        for _ in range(args.models)
    ]
    models = [
        {k: v.to(args.device) for k, v in distinct[i % args.models].items()} for i in range(n)
    ]
    settings = [1, *(int(s) for s in args.stacked.split(","))]
    seconds: dict[int, list[float]] = {s: [] for s in settings}
    reference = None
    if args.device != "cpu":  # one untimed pass each: CUDA's start-up went to the first one
        for stacked in settings:
            prepared.cfg.eval.stacked_models = stacked
            build_evaluator(prepared).evaluate(models.__getitem__, None)
    for _ in range(args.repeats):
        for stacked in settings:
            prepared.cfg.eval.stacked_models = stacked
            evaluator = build_evaluator(prepared)
            t0 = time.perf_counter()
            scores = evaluator.evaluate(models.__getitem__, None)
            seconds[stacked].append(time.perf_counter() - t0)
            print(f"stacked_models={stacked}: {seconds[stacked][-1]:.2f} s", flush=True)
            reference = reference or scores
            if scores["personalization"] != reference["personalization"]:
                raise SystemExit(f"stacked_models={stacked} changed the scores")
    print(
        f"{args.work}: {n} clients, {args.models} distinct models, test union "
        f"{len(evaluator.test.y)}, {args.device}, {args.threads} threads, medians of "
        f"{args.repeats}"
    )
    one = statistics.median(seconds[1])
    print("| stacked_models | evaluation s | x one at a time |\n|---|---|---|")
    for stacked, values in seconds.items():
        m = statistics.median(values)
        print(f"| {stacked} | {m:.2f} | {m / one:.2f} |")


if __name__ == "__main__":
    main()
