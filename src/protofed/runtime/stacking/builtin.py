"""The built-in algorithms' rounds stacked: each gives every client what its `fit` gives.

Each adapter mirrors its algorithm's `fit`, phase by phase, with one call of the `Trainer`
for all of the round's clients (tests/training/test_stacked.py holds them to it), and the
loss terms that read a client's batch live here with them: FedProto's and FedDPA's prototype
term (each client with the prototypes it was sent) and MOON's contrastive term (each
client's batch embedded by its own frozen global and previous models).
"""

from __future__ import annotations

import torch

from protofed.algorithms.common.ala import PERSONAL
from protofed.algorithms.common.prototype_losses import (
    Reduction,
    Target,
    masked_prototype_distance,
)
from protofed.algorithms.common.split import HEAD, is_head, split_arrays
from protofed.algorithms.ditto import Ditto
from protofed.algorithms.fedavg import FedAvg
from protofed.algorithms.fedbabu import PERSONAL as TUNED
from protofed.algorithms.fedbabu import FedBABU
from protofed.algorithms.feddpa import FedDPA
from protofed.algorithms.fedper import FedPer
from protofed.algorithms.fedproto import FedProto
from protofed.algorithms.fedprox import FedProx
from protofed.algorithms.fedrep import FedRep
from protofed.algorithms.local import Local
from protofed.algorithms.moon import MOON, PREVIOUS, model_contrastive_loss
from protofed.core.types import MODEL, Arrays, FitResult, Metrics, Records
from protofed.runtime.stacking.registry import register_stacked
from protofed.training.client import Client
from protofed.training.stacked import Batch, StackedTask, Term, Trainer, part, proximal_term


@register_stacked(FedAvg)
def fedavg(
    algorithm: FedAvg,
    clients: list[Client],
    messages: list[Records],
    states: list[Records],
    train: Trainer,
) -> list[FitResult]:
    """The sent model, cross-entropy, weights back."""
    trained = train([StackedTask(message[MODEL]) for message in messages])
    return [FitResult({MODEL: weights}, metrics) for weights, metrics in trained]


@register_stacked(FedProx)
def fedprox(
    algorithm: FedProx,
    clients: list[Client],
    messages: list[Records],
    states: list[Records],
    train: Trainer,
) -> list[FitResult]:
    """The proximal term on each client's weights, anchored where it began."""
    term = proximal_term(algorithm.params.mu)
    tasks = [StackedTask(m[MODEL], m[MODEL] if term is not None else {}) for m in messages]
    trained = train(tasks, term)
    return [FitResult({MODEL: weights}, metrics) for weights, metrics in trained]


@register_stacked(Local)
def local(
    algorithm: Local,
    clients: list[Client],
    messages: list[Records],
    states: list[Records],
    train: Trainer,
) -> list[FitResult]:
    """Each client from its own model, which it keeps."""
    trained = train([StackedTask(algorithm.own_model(state)) for state in states])
    return [FitResult({}, metrics, {MODEL: weights}) for weights, metrics in trained]


@register_stacked(FedPer)
def fedper(
    algorithm: FedPer,
    clients: list[Client],
    messages: list[Records],
    states: list[Records],
    train: Trainer,
) -> list[FitResult]:
    """The received body and the client's own head, trained whole."""
    tasks = [
        StackedTask({**m[MODEL], **algorithm.local_head(s)})
        for m, s in zip(messages, states, strict=True)
    ]
    results = []
    for weights, metrics in train(tasks):
        body, head = split_arrays(weights)
        results.append(FitResult({MODEL: body}, metrics, {HEAD: head}))
    return results


def _is_body(name: str) -> bool:
    return not is_head(name)


