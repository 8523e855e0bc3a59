"""Which clients are unseen users (`eval.unseen_clients`), from the seed; the rest train.

Apart from `unseen` (which scores them) so that preparation can choose them without
importing the runtime that trains clients.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from protofed.config import ExperimentConfig
from protofed.core.seeding import UNSEEN_USERS, numpy_generator
from protofed.data.federated import FederatedData
from protofed.errors import ConfigError


def unseen_count(setting: int | float, num_clients: int) -> int:
    """How many of `num_clients` clients `eval.unseen_clients` holds out: a count as given,
    a fraction of the federation rounded (at least one)."""
    if isinstance(setting, float):
        return max(1, round(setting * num_clients))
    return int(setting)


def held_out(cfg: ExperimentConfig, num_clients: int) -> tuple[int, ...]:
    """The sorted ids of the unseen clients, drawn from the seed's own stream; () when off.
    A ConfigError (one line, naming the key) where too many are asked for, or where the run
    cannot hold clients out."""
    e = cfg.eval
    if not e.unseen_clients:
        if e.finetune_epochs:
            raise ConfigError(
                "eval.finetune_epochs applies to the unseen clients only: set eval.unseen_clients"
            )
        return ()
    k = unseen_count(e.unseen_clients, num_clients)
    if k >= num_clients:
        raise ConfigError(
            f"eval.unseen_clients={e.unseen_clients} holds out {k} of the federation's "
            f"{num_clients} clients: at least one must train"
        )
    if cfg.data.dynamic.enabled:
        raise ConfigError("eval.unseen_clients is not supported with data.dynamic")
    rng = numpy_generator(cfg.seed, UNSEEN_USERS)
    return tuple(sorted(int(i) for i in rng.choice(num_clients, size=k, replace=False)))


def training_clients(num_clients: int, unseen: Sequence[int]) -> list[int]:
    """The clients that train: every client but the unseen ones."""
    out = set(unseen)
    return [i for i in range(num_clients) if i not in out]


def subset(fed: FederatedData, ids: Sequence[int]) -> FederatedData:
    """`fed` with only the clients `ids` (in that order); `fed` itself where that is all."""
    if list(ids) == list(range(len(fed.clients))):
        return fed
    return dataclasses.replace(
        fed, clients=[fed.clients[i] for i in ids], counts=fed.counts[list(ids)]
    )
