"""Training seconds per round by optimizer, FedAvg on UCI-HAR natural clients.

Interleaved repeats in one sitting (plain SGD, momentum 0.9, Nesterov, Adam), medians, on two
works: PFLlib's (harcnn, 9 channels, batch 10, see speed_fedavg_uci_har.py) and
configs/uci_har_natural.yaml. Every optimizer takes the autograd-free path
(training/fused.py): gradients by hand, then torch's optimizer step on its fused kernel
(plain SGD is applied in place during the backward sweep). The goal: momentum and Adam
within 1.2x of plain SGD. On the 2-core machine with no other run on it (--rounds 3
--repeats 2): PFLlib's work momentum 1.19x, Nesterov 1.18x, Adam 1.36x; uci_har_natural
1.04x, 0.98x, 0.94x. Adam on harcnn stays above the goal: at batch 10 its step reads and
writes four 2.25 M-weight tensors (weights, gradient, two moments) where plain SGD updates
the weights in place, and the fused kernel already does that in one pass.

`--decompose` shows why, one harcnn step at batch 10 on one thread: plain SGD's step, the
same step computing every gradient as a tensor but taking no optimizer step (what Adam must
do before its kernel), the full Adam step, and torch's fused Adam kernel alone on warm
tensors, with this machine's default kernels (protofed.nn.linear). Gradients alone plus the
kernel alone is a floor for Adam's step under torch's arithmetic on those kernels.

`--against` asks whether the hand-written step earns its place (the rule: prefer what
PyTorch offers where it is as fast): one harcnn step at batch 10, one thread, for plain SGD,
momentum 0.9 and Adam, each on the autograd-free step and on autograd (forward, backward,
`make_optimizer`'s optimizer: fused kernels for momentum and Adam, foreach for plain SGD,
which the autograd-free step applies in place instead), both on oneDNN's products and on
torch's (MKL), and autograd under `torch.compile` (MKL: the oneDNN op does not lower).

Usage: python benchmarks/speed_optimizers.py [--rounds 3] [--repeats 3] [--data-dir ../shared/data]
       python benchmarks/speed_optimizers.py --decompose
       python benchmarks/speed_optimizers.py --against
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import protofed.nn.linear
from protofed.config import TrainConfig, load_config
from protofed.models.harcnn import HARCNN
from protofed.runtime import prepare, simulate
from protofed.training.fused import (
    Kernels,
    OptimizerStep,
    SGDInPlace,
    fused_step,
    sequential_layers,
)
from protofed.training.loop import make_optimizer, plain_sgd

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
            "train.batch_size=10",
            "data.predefined_split=true",
            "data.split=[0.75,0,0.25]",
            "train.local_epochs=1",
            "train.client_fraction=1.0",
        ],
        0.005,
    ),
    "uci_har_natural": (str(ROOT / "configs" / "uci_har_natural.yaml"), [], None),
}
OPTIMIZERS = {
    "sgd": ["train.optimizer=sgd", "train.momentum=0", "train.weight_decay=0"],
    "momentum": ["train.optimizer=sgd", "train.momentum=0.9"],
    "nesterov": ["train.optimizer=sgd", "train.momentum=0.9", "train.nesterov=true"],
    "adam": ["train.optimizer=adam", "train.momentum=0"],
}


def train_s_per_round(path: str | None, overrides: list[str], rounds: int, data_dir: str) -> float:
    cfg = load_config(
        path,
        [
            *overrides,
            f"train.rounds={rounds}",
            f"data.dir={data_dir}",
            "train.threads=1",
            "train.workers=1",
            "eval.every=1000",
        ],
    )
    sim = simulate(prepare(cfg))
    times: list[float] = []
    sim.run(
        on_round=lambda r, info, rec: times.append(info.train_s + info.guard_s + info.aggregate_s)
    )
    return statistics.median(times)


def _interleaved_ms(calls, repeats: int, steps: int, warmup: int = 20) -> list[list[float]]:
    """Milliseconds per call of each of `calls`, one sample per repeat, the calls taken in
    turn within each repeat so that the machine's drift hits them all alike."""
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        for call, out in zip(calls, times, strict=True):
            for _ in range(warmup):
                call()
            t = time.perf_counter()
            for _ in range(steps):
                call()
            out.append((time.perf_counter() - t) / steps * 1e3)
    return times


class _GradientsOnly(OptimizerStep):
    """Adam's step without the optimizer's kernel: every gradient made as a tensor."""

    def finish(self) -> None:
        pass


