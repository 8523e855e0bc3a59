"""`Linear`: nn.Linear with oneDNN's kernels on single-threaded CPU training, where they win.

Federated clients train on small batches, so a layer's products are skinny, and which library
runs them fastest depends on the CPU: on an AMD CPU with AVX-512 oneDNN's kernels beat MKL's
(MKL, Intel's library, takes generic code paths on AMD CPUs); on an AMD CPU with AVX2 and on
an Intel CPU with AVX-512, MKL's win (docs/speed.md). So oneDNN is used only single-threaded
(worker processes train with one thread each), on float32 CPU operands outside autocast, on
a CPU that torch reports as AVX-512 and that is not Intel's (`PROTOFED_ONEDNN=1` or `=0`
forces either); everywhere else this is exactly nn.Linear. Both agree with F.linear to fp32
rounding.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

POINTWISE: Callable[..., torch.Tensor] | None = getattr(
    getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None
)


def cpu_vendor() -> str:
    """The CPU's vendor id (`GenuineIntel`, `AuthenticAMD`), or "" where Linux's
    /proc/cpuinfo does not say."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def _onednn_wins_here() -> bool:
    forced = os.environ.get("PROTOFED_ONEDNN", "")
    if forced in ("0", "1"):
        return forced == "1"
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    return avx512 and cpu_vendor() != "GenuineIntel"


USE_ONEDNN = POINTWISE is not None and _onednn_wins_here()


def onednn_in_use() -> bool:
    """oneDNN's kernel is there, wins on this CPU and the process runs one intra-op thread."""
    return POINTWISE is not None and USE_ONEDNN and torch.get_num_threads() == 1


_MKL_WEIGHT_GRAD_FROM = 2**21  # MKL's outer product wins for the largest weight gradients


def onednn_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, w, b) on oneDNN's kernel; only where `onednn_in_use()`."""
    if POINTWISE is None:  # callers check onednn_in_use() first
        raise RuntimeError("this torch build has no oneDNN linear kernel")
    return POINTWISE(x, w, b, "none", [], "")


class _OneDnnLinear(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,  # torch's FunctionCtx, given attributes of our own (has_bias)
        x: torch.Tensor,
        w: torch.Tensor,
        b: torch.Tensor | None,
    ) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return onednn_linear(x, w, b)

    @staticmethod
    def backward(
        ctx: Any, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        x, w = ctx.saved_tensors
        grad = grad.contiguous()
        gx = onednn_linear(grad, w.t(), None) if ctx.needs_input_grad[0] else None
        gw = None
        if ctx.needs_input_grad[1]:
            if w.numel() >= _MKL_WEIGHT_GRAD_FROM:
                gw = grad.t() @ x
            else:
                gw = onednn_linear(grad.t(), x.t(), None)
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
    """a @ b.T for 2-D float32 CPU operands outside autograd: oneDNN where it wins (FedAli's
    cosine products: faster on AVX-512, a tie on AVX2; docs/speed.md)."""
    in_autograd = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
    if _onednn_operands(a, b) and not in_autograd:
        return onednn_linear(a.contiguous(), b.contiguous(), None)
    return a @ b.transpose(-2, -1)


class Linear(nn.Linear):
    """Drop-in nn.Linear (same parameters, same state_dict) with the fast CPU path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if onednn_applies(x, self.weight):
            return _OneDnnLinear.apply(x.contiguous(), self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)
