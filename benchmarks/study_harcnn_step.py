"""Speed study: one FedAvg round of harcnn on UCI-HAR-sized data, on a 2-core CPU.

Setting (PFLlib's measurement: 4.4 s of training per round): 30 clients with 196..286 training
windows each (9 channels x 128), harcnn, plain SGD lr 0.005, batch 10, 1 local epoch, every
client every round. Each client runs its own ~24 sequential SGD steps from the global model.
Data is random with the right shapes. Every variant is checked against the naive loop
(autograd + torch.optim.SGD) after one client epoch: max |param difference| must be <= 1e-4.

Run: `.venv/bin/python benchmarks/study_harcnn_step.py` (~3.5 min; `--quick` skips
torch.compile and the batched-clients variant). Each variant runs in its own subprocess, so
env vars (set before torch is imported) and thread counts are isolated. Timings are the best
of 3 repetitions (the machine is shared; the median is printed too).

Results (AMD EPYC Zen 5, 2 cores, AVX-512, torch 2.13 CPU, 30 clients = 7,273 samples = 741
steps per round; measured with the host otherwise idle, load average < 1; other jobs on the
same 2 cores make every number worse, the 2-thread ones by up to 5x):

| variant                                        | thr | ms/step best/med | s/round | diff   |
|------------------------------------------------|-----|------------------|---------|--------|
| naive: autograd + SGD(foreach), set_to_none    |  2  | 4.76 / 5.03      |  3.53   | 0      |
| naive                                          |  1  | 6.32 / 6.51      |  4.68   | 0      |
| naive, MKL_CBWR=AVX512                         |  2  | 4.40 / 4.72      |  3.26   | 0      |
| naive, MKL_ENABLE_INSTRUCTIONS=AVX512          |  2  | 4.70 / 5.23      |  3.48   | 0      |
| naive, SGD(fused=True)                         |  2  | 6.20 / 6.22      |  4.59   | 0      |
| naive, SGD(foreach=False)                      |  2  | 4.72 / 4.99      |  3.50   | 0      |
| naive, zero_grad(set_to_none=False)            |  2  | 6.06 / 6.45      |  4.49   | 0      |
| naive, torch.backends.mkldnn disabled          |  2  | 4.77 / 4.79      |  3.53   | 0      |
| torch.compile(model+loss) (27 s to compile)    |  2  | 6.81 / 7.21      |  5.05   | 7.5e-9 |
| torch.compile(model+loss) (21 s to compile)    |  1  | 9.06 / 9.92      |  6.71   | 7.5e-9 |
| protofed harcnn as built (nn.Linear->oneDNN)   |  1  | 4.59 / 5.01      |  3.40   | 1.5e-8 |
| autograd + oneDNN Linear, ReLU+pool Functions  |  1  | 5.21 / 5.27      |  3.86   | 7.5e-9 |
| autograd + oneDNN Linear, ReLU+pool Functions  |  2  | 2.97 / 3.00      |  2.20   | 7.5e-9 |
| fused hand-written step, oneDNN, no autograd   |  1  | 2.91 / 2.98      |  2.16   | 7.5e-9 |
| fused hand-written step, oneDNN, no autograd   |  2  | 1.88 / 1.95      |  1.40   | 4.8e-8 |
| 30 clients as one wide model (groups + bmm) *  |  2  | 7.30             |  6.35   | 7.5e-9 |
| 2 procs x 1 thread, naive                      | 2x1 | -                |  3.03   | 7.5e-9 |
| 2 procs x 1 thread, protofed harcnn as built   | 2x1 | -                |  2.11   | 1.5e-8 |
| 2 procs x 1 thread, oneDNN Lin. + ReLU/pool    | 2x1 | -                |  1.94   | 7.5e-9 |
| 2 procs x 1 thread, fused step                 | 2x1 | -                |  1.42   | 7.5e-9 |

ms/step is per client step (batch 10, best and median of 3 repetitions of ~100 steps);
s/round is ms/step x 741 for one process, and for the "2 procs" rows the measured wall time of
a whole round (dispatch, training, FedAvg aggregation of 30 x 2.25 M parameters; best of 3,
medians 3.04 / 2.15 / 2.00 / 1.50). * one wide step over 30 clients divided by 30; s/round
is the measured epoch. Evaluating the global model on 3,090 held-out windows (batch 1024, 2
threads) adds 0.18-0.19 s per round, so the fused 2-process round is 1.61 s in all. Worker
start-up (spawn, import torch) is 1.3-3 s once per run. diff = max |param difference| after one
client epoch vs the naive loop (fp32 rounding only; the limit is 1e-4).

fc1 GEMMs (10 x 1664 by 1664 x 1024), 1 thread, us: MKL forward 573, oneDNN 311; MKL dX 608,
oneDNN 182; MKL dW 404, `W.addmm_(dY.T, X)` (dW and update fused) 328, oneDNN dW 207 (+ a
separate update). MKL_CBWR / MKL_ENABLE_INSTRUCTIONS change nothing measurable.

Findings:
- The skinny GEMMs (M=10) dominate, and MKL runs them at 40-60 GFLOP/s on this AMD CPU
  whatever MKL_CBWR / MKL_ENABLE_INSTRUCTIONS say; oneDNN (`torch.ops.mkldnn.
  _linear_pointwise`, the op inductor uses) is 1.8-3.3x faster single-threaded.
- The rest is per-op overhead, not math: the autograd graph, max_pool1d's index path (~120 us
  fwd+bwd per pool), conv1's weight gradient through mkldnn (~290 us; 100 us as one GEMM over
  a zero-copy window view), a fresh 6.8 MB fc1 gradient per step then a separate SGD pass.
  The fused step drops all of it: 2.9 ms vs 4.6 ms (protofed.nn.Linear) vs 6.3 ms (naive).
- Batching clients (bmm / grouped conv / vmap) is slower: each client keeps its own weights,
  so M stays 10, and 30 x 9 MB of weights no longer fit in cache.
- torch.compile does not help (mm stays on MKL; one recompile per tail-batch size), and it
  crashes on protofed.nn.Linear's oneDNN op at 1 thread (inductor's mkldnn lowering wants
  constant weights); that Linear should fall back to F.linear under torch.compiler.is_compiling().
- Two threads in one process match two single-threaded processes only on an idle machine;
  with another job on the second core, OpenMP's per-op barriers made the 2-thread fused step
  12 ms/step (6x slower), while 2 processes just share the cores. Use processes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

LR = 0.005
BATCH = 10
NUM_CLIENTS = 30
SHAPE = (9, 128)
NUM_CLASSES = 6
EVAL_SAMPLES = 3090  # val (10%) + test (20%) of 10,299 UCI-HAR windows
TOL = 1e-4
ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- setup


def client_sizes(seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(196, 286) for _ in range(NUM_CLIENTS)]


def total_steps(sizes: list[int]) -> int:
    return sum(math.ceil(n / BATCH) for n in sizes)


def make_data(sizes: list[int], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, *SHAPE, generator=g) for n in sizes]
    ys = [torch.randint(0, NUM_CLASSES, (n,), generator=g) for n in sizes]
    return xs, ys


def make_model(plain: bool = True):
    """harcnn as `build_model` makes it; `plain` swaps protofed.nn.Linear for torch's own.

    protofed.nn.Linear routes single-threaded training through oneDNN, so the reference loop
    and torch.compile get plain nn.Linear (same parameters, same initialisation).
    """
    try:
        from protofed.config import ModelConfig
        from protofed.models import build_model
    except ImportError:  # running from a checkout without `pip install -e .`
        sys.path.insert(0, str(ROOT / "src"))
        from protofed.config import ModelConfig
        from protofed.models import build_model
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="harcnn"), SHAPE, NUM_CLASSES)
    if plain:
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.__class__ = torch.nn.Linear
    return model


def permutation(n: int, round_idx: int, client: int):
    g = torch.Generator().manual_seed(1000 * round_idx + client)
    return torch.randperm(n, generator=g)


def batches(x, y, perm):
    """The client's epoch: permute once (one gather), then contiguous slices of BATCH."""
    xp, yp = x[perm], y[perm]
    for i in range(0, len(xp), BATCH):
        yield xp[i : i + BATCH], yp[i : i + BATCH]


