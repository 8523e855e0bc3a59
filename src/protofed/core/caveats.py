"""What a private run's epsilon does not cover, in the words every output prints beside it.

Kept apart from the privacy layer (which needs torch) so that `protofed`'s light commands
print them too (`protofed.privacy.private.caveats` decides which apply to a run).
"""

from collections.abc import Mapping
from typing import Any

NOT_A_GUARANTEE = "not a guarantee: the noise can be regenerated from the config"
"""privacy.noise=seeded: the noise comes from the config's seed."""

CLASS_PRESENCE = (
    "except which classes each client holds: prototype tables send their class indices "
    "in the clear (docs/privacy.md)"
)
"""Prototype methods (FedProto, PFPL, FedDPA, ProtoHAR, FedNH, FedPAC)."""

CLEAR_EVALUATION = (
    "except each client's per-class evaluation counts, sent in the clear (privacy.clear_evaluation)"
)
"""A Flower deployment with privacy.clear_evaluation=true."""

SEEDED_METRIC = "noise_seeded"
"""A round's server metric, 1.0 where the noise came from the seed (privacy.noise=seeded)."""


def stated(privacy: Mapping[str, Any]) -> list[str]:
    """The caveats of summary.json's `privacy` record. One written before caveats were
    recorded had seeded noise (its `noise` key is missing too): no guarantee."""
    if "caveats" in privacy:
        return [str(c) for c in privacy["caveats"]]
    return [NOT_A_GUARANTEE] if privacy.get("noise", "seeded") == "seeded" else []
