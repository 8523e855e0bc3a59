"""Epsilon from Google's dp-accounting: the run's rounds as a composed, sampled Gaussian.

One round releases the mean of the round's clipped replies with Gaussian noise of
`noise_multiplier` x the sensitivity (mechanisms.py says what is clipped and how the noise
is shared out). How the clients are drawn decides the event and the neighbouring relation:
- `sampling=poisson`: every client independently with probability q = m / N; a neighbour
  adds or removes one client, whose clipped reply moves the sum by at most the bound, so
  the round is `PoissonSampledDpEvent(q, Gaussian(sigma))`.
- `sampling=fixed` (the runtime's usual draw of m of N without replacement): N is public
  and a neighbour replaces one client, which moves the sum by up to twice the bound, so the
  round is `SampledWithoutReplacementDpEvent(N, m, Gaussian(sigma / 2))` (full
  participation: `Gaussian(sigma / 2)`), accounted with Renyi DP only (dp-accounting's PLD
  accountant has no such event).

Nothing here is hand-written accounting: events, composition, epsilon and the calibration
of sigma for a target epsilon all come from dp-accounting.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager

import dp_accounting
from dp_accounting import dp_event, pld, rdp

from protofed.config import PrivacyConfig
from protofed.errors import ConfigError

NeighboringRelation = dp_accounting.NeighboringRelation


@contextmanager
def _quiet() -> Iterator[None]:
    """dp-accounting logs through absl at every order it skips: not the user's concern."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def round_event(
    cfg: PrivacyConfig, population: int, per_round: int, sigma: float
) -> dp_event.DpEvent:
    """One round's release as a dp-accounting event (module docstring)."""
    if cfg.sampling == "poisson":
        return dp_event.PoissonSampledDpEvent(
            per_round / population, dp_event.GaussianDpEvent(sigma)
        )
    gaussian = dp_event.GaussianDpEvent(sigma / 2)  # replace-one: sensitivity twice the bound
    if per_round >= population:
        return gaussian
    return dp_event.SampledWithoutReplacementDpEvent(population, per_round, gaussian)


def accountant(cfg: PrivacyConfig) -> dp_accounting.PrivacyAccountant:
    """A fresh accountant of the configured kind, with the sampling's neighbouring relation."""
    relation = (
        NeighboringRelation.ADD_OR_REMOVE_ONE
        if cfg.sampling == "poisson"
        else NeighboringRelation.REPLACE_ONE
    )
    if cfg.accountant == "pld":
        if cfg.sampling == "fixed":
            raise ConfigError(
                "privacy.accountant: pld cannot account privacy.sampling=fixed (sampling "
                "without replacement); use accountant=rdp or sampling=poisson"
            )
        return pld.PLDAccountant(neighboring_relation=relation)
    return rdp.RdpAccountant(neighboring_relation=relation)


def epsilon(
    cfg: PrivacyConfig, population: int, per_round: int, sigma: float, rounds: int
) -> float:
    """Epsilon at `cfg.delta` after `rounds` rounds (inf without noise, 0 before round 1)."""
    if rounds <= 0:
        return 0.0
    if sigma <= 0:
        return math.inf
    event = dp_event.SelfComposedDpEvent(round_event(cfg, population, per_round, sigma), rounds)
    with _quiet():
        return float(accountant(cfg).compose(event).get_epsilon(cfg.delta))


def calibrate(cfg: PrivacyConfig, population: int, per_round: int, rounds: int) -> float:
    """The smallest noise multiplier whose run of `rounds` rounds spends at most
    `cfg.target_epsilon` at `cfg.delta` (dp-accounting's bisection, within its tolerance)."""
    assert cfg.target_epsilon is not None

    def run_event(sigma: float) -> dp_event.DpEvent:
        return dp_event.SelfComposedDpEvent(round_event(cfg, population, per_round, sigma), rounds)

    try:
        with _quiet():
            sigma = dp_accounting.calibrate_dp_mechanism(
                lambda: accountant(cfg),
                run_event,
                cfg.target_epsilon,
                cfg.delta,
                dp_accounting.LowerEndpointAndGuess(0.05, 1.0),
            )
    except ConfigError:
        raise
    except Exception as exc:  # no multiplier in dp-accounting's search reaches the target
        raise ConfigError(
            f"privacy.target_epsilon: {cfg.target_epsilon} cannot be reached at delta "
            f"{cfg.delta} over {rounds} rounds of {per_round} of {population} clients "
            f"({type(exc).__name__}); raise it or set privacy.noise_multiplier"
        ) from None
    return float(sigma)