# --------------------------------------------------------------------------- trainers
# A trainer wraps a fresh harcnn: .epoch(x, y, perm) runs one client epoch in place, and
# .params() returns the parameters in model.parameters() order.


class NaiveTrainer:
    """The reference: nn.Module + autograd + torch.optim.SGD."""

    def __init__(self, model, foreach=None, fused=None, set_to_none=True, compiled=False):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=LR, foreach=foreach, fused=fused)
        self.set_to_none = set_to_none

        def loss_fn(xb, yb):
            return F.cross_entropy(model(xb), yb)

        if compiled:  # one graph per tail-batch size; keep them all
            torch._dynamo.config.cache_size_limit = 64
            loss_fn = torch.compile(loss_fn, dynamic=False)
        self.loss_fn = loss_fn

    def epoch(self, x, y, perm) -> None:
        for xb, yb in batches(x, y, perm):
            self.opt.zero_grad(set_to_none=self.set_to_none)
            self.loss_fn(xb, yb).backward()
            self.opt.step()

    def params(self):
        return [p.detach() for p in self.model.parameters()]


def _onednn_ops():
    lp = torch.ops.mkldnn._linear_pointwise

    class LinearFn(torch.autograd.Function):
        """y = x @ w.T + b (optionally ReLU) with oneDNN kernels forward and backward."""

        @staticmethod
        def forward(ctx, x, w, b, relu: bool):
            out = lp(x, w, b, "relu" if relu else "none", [], "")
            ctx.save_for_backward(x, w, out if relu else None)
            ctx.relu = relu
            return out

        @staticmethod
        def backward(ctx, g):
            x, w, out = ctx.saved_tensors
            if ctx.relu:
                g = g * (out > 0)
            gx = lp(g, w.t(), None, "none", [], "")
            big = w.numel() >= 2**21  # MKL wins for the 1024x1664 dW, oneDNN below
            gw = g.t() @ x if big else lp(g.t(), x.t(), None, "none", [], "")
            return gx, gw, g.sum(0), None

    class PoolReluFn(torch.autograd.Function):
        """relu(max_pool1d(c, 2)) == max_pool1d(relu(c), 2), with a cheap mask backward."""

        @staticmethod
        def forward(ctx, c):
            p, mask = pool_relu(c)
            ctx.save_for_backward(mask)
            ctx.length = c.shape[2]
            return p

        @staticmethod
        def backward(ctx, dp):
            (mask,) = ctx.saved_tensors
            return unpool(dp, mask, ctx.length)

    def pool_relu(c):
        b, ch, length = c.shape
        h = length // 2
        a = c[:, :, : 2 * h].reshape(b, ch, h, 2)
        p = F.max_pool1d(c, 2)
        first = a[..., 0] >= a[..., 1]  # max_pool picks the first of equal values
        pos = p > 0
        mask = torch.stack((first & pos, pos & ~first), -1).to(c.dtype)
        return p.relu_(), mask

    def unpool(dp, mask, length):
        b, ch, h = dp.shape
        d = (dp.unsqueeze(-1) * mask).view(b, ch, 2 * h)
        return F.pad(d, (0, length - 2 * h)) if length != 2 * h else d

    return lp, LinearFn, PoolReluFn, pool_relu, unpool


