"""A round's clients trained together: their weights and optimizer states stacked on a client axis.

A federated round trains many small models, each with many tiny steps. One client at a time,
a GPU spends those steps launching kernels; stacked, every step is one program for all the
round's clients: `torch.func.functional_call` runs the workspace model with a client's weights,
`grad_and_value` takes its gradient and `vmap` maps both over the client axis, then one
optimizer update moves every client's slice.

Each client gets exactly what training it alone gives (`training.loop.train_epochs`), to fp32
rounding (tests/training/test_stacked.py):
- its batches in the order its own generator draws them (`training.loop.batches`, epoch by
  epoch), padded to the batch size with examples of weight zero, so a short last batch is the
  mean over its own examples;
- its own number of steps: clients are ordered by their step count, so at every step the
  clients that still have batches are the first k, and only their slices are computed and
  updated. A client out of batches takes no step: its weights and its momentum or Adam state
  are not touched (not a zero-gradient step, which would move momentum and Adam's moments);
- torch.optim's update rules for SGD (momentum, dampening-free as `make_optimizer` builds it,
  Nesterov, weight decay), Adam and AdamW, with the hyperparameters `make_optimizer` gives;
  every client's step count is the global step, since a client steps at every step until it
  is out of batches.

It applies to a model whose training forward pass is a pure function of its parameters: no
buffers (BatchNorm statistics would be updated in place) and no dropout (its masks would be
drawn for all clients at once, so not the per-client path's). The loss is cross-entropy plus
an optional per-client `Term` of the client's weights, its own tensors and its `Batch`
(FedProx's proximal term and its anchor; FedProto's prototype distance, reading the batch's
embeddings, and the prototypes it was sent; MOON's contrastive term, embedding the batch under
its frozen global and previous weights). An algorithm's round stacked is an adapter registered
for it beside the runtime that runs it (`runtime.stacking`: the algorithms know nothing of
this module), calling a `Trainer` once per training phase for all clients (Ditto's two
models, FedRep's head then body); what runs stacked is decided there, once per run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from protofed.config import TrainConfig
from protofed.core.types import Arrays, Metrics
from protofed.nn import linear
from protofed.training.client import Client
from protofed.training.loop import autocast, batches, make_optimizer


def part(arrays: Arrays, prefix: str) -> Arrays:
    """The entries under `prefix`, named without it (a submodule's weights: "features.")."""
    return {n[len(prefix) :]: t for n, t in arrays.items() if n.startswith(prefix)}


def embedding(model: nn.Module, weights: Arrays, x: torch.Tensor) -> torch.Tensor:
    """`model.features(x)` under `weights` (named as the whole model's parameters)."""
    return functional_call(model.get_submodule("features"), part(weights, "features."), (x,))


@dataclass(frozen=True)
class Batch:
    """One client's batch as its `Term` sees it, inside vmap: the rows (padded to the batch
    size), each row's weight in the batch mean (1/len(batch), 0 for padding: a term averages
    with it, never over the padded length), the rows' embedding under the client's weights,
    and `embed(weights)`, their embedding under other weights (MOON's frozen models)."""

    x: torch.Tensor
    y: torch.Tensor
    weight: torch.Tensor
    features: torch.Tensor
    embed: Callable[[Arrays], torch.Tensor]


Term = Callable[[Arrays, Arrays, Batch], torch.Tensor]
"""A per-client addition to the loss: (one client's trained parameters, its own tensors, its
batch) -> scalar."""


@dataclass(frozen=True)
class StackedTask:
    """One client's part of a stacked round: the weights it starts from (every parameter of
    the model) and the tensors its loss term reads (FedProx: its anchor), if any."""

    start: Arrays
    aux: Arrays = field(default_factory=dict)


class Trainer(Protocol):
    """Trains a round's clients stacked, each from its task (`StackedTrainer`)."""

    def __call__(
        self,
        tasks: list[StackedTask],
        term: Term | None = None,
        *,
        epochs: int | None = None,
        trainable: Callable[[str], bool] | None = None,
        pull: float = 0.0,
    ) -> list[tuple[Arrays, Metrics]]: ...


@dataclass
class StackedTrainer:
    """A `Trainer` for these clients on this workspace model (`train_stacked`, phase by phase:
    each client's generator goes on drawing where its last phase left it)."""

    model: nn.Module
    clients: list[Client]

    def __call__(
        self,
        tasks: list[StackedTask],
        term: Term | None = None,
        *,
        epochs: int | None = None,
        trainable: Callable[[str], bool] | None = None,
        pull: float = 0.0,
    ) -> list[tuple[Arrays, Metrics]]:
        return train_stacked(
            self.model, self.clients, tasks, term, epochs=epochs, trainable=trainable, pull=pull
        )


def proximal_term(mu: float) -> Term | None:
    """`regularizers.proximal_loss`'s mu/2 * ||w - anchor||^2 over the trained parameters the
    client's anchor names; None for mu == 0 (plain cross-entropy, as there)."""
    if mu == 0:
        return None
    half_mu = 0.5 * float(mu)

    def term(params: Arrays, anchor: Arrays, batch: Batch) -> torch.Tensor:
        distances = [(p - anchor[n]).pow(2).sum() for n, p in params.items() if n in anchor]
        return half_mu * torch.stack(distances).sum()

    return term


def model_reason(model: nn.Module) -> str | None:
    """Why this model cannot train stacked (None: it can)."""
    if any(True for _ in model.buffers()):
        return "the model has buffers (BatchNorm statistics), updated in place per client"
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return "the model has dropout, whose masks stacked would not be each client's own"
    return None


@dataclass
class Schedule:
    """Every client's batches, clients ordered by step count (most first).

    `index[t, j]`: row numbers into the round's concatenated data of the j-th client's batch at
    step t, padded with row 0; `weight[t, j]`: 1/len(batch) for its rows, 0 for the padding.
    `active[t]`: how many clients (a prefix) still have a batch at step t.
    """

    order: list[int]
    steps: list[int]
    index: torch.Tensor
    weight: torch.Tensor
    active: list[int]


def schedule(clients: list[Client], epochs: int, batch_size: int) -> Schedule:
    """Draw each client's batches from its own generator, as `train_epochs` would."""
    drawn, offset = [], 0
    for c in clients:
        n = c.num_examples
        own = [b + offset for _ in range(epochs) for b in batches(n, batch_size, c.generator)]
        drawn.append(own)
        offset += n
    steps = [len(b) for b in drawn]
    order = sorted(range(len(clients)), key=lambda i: -steps[i])  # stable: ties keep order
    longest = max(steps, default=0)
    index = torch.zeros(longest, len(clients), batch_size, dtype=torch.long)
    weight = torch.zeros(longest, len(clients), batch_size)
    for j, i in enumerate(order):
        for t, rows in enumerate(drawn[i]):
            index[t, j, : len(rows)] = rows
            weight[t, j, : len(rows)] = 1.0 / len(rows) if len(rows) else 0.0
    active = [sum(1 for i in order if steps[i] > t) for t in range(longest)]
    return Schedule(order, [steps[i] for i in order], index, weight, active)


class StackedOptimizer:
    """torch.optim's SGD, Adam or AdamW on stacked parameters, one prefix of clients a step.

    The hyperparameters are those of the optimizer `make_optimizer` builds for one client; the
    arithmetic is torch's single-tensor update, element by element, on all tensors at once.
    """

    def __init__(self, params: list[torch.Tensor], train: TrainConfig, lr: float | None) -> None:
        probe = make_optimizer([torch.zeros(1, requires_grad=True)], train, lr)
        self.kind = train.optimizer
        self.hp = dict(probe.defaults)
        self.params = params
        self.step_count = 0
        momentum = self.kind == "sgd" and self.hp["momentum"] != 0
        adam = self.kind in ("adam", "adamw")
        self.first = [torch.zeros_like(p) for p in params] if momentum or adam else []
        self.second = [torch.zeros_like(p) for p in params] if adam else []

    def step(self, k: int, grads: list[torch.Tensor]) -> None:
        """Update the first `k` clients' slices with their gradients (each (k, ...))."""
        self.step_count += 1
        params = [p[:k] for p in self.params]
        if self.kind == "sgd":
            self._sgd(k, params, grads)
        else:
            self._adam(k, params, grads)

    def _sgd(self, k: int, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        hp = self.hp
        lr, wd, momentum = hp["lr"], hp["weight_decay"], hp["momentum"]
        if wd != 0:
            grads = list(torch._foreach_add(grads, params, alpha=wd))
        if momentum != 0:
            bufs = [b[:k] for b in self.first]
            if self.step_count == 1:  # torch: the buffer starts as the first gradient
                torch._foreach_copy_(bufs, grads)
            else:
                torch._foreach_mul_(bufs, momentum)
                torch._foreach_add_(bufs, grads, alpha=1 - hp["dampening"])
            nesterov = hp["nesterov"]
            grads = list(torch._foreach_add(grads, bufs, alpha=momentum)) if nesterov else bufs
        torch._foreach_add_(params, grads, alpha=-lr)

    def _adam(self, k: int, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        hp = self.hp
        lr, wd, eps = hp["lr"], hp["weight_decay"], hp["eps"]
        beta1, beta2 = hp["betas"]
        if wd != 0:
            if self.kind == "adamw":
                torch._foreach_mul_(params, 1 - lr * wd)
            else:
                grads = list(torch._foreach_add(grads, params, alpha=wd))
        exp_avg = [m[:k] for m in self.first]
        exp_avg_sq = [v[:k] for v in self.second]
        torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sq, beta2)
        torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
        step = float(self.step_count)
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        denom = list(torch._foreach_sqrt(exp_avg_sq))
        torch._foreach_div_(denom, bias_correction2**0.5)
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, exp_avg, denom, value=-step_size)


def _loss_and_grad(
    model: nn.Module, term: Term | None
) -> Callable[..., tuple[Arrays, torch.Tensor]]:
    """vmap(grad_and_value(one client's loss)) over (trained, frozen, x, y, weight, aux)."""

    def loss(
        params: Arrays,
        frozen: Arrays,
        x: torch.Tensor,
        y: torch.Tensor,
        w: torch.Tensor,
        aux: Arrays,
    ) -> torch.Tensor:
        weights = {**frozen, **params}
        features = embedding(model, weights, x)
        logits = functional_call(model.get_submodule("head"), part(weights, "head."), (features,))
        value = (F.cross_entropy(logits, y, reduction="none") * w).sum()
        if term is None:
            return value
        batch = Batch(x, y, w, features, lambda other: embedding(model, other, x))
        return value + term(params, aux, batch)

    return vmap(grad_and_value(loss))


def train_stacked(
    model: nn.Module,
    clients: list[Client],
    tasks: list[StackedTask],
    term: Term | None = None,
    *,
    epochs: int | None = None,
    trainable: Callable[[str], bool] | None = None,
    pull: float = 0.0,
) -> list[tuple[Arrays, Metrics]]:
    """Train every client from its task's weights at once; each one's weights and metrics.

    All clients share `clients[0].train` (one experiment's round); `epochs` replaces its
    `local_epochs`, `trainable(name)` picks the parameters the optimizer moves (the others
    stay as the task starts them, and the term sees only the trained ones), as
    `Client.train_model`'s `epochs` and `parameters`. `pull` (Ditto's lambda): each step also
    moves the trained weights the task's aux names by -lr * pull * (w - aux), w as the step
    began, beside the optimizer (`regularizers.ProximalStep`). The workspace `model` is only the
    function: its own weights are not read or changed. Metrics are those of `train_epochs`:
    the mean loss of the client's steps (with its term) and their number.
    """
    if not clients:
        return []
    train = clients[0].train
    names = [name for name, _ in model.named_parameters()]
    for task in tasks:
        if set(task.start) != set(names):
            raise ValueError("a stacked task starts from every parameter of the model")
    moved = [n for n in names if trainable is None or trainable(n)]
    device = tasks[0].start[names[0]].device
    epochs = train.local_epochs if epochs is None else epochs
    plan = schedule(clients, epochs, train.batch_size)

    def stack(records: list[Arrays], keys: list[str]) -> Arrays:
        return {n: torch.stack([records[i][n] for i in plan.order]).detach() for n in keys}

    params = stack([t.start for t in tasks], moved)
    frozen = stack([t.start for t in tasks], [n for n in names if n not in params])
    aux = {n: a.to(device) for n, a in stack([t.aux for t in tasks], sorted(tasks[0].aux)).items()}
    if not params:
        raise ValueError("a stacked phase trains at least one parameter")
    optimizer = StackedOptimizer(list(params.values()), train, None)
    pulled = [n for n in params if n in aux] if pull else []
    proximal = (pulled, float(optimizer.hp["lr"]) * pull)
    total = _run(model, clients, plan, (params, frozen, aux), optimizer, term, device, proximal)
    losses = total.tolist()
    out: list[tuple[Arrays, Metrics]] = [({}, {}) for _ in clients]
    for j, i in enumerate(plan.order):
        weights = {n: (params[n] if n in params else frozen[n])[j].clone() for n in names}
        steps = plan.steps[j]
        out[i] = (weights, {"loss": losses[j] / max(steps, 1), "steps": float(steps)})
    return out


def _run(
    model: nn.Module,
    clients: list[Client],
    plan: Schedule,
    stacked: tuple[Arrays, Arrays, Arrays],
    optimizer: StackedOptimizer,
    term: Term | None,
    device: torch.device,
    proximal: tuple[list[str], float] = ([], 0.0),
) -> torch.Tensor:
    """The steps, in place on the trained weights; each client's summed loss (plan.order).

    `stacked`: the (trained, frozen, aux) tensors, each (clients, ...) in `plan.order`;
    `proximal`: the trained weights pulled toward their aux after each step, and the rate."""
    params, frozen, aux = stacked
    pulled, rate = proximal
    train = clients[0].train
    x = torch.cat([c.data.train_x for c in clients]).to(device)
    y = torch.cat([c.data.train_y for c in clients]).to(device)
    index, weight = plan.index.to(device), plan.weight.to(device)
    total = torch.zeros(len(clients), device=device)
    step = _loss_and_grad(model, term)
    precision = autocast(train, device)
    was_training = model.training
    model.train()
    try:
        # protofed's Linear on torch's own op: its oneDNN autograd function has no vmap rule
        with linear.onednn_products(False):
            for t, k in enumerate(plan.active):
                rows = index[t, :k]
                with precision:
                    grads, loss = step(
                        {n: p[:k] for n, p in params.items()},
                        {n: f[:k] for n, f in frozen.items()},
                        x[rows],
                        y[rows],
                        weight[t, :k],
                        {n: a[:k] for n, a in aux.items()},
                    )
                if pulled:  # w - anchor as the step began (ProximalStep's order)
                    away = torch._foreach_sub(
                        [params[n][:k] for n in pulled], [aux[n][:k] for n in pulled]
                    )
                optimizer.step(k, [grads[n] for n in params])
                if pulled:
                    torch._foreach_add_([params[n][:k] for n in pulled], away, alpha=-rate)
                total[:k] += loss.detach().float()
    finally:
        model.train(was_training)
    return total
