"""FedALA (Zhang et al., AAAI 2023): FedAvg whose clients start from an adaptive aggregate.

Each selected client builds its starting point from the received global model and its own
model of last time by adaptive local aggregation (ALA, see `common/ala.py`): the lower layers
are the global ones, the top p layers mix local and global with element-wise weights W in
[0, 1] trained on s % of its data. It then trains one round as FedAvg and sends the result;
the server takes the sample-weighted mean. The client keeps its trained model and W in its
state (the records `ala.local` and `ala.weights`); its personalized model is theta_hat, the
ALA aggregate of the current global model and its local model with its latest W (the paper's
output; the global model before its first ALA), or with `personalized=trained` the model it
trained last. Nothing but the usual model travels: ALA adds no bytes. In a client's first
round there is no local model yet and it starts from the global model, as FedAvg; its first
ALA (the start phase, W trained until its loss settles) comes in its second round.

Defaults are the slides': p = 1, s = 80, eta = 1.0; the start phase ends when the std of the
last 10 losses is below 0.1 (official code; the paper says 0.01). `fedala` gives the same
numbers as `fedavg` with `algorithm.ala.enabled=true`; the plug-in brings ALA to other methods.
"""

from __future__ import annotations

from protofed.algorithms.base import Setting
from protofed.algorithms.common.ala import AdaptiveLocalAggregation, AlaSettings
from protofed.algorithms.fedavg import FedAvg


class FedALA(AdaptiveLocalAggregation, FedAvg):
    name = "fedala"
    summary = (
        "FedAvg whose clients start from an adaptive local/global mix of the top layers (ALA)."
    )
    reference = "Zhang et al., FedALA: Adaptive Local Aggregation for Personalized Federated Learning, AAAI 2023"
    ala_local = "reply"  # the local model is what the client trained and sent last time

    class Params(AlaSettings):
        """p, s, eta, threshold, max_start_epochs, personalized (see `common.ala.AlaSettings`)."""

    params: Params

    def __init__(self, params: Params, setting: Setting) -> None:
        super().__init__(params, setting, ala=params)
