"""FedProx: FedAvg with a proximal term in the local objective (docs/algorithms/fedprox.md)."""

from __future__ import annotations

import torch
from pydantic import Field

from protofed.algorithms.base import (
    MODEL,
    Algorithm,
    Arrays,
    Client,
    FitResult,
    Hyperparams,
    Metrics,
    Records,
)
from protofed.algorithms.common.regularizers import parameter_snapshot, proximal_loss
from protofed.training.stacked import StackedTask, Term


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

    # the same step stacked (train.stacked): the proximal term on each client's own weights
    def stacked_task(self, client: Client, message: Records, state: Records) -> StackedTask:
        names = {name for name, _ in client.model.named_parameters()}
        anchor = {name: w for name, w in message[MODEL].items() if name in names}
        return StackedTask(message[MODEL], anchor if self.params.mu != 0 else {})

    def stacked_term(self) -> Term | None:
        if self.params.mu == 0:
            return None  # as `proximal_loss`: plain cross-entropy
        half_mu = 0.5 * float(self.params.mu)

        def term(params: Arrays, anchor: Arrays) -> torch.Tensor:
            distances = [(p - anchor[n]).pow(2).sum() for n, p in params.items() if n in anchor]
            return half_mu * torch.stack(distances).sum()

        return term

    def stacked_result(
        self, message: Records, state: Records, weights: Arrays, metrics: Metrics
    ) -> FitResult:
        return FitResult({MODEL: weights}, metrics)
