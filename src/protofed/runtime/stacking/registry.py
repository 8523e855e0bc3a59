"""Which algorithms train stacked: one registered adapter per algorithm, and the reasons not.

An adapter is an algorithm's round written for all of its clients at once: given the
algorithm, the round's `Client`s, the messages they were sent, the states they kept and a
`Trainer` (training/stacked.py), it returns each client's `FitResult`, as `fit` would one
by one. It calls the trainer once per training phase for every client (Ditto's two models,
FedRep's head then body). The `Algorithm` interface knows nothing of it: an algorithm opts
in with one registration, keyed by its class (or by the name it declares):

    @register_stacked(MyAlgorithm)
    def my_round(algorithm, clients, messages, states, train) -> list[FitResult]: ...

A subclass inherits its parent's adapter as long as the `fit` that runs is the one the
adapter stands for (a mix-in's `fit` around it, ALA's, is not).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from protofed.algorithms.base import Algorithm
from protofed.core.types import FitResult, Records
from protofed.training.client import Client
from protofed.training.stacked import Trainer

A = TypeVar("A", bound=Algorithm)

StackedFit = Callable[[A, list[Client], list[Records], list[Records], Trainer], list[FitResult]]
"""An algorithm's round stacked: (algorithm, clients, messages, states, train) -> one
`FitResult` per client, in order."""

ADAPTERS: dict[type[Algorithm] | str, StackedFit[Any]] = {}
"""Algorithm class (or the `name` a class declares) -> its round stacked."""

NOT_WRITTEN = "its client step is not written for stacked training yet"


def register_stacked(key: type[A] | str) -> Callable[[StackedFit[A]], StackedFit[A]]:
    """Decorator: `fit` registered as the stacked round of `key`'s clients (a class, or
    the `name` an algorithm class declares)."""

    def add(fit: StackedFit[A]) -> StackedFit[A]:
        ADAPTERS[key] = fit
        return fit

    return add


def registered(cls: type[Algorithm]) -> tuple[type[Algorithm], StackedFit[Any]] | None:
    """The nearest class of `cls`'s MRO with an adapter, and the adapter (None: none has)."""
    for k in cls.__mro__:
        fit = ADAPTERS.get(k)
        if fit is None and isinstance(vars(k).get("name"), str):
            fit = ADAPTERS.get(vars(k)["name"])
        if fit is not None:
            return k, fit
    return None


def stack_reason(cls: type[Algorithm]) -> str | None:
    """Why `cls` cannot train a round's clients stacked (None: it can), for `protofed list`."""
    found = registered(cls)
    if found is None:
        return NOT_WRITTEN
    if cls.pools_data:
        return "it trains one client on every client's data"
    owner = next(k for k in cls.__mro__ if "fit" in vars(k))
    if not issubclass(found[0], owner):  # a mix-in's fit around the algorithm's (ALA)
        return f"{owner.__name__}.fit does more than the stacked step"
    return None


def adapter_for(algorithm: Algorithm) -> StackedFit[Any]:
    """`algorithm`'s stacked round (TypeError where it has none that stands for its `fit`)."""
    cls = type(algorithm)
    found = registered(cls)
    why = stack_reason(cls)
    if found is None or why is not None:
        raise TypeError(f"{cls.__name__} cannot train stacked: {why}")
    return found[1]
