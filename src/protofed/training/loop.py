"""Local training: the one loop every algorithm's client side calls.

Data sit in memory as tensors, so an epoch is a seeded permutation and a slice per batch: no
DataLoader, no worker processes, no re-reading from disk. The optimizer is built fresh for
every call, so no momentum or Adam state leaks across rounds or clients.

`train.precision=bf16` runs each step's loss function (the forward pass and the loss,
whatever loss an algorithm passes in) under bf16 autocast, here and only here; parameters,
gradients and the optimizer stay fp32. Prediction stays fp32 (see `predict`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from protofed.config import TrainConfig
from protofed.training.fused import (
    Kernels,
    OptimizerStep,
    SGDInPlace,
    fused_step,
    sequential_layers,
)

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def make_optimizer(
    params: Iterable[torch.Tensor], train: TrainConfig, lr: float | None = None
) -> torch.optim.Optimizer:
    """torch's optimizer for `train`, on its fused kernel where torch has one for the params.

    The fused kernels (one vectorised pass over each tensor, on the CPU since torch 2.4) do
    the foreach arithmetic in fewer passes over memory; plain SGD stays on foreach, which
    measured faster. Timings: docs/speed.md.
    """
    lr = train.lr if lr is None else lr
    params = list(params)
    fused = not plain_sgd(train) and _fusable(params)
    foreach: bool | None = None if fused else True  # exactly one of the two kernels is asked
    fused_kernel: bool | None = True if fused else None
    if train.optimizer in ("adam", "adamw"):
        cls = torch.optim.AdamW if train.optimizer == "adamw" else torch.optim.Adam
        return cls(
            params, lr=lr, weight_decay=train.weight_decay, foreach=foreach, fused=fused_kernel
        )
    return torch.optim.SGD(
        params,
        lr=lr,
        momentum=train.momentum,
        weight_decay=train.weight_decay,
        nesterov=train.nesterov and train.momentum > 0,
        foreach=foreach,
        fused=fused_kernel,
    )


def plain_sgd(train: TrainConfig) -> bool:
    """SGD without momentum or weight decay: one pass, applied in place where it can be."""
    return train.optimizer == "sgd" and train.momentum == 0 and train.weight_decay == 0


def _fusable(params: list[torch.Tensor]) -> bool:
    """Whether torch's fused optimizer kernels take these parameters (floating, CPU or CUDA)."""
    devices = {p.device.type for p in params}
    return (
        bool(params)
        and len(devices) == 1
        and devices <= {"cpu", "cuda"}
        and all(p.is_floating_point() for p in params)
    )


def autocast(train: TrainConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """The context the forward pass and loss run in: bf16 autocast, or nothing for fp32.

    Autocast casts the inputs of matrix products and convolutions to bf16 and keeps the
    parameters (the master weights) in fp32; losses and reductions run in fp32.
    """
    if train.precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def batches(
    n: int, batch_size: int, generator: torch.Generator, device: torch.device | str = "cpu"
) -> list[torch.Tensor]:
    """Index batches of one shuffled epoch, on `device` (the data's).

    The permutation is drawn on the CPU, so it is the same on every device, and moved once
    per epoch: indexing CUDA data with a CPU index would copy (and synchronise) every step.
    """
    order = torch.randperm(n, generator=generator).to(device)
    return list(order.split(batch_size))


def train_epochs(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    train: TrainConfig,
    generator: torch.Generator,
    *,
    epochs: int | None = None,
    loss_fn: LossFn = cross_entropy,
    parameters: Iterable[torch.Tensor] | None = None,
    lr: float | None = None,
    after_step: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Train `model` in place; return the mean loss and the number of steps.

    `parameters` restricts what the optimizer updates (FedRep's phases, FedBABU's body);
    `after_step` runs after every optimizer step (pFedMe's and Ditto's proximal updates).
    """
    epochs = train.local_epochs if epochs is None else epochs
    fused = _fused_layers(model, x, train, loss_fn, parameters, after_step)
    if fused is not None:
        return _train_fused(model, fused, x, y, train, generator, epochs, lr)
    params = [p for p in (model.parameters() if parameters is None else parameters)]
    trainable = {id(p) for p in params}
    frozen = [p for p in model.parameters() if id(p) not in trainable and p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    optimizer = make_optimizer(params, train, lr)
    model.train()
    for module in _frozen_norms(model, trainable):
        module.eval()  # a frozen part is a fixed function: its BatchNorm statistics stay too
    total, steps = torch.zeros((), device=x.device), 0  # summed on the device: no sync per step
    precision = autocast(train, x.device)
    try:
        for _ in range(epochs):
            for idx in batches(len(x), train.batch_size, generator, x.device):
                optimizer.zero_grad(set_to_none=True)
                with precision:
                    loss = loss_fn(model, x[idx], y[idx])
                loss.backward()
                optimizer.step()
                if after_step is not None:
                    after_step()
                total += loss.detach()
                steps += 1
    finally:
        for p in frozen:
            p.requires_grad_(True)
    return {"loss": total.item() / max(steps, 1), "steps": float(steps)}


def _frozen_norms(model: nn.Module, trainable: set[int]) -> list[nn.Module]:
    """Normalisation layers none of whose parameters are being trained."""
    return [
        m
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._NormBase)
        and not any(id(p) in trainable for p in m.parameters(recurse=False))
    ]


def _fused_layers(
    model: nn.Module,
    x: torch.Tensor,
    train: TrainConfig,
    loss_fn: LossFn,
    parameters: Iterable[torch.Tensor] | None,
    after_step: Callable[[], None] | None,
) -> list[nn.Module] | None:
    """The model's layers if the step can run without autograd (see training/fused.py)."""
    if not (
        train.fused
        and train.precision == "fp32"
        and loss_fn is cross_entropy
        and parameters is None
        and after_step is None
        and x.device.type == "cpu"
        and x.dtype == torch.float32
    ):
        return None
    if not all(p.requires_grad and p.dtype == torch.float32 for p in model.parameters()):
        return None
    return sequential_layers(model)


def _train_fused(
    model: nn.Module,
    layers: list[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    train: TrainConfig,
    generator: torch.Generator,
    epochs: int,
    lr: float | None,
) -> dict[str, float]:
    kernels = Kernels()
    if plain_sgd(train):
        update: SGDInPlace | OptimizerStep = SGDInPlace(kernels, train.lr if lr is None else lr)
    else:
        update = OptimizerStep(kernels, make_optimizer(model.parameters(), train, lr))
    total = torch.zeros(())
    steps = 0
    try:
        for _ in range(epochs):
            for idx in batches(len(x), train.batch_size, generator):
                total += fused_step(layers, x[idx], y[idx], update)
                steps += 1
    finally:
        for p in model.parameters():
            p.grad = None  # the gradients were the step's scratch, as autograd's are
    return {"loss": total.item() / max(steps, 1), "steps": float(steps)}


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    """Predicted labels, in eval mode and in chunks (so memory stays flat).

    Always fp32, whatever `train.precision`: bf16 is a training setting, the weights it
    trains are fp32, and scoring them in fp32 measures what bf16 training did, the same way
    for every run (and without bf16 hardware, as on AVX2 CPUs, bf16 would be slower).
    """
    model.eval()
    out = [model(chunk).argmax(dim=1) for chunk in x.split(batch_size)]
    return torch.cat(out) if out else torch.empty(0, dtype=torch.long)
