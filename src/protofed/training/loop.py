"""Local training: the one loop every algorithm's client side calls.

Data sit in memory as tensors, so an epoch is a seeded permutation and a slice per batch: no
DataLoader, no worker processes, no re-reading from disk. The optimizer is built fresh for
every call, so no momentum or Adam state leaks across rounds or clients.

`train.precision=bf16` runs each step's loss function (the forward pass and the loss,
whatever loss an algorithm passes in) under bf16 autocast, here and only here; parameters,
gradients and the optimizer stay fp32. Prediction stays fp32 (see `predict`).

Which step (autograd, or the autograd-free one of training/fused.py) and which matrix-product
kernels a client's training runs on is a `Plan`: torch's own by default, an alternative only
where a short measurement on the run's shapes found it faster on this machine
(`training.fused.choose_plan`, cached per machine and torch version). `PROTOFED_KERNELS=torch`
skips the measurement (torch's products; the autograd-free step only with `train.fused=true`),
`PROTOFED_KERNELS=onednn` asks for oneDNN's products wherever they apply.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from protofed.config import TrainConfig
from protofed.nn.linear import Linear, onednn_available, onednn_products
from protofed.training.fused import (
    TORCH,
    WEIGHT_MAJOR_FROM,
    Kernels,
    OptimizerStep,
    Plan,
    SGDInPlace,
    autograd_free_step,
    choose_plan,
    model_copy,
    model_signature,
    sequential_layers,
)

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def make_optimizer(
    params: Iterable[torch.Tensor], train: TrainConfig, lr: float | None = None
) -> torch.optim.Optimizer:
    """torch's optimizer for `train`, on torch's `fused=True` optimizer kernel where torch has
    one for the params (this is torch's fused kernel, not the autograd-free step of
    `train.fused`).

    The fused kernels (one vectorised pass over each tensor, on the CPU since torch 2.4) do
    the foreach arithmetic in fewer passes over memory; plain SGD stays on foreach, which
    measured faster. Timings: docs/speed.md.
    """
    lr = train.lr if lr is None else lr
    params = list(params)
    one_pass = not plain_sgd(train) and _fusable(params)
    foreach: bool | None = None if one_pass else True  # exactly one of the two kernels is asked
    fused_kernel: bool | None = True if one_pass else None
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


def autocast(train: TrainConfig, device: torch.device) -> contextlib.AbstractContextManager[Any]:
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
    plan, layers = plan_for(model, x, train, loss_fn, parameters, after_step)
    if plan.autograd_free and layers is not None:
        return _train_autograd_free(model, layers, x, y, train, generator, epochs, lr, plan)
    with onednn_products(plan.products == "onednn"):
        return _train_autograd(
            model, x, y, train, generator, epochs, loss_fn, parameters, lr, after_step
        )


def _train_autograd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    train: TrainConfig,
    generator: torch.Generator,
    epochs: int,
    loss_fn: LossFn,
    parameters: Iterable[torch.Tensor] | None,
    lr: float | None,
    after_step: Callable[[], None] | None,
) -> dict[str, float]:
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


def _autograd_free_layers(
    model: nn.Module,
    x: torch.Tensor,
    train: TrainConfig,
    loss_fn: LossFn,
    parameters: Iterable[torch.Tensor] | None,
    after_step: Callable[[], None] | None,
) -> list[nn.Module] | None:
    """The model's layers if the step can run without autograd (see training/fused.py) and
    `train.fused` does not rule it out."""
    if train.fused == "false" or not _measurable(model, x, train, loss_fn, parameters, after_step):
        return None
    return sequential_layers(model)


def _measurable(
    model: nn.Module,
    x: torch.Tensor,
    train: TrainConfig,
    loss_fn: LossFn,
    parameters: Iterable[torch.Tensor] | None,
    after_step: Callable[[], None] | None,
) -> bool:
    """The common case, whose step a copy of the model with random inputs can time: the default
    loss, every parameter trained, no per-step hook, float32 on the CPU."""
    return (
        train.precision == "fp32"
        and loss_fn is cross_entropy
        and parameters is None
        and after_step is None
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and all(p.requires_grad and p.dtype == torch.float32 for p in model.parameters())
    )


def candidate_plans(
    model: nn.Module, layers: list[nn.Module] | None, train: TrainConfig
) -> list[Plan]:
    """What may run this training, the default first (autograd on torch's products, or the
    autograd-free step on them with `train.fused=true`)."""
    steps = {"true": [True], "false": [False]}.get(train.fused, [False, True])
    steps = [s for s in steps if not s or layers is not None] or [False]
    forced = os.environ.get("PROTOFED_KERNELS", "measure").strip().lower()
    if forced in ("torch", "onednn"):
        onednn_forced = forced == "onednn" and onednn_available()
        return [Plan(steps[0], "onednn" if onednn_forced else "torch")]
    onednn = onednn_available()
    big = layers is not None and any(
        isinstance(m, nn.Linear) and m.weight.numel() >= WEIGHT_MAJOR_FROM for m in layers
    )
    has_linear = any(isinstance(m, Linear) for m in model.modules())
    out = []
    for autograd_free in steps:
        out.append(Plan(autograd_free, "torch"))
        if onednn and (autograd_free or has_linear):
            out.append(Plan(autograd_free, "onednn"))
        if autograd_free and big:
            out.append(Plan(autograd_free, "weight_major"))
    return out


def plan_for(
    model: nn.Module,
    x: torch.Tensor,
    train: TrainConfig,
    loss_fn: LossFn = cross_entropy,
    parameters: Iterable[torch.Tensor] | None = None,
    after_step: Callable[[], None] | None = None,
) -> tuple[Plan, list[nn.Module] | None]:
    """The plan for this training and, for the autograd-free step, the model's layers."""
    if not _measurable(model, x, train, loss_fn, parameters, after_step):
        return TORCH, None
    layers = sequential_layers(model)
    if layers is None:  # only the sequential models' steps are timed (their output: logits)
        return TORCH, None
    if train.fused == "false":
        layers = None
    candidates = candidate_plans(model, layers, train)
    key = {
        "model": model_signature(model),
        "input": list(x.shape[1:]),
        "batch": train.batch_size,
        "optimizer": [train.optimizer, plain_sgd(train), train.momentum > 0, train.nesterov],
        "weight_decay": train.weight_decay > 0,
        "threads": torch.get_num_threads(),
    }

    def make_step(plan: Plan) -> Callable[[], None]:
        return _timed_step(model, x, train, plan)

    plan = choose_plan(key, candidates, make_step)
    return plan, layers if plan.autograd_free else None