class OneDnnAutogradTrainer(NaiveTrainer):
    """Same module and optimizer; Linear and ReLU+pool run through custom autograd Functions."""

    def __init__(self, model):
        super().__init__(model)
        _, linear, pool, _, _ = _onednn_ops()
        f = model.features

        def loss_fn(xb, yb):
            h = pool.apply(f[0](xb))
            h = pool.apply(f[3](h)).flatten(1)
            h = linear.apply(h, f[7].weight, f[7].bias, True)
            h = linear.apply(h, f[9].weight, f[9].bias, True)
            return F.cross_entropy(model.head(h), yb)

        self.loss_fn = loss_fn


class FusedTrainer:
    """Hand-written forward + backward + SGD update for harcnn; no autograd graph.

    Parameters live in one flat buffer (copying the global model in or the result out is one
    `copy_`). Each layer's input gradient is computed with the old weights before the layer is
    updated in place, so the result is plain SGD exactly (up to fp32 rounding).
    """

    def __init__(self, model):
        self.flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        self.views, offset = [], 0
        for p in model.parameters():
            self.views.append(self.flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        self.lp, _, _, self.pool_relu, self.unpool = _onednn_ops()

    def params(self):
        return self.views

    def epoch(self, x, y, perm) -> None:
        for xb, yb in batches(x, y, perm):
            self.step(xb, yb)

    def step(self, xb, yb) -> None:
        lp, pool_relu, unpool = self.lp, self.pool_relu, self.unpool
        w1, b1, w2, b2, w3, b3, w4, b4, w5, b5 = self.views
        bsz = xb.shape[0]
        c1 = F.conv1d(xb, w1, b1)
        p1, k1 = pool_relu(c1)
        c2 = F.conv1d(p1, w2, b2)
        p2, k2 = pool_relu(c2)
        h0 = p2.view(bsz, -1)
        h1 = lp(h0, w3, b3, "relu", [], "")
        h2 = lp(h1, w4, b4, "relu", [], "")
        z = torch.addmm(b5, h2, w5.t())
        g = torch.softmax(z, 1)  # d(mean cross-entropy)/dz = (softmax - onehot) / B
        g[torch.arange(bsz), yb] -= 1
        g.div_(bsz)
        # head, fc2, fc1: input gradient first (old weights), then the in-place update
        dh2 = (g @ w5).mul_(h2 > 0)
        w5.addmm_(g.t(), h2, alpha=-LR)
        b5.sub_(g.sum(0), alpha=LR)
        dh1 = lp(dh2, w4.t(), None, "none", [], "").mul_(h1 > 0)
        w4.sub_(lp(dh2.t(), h1.t(), None, "none", [], ""), alpha=LR)
        b4.sub_(dh2.sum(0), alpha=LR)
        dh0 = lp(dh1, w3.t(), None, "none", [], "")
        w3.addmm_(dh1.t(), h0, alpha=-LR)  # fused dW + update: no 6.8 MB grad buffer
        b3.sub_(dh1.sum(0), alpha=LR)
        # conv2: oneDNN backward (input and weight)
        dr2 = unpool(dh0.view(bsz, w2.shape[0], -1), k2, c2.shape[2])
        dp1, dw2, db2 = torch.ops.aten.convolution_backward(
            dr2, p1, w2, [w2.shape[0]], [1], [0], [1], False, [0], 1, [True, True, True]
        )
        w2.sub_(dw2, alpha=LR)
        b2.sub_(db2, alpha=LR)
        # conv1: weight gradient only, as one GEMM over zero-copy windows of x (im2col view)
        dr1 = unpool(dp1, k1, c1.shape[2])
        out_ch, in_ch, k = w1.shape
        length, lo = xb.shape[2], c1.shape[2]
        xt = xb.transpose(1, 2).contiguous()  # (B, L, C): a window is 9*C contiguous floats
        rows = bsz * length - (k - 1)
        cols = xt.as_strided((rows, k * in_ch), (in_ch, 1))  # incl. windows across samples...
        dy = torch.zeros(bsz, length, out_ch)
        dy[:, :lo] = dr1.transpose(1, 2)  # ...which get zero gradient here
        gw1 = dy.view(bsz * length, out_ch)[:rows].t() @ cols  # (O, k*C) in (k, c) order
        w1.sub_(gw1.view(out_ch, k, in_ch).transpose(1, 2), alpha=LR)
        b1.sub_(dr1.sum((0, 2)), alpha=LR)


TRAINERS = {
    "naive": lambda m: NaiveTrainer(m),
    "protofed": lambda m: NaiveTrainer(make_model(plain=False)),
    "naive_fusedsgd": lambda m: NaiveTrainer(m, fused=True),
    "naive_forloop": lambda m: NaiveTrainer(m, foreach=False),
    "naive_zero": lambda m: NaiveTrainer(m, set_to_none=False),
    "compile": lambda m: NaiveTrainer(m, compiled=True),
    "onednn_autograd": OneDnnAutogradTrainer,
    "fused": FusedTrainer,
}


# --------------------------------------------------------------------------- measurements


def max_diff(a, b) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a, b, strict=True))


