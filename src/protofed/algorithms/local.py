"""Local training: every client trains only on its own data and never communicates.

The lower reference of personalized FL (the "Local" baseline of e.g. FedPer, Arivazhagan et
al. 2019, and Ditto, Li et al. 2021): no message goes down, no array goes up, and each
client's model lives in its state, starting from the shared initial weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from protofed.algorithms.base import Algorithm, Arrays, Hyperparams, Metrics, Reply

if TYPE_CHECKING:
    from protofed.training.client import Client


class Local(Algorithm):
    name = "local"
    summary = "Local training only: each client trains on its own data, no communication."
    reference = "Local-only baseline (lower reference of personalized FL; no federation)"
    has_global_model = False

    class Params(Hyperparams):
        """No hyperparameters: local epochs, optimizer and lr come from `train`."""

    def init_server(self) -> Arrays:
        return {}  # the server holds nothing

    def configure(self, server: Arrays, client: int, round: int) -> Arrays:
        return {}  # nothing is sent: zero bytes down

    def own_model(self, state: Arrays) -> Arrays:
        """The client's model: its state, or the initial weights before its first round."""
        return state if state else self.setting.init_model

    def fit(self, client: Client, message: Arrays, state: Arrays) -> tuple[Arrays, Metrics, Arrays]:
        client.load(self.own_model(state))
        metrics = client.train_model()
        metrics["num_examples"] = float(client.num_examples)
        return {}, metrics, client.weights()  # nothing is sent: zero bytes up

    def aggregate(self, server: Arrays, replies: Iterable[Reply], round: int) -> Arrays:
        for _ in replies:  # drive the (lazy) round so every client trains
            pass
        return server

    def client_model(self, message: Arrays, state: Arrays) -> Arrays:
        return self.own_model(state)
