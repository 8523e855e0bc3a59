"""FedProx: FedAvg with a proximal term in the local objective (docs/algorithms/fedprox.md)."""

from __future__ import annotations

from pydantic import Field

from protofed.algorithms.base import MODEL, Algorithm, Client, FitResult, Hyperparams, Records
from protofed.algorithms.common.regularizers import parameter_snapshot, proximal_loss


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

    Params = FedProxParams
    params: FedProxParams

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(message[MODEL])
        anchor = parameter_snapshot(client.model)  # w_global, detached, on the model's device
        metrics = client.train_model(loss_fn=proximal_loss(anchor, self.params.mu))
        return FitResult({MODEL: client.weights()}, metrics)