def check_equivalence(kind: str, xs, ys) -> float:
    """One epoch of client 0 from the same start: max |param diff| vs the naive loop."""
    ref = NaiveTrainer(make_model())
    ref.epoch(xs[0], ys[0], permutation(len(xs[0]), 0, 0))
    fast = TRAINERS[kind](make_model())
    fast.epoch(xs[0], ys[0], permutation(len(xs[0]), 0, 0))
    with torch.no_grad():
        return max_diff(ref.params(), fast.params())


def child_step(kind: str, threads: int, mkldnn: bool) -> dict:
    """ms per client step of one trainer in this process (best and median of 3 reps)."""
    torch.set_num_threads(threads)
    torch.backends.mkldnn.enabled = mkldnn
    sizes = client_sizes()
    xs, ys = make_data(sizes)
    t0 = time.perf_counter()
    diff = check_equivalence(kind, xs, ys)
    trainer = TRAINERS[kind](make_model())
    clients = range(4)  # ~100 steps per repetition
    steps = sum(math.ceil(sizes[c] / BATCH) for c in clients)
    for c in clients:  # warm-up (and compile every tail batch size)
        trainer.epoch(xs[c], ys[c], permutation(sizes[c], 0, c))
    warm = time.perf_counter() - t0
    times = []
    for rep in range(3):
        t = time.perf_counter()
        for c in clients:
            trainer.epoch(xs[c], ys[c], permutation(sizes[c], rep + 1, c))
        times.append((time.perf_counter() - t) / steps * 1e3)
    return {
        "ms_step": min(times),
        "ms_median": statistics.median(times),
        "s_round": min(times) * total_steps(sizes) / 1e3,
        "max_diff": diff,
        "setup_s": warm,
    }