@register_stacked(FedRep)
def fedrep(
    algorithm: FedRep,
    clients: list[Client],
    messages: list[Records],
    states: list[Records],
    train: Trainer,
) -> list[FitResult]:
    """Every client's head (body frozen), then every client's body."""
    weights: list[Arrays] = [
        {**m[MODEL], **algorithm.local_head(s)} for m, s in zip(messages, states, strict=True)
    ]
    body_epochs = algorithm.params.body_epochs
    if body_epochs is None:
        body_epochs = clients[0].train.local_epochs if clients else 0
    metrics: list[Metrics] = [{"steps": 0.0} for _ in clients]
    phases = [("head", algorithm.params.head_epochs, is_head), ("body", body_epochs, _is_body)]
    for name, epochs, trainable in phases:
        if epochs == 0:
            continue
        trained = train([StackedTask(w) for w in weights], epochs=epochs, trainable=trainable)
        weights = [w for w, _ in trained]
        for m, (_, phase) in zip(metrics, trained, strict=True):
            m[f"{name}_loss"] = m["loss"] = phase["loss"]
            m["steps"] += phase["steps"]
    results = []
    for w, m in zip(weights, metrics, strict=True):
        body, head = split_arrays(w)
        results.append(FitResult({MODEL: body}, m, {HEAD: head}))
    return results


@register_stacked(FedBABU)
def fedbabu(
    algorithm: FedBABU,
    clients: list[Client],
    messages: list[Records],
    states: list[Records],
    train: Trainer,
) -> list[FitResult]:
    """Every client's body under the fixed head, then the fine-tuning."""
    starts = [{**m[MODEL], **algorithm.fixed_head()} for m in messages]
    trained = train([StackedTask(w) for w in starts], trainable=lambda n: not is_head(n))
    kept: list[Records] = [{} for _ in clients]
    tuned: list[float] = []
    if algorithm.params.finetune_epochs > 0:
        which = algorithm.params.finetune
        trainable = None if which == "full" else (lambda n: is_head(n) == (which == "head"))
        out = train(
            [StackedTask(w) for w in starts],
            epochs=algorithm.params.finetune_epochs,
            trainable=trainable,
        )
        kept = [{TUNED: weights} for weights, _ in out]
        tuned = [metrics["loss"] for _, metrics in out]
    results = []
    for i, (weights, metrics) in enumerate(trained):
        if tuned:
            metrics = {**metrics, "finetune_loss": tuned[i]}
        results.append(FitResult({MODEL: split_arrays(weights)[0]}, metrics, kept[i]))
    return results


@register_stacked(Ditto)
def ditto(
    algorithm: Ditto,
    clients: list[Client],
    messages: list[Records],
    states: list[Records],
    train: Trainer,
) -> list[FitResult]:
    """Every client's global model, then every client's personal one."""
    global_ = train([StackedTask(m[MODEL]) for m in messages])
    lam = algorithm.params.lam  # the pull toward w^t, as received (`ProximalStep`)
    tasks = [
        StackedTask(s.get(PERSONAL, m[MODEL]), m[MODEL] if lam else {})
        for m, s in zip(messages, states, strict=True)
    ]
    personal = train(tasks, epochs=algorithm.params.personal_epochs, pull=lam)
    results = []
    for (reply, metrics), (own, mine) in zip(global_, personal, strict=True):
        metrics = {**metrics, "personal_loss": mine["loss"], "personal_steps": mine["steps"]}
        results.append(FitResult({MODEL: reply}, metrics, {PERSONAL: own}))
    return results


# prototype terms ---------------------------------------------------------------------
def prototype_inputs(
    prototypes: torch.Tensor, present: torch.Tensor, lam: float, dim: int
) -> dict[str, torch.Tensor]:
    """A client's tensors for `prototype_term`: the prototypes it was sent, dense (C, dim)
    (none sent yet: zeros, every class absent), its class mask and its weight lam."""
    if prototypes.shape[1] != dim:
        prototypes = prototypes.new_zeros(len(prototypes), dim)
    return {
        "prototypes": prototypes,
        "present": present.float(),
        "lam": torch.tensor(float(lam)),
    }


def prototype_term(target: Target = "sample", reduction: Reduction = "mean") -> Term:
    """`prototype_regularized_loss`'s lam * distance for stacked training, each client with its
    own prototypes, mask and lam (`prototype_inputs`): a client with no prototype in its batch
    (or lam 0) adds 0, as the per-client loss adds nothing."""

    def term(
        params: dict[str, torch.Tensor], aux: dict[str, torch.Tensor], batch: Batch
    ) -> torch.Tensor:
        distance = masked_prototype_distance(
            batch.features,
            batch.y,
            batch.weight,
            aux["prototypes"],
            aux["present"],
            reduction,
            target,
        )
        return aux["lam"] * distance

    return term