def _timed_step(
    model: nn.Module, x: torch.Tensor, train: TrainConfig, plan: Plan
) -> Callable[[], None]:
    """One training step of `plan` on a copy of the model and random inputs of x's shape."""
    twin = model_copy(model)
    twin.train()
    gen = torch.Generator().manual_seed(0)
    xb = torch.randn((train.batch_size, *x.shape[1:]), generator=gen)
    layers = sequential_layers(twin)
    if layers is None:  # plan_for times sequential models only
        raise RuntimeError("only sequential models' steps are timed")
    head = cast(nn.Linear, layers[-1])
    yb = torch.randint(head.out_features, (train.batch_size,), generator=gen)
    if plan.autograd_free:
        kernels = Kernels(plan.products)
        update: SGDInPlace | OptimizerStep = (
            SGDInPlace(kernels, train.lr)
            if plain_sgd(train)
            else OptimizerStep(kernels, make_optimizer(twin.parameters(), train))
        )

        def free_step() -> None:
            autograd_free_step(layers, xb, yb, update)

        return free_step

    optimizer = make_optimizer(twin.parameters(), train)
    onednn = plan.products == "onednn"

    def step() -> None:
        with onednn_products(onednn):
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(twin(xb), yb)
            loss.backward()
            optimizer.step()

    return step


def _train_autograd_free(
    model: nn.Module,
    layers: list[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    train: TrainConfig,
    generator: torch.Generator,
    epochs: int,
    lr: float | None,
    plan: Plan,
) -> dict[str, float]:
    kernels = Kernels(plan.products)
    if plain_sgd(train):
        update: SGDInPlace | OptimizerStep = SGDInPlace(kernels, train.lr if lr is None else lr)
    else:
        update = OptimizerStep(kernels, make_optimizer(model.parameters(), train, lr))
    total = torch.zeros(())
    steps = 0
    try:
        for _ in range(epochs):
            for idx in batches(len(x), train.batch_size, generator):
                total += autograd_free_step(layers, x[idx], y[idx], update)
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
