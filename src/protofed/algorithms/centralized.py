"""Centralized training: one model on all clients' pooled data (upper reference) (docs/algorithms/centralized.md)."""

from __future__ import annotations

from typing import ClassVar

from protofed.algorithms.base import Hyperparams
from protofed.algorithms.fedavg import FedAvg


class Centralized(FedAvg):
    """FedAvg's client and server steps, run on the single pooled client (one reply)."""

    name = "centralized"
    summary = "One model trained on all clients' pooled data (upper reference, no federation)."
    reference = (
        "Centralized training on pooled data (reference baseline, cf. McMahan et al., AISTATS 2017)"
    )
    pools_data: ClassVar[bool] = True  # the runtime trains one pooled client per round

    class Params(Hyperparams):
        """No hyperparameters: a round is `train.local_epochs` epochs over the pooled data."""
