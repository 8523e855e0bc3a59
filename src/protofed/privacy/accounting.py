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
  participation: `Gaussian(sigma / 2)`), accounted with Renyi DP only where m < N
  (dp-accounting's PLD accountant has no such event).

`privacy.accountant=auto` (the default) takes the tighter PLD accountant wherever it applies
(Poisson sampling, full participation, local mode) and Renyi DP elsewhere: RDP's conversion
to (epsilon, delta) is a valid but loose bound (4.00 where PLD gives 3.70 for the same run of
full participation).

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
    no credit for sampling (the server knows whom it drew): one of one, replace-one. The
    accountant comes back resolved (`auto` made `pld` or `rdp`)."""
    if cfg.mode == "local":
        cfg, population, per_round = cfg.model_copy(update={"sampling": "fixed"}), 1, 1
    return resolve(cfg, population, per_round), population, per_round


def resolve(cfg: PrivacyConfig, population: int, per_round: int) -> PrivacyConfig:
    """`cfg` with `accountant=auto` made concrete: pld unless m of N are drawn without
    replacement (m < N), which only rdp can account."""
    if cfg.accountant != "auto":
        return cfg
    sampled = cfg.sampling == "fixed" and per_round < population
    return cfg.model_copy(update={"accountant": "rdp" if sampled else "pld"})


def composed_multiplier(
    update_multiplier: float, count_std: float, count_sensitivity: float
) -> float:
    """The one Gaussian multiplier that adaptive clipping's two releases compose to, in units
    of the update's sensitivity: a Gaussian of std s on a quantity of sensitivity D is the
    Gaussian mechanism of multiplier s / D, and Gaussian mechanisms on the same neighbours
    compose as one of multiplier (sum of z_i^-2)^-1/2 (Andrew et al. 2021, Theorem 1; Dong et
    al. 2019). `count_sensitivity` is in units of the update's: 1/2 for centred bits under
    either sampling (add/remove: 1/2 against a bound of 1; replace: 1 against 2)."""
    count_multiplier = count_std / count_sensitivity
    return float((update_multiplier**-2 + count_multiplier**-2) ** -0.5)


def accountant(cfg: PrivacyConfig) -> dp_accounting.PrivacyAccountant:
    """A fresh accountant of the configured kind, with the sampling's neighbouring relation."""
    relation = (
        NeighboringRelation.ADD_OR_REMOVE_ONE
        if cfg.sampling == "poisson"
        else NeighboringRelation.REPLACE_ONE
    )
    if cfg.accountant == "pld":
        # pld only ever sees a Poisson-sampled Gaussian (add-or-remove) or, without
        # sampling, a Gaussian whose multiplier sigma / 2 already encodes the replaced
        # client's doubled sensitivity: dp-accounting's REPLACE_ONE would double it again
        # (24.4 where the same Gaussian(0.5) round is 10.0 at delta 1e-5), so add-or-remove
        return pld.PLDAccountant(
            NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=PLD_INTERVAL
        )
    return rdp.RdpAccountant(neighboring_relation=relation)


def refuse_unaccountable(cfg: PrivacyConfig, population: int, per_round: int) -> None:
    """A one-line ConfigError for what dp-accounting cannot account, before round 1."""
    if cfg.accountant == "pld" and cfg.sampling == "fixed" and per_round < population:
        raise ConfigError(
            "privacy.accountant: pld cannot account privacy.sampling=fixed with "
            f"{per_round} of {population} clients a round (sampling without replacement); "
            "use accountant=rdp (or auto) or sampling=poisson"
        )


def epsilon(
    cfg: PrivacyConfig, population: int, per_round: int, sigma: float, rounds: int
) -> float:
    """Epsilon at `cfg.delta` after `rounds` rounds (inf without noise, 0 before round 1)."""
    if rounds <= 0:
        return 0.0
    if sigma <= 0:
        return math.inf
    cfg = resolve(cfg, population, per_round)
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
        cfg = resolve(cfg, population, per_round)
        refuse_unaccountable(cfg, population, per_round)
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
        """The PLD accountant's own distribution for one Poisson-sampled Gaussian round,
        composed `rounds` times; a round without sampling (one Gaussian) the accountant
        composes itself, exactly (T Gaussians of multiplier z are one of z / sqrt(T))."""
        if isinstance(self.event, dp_event.GaussianDpEvent):
            event = dp_event.SelfComposedDpEvent(self.event, rounds)
            return float(accountant(self.cfg).compose(event).get_epsilon(self.cfg.delta))
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
    cfg = resolve(cfg, population, per_round)
    refuse_unaccountable(cfg, population, per_round)

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
