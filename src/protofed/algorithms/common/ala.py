"""ALA, adaptive local aggregation (FedALA, Zhang et al., AAAI 2023): the mechanics, once, and
the plug-in that brings them to other algorithms (`algorithm.ala.*`).

Before local training a client builds theta_hat = theta_local + (theta_global - theta_local) * W
on the top p layers and takes every lower layer from the global model; W is trained on s % of
its data and kept in its state. What it does, how each ambiguity of the paper and the official
code was settled, and the plug-in: docs/algorithms/fedala.md.

An algorithm accepts the plug-in by naming its clients' local model in one class attribute,
`ala_local`, that only this module reads (see `declared_local`).
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from protofed.algorithms.base import Algorithm, Hyperparams, Setting, with_model
from protofed.algorithms.common.split import is_head
from protofed.core.types import MODEL, Arrays, FitResult, Metrics, Records
from protofed.errors import ConfigError
from protofed.training.client import Client
from protofed.training.loop import batches

if TYPE_CHECKING:
    from collections.abc import Container

    from protofed.models.base import FedModel

ALA_KEY = "ala"  # the `algorithm.ala.*` section
WEIGHTS = "ala.weights"  # client state record: W, one tensor per top-layer parameter
LOCAL = "ala.local"  # client state record ("reply" algorithms): the model it trained last
OWN = (WEIGHTS, LOCAL)  # the records ALA adds to a client's state
PERSONAL = "personal"  # client state record of "state" algorithms: their local model
WINDOW = 10  # the start phase looks at the std of the last WINDOW epoch losses
LocalModel = Literal["reply", "state"]
MODES: tuple[LocalModel, ...] = ("reply", "state")
EMBED_CHUNK = 128  # samples embedded at once when only the head is covered


def declared_local(cls: type[Algorithm]) -> LocalModel | None:
    """Which model is `cls`'s clients' local one for ALA, or None if it names none.

    An algorithm names it in a class attribute, which subclasses inherit:

        class MyAlgo(Algorithm):
            ala_local = "reply"

    "reply": the `"model"` record the client trained and sent back last time (FedAvg,
    FedProx, FedRep, ...); the plug-in keeps it and hands `fit` a message whose model is
    theta_hat. "state": the algorithm's own client state record `"personal"` (Ditto); the
    plug-in hands `fit` theta_hat in its place. Not set (or None): `algorithm.ala.*` is a
    config error for it.

    The attribute lives on the algorithms that opt in, not on the `Algorithm` base (which
    knows no plug-in) nor in a table here, so an algorithm of your own opts in on its own
    class, and a subclass inherits what its parent declared.
    """
    value = getattr(cls, "ala_local", None)
    for mode in MODES:
        if value == mode:
            return mode
    return None


class AlaSettings(Hyperparams):
    """ALA's hyperparameters (the slides' defaults)."""

    p: int = Field(
        1,
        ge=1,
        description="Top layers (of model.layers(), among those the server sends) "
        "mixed by trained weights; the lower ones are taken from the global model (slides: 1).",
    )
    s: float = Field(
        80.0,
        gt=0,
        le=100,
        description="Percent of the client's training data W is trained on (slides: 80).",
    )
    eta: float = Field(1.0, gt=0, description="Learning rate of W (slides: 1.0).")
    threshold: float = Field(
        0.1,
        gt=0,
        description="Start phase ends when the std of the last 10 epoch losses is "
        "below this (official code 0.1; the paper writes 0.01).",
    )
    max_start_epochs: int = Field(
        100, ge=1, description="Cap on start-phase epochs (a warning when it is reached)."
    )
    personalized: Literal["hat", "trained"] = Field(
        "hat",
        description="Evaluated client model: 'hat' = the ALA aggregate of the current "
        "global model and the client's local model with its latest W (the paper's output; the "
        "official code evaluates right after ALA), 'trained' = the model it trained last. "
        "Ditto's (ala_local='state') is its own personal model either way.",
    )


class AlaParams(AlaSettings):
    """`algorithm.ala.*`: the ALA plug-in for an algorithm that declares `ala_local`."""

    enabled: bool = Field(False, description="Apply ALA before this algorithm's local training.")


# the mechanics ----------------------------------------------------------------------------
def top_layers(model: FedModel, available: Container[str], p: int) -> list[str]:
    """The p layers nearest the output among those whose parameters are all `available`."""
    eligible = [
        layer
        for layer in model.layers()
        if all(name in available for name in model.layer_params(layer))
    ]
    if p > len(eligible):
        raise ConfigError(
            f"algorithm ALA p={p} but the model has only {len(eligible)} layers with a global "
            f"version ({', '.join(eligible) or 'none'})"
        )
    return eligible[-p:]


def ala_parameters(model: FedModel, global_: Arrays, local: Arrays, p: int) -> list[str]:
    """Names of the parameters W covers: those of the top p layers present in both models."""
    both = {n for n in global_ if n in local}
    return [n for layer in top_layers(model, both, p) for n in model.layer_params(layer)]


def initial_weights(local: Arrays, names: list[str]) -> Arrays:
    """W before any training: ones."""
    return {n: torch.ones_like(local[n]) for n in names}


def combine(global_: Arrays, local: Arrays, weights: Arrays) -> Arrays:
    """theta_hat over the keys of `local`.

    Parameters with a weight: local + (global - local) * W (computed with `torch.lerp`, exact
    at W = 0 and W = 1). Every other key: the global value where the global model has one
    (lower layers, all buffers), else the local one (parts the server never sends).
    """
    out: Arrays = {}
    for name, value in local.items():
        if name in weights:
            out[name] = torch.lerp(value, global_[name], weights[name])
        else:
            out[name] = global_.get(name, value)
    return out


def _fixed_function(module: nn.Module) -> bool:
    """Whether `module` computes the same in train and eval mode and keeps no statistics."""
    return not any(
        isinstance(m, nn.modules.batchnorm._NormBase | nn.modules.dropout._DropoutNd)
        for m in module.modules()
    )


@dataclass(frozen=True)
class _Interpolation:
    """The workspace model's W-covered parameters and what W mixes them from, in one order."""

    params: list[nn.Parameter]  # the model's own tensors: theta_hat(W), rewritten every step
    local: list[torch.Tensor]
    global_: list[torch.Tensor]
    gap: list[torch.Tensor]  # global - local: dL/dW = dL/dtheta_hat * gap
    weights: list[torch.Tensor]  # W, trained in place

    @classmethod
    def of(
        cls, model: nn.Module, global_: Arrays, local: Arrays, weights: Arrays
    ) -> _Interpolation:
        named = dict(model.named_parameters())
        params = [named[n] for n in weights]
        lo = [local[n].to(p.device, p.dtype) for n, p in zip(weights, params, strict=True)]
        hi = [global_[n].to(p.device, p.dtype) for n, p in zip(weights, params, strict=True)]
        gap = [g - v for g, v in zip(hi, lo, strict=True)]
        return cls(params, lo, hi, gap, [w.detach().clone() for w in weights.values()])

    def step(self, grads: tuple[torch.Tensor | None, ...], eta: float) -> None:
        """One gradient step on W (clipped to [0, 1]), then theta_hat(W) into the model."""
        with torch.no_grad():
            for p, g, w, lo, hi, gap in zip(
                self.params, grads, self.weights, self.local, self.global_, self.gap, strict=True
            ):
                if g is not None:
                    w.addcmul_(g, gap, value=-eta).clamp_(0.0, 1.0)
                p.copy_(torch.lerp(lo, hi, w))


