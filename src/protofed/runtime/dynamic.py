"""The dynamic scenario: classes withheld from some clients, given back on a schedule.

FedSub (Campana and Delmastro 2025, section 4.4) removes some classes from 60 % of the
clients before training; every 50 rounds (HAR) each such client gets one of them back, in its
training and test data. Nothing here is specific to an algorithm: the runtime hands every
engine's `fit` and the evaluation the round's view of a client's data (`client_data`), so any
algorithm runs on the scenario unchanged.

Decisions: the chosen clients and each one's withheld classes (in the order they return)
come from the config's seed (`core/seeding.py`, stream DYNAMIC_DATA): the clients from one
stream (among the clients with at least two classes), each client's classes from its own, so
changing the fraction never changes a client's classes. A client never loses all its classes:
one class with both train and test samples is kept. The k-th withheld class (k = 1, 2, ...) is back from round k * every on, in train, val
and test alike; the evaluation after round r uses round r's data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from protofed.config import DynamicConfig
from protofed.core.seeding import DYNAMIC_DATA
from protofed.data.federated import SPLITS, ClientData, FederatedData


@dataclass(frozen=True)
class DynamicClasses:
    """Which classes each client lacks in which round (built once from the config)."""

    every: int
    withheld: dict[int, tuple[int, ...]]  # client -> its withheld classes, in return order

    @classmethod
    def build(cls, cfg: DynamicConfig, fed: FederatedData, seed: int) -> DynamicClasses | None:
        if not cfg.enabled:
            return None
        n = len(fed.clients)
        present, anchors = {}, {}
        for i, c in enumerate(fed.clients):
            present[i] = np.unique(torch.cat([c.train_y, c.val_y, c.test_y]).cpu().numpy())
            anchors[i] = np.intersect1d(c.train_y.cpu().numpy(), c.test_y.cpu().numpy())
        # clients that can lose a class and keep one with train and test samples
        eligible = [i for i in range(n) if len(present[i]) >= 2 and len(anchors[i]) > 0]
        count = min(len(eligible), max(1, math.ceil(cfg.client_fraction * n - 1e-9)))
        chooser = np.random.default_rng(np.random.SeedSequence([seed, DYNAMIC_DATA]))
        chosen = sorted(int(i) for i in chooser.choice(eligible, size=count, replace=False))
        withheld: dict[int, tuple[int, ...]] = {}
        for i in chosen:
            rng = np.random.default_rng(np.random.SeedSequence([seed, DYNAMIC_DATA, i + 1]))
            keep = int(rng.choice(anchors[i]))
            candidates = rng.permutation([int(k) for k in present[i] if k != keep])
            withheld[i] = tuple(int(k) for k in candidates[: cfg.classes])
        return cls(every=cfg.every, withheld=withheld)

    def stage(self, server_round: int) -> int:
        """How many withheld classes each client has got back by `round` (1-based)."""
        return server_round // self.every

    def hidden(self, client: int, server_round: int) -> tuple[int, ...]:
        """The classes `client` still lacks in `round`."""
        return self.withheld.get(client, ())[self.stage(server_round) :]

    def view(self, data: ClientData, client: int, server_round: int) -> ClientData:
        """`data` without the classes `client` lacks in `round` (the same object if none)."""
        hidden = self.hidden(client, server_round)
        if not hidden:
            return data
        out = {}
        for split in SPLITS:
            x, y = getattr(data, f"{split}_x"), getattr(data, f"{split}_y")
            keep = ~torch.isin(y, torch.tensor(hidden, dtype=y.dtype, device=y.device))
            out[f"{split}_x"], out[f"{split}_y"] = x[keep], y[keep]
        return replace(data, **out)

    def federated(self, fed: FederatedData, server_round: int) -> FederatedData:
        """Every client's view in `round` (what the evaluation of that round scores)."""
        return replace(
            fed, clients=[self.view(c, i, server_round) for i, c in enumerate(fed.clients)]
        )

    def describe(self) -> dict[str, Any]:
        """JSON-able schedule for the run directory."""
        return {
            "every": self.every,
            "withheld": {str(k): list(v) for k, v in self.withheld.items()},
        }


def client_data(
    fed: FederatedData, dynamic: DynamicClasses | None, client: int, server_round: int
) -> ClientData:
    """Client `client`'s data in `round`: the one function every engine calls."""
    data = fed.clients[client]
    return data if dynamic is None else dynamic.view(data, client, server_round)
