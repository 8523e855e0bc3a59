"""Client-level differential privacy for every algorithm (docs/privacy.md).

`private` wraps a built algorithm: its replies clipped, Gaussian noise on the server's
mean (`central`) or on each reply (`local`), epsilon from dp-accounting after every round.
"""

from protofed.privacy.accounting import calibrate, epsilon, round_event
from protofed.privacy.private import (
    Plan,
    Private,
    plan,
    private,
    released_examples,
    summand_bound,
)

__all__ = [
    "Plan",
    "Private",
    "calibrate",
    "epsilon",
    "plan",
    "private",
    "released_examples",
    "round_event",
    "summand_bound",
]
