"""FedProx: FedAvg with a proximal term in the local objective (docs/algorithms/fedprox.md)."""

from __future__ import annotations

from pydantic import Field

from protofed.algorithms.base import MODEL, Algorithm, Client, FitResult, Hyperparams, Records
from protofed.algorithms.common.regularizers import parameter_snapshot, proximal_loss
from protofed.training.stacked import StackedTask, Trainer, proximal_term


class FedProxParams(Hyperparams):
    mu: float = Field(
        0.01,
        ge=0,
        description="Proximal coefficient mu (paper grid {0.001, 0.01, 0.1, 1}); 0 is FedAvg.",
    )


class FedProx(Algorithm):
    name = "fedprox"
    summary = "FedAvg plus a proximal term mu/2*||w - w_global||^2 in the local loss."
    reference = "Li et al., Federated Optimization in Heterogeneous Networks, MLSys 2020"
    ala_local = "reply"  # ALA plug-in: the local model is the one the client trained last
    stackable = True

    Params = FedProxParams
    params: FedProxParams

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(message[MODEL])
        anchor = parameter_snapshot(client.model)  # w_global, detached, on the model's device
        metrics = client.train_model(loss_fn=proximal_loss(anchor, self.params.mu))
        return FitResult({MODEL: client.weights()}, metrics)

    def stacked_fit(
        self, clients: list[Client], messages: list[Records], states: list[Records], train: Trainer
    ) -> list[FitResult]:
        """`fit` stacked: the proximal term on each client's weights, anchored where it began."""
        term = proximal_term(self.params.mu)
        tasks = [StackedTask(m[MODEL], m[MODEL] if term is not None else {}) for m in messages]
        trained = train(tasks, term)
        return [FitResult({MODEL: weights}, metrics) for weights, metrics in trained]
