"""Local training on cross-entropy without autograd, for sequential models on the CPU, and
the measurement that decides, per machine and shapes, whether to use it.

Federated clients take many tiny steps, where the autograd graph and a fresh gradient buffer
per weight can cost as much as the arithmetic. For the common case this module runs the same
mathematics by hand ("the autograd-free step"; `train.fused` is its config key, a name kept
from before: it is not torch's `fused=` optimizer kernels, which training.loop.make_optimizer
asks for): a forward pass that keeps what the backward pass needs, then, layer by layer from
the top, the input gradient (with the old weights) and the layer's weight gradient. Plain SGD
(`SGDInPlace`) applies each weight gradient in place during the sweep, folding the largest
into `W.addmm_(-lr * dY^T X)`; every other optimizer (`OptimizerStep`) gets the gradients as
`.grad` and takes torch's own step (`training.loop.make_optimizer`).

It applies only where the result is autograd's: the default loss, every parameter trained, no
per-step hook, float32 on the CPU, and a model whose `features` is an `nn.Sequential` of
Conv1d / ReLU / MaxPool1d(2) / AdaptiveAvgPool1d(1) / Flatten / Linear (mlp, cnn1d, harcnn).
Tests check both paths give the same weights to fp32 rounding for every optimizer.

Whether it is used, and on which matrix-product kernels, is a `Plan` that `choose_plan` picks
by a short measurement on the run's own shapes (a copy of the model, random inputs of the
run's batch), as cuDNN's benchmark mode does, cached per machine and torch version
(`PROTOFED_KERNEL_CACHE`); torch's own kernels and autograd are the default wherever nothing
was measured. Measured: the autograd-free step about 1.25x faster than autograd for plain
SGD, a tie or a few per cent slower for momentum and Adam, by machine (docs/speed.md).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from protofed.nn.linear import onednn_available, onednn_linear

# From this many weights on, `W.addmm_(-lr * dY^T X)` beats oneDNN's dW followed by `W -= lr dW`:
# it never writes dW, the memory traffic that worker processes contend for (docs/speed.md).
_FUSED_UPDATE_FROM = 2**20
# With `products="weight_major"`, the forward product of a layer from this many weights on runs
# as `(W X^T)^T`: for harcnn's 1024 x 1664 layer at batch 10 it took 0.60 against F.linear's
# 1.09 ms on one Intel machine (docs/speed.md); measured per machine, never assumed.
WEIGHT_MAJOR_FROM = 2**16

Products = Literal["torch", "onednn", "weight_major"]


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
    """The autograd-free step's matrix products: torch's (the default), oneDNN's (only where
    available: one intra-op thread, see protofed.nn.linear), or torch's with the forward
    product of large layers weight-major, `(W X^T)^T`."""

    def __init__(self, products: Products = "torch") -> None:
        self.onednn = products == "onednn" and onednn_available()
        self.weight_major = products == "weight_major"

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if self.onednn:
            return onednn_linear(x, w, b)
        if self.weight_major and w.numel() >= WEIGHT_MAJOR_FROM:  # the same product
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
def autograd_free_step(
    layers: list[nn.Module], x: torch.Tensor, y: torch.Tensor, update: Update
) -> torch.Tensor:
    """One step on the mean cross-entropy; returns the (pre-update) loss."""
    kernels = update.kernels
    saved: list[Saved] = []
    h = x
    for layer in layers:
        if isinstance(layer, nn.Linear):
            if h.dim() != 2:
                raise RuntimeError(
                    "the autograd-free step expects flattened inputs to Linear layers"
                )
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


# -- which step and which products: measured, not assumed -------------------------------------
@dataclass(frozen=True)
class Plan:
    """How a client's local training runs: autograd (torch's step) or the autograd-free step,
    on torch's products, oneDNN's, or (autograd-free only) torch's with a weight-major forward."""

    autograd_free: bool = False
    products: Products = "torch"

    @property
    def label(self) -> str:
        return f"{'autograd_free' if self.autograd_free else 'autograd'}/{self.products}"


TORCH = Plan()  # torch's own kernels and autograd: the default wherever nothing was measured
_CHOSEN: dict[str, Plan] = {}  # this process's choices, by key
_WARMUP, _ROUNDS, _STEPS = 2, 5, 4  # per candidate: untimed steps, then rounds of timed steps
_MARGIN = 0.02  # an alternative must beat the first candidate (the default) by 2 %


