"""An empirical epsilon in the same run: one-shot privacy estimation with canary clients.

Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning" (ICLR 2024):
`privacy.audit=K` makes K canary clients, each a fixed random direction, and K more that are
held out. A canary's reply is its direction at the full bound of every group (norm C_g in
group g, so it is the worst-case client the accountant bounds); each round, each inserted
canary takes part with the real clients' rate and its reply enters the release like any
client's (clipped, noised). The auditor observes what was released, summed over the rounds
(each group in units of its bound: for FedAvg, the final model minus the first), and
measures the cosine of every canary's direction with it. Inserted canaries lean towards the
observation; held-out ones are what chance gives. The estimate is the epsilon, at the run's
delta, of the Gaussian mechanism that separates the two sets of cosines as far as their
means are apart in units of their pooled spread (`gaussian_epsilon`).

It is a lower-bound style estimate, not a proof: a point above the accounted epsilon says the
accounting or the mechanism is wrong (the noise too small, a reply not clipped); a point far
below says nothing more than that this attack is weak. The canaries' randomness comes from
the seed (stream AUDIT): what they are is the auditor's, not any client's.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from dp_accounting.pld import privacy_loss_distribution

from protofed.core.seeding import AUDIT, numpy_generator, torch_generator

ESTIMATE_CAP = 1000.0
"""The largest epsilon the estimate reports (a release without noise gives more)."""


def direction(seed: int, canary: int, group: str, size: int) -> torch.Tensor:
    """Canary `canary`'s unit float64 direction in the group (record) `group`."""
    generator = torch_generator(seed, AUDIT, canary, zlib.crc32(group.encode()))
    drawn = torch.randn(size, generator=generator, dtype=torch.float64)
    return drawn / drawn.norm().clamp(min=1e-30)


def taking_part(seed: int, server_round: int, canaries: int, rate: float) -> list[int]:
    """The inserted canaries (0 .. canaries - 1) that take part in `server_round`."""
    if rate >= 1:
        return list(range(canaries))
    draws = numpy_generator(seed, AUDIT, server_round).random(canaries)
    return [int(i) for i in np.flatnonzero(draws < rate)]


def cosines(
    seed: int, canaries: int, observed: Mapping[str, torch.Tensor]
) -> tuple[list[float], list[float]]:
    """(inserted canaries' cosines, held-out canaries' cosines) with the observation, its
    groups joined as one vector (a canary, a unit direction in each, is sqrt(G) long)."""
    norm = math.sqrt(sum(float(o.double().pow(2).sum()) for o in observed.values()))
    scale = norm * math.sqrt(len(observed))

    def cosine(canary: int) -> float:
        dot = sum(
            float(direction(seed, canary, name, o.numel()) @ o.double().flatten())
            for name, o in observed.items()
        )
        return dot / scale if scale > 0 else 0.0

    return [cosine(i) for i in range(canaries)], [cosine(canaries + i) for i in range(canaries)]


def gaussian_epsilon(inserted: Sequence[float], held_out: Sequence[float], delta: float) -> float:
    """The epsilon at `delta` of the Gaussian mechanism that separates the two sets of
    cosines as far as they are apart: mu = (mean inserted - mean held out) / pooled std,
    the mechanism of multiplier 1 / mu (dp-accounting's PLD). One variance for both: with
    tens of canaries the two sample variances differ by chance, and a Gaussian pair of
    unequal variances has an unbounded privacy loss that such chance alone would inflate
    at small delta."""
    gap = float(np.mean(inserted)) - float(np.mean(held_out))
    pooled = math.sqrt((float(np.var(inserted, ddof=1)) + float(np.var(held_out, ddof=1))) / 2)
    if gap <= 0:
        return 0.0
    if pooled <= 0 or pooled / gap < 1 / 60:  # beyond what a PLD represents: no noise
        return ESTIMATE_CAP
    distribution = privacy_loss_distribution.from_gaussian_mechanism(
        pooled / gap, value_discretization_interval=1e-3
    )
    return min(float(distribution.get_epsilon_for_delta(delta)), ESTIMATE_CAP)


def estimate(seed: int, canaries: int, observed: Mapping[str, torch.Tensor], delta: float) -> float:
    """The run's empirical epsilon at `delta` from what it released (module docstring)."""
    inserted, held_out = cosines(seed, canaries, observed)
    return gaussian_epsilon(inserted, held_out, delta)
