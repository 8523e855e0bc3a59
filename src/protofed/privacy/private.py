"""Any algorithm made client-level differentially private, around its four questions.

`private(algorithm, cfg.privacy, per_round, rounds)` wraps a built algorithm the way
Flower's DP wrappers wrap a strategy, on both sides of the wire, so the built-in and the
Flower engines run the same mechanism:
- `configure` adds the round's clip norm (record `privacy`) to every message;
- `fit` runs the algorithm's own `fit`, then clips every record of its reply
  (mechanisms.py; a binary record such as FedSub's masks is sent as centred, scaled bits); in `local` mode the client adds its noise before the reply leaves; the
  reply's metrics (its training loss) are not sent;
- `aggregate` (`central` mode) replaces the round's replies by the noised mean of their
  clipped records before the algorithm's own `aggregate` sees them, then moves the clip
  norm (adaptive clipping) and reports epsilon in its metrics; in both modes binary records
  reach the algorithm as bits again (thresholded: post-processing).
The algorithm itself is untouched: what it computes from the released mean is
post-processing, so the guarantee holds for any `aggregate`, and a server that keeps
per-client state (PFPL's prototypes, FedPAC's heads, FedClar's clusters) keeps the mean
for every client. The noise comes from the run's seed (streams keyed by round and client),
and the clip norm lives in the server state, so a resumed run draws what an uninterrupted
one would have.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from protofed.algorithms.base import Algorithm
from protofed.config import PrivacyConfig
from protofed.core.results import PrivacySummary
from protofed.core.seeding import PRIVACY_CLIENT, PRIVACY_SERVER, torch_generator
from protofed.core.types import AggregateResult, Arrays, FitResult, Records, Reply
from protofed.errors import ConfigError
from protofed.privacy import accounting
from protofed.privacy.mechanisms import (
    PRIVACY,
    binary_names,
    central_mean,
    clip_reply,
    decode_binary,
    noise_reply,
    split,
)
from protofed.training.client import Client

CLIP, UNCLIPPED = "clip_norm", "unclipped"


@dataclass(frozen=True)
class Plan:
    """The run's privacy, fixed before round 1: the noise multiplier (given, or calibrated
    for the target epsilon), the update's own share of it under adaptive clipping, and what
    the accountant needs."""

    cfg: PrivacyConfig
    population: int
    per_round: int
    rounds: int
    sigma: float  # the multiplier the accountant composes
    sigma_update: float  # the update's (adaptive clipping spends the rest on the count)
    count_noise: float  # adaptive: std of the noise on the unclipped count
    ledger: accounting.Ledger = field(compare=False, repr=False)  # epsilon, round by round

    def epsilon(self, rounds: int) -> float:
        return self.ledger.epsilon(rounds)


def plan(cfg: PrivacyConfig, population: int, per_round: int, rounds: int) -> Plan:
    """The privacy plan, or a one-line ConfigError naming the key that cannot be met."""
    if (cfg.noise_multiplier is None) == (cfg.target_epsilon is None):
        raise ConfigError(
            "privacy: set exactly one of privacy.noise_multiplier and privacy.target_epsilon"
        )
    if cfg.adaptive and cfg.mode == "local":
        raise ConfigError("privacy.adaptive: adaptive clipping needs privacy.mode=central")
    if cfg.accountant == "pld" and cfg.mode == "local":
        raise ConfigError(
            "privacy.accountant: pld cannot account privacy.mode=local (each client's own "
            "Gaussian under replace-one adjacency); use accountant=rdp"
        )
    run = accounting.accounted(cfg, population, per_round)
    sigma = cfg.noise_multiplier
    if sigma is None:
        sigma = accounting.calibrate(*run, rounds)
    count_noise = cfg.count_noise if cfg.count_noise is not None else per_round / 20
    sigma_update = sigma
    if cfg.adaptive and sigma > 0:
        # Andrew et al. 2021: the count's noise takes its share, so that the update's and
        # the count's mechanisms compose to one Gaussian of multiplier sigma
        rest = sigma**-2 - (2 * count_noise) ** -2
        if rest <= 0:
            raise ConfigError(
                f"privacy.count_noise: {count_noise:g} is too small for noise multiplier "
                f"{sigma:.3g} (it needs more than {sigma / 2:.3g})"
            )
        sigma_update = rest**-0.5
    ledger = accounting.Ledger(*run, sigma)
    return Plan(cfg, population, per_round, rounds, sigma, sigma_update, count_noise, ledger)


class Private(Algorithm):
    """An algorithm behind the privacy layer (module docstring); built by `private`."""

    name = "private"
    summary = "an algorithm with client-level differential privacy"

    def __init__(self, inner: Algorithm, dp: Plan) -> None:
        super().__init__(inner.params, inner.setting)
        self.inner = inner
        self.dp = dp

    def __getattr__(self, attribute: str) -> Any:  # the algorithm's own helpers
        if "inner" not in self.__dict__:  # a copy being built: nothing to delegate to yet
            raise AttributeError(attribute)
        return getattr(self.__dict__["inner"], attribute)

    def _stds(self, groups: int, clip: float) -> tuple[float, float]:
        """Noise std on the update and on each other record (mechanisms.py, sqrt(G))."""
        root = math.sqrt(max(groups, 1))
        return (
            self.dp.sigma_update * root * clip,
            self.dp.sigma * root * self.dp.cfg.prototype_clip,
        )

    # the four questions ------------------------------------------------------------------
    def init_server(self) -> Records:
        return {**self.inner.init_server(), PRIVACY: {CLIP: torch.tensor(self.dp.cfg.clip_norm)}}

    def configure(self, server: Records, client: int, server_round: int) -> Records:
        inner, privacy = _apart(server)
        return {**self.inner.configure(inner, client, server_round), PRIVACY: privacy}

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        inner, privacy = _apart(message)
        result = self.inner.fit(client, inner, state)
        clip = float(privacy[CLIP])
        reply, norm = clip_reply(result.reply, inner, clip, self.dp.cfg.prototype_clip)
        if self.dp.cfg.mode == "local":
            stds = self._stds(split(reply, inner).count, clip)
            keys = (PRIVACY_CLIENT, client.server_round, client.id + 1)
            reply = noise_reply(reply, inner, stds, torch_generator(self.setting.seed, *keys))
        elif self.dp.cfg.adaptive:  # the bit adaptive clipping counts (the server noises it)
            reply[PRIVACY] = {
                **reply.get(PRIVACY, {}),
                UNCLIPPED: torch.tensor(float(norm <= clip)),
            }
        return FitResult(reply, {}, result.state)

    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        inner, privacy = _apart(server)
        received = list(replies)
        clip = float(privacy[CLIP])
        unclipped = sum(float(r.records.get(PRIVACY, {}).get(UNCLIPPED, 0.0)) for r in received)
        released = [Reply(r.client, _apart(r.records)[0], {}, 1.0) for r in received]
        generator = torch_generator(self.setting.seed, PRIVACY_SERVER, server_round)
        if self.dp.cfg.mode == "central" and released:
            sent = [_apart(self.configure(server, r.client, server_round))[0] for r in released]
            stds = self._stds(split(released[0].records, sent[0]).count, clip)
            released = central_mean(
                released, sent, stds, self.dp.per_round, self.setting.num_classes, generator
            )
        released = [  # binary records back as bits (mechanisms.py): post-processing
            Reply(out.client, decode_binary(out.records, binary_names(r.records)), {}, 1.0)
            for out, r in zip(released, received, strict=True)
        ]
        if released:
            result = self.inner.aggregate(inner, released, server_round)
        else:  # Poisson sampling drew nobody: the model stays (docs/privacy.md)
            result = AggregateResult(inner)
        new_clip = self._next_clip(clip, unclipped, generator)
        metrics = {
            **result.metrics,
            "epsilon": self.dp.epsilon(server_round),
            "noise_multiplier": self.dp.sigma,
            CLIP: clip,
        }
        server_state = {**result.server, PRIVACY: {CLIP: torch.tensor(new_clip)}}
        return AggregateResult(server_state, metrics)

    def _next_clip(self, clip: float, unclipped: float, generator: torch.Generator) -> float:
        """Adaptive clipping's geometric step toward the target quantile (Andrew et al.
        2021): the noised fraction of unclipped updates against `target_quantile`."""
        cfg = self.dp.cfg
        if not cfg.adaptive:
            return clip
        noise = 0.0
        if self.dp.sigma > 0:
            noise = self.dp.count_noise * float(torch.randn((), generator=generator))
        fraction = (unclipped + noise) / self.dp.per_round
        return clip * math.exp(-cfg.clip_lr * (fraction - cfg.target_quantile))

    def guarantee(self, server: Records, rounds: int) -> PrivacySummary:
        """What the run guarantees after `rounds` rounds (summary.json's `privacy`)."""
        cfg, spent = self.dp.cfg, self.dp.epsilon(rounds)
        return PrivacySummary(
            mode=cfg.mode,
            epsilon=spent if math.isfinite(spent) else None,
            delta=cfg.delta,
            noise_multiplier=self.dp.sigma,
            clip_norm=float(_apart(server)[1].get(CLIP, torch.tensor(cfg.clip_norm))),
            sampling=cfg.sampling,
            accountant=cfg.accountant,
        )

    # evaluation --------------------------------------------------------------------------
    def client_model(self, message: Records, state: Records) -> Arrays:
        return self.inner.client_model(_apart(message)[0], state)

    def trained_model(self, message: Records, result: FitResult) -> Arrays:
        reply = {k: v for k, v in result.reply.items() if k != PRIVACY}
        inner = FitResult(reply, result.metrics, result.state)
        return self.inner.trained_model(_apart(message)[0], inner)

    def global_model(self, server: Records) -> Arrays | None:
        return self.inner.global_model(_apart(server)[0])

    def prototypes(self, server: Records) -> dict[str, Any] | None:
        return self.inner.prototypes(_apart(server)[0])


def _apart(records: Records) -> tuple[Records, Arrays]:
    """(the algorithm's records, the privacy layer's record)."""
    inner = {k: v for k, v in records.items() if k != PRIVACY}
    return inner, records.get(PRIVACY, {})


def private(algorithm: Algorithm, cfg: PrivacyConfig, per_round: int, rounds: int) -> Algorithm:
    """`algorithm` behind the privacy layer, with its name and class attributes."""
    cls = type(algorithm)
    if cls.pools_data:
        raise ConfigError(
            f"privacy.enabled: '{cls.name}' pools every client's data on one machine; there is "
            "no client reply to make private"
        )
    dp = plan(cfg, algorithm.setting.num_clients, per_round, rounds)
    namespace = {
        "name": cls.name,
        "summary": cls.summary,
        "reference": cls.reference,
        "Params": cls.Params,
        "has_global_model": cls.has_global_model,
        "__module__": __name__,
        "__doc__": f"{cls.__name__} with client-level differential privacy (privacy.*).",
    }
    wrapped = type(f"Private{cls.__name__}", (Private,), namespace)
    return wrapped(algorithm, dp)
