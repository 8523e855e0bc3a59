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
of sigma for a target epsilon all come from dp-accounting. A run asks for epsilon after
every round, so `Ledger` does once what does not depend on the round count (a round's RDP
vector, a round's privacy loss distribution) and composes the rounds from it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager

import dp_accounting
import numpy as np
from dp_accounting import dp_event, pld, rdp
from dp_accounting.pld import privacy_loss_distribution

from protofed.config import PrivacyConfig
from protofed.errors import ConfigError

NeighboringRelation = dp_accounting.NeighboringRelation
PLD_INTERVAL = 1e-4
"""The PLD accountant's discretization of the privacy loss (dp-accounting's default)."""


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


def accounted(
    cfg: PrivacyConfig, population: int, per_round: int
) -> tuple[PrivacyConfig, int, int]:
    """What the accountant composes for `per_round` of `population` clients a round: in
    `local` mode each client's own Gaussian mechanism in every round it takes part in, with
    no credit for sampling (the server knows whom it drew): one of one, replace-one."""
    if cfg.mode == "local":
        return cfg.model_copy(update={"sampling": "fixed"}), 1, 1
    return cfg, population, per_round


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
        return pld.PLDAccountant(relation, value_discretization_interval=PLD_INTERVAL)
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


class Ledger:
    """Epsilon after any number of rounds of one run, each answer as dp-accounting gives it
    for the run's rounds composed (`epsilon`), with the work that does not depend on the
    round count done once:
    - `rdp`: a round's RDP vector, times the round count (what the accountant does for a
      `SelfComposedDpEvent`: the same float operations, the same epsilon);
    - `pld`: a round's privacy loss distribution, composed one round at a time (the
      accountant self-composes it by FFT instead: the same epsilon to about 1e-10, and
      always the same number for the same round, whatever rounds were asked before).
    """

    def __init__(self, cfg: PrivacyConfig, population: int, per_round: int, sigma: float) -> None:
        accountant(cfg)  # refuses what it cannot account before round 1
        self.cfg, self.sigma = cfg, sigma
        self.event = round_event(cfg, population, per_round, sigma) if sigma > 0 else None
        self._spent: dict[int, float] = {}
        self._rdp: tuple[np.ndarray, np.ndarray] | None = None  # (orders, one round's RDP)
        self._pld_round: privacy_loss_distribution.PrivacyLossDistribution | None = None
        self._pld: tuple[int, privacy_loss_distribution.PrivacyLossDistribution] | None = None

    def epsilon(self, rounds: int) -> float:
        """Epsilon at `cfg.delta` after `rounds` rounds (inf without noise, 0 before round 1)."""
        if rounds <= 0:
            return 0.0
        if self.event is None:
            return math.inf
        if rounds not in self._spent:
            compose = self._pld_epsilon if self.cfg.accountant == "pld" else self._rdp_epsilon
            with _quiet():
                self._spent[rounds] = compose(rounds)
        return self._spent[rounds]

    def _rdp_epsilon(self, rounds: int) -> float:
        if self._rdp is None:
            assert self.event is not None
            one = accountant(self.cfg).compose(self.event)
            assert isinstance(one, rdp.RdpAccountant)
            self._rdp = (one.orders, one.rdp)
        orders, per_round = self._rdp
        return float(rdp.compute_epsilon(orders, rounds * per_round, self.cfg.delta)[0])

    def _pld_epsilon(self, rounds: int) -> float:
        """The PLD accountant's own distribution for one Poisson-sampled Gaussian round (the
        only event it is given: accountant() refuses the others), composed `rounds` times."""
        assert isinstance(self.event, dp_event.PoissonSampledDpEvent)
        if self._pld_round is None:
            self._pld_round = privacy_loss_distribution.from_gaussian_mechanism(
                standard_deviation=self.sigma,
                value_discretization_interval=PLD_INTERVAL,
                sampling_prob=self.event.sampling_probability,
                neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
            )
        done, composed = 0, privacy_loss_distribution.identity(PLD_INTERVAL)
        if self._pld is not None and self._pld[0] <= rounds:
            done, composed = self._pld
        for _ in range(rounds - done):
            composed = composed.compose(self._pld_round)
        self._pld = (rounds, composed)
        return float(composed.get_epsilon_for_delta(self.cfg.delta))


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
