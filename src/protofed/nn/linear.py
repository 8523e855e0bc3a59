"""`Linear`: nn.Linear with oneDNN kernels on single-threaded CPU training, where they win.

Federated clients train on small batches, so a Linear layer's matrix products are skinny
(10 x 1664 times 1664 x 1024). PyTorch sends them to MKL. Which is faster depends on the CPU:
- on the machine this was written on (2026-11-22/23, an AMD EPYC that had AVX-512: the
  notes of that day count on its AVX512-BF16), oneDNN's kernels (the ones torch's own
  compiler uses) ran these shapes 2-3x faster than MKL, and FedAli's 4096 x 192 x 512 cosine
  products 2.4x faster;
- on an AVX2-only AMD EPYC (2026-11-26) MKL was as fast on the large products and a whole
  autograd-free harcnn step 10 % faster with MKL's (`benchmarks/speed_optimizers.py --against`).
So oneDNN is used where torch reports AVX-512 (`USE_ONEDNN`, a rule read off those two
machines; `PROTOFED_ONEDNN=1` or `=0` forces either, to measure a new one), only
single-threaded: worker processes train with
one thread each (`train.workers`), so there this layer computes the same products through
oneDNN, forward and backward. Everywhere else (several threads, GPU, other dtypes, CPU
autocast, i.e. `train.precision=bf16`, or a torch build without the op) it is exactly
nn.Linear. The numbers agree with F.linear to fp32 rounding (a test checks outputs and
gradients on both paths).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

POINTWISE = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)


def _onednn_wins_here() -> bool:
    forced = os.environ.get("PROTOFED_ONEDNN", "")
    if forced in ("0", "1"):
        return forced == "1"
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


USE_ONEDNN = POINTWISE is not None and _onednn_wins_here()


def onednn_in_use() -> bool:
    """oneDNN's kernel is there, wins on this CPU and the process runs one intra-op thread."""
    return POINTWISE is not None and USE_ONEDNN and torch.get_num_threads() == 1


_MKL_WEIGHT_GRAD_FROM = 2**21  # MKL's outer product wins for the largest weight gradients


def _onednn_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return POINTWISE(x, w, b, "none", [], "")


class _OneDnnLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return _onednn_linear(x, w, b)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w = ctx.saved_tensors
        grad = grad.contiguous()
        gx = _onednn_linear(grad, w.t(), None) if ctx.needs_input_grad[0] else None
        gw = None
        if ctx.needs_input_grad[1]:
            if w.numel() >= _MKL_WEIGHT_GRAD_FROM:
                gw = grad.t() @ x
            else:
                gw = _onednn_linear(grad.t(), x.t(), None)
        gb = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb


def _onednn_operands(*tensors: torch.Tensor) -> bool:
    """oneDNN's kernel is there and wins: 2-D float32 CPU operands, one thread, and no CPU
    autocast (the op is not on autocast's lists: it would silently stay fp32)."""
    return (
        onednn_in_use()
        and not torch.is_autocast_enabled("cpu")
        and all(
            t.dim() == 2 and t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors
        )
    )


def onednn_applies(x: torch.Tensor, w: torch.Tensor) -> bool:
    return _onednn_operands(x, w) and torch.is_grad_enabled()


def matmul_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b.T for 2-D float32 CPU operands outside autograd: oneDNN where it wins (see the
    module's docstring: 2.4x on AVX-512 for FedAli's cosine products, a tie on AVX2)."""
    in_autograd = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
    if _onednn_operands(a, b) and not in_autograd:
        return _onednn_linear(a.contiguous(), b.contiguous(), None)
    return a @ b.transpose(-2, -1)


class Linear(nn.Linear):
    """Drop-in nn.Linear (same parameters, same state_dict) with the fast CPU path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if onednn_applies(x, self.weight):
            return _OneDnnLinear.apply(x.contiguous(), self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)