def child_wide(threads: int) -> dict:
    """All 30 clients as one wide model: grouped Conv1d (groups=30) and bmm for the linears.

    Each client's parameters only get gradients from its own loss term, so one SGD step on the
    sum of per-client mean losses is 30 independent SGD steps. Clients with fewer batches (and
    the padding of short last batches) get zero loss weight, hence a zero update.
    """
    torch.set_num_threads(threads)
    sizes = client_sizes()
    xs, ys = make_data(sizes)
    k = NUM_CLIENTS
    base = [p.detach() for p in make_model().parameters()]
    w1, b1, w2, b2, w3, b3, w4, b4, w5, b5 = base
    wide = [
        w1.repeat(k, 1, 1),
        b1.repeat(k),
        w2.repeat(k, 1, 1),
        b2.repeat(k),
        w3.t().unsqueeze(0).repeat(k, 1, 1),  # (k, in, out) for x @ W
        b3.view(1, 1, -1).repeat(k, 1, 1),
        w4.t().unsqueeze(0).repeat(k, 1, 1),
        b4.view(1, 1, -1).repeat(k, 1, 1),
        w5.t().unsqueeze(0).repeat(k, 1, 1),
        b5.view(1, 1, -1).repeat(k, 1, 1),
    ]
    wide = [p.clone().requires_grad_() for p in wide]
    opt = torch.optim.SGD(wide, lr=LR)
    perms = [permutation(n, 0, c) for c, n in enumerate(sizes)]
    xp = [x[p] for x, p in zip(xs, perms, strict=True)]
    yp = [y[p] for y, p in zip(ys, perms, strict=True)]
    nsteps = max(math.ceil(n / BATCH) for n in sizes)
    xbuf = torch.zeros(BATCH, k * SHAPE[0], SHAPE[1])
    ybuf = torch.zeros(k, BATCH, dtype=torch.long)
    wbuf = torch.zeros(k, BATCH)

    def wide_step(s: int) -> None:
        xbuf.zero_()
        wbuf.zero_()
        for c in range(k):
            xb, yb = xp[c][s * BATCH : (s + 1) * BATCH], yp[c][s * BATCH : (s + 1) * BATCH]
            n = len(xb)
            if n:
                xbuf[:n, c * SHAPE[0] : (c + 1) * SHAPE[0]] = xb
                ybuf[c, :n] = yb
                wbuf[c, :n] = 1.0 / n
        v = wide
        h = F.max_pool1d(F.relu(F.conv1d(xbuf, v[0], v[1], groups=k)), 2)
        h = F.max_pool1d(F.relu(F.conv1d(h, v[2], v[3], groups=k)), 2)
        h = h.view(BATCH, k, -1).transpose(0, 1)  # (k, B, 64*26)
        h = F.relu(torch.baddbmm(v[5], h, v[4]))
        h = F.relu(torch.baddbmm(v[7], h, v[6]))
        z = torch.baddbmm(v[9], h, v[8])
        loss = F.cross_entropy(z.reshape(-1, NUM_CLASSES), ybuf.view(-1), reduction="none")
        opt.zero_grad()
        (loss * wbuf.view(-1)).sum().backward()
        opt.step()

    t = time.perf_counter()
    for s in range(nsteps):
        wide_step(s)
    wall = time.perf_counter() - t
    # equivalence: client 0 and the client with the fewest samples vs the naive loop
    diff = 0.0
    for c in (0, min(range(k), key=lambda i: sizes[i])):
        ref = NaiveTrainer(make_model())
        ref.epoch(xs[c], ys[c], perms[c])
        got = [
            wide[0][c * 32 : (c + 1) * 32],
            wide[1][c * 32 : (c + 1) * 32],
            wide[2][c * 64 : (c + 1) * 64],
            wide[3][c * 64 : (c + 1) * 64],
            *(wide[i][c].t() if i % 2 == 0 else wide[i][c].view(-1) for i in range(4, 10)),
        ]
        with torch.no_grad():
            diff = max(diff, max_diff(ref.params(), got))
    return {
        "ms_step": wall / nsteps / k * 1e3,
        "ms_median": wall / nsteps / k * 1e3,
        "s_round": wall,
        "max_diff": diff,
        "setup_s": 0.0,
    }