def machine_key() -> str:
    """Names this machine and torch build (no CPU model is read: the host name, architecture,
    torch's CPU capability, the core count and torch's version)."""
    parts = [
        platform.node(),
        platform.system(),
        platform.machine(),
        torch.backends.cpu.get_cpu_capability(),
        str(os.cpu_count()),
        torch.__version__,
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def kernel_cache_path() -> Path | None:
    """Where measured plans are kept: `$PROTOFED_KERNEL_CACHE` (a file; `off` or empty: keep
    them in memory only), else `kernels/<machine key>.json` under the user's cache folder."""
    given = os.environ.get("PROTOFED_KERNEL_CACHE")
    if given is not None:
        return None if given.strip() in ("", "off") else Path(given).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("protofed")) / "kernels" / f"{machine_key()}.json"


@contextlib.contextmanager
def _locked(path: Path | None) -> Iterator[None]:
    """Other processes (a run's workers) wait while one measures, then read its choice."""
    try:
        import fcntl
    except ImportError:  # not POSIX: each process may measure for itself
        fcntl = None  # type: ignore[assignment]
    with contextlib.ExitStack() as stack:
        if fcntl is not None and path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                lock = stack.enter_context(open(path.with_name(path.name + ".lock"), "a"))
            except OSError:  # no cache folder: each process measures for itself
                pass
            else:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _read_cache(path: Path | None) -> dict[str, dict[str, Any]]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(path: Path | None, key: str, entry: dict[str, Any]) -> None:
    if path is None:
        return
    data = _read_cache(path)
    data[key] = entry
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError:  # a read-only cache folder: the choice stays in this process
        with contextlib.suppress(OSError):
            tmp.unlink()


def measure_plans(
    candidates: list[Plan], make_step: Callable[[Plan], Callable[[], None]]
) -> dict[str, float]:
    """Seconds a step for each candidate: the best of a few rounds of a few steps, the
    candidates interleaved so that a change of load hits them alike."""
    steps = {plan.label: make_step(plan) for plan in candidates}
    for step in steps.values():
        for _ in range(_WARMUP):
            step()
    best = dict.fromkeys(steps, float("inf"))
    for _ in range(_ROUNDS):
        for label, step in steps.items():
            t0 = time.perf_counter()
            for _ in range(_STEPS):
                step()
            best[label] = min(best[label], (time.perf_counter() - t0) / _STEPS)
    return best


def fastest(candidates: list[Plan], seconds: dict[str, float]) -> Plan:
    """The fastest candidate, unless the first (the default) is within the margin of it."""
    winner = min(candidates, key=lambda plan: seconds[plan.label])
    default = candidates[0]
    if seconds[default.label] <= seconds[winner.label] * (1 + _MARGIN):
        return default
    return winner


def choose_plan(
    key: dict[str, Any], candidates: list[Plan], make_step: Callable[[Plan], Callable[[], None]]
) -> Plan:
    """The plan for the run's shapes (`key`): the one measured fastest on this machine, once
    per machine, torch version and key (cached in `kernel_cache_path()`); the first candidate
    (the default) where it is the only one or within 2 % of the fastest.

    `make_step(plan)` returns one training step on a copy of the model and random inputs of
    the run's shapes; the global random state is left as it was."""
    if len(candidates) == 1:
        return candidates[0]
    text = json.dumps({**key, "candidates": [asdict(p) for p in candidates]}, sort_keys=True)
    if text in _CHOSEN:
        return _CHOSEN[text]
    path = kernel_cache_path()
    with _locked(path):
        entry = _read_cache(path).get(text)
        plan = _cached_plan(entry, candidates)
        if plan is None:
            with torch.random.fork_rng(devices=[]):
                seconds = measure_plans(candidates, make_step)
            plan = fastest(candidates, seconds)
            _write_cache(
                path,
                text,
                {
                    "plan": asdict(plan),
                    "seconds_per_step": seconds,
                    "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
            )
    _CHOSEN[text] = plan
    return plan


def _cached_plan(entry: object, candidates: list[Plan]) -> Plan | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("plan"), dict):
        return None
    try:
        plan = Plan(**entry["plan"])
    except TypeError:
        return None
    return plan if plan in candidates else None


def model_signature(model: nn.Module) -> list[list[Any]]:
    """The model's layers and their parameters' shapes: what the products' shapes follow from."""
    return [
        [type(m).__name__, [list(p.shape) for p in m.parameters(recurse=False)]]
        for m in model.modules()
        if any(True for _ in m.parameters(recurse=False))
    ]


def model_copy(model: nn.Module) -> nn.Module:
    """A copy to measure on (its steps never touch the run's weights)."""
    return copy.deepcopy(model)


fused_step = autograd_free_step  # the name before it was renamed (benchmarks import it)