@register_stacked(FedProto)  # and PFPL, whose `regularizer` picks the term's form
def fedproto(
    algorithm: FedProto,
    clients: list[Client],
    messages: list[Records],
    states: list[Records],
    train: Trainer,
) -> list[FitResult]:
    """Each client's own model, the prototype term with the prototypes it was sent (none
    before the first aggregation: cross-entropy alone), then its prototypes from its trained
    model, as `fit` computes them."""
    lam, target, reduction = algorithm.regularizer()
    received = [algorithm.received(m) for m in messages]
    term = None
    if lam != 0 and any(bool(present.any()) for _, present in received):
        term = prototype_term(target, reduction)
    dim = max(protos.shape[1] for protos, _ in received)
    tasks = [
        StackedTask(algorithm.own_model(s), prototype_inputs(*sent, lam, dim) if term else {})
        for s, sent in zip(states, received, strict=True)
    ]
    results = []
    for client, (weights, metrics) in zip(clients, train(tasks, term), strict=True):
        client.load(weights)
        results.append(FitResult(algorithm.local_prototypes(client), metrics, {MODEL: weights}))
    return results


@register_stacked(FedDPA)
def feddpa(
    algorithm: FedDPA,
    clients: list[Client],
    messages: list[Records],
    states: list[Records],
    train: Trainer,
) -> list[FitResult]:
    """Every client's Het_k and lambda_k from the sent model, as `fit` computes them, then the
    alignment term on the batch's class means with its own lambda_k, then each client's
    prototypes from its trained model."""
    aligned = [algorithm.alignment(c, m) for c, m in zip(clients, messages, strict=True)]
    term = None
    if any(lam != 0 and bool(present.any()) for _, present, _, lam in aligned):
        term = prototype_term("class_mean", algorithm.params.reg_reduction)
    dim = max(protos.shape[1] for protos, *_ in aligned)
    tasks = [
        StackedTask(m[MODEL], prototype_inputs(protos, present, lam, dim) if term else {})
        for m, (protos, present, _, lam) in zip(messages, aligned, strict=True)
    ]
    results = []
    for client, (weights, metrics), (*_, het, lam) in zip(
        clients, train(tasks, term), aligned, strict=True
    ):
        client.load(weights)
        results.append(algorithm.fitted(client, metrics, het, lam))
    return results


# MOON's contrastive term --------------------------------------------------------------
def contrastive_inputs(global_: Arrays, previous: Arrays | None) -> Arrays:
    """A client's tensors for `contrastive_term`: the embedding weights of the model it was
    sent and of its previous one, and whether it has one (without: the sent model's, unused)."""
    frozen = {"global/": global_, "previous/": global_ if previous is None else previous}
    inputs = {
        f"{prefix}{n}": t
        for prefix, weights in frozen.items()
        for n, t in weights.items()
        if n.startswith("features.")
    }
    return {**inputs, "on": torch.tensor(float(previous is not None))}


def contrastive_term(mu: float, tau: float) -> Term:
    """`moon_loss`'s mu * l_con for stacked training: each client's batch embedded by its own
    frozen global and previous models; a client without a previous model adds 0, as `fit`
    trains it on cross-entropy alone."""

    def term(params: Arrays, aux: Arrays, batch: Batch) -> torch.Tensor:
        z_global = batch.embed(part(aux, "global/")).detach()
        z_previous = batch.embed(part(aux, "previous/")).detach()
        loss = model_contrastive_loss(batch.features, z_global, z_previous, tau, batch.weight)
        return aux["on"] * mu * loss

    return term


@register_stacked(MOON)
def moon(
    algorithm: MOON,
    clients: list[Client],
    messages: list[Records],
    states: list[Records],
    train: Trainer,
) -> list[FitResult]:
    """The contrastive term for the clients with a previous model (each with its own frozen
    pair), cross-entropy alone for the others."""
    p = algorithm.params
    term = None
    if p.mu > 0 and any(PREVIOUS in s for s in states):
        term = contrastive_term(p.mu, p.temperature)
    tasks = [
        StackedTask(m[MODEL], contrastive_inputs(m[MODEL], s.get(PREVIOUS)) if term else {})
        for m, s in zip(messages, states, strict=True)
    ]
    return [FitResult({MODEL: w}, metrics, {PREVIOUS: w}) for w, metrics in train(tasks, term)]