def child_gemm() -> dict:
    """The fc1 GEMMs (batch 10, 1664 -> 1024) with MKL and oneDNN, in us, at 1 and 2 threads."""
    lp = torch.ops.mkldnn._linear_pointwise
    x, w, dy, b = torch.randn(10, 1664), torch.randn(1024, 1664), torch.randn(10, 1024), None

    def bench(fn, n=100):
        best = 1e9
        for _ in range(3):
            fn()
            t = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t) / n * 1e6)
        return round(best)

    out = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        out[f"{threads}t"] = {
            "mkl fwd x@W.T": bench(lambda: x @ w.t()),
            "onednn fwd": bench(lambda: lp(x, w, b, "none", [], "")),
            "mkl dX dY@W": bench(lambda: dy @ w),
            "onednn dX": bench(lambda: lp(dy, w.t(), None, "none", [], "")),
            "mkl dW dY.T@X": bench(lambda: dy.t() @ x),
            "mkl W.addmm_(dY.T,X)": bench(lambda: w.addmm_(dy.t(), x, alpha=-1e-9)),
            "onednn dW": bench(lambda: lp(dy.t(), x.t(), None, "none", [], "")),
        }
    return out


def load_flat(params, flat) -> None:
    """Copy a flat vector into parameters (never aliasing it, unlike vector_to_parameters)."""
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def _worker(conn, kind, xs, ys, sizes, global_flat, out, counter, order) -> None:
    torch.set_num_threads(1)
    trainer = TRAINERS[kind](make_model())
    params = trainer.params()
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            return
        round_idx = msg
        while True:
            with counter.get_lock():  # dynamic scheduling, longest clients first
                i = counter.value
                counter.value += 1
            if i >= len(order):
                break
            c = order[i]
            if kind == "fused":
                trainer.flat.copy_(global_flat)
            else:
                load_flat(params, global_flat)
            trainer.epoch(xs[c], ys[c], permutation(sizes[c], round_idx, c))
            if kind == "fused":
                out[c].copy_(trainer.flat)
            else:
                torch.cat([p.reshape(-1) for p in params], out=out[c])
        conn.send("done")


