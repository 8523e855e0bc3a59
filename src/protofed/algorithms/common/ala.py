"""ALA, adaptive local aggregation (Zhang et al., FedALA, AAAI 2023): the mechanics, once.

Before local training a client does not overwrite its local model with the global one. It
builds

    theta_hat = theta_local + (theta_global - theta_local) * W      on the top p layers,
    theta_hat = theta_global                                         on every lower layer,

with W element-wise weights, one per parameter of the top p layers, initialised to ones and
clipped to [0, 1]. W is trained on a random s % of the client's training data with learning
rate eta, by plain gradient steps: dL/dW = dL/dtheta_hat * (theta_global - theta_local).

Start phase: the first round in which the client has a local model that differs from the
global one, W is trained epoch after epoch until the standard deviation of the last 10 epoch
losses is below `threshold`, or until `max_start_epochs` (a warning says so). Later rounds:
one epoch. W stays in the client's state between rounds.

Decisions, where the slides and the official code (TsingZ0/FedALA, utils/ALA.py) leave room:
- Layers: the top p entries of `model.layers()` whose parameters the server sends (for a
  method that sends the whole model, `model.layers()[-p:]`; for FedRep, the top body layers,
  since the head has no global version). Never counted in tensors, and p = 0 is rejected
  (the official code counts tensors and reads p = 0 as "all of them").
- Threshold: 0.1 by default, as in the official code; the paper writes 0.01. The recorded
  loss is the mean loss of one epoch over the subset (the official code records the last
  batch's loss of each epoch, on an unshuffled subset); the std is the population std of the
  last 10. A cap on start-phase epochs (the official loop has none) ends runs that never settle.
- The subset is s % of the training samples drawn without replacement with the client's
  seeded generator, fresh each round and reshuffled each epoch (the official code takes a
  contiguous random slice and never shuffles it); partial last batches are kept.
- The loss W is trained on is cross-entropy, whatever the method's own local objective.
- Buffers (BatchNorm statistics) come from the global model in every layer, the top ones
  included: W is defined on parameters only. The official code copies parameters only and
  leaves the client's buffers local; its models have none.
- The forward passes run in train mode (as the official code, whose copy inherits the mode of
  the last local training); any BatchNorm statistics they change are discarded. When W
  covers only the head and the body has no BatchNorm or dropout, the subset is embedded once
  per round and each step runs the head alone (the same numbers, without re-running the
  frozen body every epoch of the start phase).
- A client's first round has no local model: it starts from the global model (the official
  code skips ALA while local and global are equal). Its start phase is its next round.
- Inside a round, every step's loss is taken at theta_hat(W) with the current W (the official
  code's first step of a round runs on the previous local top layers instead, since its
  temporary model is a copy of the local one before any W is applied).
- The personalized (evaluated) model, `personalized`: the paper's output is theta_hat, and the
  official server evaluates every client right after ALA, before local training. Evaluation
  here has no client data to train W on, so "hat" (default) evaluates theta_hat built from the
  current global model, the client's local model and its W of its latest round (the official
  code trains W one more epoch first; the slides observe that W hardly changes after the start
  phase). "trained" evaluates the model the client trained last instead.
- Nothing is sent: ALA works on the received model and on what the client kept, so it adds
  zero bytes to every message and reply.

The `AdaptiveLocalAggregation` mix-in applies this around any algorithm's `fit` that declares
which model is its clients' local one (`Algorithm.ala_local`):
- "reply": the local model is the `"model"` record the client trained and sent back last
  time (FedAvg, FedProx, FedRep, FedALA). The mix-in keeps it in the client's state and
  hands the algorithm theta_hat in place of the received message's model. The algorithm's
  personalized model is built from theta_hat in place of the message's model
  (`personalized="hat"`, FedALA's evaluation) or from the model the client trained last
  (`"trained"`).
- "state": the local model is the algorithm's own client state record `"personal"` (Ditto's
  personal model). The mix-in hands the algorithm theta_hat in place of that record; the
  message is left as it is, and the personalized model is the algorithm's own (Ditto's
  trained v) either way.

ALA keeps its own state in two records of the client's state, `"ala.weights"` (W) and, for
"reply" algorithms, `"ala.local"` (the local model); the algorithm sees only its own records.
"""

from __future__ import annotations

