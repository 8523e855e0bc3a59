"""`Linear`: nn.Linear, whose products run on oneDNN's kernel where the caller asks for it.

Federated clients train on small batches, so a layer's products are skinny, and which library
runs them fastest depends on the machine: oneDNN's kernel beat MKL's (torch's own, for
float32 CPU products) 2-3x on one AMD CPU with AVX-512 and lost to it on an AVX2 AMD and an
Intel AVX-512 CPU (docs/speed.md). So nothing here guesses from the CPU: torch's own
kernel is the default, and oneDNN's runs only inside `onednn_products()`, a context that
the training loop enters where a short measurement on the run's own shapes found it faster
(protofed.training.fused.choose_plan), and only on single-threaded, 2-D float32 CPU operands
outside autocast; everywhere else this is exactly nn.Linear. Both agree with F.linear to fp32
rounding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

POINTWISE: Callable[..., torch.Tensor] | None = getattr(
    getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None
)

# Whether the products run on oneDNN: set only by `onednn_products()`, for the code inside it
# (a context variable, so it is per thread and per task, and always restored).
_ONEDNN: ContextVar[bool] = ContextVar("protofed_onednn_products", default=False)


@contextlib.contextmanager
def onednn_products(on: bool = True) -> Iterator[None]:
    """Inside: `Linear` and `matmul_nt` run their products on oneDNN's kernel where it applies
    (`on=False`: on torch's, whatever an outer context asked)."""
    token = _ONEDNN.set(on)
    try:
        yield
    finally:
        _ONEDNN.reset(token)


def onednn_available() -> bool:
    """This torch build has oneDNN's linear kernel and the process runs one intra-op thread."""
    return POINTWISE is not None and torch.get_num_threads() == 1


def onednn_in_use() -> bool:
    """oneDNN's kernel was asked for (`onednn_products`), is there, and the process runs one
    intra-op thread."""
    return _ONEDNN.get() and onednn_available()


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
    """a @ b.T; on oneDNN's kernel for 2-D float32 CPU operands outside autograd inside
    `onednn_products()` (FedAli's cosine products: faster on one AVX-512 AMD CPU)."""
    in_autograd = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
    if _onednn_operands(a, b) and not in_autograd:
        return onednn_linear(a.contiguous(), b.contiguous(), None)
    return a @ b.transpose(-2, -1)


class Linear(nn.Linear):
    """Drop-in nn.Linear (same parameters, same state_dict); oneDNN's products inside
    `onednn_products()`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if onednn_applies(x, self.weight):
            return _OneDnnLinear.apply(x.contiguous(), self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)