def child_rounds(kind: str, workers: int, rounds: int = 3) -> dict:
    """Whole FedAvg rounds with `workers` single-threaded processes sharing the clients."""
    torch.set_num_threads(2)
    sizes = client_sizes()
    xs, ys = make_data(sizes)
    for t in (*xs, *ys):
        t.share_memory_()
    model = make_model()
    global_flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    global_flat.share_memory_()
    out = torch.zeros(NUM_CLIENTS, global_flat.numel()).share_memory_()
    weights = torch.tensor(sizes, dtype=torch.float32) / sum(sizes)
    order = sorted(range(NUM_CLIENTS), key=lambda c: -sizes[c])
    ctx = mp.get_context("spawn")
    counter = ctx.Value("i", 0)
    t0 = time.perf_counter()
    procs, conns = [], []
    for _ in range(workers):
        a, b = ctx.Pipe()
        p = ctx.Process(
            target=_worker, args=(b, kind, xs, ys, sizes, global_flat, out, counter, order)
        )
        p.start()
        procs.append(p)
        conns.append(a)
    for a in conns:
        a.recv()
    startup = time.perf_counter() - t0
    xe = torch.randn(EVAL_SAMPLES, *SHAPE)
    train_times, eval_times = [], []
    for r in range(rounds + 1):
        t = time.perf_counter()
        counter.value = 0
        for a in conns:
            a.send(r)
        for a in conns:
            a.recv()
        torch.mv(out.t(), weights, out=global_flat)  # FedAvg aggregation
        t1 = time.perf_counter()
        load_flat(list(model.parameters()), global_flat)
        with torch.inference_mode():
            for i in range(0, EVAL_SAMPLES, 1024):
                model(xe[i : i + 1024]).argmax(1)
        t2 = time.perf_counter()
        if r:  # round 0 is warm-up
            train_times.append(t1 - t)
            eval_times.append(t2 - t1)
        else:  # check one client's round-0 result against the naive loop in this process
            ref = NaiveTrainer(make_model())
            ref.epoch(xs[0], ys[0], permutation(sizes[0], 0, 0))
            flat_ref = torch.cat([p.reshape(-1) for p in ref.params()])
            diff = (flat_ref - out[0]).abs().max().item()
    for a in conns:
        a.send(None)
    for p in procs:
        p.join()
    return {
        "s_round": min(train_times),
        "s_round_median": statistics.median(train_times),
        "eval_s": min(eval_times),
        "startup_s": startup,
        "max_diff": diff,
    }


# --------------------------------------------------------------------------- driver