import functools
import statistics
import warnings
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from protofed.algorithms.base import Algorithm, Hyperparams, Setting, with_model
from protofed.algorithms.common.split import is_head
from protofed.core.types import MODEL, Arrays, Client, FitResult, Metrics, Records
from protofed.errors import ConfigError
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
MODES = ("reply", "state")
EMBED_CHUNK = 128  # samples embedded at once when only the head is covered


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
    are touched during training; everything is overwritten by the caller's next `load`.
    """
    model = client.model
    client.load(model_arrays)
    named = dict(model.named_parameters())
    names = list(weights)
    top = [named[n] for n in names]
    lo = [local[n].to(p.device, p.dtype) for n, p in zip(names, top, strict=True)]
    hi = [global_[n].to(p.device, p.dtype) for n, p in zip(names, top, strict=True)]
    diff = [g - v for g, v in zip(hi, lo, strict=True)]
    w = [weights[n].detach().clone() for n in names]

    n = client.num_examples
    size = max(1, int(n * settings.s / 100))
    subset = torch.randperm(n, generator=client.generator)[:size]  # on the CPU, as `batches`
    inputs = client.data.train_x[subset]
    targets = client.data.train_y[subset]

    covered = {id(p) for p in top}
    frozen = [p for p in model.parameters() if id(p) not in covered and p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)  # no gradient through the lower layers: W sees only the top
    model.train()
    forward: nn.Module = model
    if all(is_head(name) for name in names) and _fixed_function(model.features):
        # W covers only the head and the body is a fixed function of its input (no
        # BatchNorm, no dropout): embed the subset once instead of once per epoch.
        with torch.no_grad():
            inputs = torch.cat([model.features(c) for c in inputs.split(EMBED_CHUNK)])
        forward = model.head
    losses: list[float] = []
    capped = False
    try:
        while True:
            total = torch.zeros((), device=inputs.device)
            for idx in batches(size, client.train.batch_size, client.generator, inputs.device):
                loss = F.cross_entropy(forward(inputs[idx]), targets[idx])
                grads = torch.autograd.grad(loss, top, allow_unused=True)
                with torch.no_grad():
                    for p, g, wi, v, gl, d in zip(top, grads, w, lo, hi, diff, strict=True):
                        if g is not None:
                            wi.addcmul_(g, d, value=-settings.eta).clamp_(0.0, 1.0)
                        p.copy_(torch.lerp(v, gl, wi))
                total += loss.detach() * len(idx)
            losses.append(float(total) / size)
            if not start:
                break
            if len(losses) >= WINDOW and statistics.pstdev(losses[-WINDOW:]) < settings.threshold:
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
    finally:
        for p in frozen:
            p.requires_grad_(True)
    metrics = {
        "ala_weights": float(sum(t.numel() for t in w)),
        "ala_epochs": float(len(losses)),
        "ala_loss": losses[-1],
        "ala_start": float(start),
        "ala_capped": float(capped),
    }
    return dict(zip(names, w, strict=True)), metrics


def adapt(
    client: Client, global_: Arrays, local: Arrays, weights: Arrays, settings: AlaSettings, assemble
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

    ala: AlaSettings

    def __init__(self, params: Hyperparams, setting: Setting, ala: AlaSettings) -> None:
        if self.ala_local not in MODES:
            raise TypeError(f"{type(self).__name__}: ala_local must be one of {MODES}")
        super().__init__(params, setting)
        self.ala = ala

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
        base = super()

        def assemble(hat: Arrays) -> Arrays:  # the complete model the algorithm would use
            if by_reply:
                return base.client_model(with_model(message, hat), inner)
            return base.client_model(message, {**inner, PERSONAL: hat})

        hat, weights, metrics = adapt(client, message[MODEL], local, weights, self.ala, assemble)
        if by_reply:
            return with_model(message, hat), inner, weights, metrics
        return message, {**inner, PERSONAL: hat}, weights, metrics

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        message, inner, weights, ala_metrics = self.initialise(client, message, state)
        result = super().fit(client, message, inner)
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
def with_ala(cls: type[Algorithm]) -> type[Algorithm]:
    """`cls` with ALA before its local training (cls must declare `ala_local`)."""
    if cls.ala_local not in MODES:
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
        cls.ala_local in MODES
        and not issubclass(cls, AdaptiveLocalAggregation)
        and not cls.pools_data
    )
