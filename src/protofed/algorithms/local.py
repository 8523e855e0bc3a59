"""Local training: every client trains only on its own data and never communicates (docs/algorithms/local.md)."""

from __future__ import annotations

from collections.abc import Iterable

from protofed.algorithms.base import Algorithm, Hyperparams
from protofed.core.types import MODEL, AggregateResult, Arrays, FitResult, Records, Reply
from protofed.training.client import Client


class Local(Algorithm):
    name = "local"
    summary = "Local training only: each client trains on its own data, no communication."
    reference = "Local-only baseline (lower reference of personalized FL; no federation)"
    has_global_model = False

    class Params(Hyperparams):
        """No hyperparameters: local epochs, optimizer and lr come from `train`."""

    def init_server(self) -> Records:
        return {}  # the server holds nothing

    def configure(self, server: Records, client: int, server_round: int) -> Records:
        return {}  # nothing is sent: zero bytes down

    def own_model(self, state: Records) -> Arrays:
        """The client's model: its state's, or the initial weights before its first round."""
        return state.get(MODEL, self.setting.init_model)

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(self.own_model(state))
        metrics = client.train_model()
        return FitResult({}, metrics, {MODEL: client.weights()})  # nothing is sent: zero bytes up

    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        for _ in replies:  # drive the (lazy) round so every client trains
            pass
        return AggregateResult(server)

    def client_model(self, message: Records, state: Records) -> Arrays:
        return self.own_model(state)