STEP_VARIANTS = [
    # (label, trainer, threads, env, mkldnn)
    ("naive: autograd + SGD(foreach), set_to_none", "naive", 2, {}, True),
    ("naive", "naive", 1, {}, True),
    ("naive, MKL_CBWR=AVX512", "naive", 2, {"MKL_CBWR": "AVX512"}, True),
    (
        "naive, MKL_ENABLE_INSTRUCTIONS=AVX512",
        "naive",
        2,
        {"MKL_ENABLE_INSTRUCTIONS": "AVX512"},
        True,
    ),
    ("naive, SGD(fused=True)", "naive_fusedsgd", 2, {}, True),
    ("naive, SGD(foreach=False)", "naive_forloop", 2, {}, True),
    ("naive, zero_grad(set_to_none=False)", "naive_zero", 2, {}, True),
    ("naive, torch.backends.mkldnn disabled", "naive", 2, {}, False),
    ("torch.compile(model+loss)", "compile", 2, {}, True),
    ("torch.compile(model+loss)", "compile", 1, {}, True),
    ("protofed model as built (protofed.nn.Linear), autograd", "protofed", 1, {}, True),
    ("autograd + oneDNN Linear/pool Functions", "onednn_autograd", 1, {}, True),
    ("autograd + oneDNN Linear/pool Functions", "onednn_autograd", 2, {}, True),
    ("fused hand-written step (oneDNN), no autograd", "fused", 1, {}, True),
    ("fused hand-written step (oneDNN), no autograd", "fused", 2, {}, True),
]
ROUND_VARIANTS = [
    ("2 procs x 1 thread, naive (measured round)", "naive"),
    ("2 procs x 1 thread, protofed.nn.Linear + autograd", "protofed"),
    ("2 procs x 1 thread, autograd + oneDNN Linear/pool", "onednn_autograd"),
    ("2 procs x 1 thread, fused step (round)", "fused"),
]


def run_child(args: list[str], env: dict[str, str]) -> dict:
    full_env = {**os.environ, **env}
    proc = subprocess.run(
        [sys.executable, __file__, *args], env=full_env, capture_output=True, text=True
    )
    if proc.returncode:
        raise RuntimeError(f"child {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _diff(d: float) -> str:
    return f"{d:.1e}" + ("" if d <= TOL else " NOT EQUIVALENT")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip torch.compile and wide model")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        what = args.child[0]
        if what == "step":
            res = child_step(args.child[1], int(args.child[2]), args.child[3] == "1")
        elif what == "wide":
            res = child_wide(int(args.child[1]))
        elif what == "rounds":
            res = child_rounds(args.child[1], int(args.child[2]))
        else:
            res = child_gemm()
        print(json.dumps(res))
        return

    start = time.perf_counter()
    sizes = client_sizes()
    print(f"{NUM_CLIENTS} clients, {sum(sizes)} samples, {total_steps(sizes)} steps per round")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("fc1 GEMM micro-benchmark (us):", json.dumps(run_child(["--child", "gemm"], {})))
    rows = []
    header = "| variant | thr | ms/step (best / median) | s/round | max diff |"
    for label, kind, threads, env, mkldnn in STEP_VARIANTS:
        if args.quick and kind == "compile":
            continue
        r = run_child(["--child", "step", kind, str(threads), "1" if mkldnn else "0"], env)
        extra = f" (compile+warm-up {r['setup_s']:.0f} s)" if kind == "compile" else ""
        rows.append(
            f"| {label}{extra} | {threads} | {r['ms_step']:.2f} / {r['ms_median']:.2f} "
            f"| {r['s_round']:.2f} | {_diff(r['max_diff'])} |"
        )
        print(rows[-1], flush=True)
    if not args.quick:
        r = run_child(["--child", "wide", "2"], {})
        rows.append(
            f"| 30 clients as one wide model (groups=30 + bmm), per client-step | 2 "
            f"| {r['ms_step']:.2f} | {r['s_round']:.2f} | {_diff(r['max_diff'])} |"
        )
        print(rows[-1], flush=True)
    for label, kind in ROUND_VARIANTS:
        r = run_child(["--child", "rounds", kind, "2"], {})
        rows.append(
            f"| {label}: train+aggregate {r['s_round']:.2f} s (median {r['s_round_median']:.2f})"
            f", eval {r['eval_s']:.2f} s, worker start-up {r['startup_s']:.1f} s | 2x1 | - "
            f"| {r['s_round'] + r['eval_s']:.2f} | {_diff(r['max_diff'])} |"
        )
        print(rows[-1], flush=True)
    print()
    print(header)
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    print(
        f"\nload average after: {os.getloadavg()[0]:.2f}; "
        f"study took {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
