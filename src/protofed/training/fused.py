"""Local training on cross-entropy without autograd, for sequential models on the CPU.

Federated clients take many tiny steps, where the autograd graph and a fresh gradient buffer
per weight cost as much as the arithmetic. For the common case this module runs the same
mathematics by hand: a forward pass that keeps what the backward pass needs, then, layer by
layer from the top, the input gradient (with the old weights) and the layer's weight gradient.
Plain SGD (`SGDInPlace`) applies each weight gradient in place during the sweep, folding the
largest into `W.addmm_(-lr * dY^T X)`; every other optimizer (`OptimizerStep`) gets the
gradients as `.grad` and takes torch's own step (`training.loop.make_optimizer`).

It applies only where the result is autograd's: the default loss, every parameter trained, no
per-step hook, float32 on the CPU, and a model whose `features` is an `nn.Sequential` of
Conv1d / ReLU / MaxPool1d(2) / AdaptiveAvgPool1d(1) / Flatten / Linear (mlp, cnn1d, harcnn).
Tests check both paths give the same weights to fp32 rounding for every optimizer. Measured
faster than autograd for plain SGD (1.24x), a tie or a few per cent slower for the others,
see docs/speed.md.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from protofed.nn.linear import onednn_in_use, onednn_linear

# From this many weights on, `W.addmm_(-lr * dY^T X)` beats oneDNN's dW followed by `W -= lr dW`:
# it never writes dW, the memory traffic that worker processes contend for (docs/speed.md).
_FUSED_UPDATE_FROM = 2**20
# From this many weights on, MKL's forward product runs as `(W X^T)^T`: for harcnn's
# 1024 x 1664 layer at batch 10 it took 0.60 against F.linear's 1.09 ms (docs/speed.md).
_WEIGHT_MAJOR_FROM = 2**16


def _conv_ok(m: nn.Conv1d) -> bool:
    return (
        m.stride == (1,)
        and m.dilation == (1,)
        and m.groups == 1
        and m.bias is not None
        and m.padding_mode == "zeros"
        and isinstance(m.padding, tuple)
    )


def _pool_ok(m: nn.MaxPool1d) -> bool:
    k = m.kernel_size if isinstance(m.kernel_size, int) else m.kernel_size[0]
    s = m.stride if isinstance(m.stride, int) else m.stride[0]
    p = m.padding if isinstance(m.padding, int) else m.padding[0]
    d = m.dilation if isinstance(m.dilation, int) else m.dilation[0]
    return k == 2 and s == 2 and p == 0 and d == 1 and not m.ceil_mode and not m.return_indices


_CHECKS = {
    nn.Conv1d: _conv_ok,
    nn.ReLU: lambda m: True,
    nn.MaxPool1d: _pool_ok,
    nn.AdaptiveAvgPool1d: lambda m: m.output_size in (1, (1,)),
    nn.Flatten: lambda m: m.start_dim == 1 and m.end_dim == -1,
}


def sequential_layers(model: nn.Module) -> list[nn.Module] | None:
    """The model as a flat list of supported layers, or None if it is not one."""
    features, head = getattr(model, "features", None), getattr(model, "head", None)
    if not isinstance(features, nn.Sequential) or not isinstance(head, nn.Linear):
        return None
    layers = [*features.children(), head]
    for layer in layers:
        if isinstance(layer, nn.Linear):
            continue
        check = _CHECKS.get(type(layer))
        if check is None or not check(layer):
            return None
    if any(b is not None for b in model.buffers()):
        return None
    return layers


class Kernels:
    """Matrix products: oneDNN where it wins, single-threaded (see protofed.nn.linear), else aten."""

    def __init__(self) -> None:
        self.onednn = onednn_in_use()

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if self.onednn:
            return onednn_linear(x, w, b)
        if w.numel() >= _WEIGHT_MAJOR_FROM:  # the same product, in the order MKL runs fastest
            out = w @ x.t() if b is None else torch.addmm(b.unsqueeze(1), w, x.t())
            return out.t()
        return F.linear(x, w, b)

    def input_grad(self, g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.linear(g, w.t(), None) if self.onednn else g @ w

    def weight_grad(self, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """dY^T X, the weight gradient of a linear layer."""
        return self.linear(g.t(), x.t(), None) if self.onednn else g.t() @ x

    def update_weight(self, w: torch.Tensor, g: torch.Tensor, x: torch.Tensor, lr: float) -> None:
        if self.onednn and w.numel() < _FUSED_UPDATE_FROM:
            w.sub_(self.weight_grad(g, x), alpha=lr)
        else:
            w.addmm_(g.t(), x, alpha=-lr)


def _pool_forward(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """max_pool1d(h, 2) and a mask of which of each pair won (the first on ties, as torch)."""
    b, c, length = h.shape
    half = length // 2
    pairs = h[:, :, : 2 * half].reshape(b, c, half, 2)
    first = pairs[..., 0] >= pairs[..., 1]
    return torch.where(first, pairs[..., 0], pairs[..., 1]), first


def _pool_backward(g: torch.Tensor, first: torch.Tensor, length: int) -> torch.Tensor:
    b, c, half = g.shape
    out = torch.zeros(b, c, length, dtype=g.dtype)
    pairs = out[:, :, : 2 * half].view(b, c, half, 2)
    pairs[..., 0] = g * first
    pairs[..., 1] = g * ~first
    return out


class SGDInPlace:
    """Plain SGD applied as the backward sweep goes (each layer's input gradient is taken first)."""

    def __init__(self, kernels: Kernels, lr: float) -> None:
        self.kernels, self.lr = kernels, lr

    def linear(self, layer: nn.Linear, g: torch.Tensor, x: torch.Tensor) -> None:
        self.kernels.update_weight(layer.weight, g, x, self.lr)
        if layer.bias is not None:
            layer.bias.sub_(g.sum(0), alpha=self.lr)

    def conv(self, layer: nn.Conv1d, gw: torch.Tensor, gb: torch.Tensor) -> None:
        layer.weight.sub_(gw, alpha=self.lr)
        if layer.bias is not None:  # always: `sequential_layers` takes convolutions with bias
            layer.bias.sub_(gb, alpha=self.lr)

    def finish(self) -> None:
        pass


class OptimizerStep:
    """Gradients by hand into `.grad`, then the torch optimizer's own step once per batch."""

    def __init__(self, kernels: Kernels, optimizer: torch.optim.Optimizer) -> None:
        self.kernels, self.optimizer = kernels, optimizer

    def linear(self, layer: nn.Linear, g: torch.Tensor, x: torch.Tensor) -> None:
        layer.weight.grad = self.kernels.weight_grad(g, x)
        if layer.bias is not None:
            layer.bias.grad = g.sum(0)

    def conv(self, layer: nn.Conv1d, gw: torch.Tensor, gb: torch.Tensor) -> None:
        layer.weight.grad = gw
        if layer.bias is not None:  # always: `sequential_layers` takes convolutions with bias
            layer.bias.grad = gb

    def finish(self) -> None:
        self.optimizer.step()


Update = SGDInPlace | OptimizerStep
# What the forward pass keeps for a layer's backward: its input (Linear, Conv1d), its output
# (ReLU), the winners' mask and input length (MaxPool1d), the input length (AdaptiveAvgPool1d),
# the input shape (Flatten).
Saved = torch.Tensor | tuple[torch.Tensor, int] | int | torch.Size


@torch.no_grad()
def fused_step(
    layers: list[nn.Module], x: torch.Tensor, y: torch.Tensor, update: Update
) -> torch.Tensor:
    """One step on the mean cross-entropy; returns the (pre-update) loss."""
    kernels = update.kernels
    saved: list[Saved] = []
    h = x
    for layer in layers:
        if isinstance(layer, nn.Linear):
            if h.dim() != 2:
                raise RuntimeError("the fused step expects flattened inputs to Linear layers")
            saved.append(h)
            h = kernels.linear(h, layer.weight, layer.bias)
        elif isinstance(layer, nn.Conv1d):
            saved.append(h)
            h = F.conv1d(h, layer.weight, layer.bias, padding=layer.padding)
        elif isinstance(layer, nn.ReLU):
            h = h.relu()
            saved.append(h)
        elif isinstance(layer, nn.MaxPool1d):
            length = h.shape[2]
            h, first = _pool_forward(h)
            saved.append((first, length))
        elif isinstance(layer, nn.AdaptiveAvgPool1d):
            saved.append(h.shape[2])
            h = h.mean(dim=2, keepdim=True)
        else:  # Flatten
            saved.append(h.shape)
            h = h.flatten(1)
    logits = h
    loss = F.cross_entropy(logits, y)
    g = torch.softmax(logits, dim=1)
    g[torch.arange(len(y)), y] -= 1.0
    g.div_(len(y))
    for i in range(len(layers) - 1, -1, -1):
        layer, s = layers[i], saved[i]
        need_input_grad = i > 0
        if isinstance(layer, nn.Linear):
            # the input gradient with the old weights (the first layer's is never used)
            gx = kernels.input_grad(g, layer.weight) if need_input_grad else g
            update.linear(layer, g, cast(torch.Tensor, s))
            g = gx
        elif isinstance(layer, nn.Conv1d):
            gx, gw, gb = torch.ops.aten.convolution_backward(
                g.contiguous(),
                s,
                layer.weight,
                [layer.out_channels],
                [1],
                list(layer.padding),
                [1],
                False,
                [0],
                1,
                [need_input_grad, True, True],
            )
            update.conv(layer, gw, gb)
            g = gx
        elif isinstance(layer, nn.ReLU):
            g = g * (cast(torch.Tensor, s) > 0)
        elif isinstance(layer, nn.MaxPool1d):
            first, length = cast(tuple[torch.Tensor, int], s)
            g = _pool_backward(g, first, length)
        elif isinstance(layer, nn.AdaptiveAvgPool1d):
            length = cast(int, s)
            g = g.expand(-1, -1, length) / length
        else:  # Flatten
            g = g.reshape(cast(torch.Size, s))
    update.finish()
    return loss
