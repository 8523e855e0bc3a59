"""FedALA (Zhang et al., AAAI 2023): FedAvg whose clients start from an adaptive aggregate.

ALA's mechanics and plug-in live in `common/ala.py`; this is that mix-in over FedAvg, and
gives the same numbers as `fedavg` with `algorithm.ala.enabled=true`. What it does, its
parameters and how the paper's ambiguities were settled: docs/algorithms/fedala.md.
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