def decompose(repeats: int = 7, steps: int = 200) -> None:
    """Milliseconds per harcnn step at batch 10, one thread: where Adam's extra time goes."""
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 9, 128, generator=gen), torch.randint(0, 6, (10,), generator=gen)

    def setup(kind: str):
        torch.manual_seed(0)
        model = HARCNN(9, 128, 6)
        layers, kernels = sequential_layers(model), Kernels()
        if kind == "plain SGD":
            return lambda: fused_step(layers, x, y, SGDInPlace(kernels, 0.005))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
        update = (_GradientsOnly if kind == "gradients only" else OptimizerStep)(kernels, opt)
        if kind == "Adam kernel alone":
            fused_step(layers, x, y, update)  # gradients and moments exist from here on
            return opt.step
        return lambda: fused_step(layers, x, y, update)

    kinds = ["plain SGD", "gradients only", "Adam", "Adam kernel alone"]
    calls = {k: setup(k) for k in kinds}
    times = dict(zip(kinds, _interleaved_ms(list(calls.values()), repeats, steps), strict=True))
    sgd = statistics.median(times["plain SGD"])
    print(f"harcnn, batch 10, one thread: ms per step (median of {repeats} x {steps})")
    for kind in kinds:
        m = statistics.median(times[kind])
        print(f"{kind:<20}{m:>8.2f}{m / sgd:>7.2f}x", flush=True)
    floor = statistics.median(times["gradients only"]) + statistics.median(
        times["Adam kernel alone"]
    )
    print(f"{'gradients + kernel':<20}{floor:>8.2f}{floor / sgd:>7.2f}x")
    kernels_ms = _kernel_ms(calls["plain SGD"], steps)
    print(
        f"plain SGD's step: {kernels_ms:.2f} ms in torch's matrix and convolution kernels, "
        f"{kernels_ms / sgd:.0%} of its {sgd:.2f} ms"
    )


# The ops that do a harcnn step's arithmetic; everything else is glue (pooling, ReLU, Python).
_ARITHMETIC = (
    "mkldnn::_linear_pointwise",
    "aten::addmm_",
    "aten::addmm",
    "aten::mm",
    "aten::mkldnn_convolution",
    "aten::convolution_backward",
)


def _kernel_ms(call, steps: int) -> float:
    """Milliseconds a step spends inside the matrix and convolution kernels (profiled).

    With this kernel choice, a step takes at least this long even with the glue (pooling,
    ReLU, Python) at zero: over the unprofiled step time, the most a leaner step could gain."""
    from torch.profiler import profile

    with profile() as prof:
        for _ in range(steps):
            call()
    events = prof.key_averages()
    return sum(e.self_cpu_time_total for e in events if e.key in _ARITHMETIC) / 1e3 / steps


def against(repeats: int = 7, steps: int = 100) -> None:
    """Milliseconds per harcnn step: the autograd-free step against autograd and torch.compile."""
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 9, 128, generator=gen), torch.randint(0, 6, (10,), generator=gen)
    recipes = {
        "plain SGD": TrainConfig(optimizer="sgd", lr=0.005, momentum=0.0, weight_decay=0.0),
        "momentum 0.9": TrainConfig(optimizer="sgd", lr=0.005, momentum=0.9, weight_decay=0.0),
        "Adam": TrainConfig(optimizer="adam", lr=1e-3, momentum=0.0, weight_decay=0.0),
    }

    def fused(train: TrainConfig, onednn: bool):
        torch.manual_seed(0)
        model = HARCNN(9, 128, 6)
        layers, kernels = sequential_layers(model), Kernels("onednn" if onednn else "torch")
        if plain_sgd(train):
            update = SGDInPlace(kernels, train.lr)
        else:
            update = OptimizerStep(kernels, make_optimizer(model.parameters(), train))
        return lambda: fused_step(layers, x, y, update)

    def autograd(train: TrainConfig, onednn: bool, compiled: bool = False):
        torch.manual_seed(0)
        model = HARCNN(9, 128, 6)
        opt = make_optimizer(model.parameters(), train)

        def step():
            on = protofed.nn.linear.onednn_products() if onednn else contextlib.nullcontext()
            with on:  # without it: torch's path (MKL)
                loss = F.cross_entropy(model(x), y)
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        return torch.compile(step) if compiled else step

    print(f"harcnn, batch 10, one thread: ms per step (median of {repeats} x {steps})")
    head = ["fused oneDNN", "fused MKL", "autograd oneDNN", "autograd MKL", "compile MKL"]
    print(f"{'':<14}" + "".join(f"{h:>17}" for h in head))
    for name, train in recipes.items():
        torch._dynamo.reset()  # each recipe's compile starts afresh (no recompile limit)
        calls = [
            fused(train, True),
            fused(train, False),
            autograd(train, True),
            autograd(train, False),
            autograd(train, False, compiled=True),
        ]
        calls[-1]()  # compiles
        times = _interleaved_ms(calls, repeats, steps, warmup=10)
        row = "".join(f"{statistics.median(t):>17.2f}" for t in times)
        print(f"{name:<14}{row}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--only", choices=sorted(WORKS), default=None)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--decompose", action="store_true", help="one harcnn step, taken apart")
    mode.add_argument("--against", action="store_true", help="fused against autograd, compile")
    args = ap.parse_args()
    if args.decompose:
        decompose()
        return
    if args.against:
        against()
        return
    for work, (path, base, lr) in WORKS.items():
        if args.only and work != args.only:
            continue
        res: dict[str, list[float]] = {k: [] for k in OPTIMIZERS}
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            for name, opt in OPTIMIZERS.items():
                extra = ["train.lr=0.001"] if "adam" in name else [f"train.lr={lr}"] if lr else []
                overrides = [*base, *opt, *extra]
                res[name].append(train_s_per_round(path, overrides, args.rounds, args.data_dir))
        sgd = statistics.median(res["sgd"])
        took = time.perf_counter() - t0
        print(f"\n{work}  (train s/round, median of {args.repeats} x {args.rounds} rounds, ")
        print(f"threads=1, workers=1; {took:.0f} s)")
        print(f"{'optimizer':<20}{'s/round':>9}{'x sgd':>8}")
        for name, v in res.items():
            m = statistics.median(v)
            print(f"{name:<20}{m:>9.3f}{m / sgd:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