def _training_subset(client: Client, s: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of a random s % of the client's training samples, at least one."""
    n = client.num_examples
    size = max(1, int(n * s / 100))
    subset = torch.randperm(n, generator=client.generator)[:size]  # on the CPU, as `batches`
    return client.data.train_x[subset], client.data.train_y[subset]


@contextlib.contextmanager
def _trainable_only(model: nn.Module, params: list[nn.Parameter]) -> Iterator[None]:
    """No gradient through any other parameter of `model` inside: W sees only the top."""
    covered = {id(p) for p in params}
    frozen = [p for p in model.parameters() if id(p) not in covered and p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)


def _loss_network(
    model: FedModel, names: list[str], inputs: torch.Tensor
) -> tuple[nn.Module, torch.Tensor]:
    """(the module the loss runs through, its inputs): the whole model on the subset, or,
    when W covers only the head and the body is a fixed function of its input (no BatchNorm,
    no dropout), the head on the subset embedded once instead of once per epoch."""
    if not (all(is_head(name) for name in names) and _fixed_function(model.features)):
        return model, inputs
    with torch.no_grad():
        embedded = torch.cat([model.features(c) for c in inputs.split(EMBED_CHUNK)])
    return model.head, embedded


def _epoch(
    client: Client,
    forward: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    mix: _Interpolation,
    eta: float,
) -> float:
    """One epoch of steps on W over the shuffled subset; its mean cross-entropy."""
    size = len(targets)
    total = torch.zeros((), device=inputs.device)
    for idx in batches(size, client.train.batch_size, client.generator, inputs.device):
        loss = F.cross_entropy(forward(inputs[idx]), targets[idx])
        mix.step(torch.autograd.grad(loss, mix.params, allow_unused=True), eta)
        total += loss.detach() * len(idx)
    return float(total) / size


def _settled(losses: list[float], threshold: float) -> bool:
    """Whether the start phase is over: the std of the last WINDOW losses below `threshold`."""
    return len(losses) >= WINDOW and statistics.pstdev(losses[-WINDOW:]) < threshold


def train_weights(
    client: Client,
    model_arrays: Arrays,
    global_: Arrays,
    local: Arrays,
    weights: Arrays,
    settings: AlaSettings,
    start: bool,
) -> tuple[Arrays, Metrics]:
    """Train W in the client's workspace model; return the new W and metrics.

    `model_arrays` is the complete model to evaluate the loss on (theta_hat with the current
    W, plus whatever the method adds, e.g. FedRep's local head). Only the W-covered parameters
    are touched during training; everything is overwritten by the caller's next `load`. One
    epoch, or in the start phase epochs until the losses settle or `max_start_epochs`.
    """
    model = client.model
    client.load(model_arrays)
    mix = _Interpolation.of(model, global_, local, weights)
    inputs, targets = _training_subset(client, settings.s)
    losses: list[float] = []
    capped = False
    with _trainable_only(model, mix.params):
        model.train()
        forward, inputs = _loss_network(model, list(weights), inputs)
        while True:
            losses.append(_epoch(client, forward, inputs, targets, mix, settings.eta))
            if not start or _settled(losses, settings.threshold):
                break
            if len(losses) >= settings.max_start_epochs:
                capped = True
                warnings.warn(
                    f"ALA start phase of client {client.id} (round {client.server_round}) reached "
                    f"max_start_epochs={settings.max_start_epochs} before the std of the last "
                    f"{WINDOW} losses fell below threshold={settings.threshold}",
                    RuntimeWarning,
                    stacklevel=2,
                )
                break
    metrics = {
        "ala_weights": float(sum(t.numel() for t in mix.weights)),
        "ala_epochs": float(len(losses)),
        "ala_loss": losses[-1],
        "ala_start": float(start),
        "ala_capped": float(capped),
    }
    return dict(zip(weights, mix.weights, strict=True)), metrics


def adapt(
    client: Client,
    global_: Arrays,
    local: Arrays,
    weights: Arrays,
    settings: AlaSettings,
    assemble: Callable[[Arrays], Arrays],
) -> tuple[Arrays, Arrays, Metrics]:
    """One client's ALA: (theta_hat over the keys of `local`, W to keep, metrics).

    `assemble(theta_hat)` returns the complete model the loss is computed on. Without a local
    model there is nothing to aggregate (theta_hat is the global model; the caller handles it).
    If the local model equals the global one on the covered layers (or the client has no
    training data), W is not trained and the start phase waits (the official code skips ALA
    while local and global are equal).
    """
    names = ala_parameters(client.model, global_, local, settings.p)
    if weights.keys() != set(names):  # first ALA round (or a different p): W = 1
        weights = {}
    if client.num_examples == 0 or all(torch.equal(local[n], global_[n]) for n in names):
        return combine(global_, local, weights), weights, {}
    start = not weights
    current = weights or initial_weights(local, names)
    new_weights, metrics = train_weights(
        client, assemble(combine(global_, local, current)), global_, local, current, settings, start
    )
    return combine(global_, local, new_weights), new_weights, metrics


# the plug-in ------------------------------------------------------------------------------
def split_state(state: Records) -> tuple[Records, Records]:
    """(ALA's own records, the algorithm's state)."""
    own: Records = {}
    inner: Records = {}
    for name, arrays in state.items():
        (own if name in OWN else inner)[name] = arrays
    return own, inner


class AdaptiveLocalAggregation(Algorithm):
    """Mix-in: ALA before the algorithm's own `fit`, on the model it declares local.

    Combined with an algorithm class by `with_ala` (the registry does it for
    `algorithm.ala.enabled=true`), or subclassed directly (FedALA = this + FedAvg).
    """

    # the class attribute the combined algorithm declares (`declared_local`); not a ClassVar
    # here, as the algorithms that set it leave it unannotated
    ala_local: LocalModel
    ala: AlaSettings

    def __init__(self, params: Hyperparams, setting: Setting, ala: AlaSettings) -> None:
        if declared_local(type(self)) is None:
            raise TypeError(f"{type(self).__name__}: ala_local must be one of {MODES}")
        super().__init__(params, setting)
        self.ala = ala

    def _algorithm_model(self, message: Records, inner: Records, hat: Arrays) -> Arrays:
        """The complete model the algorithm would use with theta_hat as its local model."""
        if self.ala_local == "reply":
            return super().client_model(with_model(message, hat), inner)
        return super().client_model(message, {**inner, PERSONAL: hat})

    def initialise(
        self, client: Client, message: Records, state: Records
    ) -> tuple[Records, Records, Arrays, Metrics]:
        """ALA for one client: (message, algorithm state) with theta_hat in place of the
        local model, the W to keep, and ALA's metrics. What the algorithm's `fit` starts from."""
        own, inner = split_state(state)
        weights = own.get(WEIGHTS, {})
        by_reply = self.ala_local == "reply"
        local = own.get(LOCAL) if by_reply else inner.get(PERSONAL)
        if not local:
            return message, inner, weights, {}
        assemble = functools.partial(self._algorithm_model, message, inner)
        hat, weights, metrics = adapt(client, message[MODEL], local, weights, self.ala, assemble)
        if by_reply:
            return with_model(message, hat), inner, weights, metrics
        return message, {**inner, PERSONAL: hat}, weights, metrics

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        message, inner, weights, ala_metrics = self.initialise(client, message, state)
        # the algorithm's own `fit`: next in the MRO of every class this mix-in is part of
        algorithm = cast("Algorithm", super())
        result = algorithm.fit(client, message, inner)
        result.metrics.update(ala_metrics)
        new_state = dict(result.state)
        if self.ala_local == "reply":
            new_state[LOCAL] = result.reply[MODEL]  # shared with the reply, never modified
        if weights:
            new_state[WEIGHTS] = weights
        return FitResult(result.reply, result.metrics, new_state)

    def client_model(self, message: Records, state: Records) -> Arrays:
        own, inner = split_state(state)
        if self.ala_local == "reply":
            local = own.get(LOCAL, {})
            if local and self.ala.personalized == "hat":
                local = combine(message[MODEL], local, own.get(WEIGHTS, {}))
            return super().client_model(with_model(message, local), inner)
        return super().client_model(message, inner)


@functools.cache
def with_ala(cls: type[Algorithm]) -> type[AdaptiveLocalAggregation]:
    """`cls` with ALA before its local training (cls must declare `ala_local`)."""
    if declared_local(cls) is None:
        raise TypeError(f"{cls.__name__} does not declare which model is local (ala_local)")
    namespace: dict[str, Any] = {
        "name": f"{cls.name}+ala",  # what run summaries and reports call it
        "__module__": __name__,
        "__doc__": f"{cls.__name__} with adaptive local aggregation (algorithm.ala.enabled).",
    }
    return type(f"{cls.__name__}WithALA", (AdaptiveLocalAggregation, cls), namespace)


def supports_ala(cls: type[Algorithm]) -> bool:
    """Whether `algorithm.ala.*` may be set for `cls`: it declares a local model, has no ALA
    of its own, and has clients (a method that pools all data, such as `centralized`, a FedAvg
    subclass, has none to personalize)."""
    return (
        declared_local(cls) is not None
        and not issubclass(cls, AdaptiveLocalAggregation)
        and not cls.pools_data
    )
