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
for every client. The noise comes from the operating system's entropy, never recorded
(entropy.py), unless `privacy.noise=seeded` asks for the seed's replayable streams (no
guarantee then); the clip norm lives in the server state, so a resumed run goes on from it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from protofed.algorithms.base import Algorithm
from protofed.config import PrivacyConfig
from protofed.core.caveats import (
    CLASS_PRESENCE,
    CLEAR_EVALUATION,
    NOT_A_GUARANTEE,
    SEEDED_METRIC,
)
from protofed.core.results import PrivacySummary
from protofed.core.types import AggregateResult, Arrays, FitResult, Records, Reply
from protofed.errors import ConfigError
from protofed.privacy import accounting, audit
from protofed.privacy.central import (
    SECURE_SUM,
    UNCLIPPED,
    central_mean,
    release,
    released_replies,
    secure_sums,
)
from protofed.privacy.entropy import NoiseSource, client_noise, server_noise
from protofed.privacy.mechanisms import (
    PRIVACY,
    binary_names,
    clip_reply,
    decode_binary,
    deltas,
    flat,
    is_prototypes,
    noise_reply,
    split,
)
from protofed.prototypes import pack_prototypes, unpack_prototypes
from protofed.training.client import Client

log = logging.getLogger("protofed")
CLIP, PRESENCE = "clip_norm", "class_presence"
OBSERVED = "audit."
"""Server-state keys of the audit's observation, one per group: `audit.<record>`."""
COUNT_SENSITIVITY = 0.5
"""How far one added or removed client moves the noised count of adaptive clipping, in units
of the update's bound: its bit is sent centred, as +1/2 (unclipped) or -1/2."""


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
    if cfg.noise_multiplier == 0:
        raise ConfigError(
            "privacy.noise_multiplier: 0 adds no noise, so no epsilon holds (it is infinite); "
            "set a positive multiplier or privacy.target_epsilon"
        )
    if cfg.adaptive and cfg.mode == "local":
        raise ConfigError("privacy.adaptive: adaptive clipping needs privacy.mode=central")
    run = accounting.accounted(cfg, population, per_round)
    sigma = cfg.noise_multiplier
    if sigma is None:
        sigma = accounting.calibrate(*run, rounds)
    count_noise = cfg.count_noise if cfg.count_noise is not None else per_round / 20
    sigma_update = sigma
    if cfg.adaptive and sigma > 0:
        # Andrew et al. 2021: the count's noise takes its share, so that the update's and
        # the count's mechanisms compose to one Gaussian of multiplier sigma; the bits are
        # centred (+-1/2), so one client moves the count by at most 1/2 where one client is
        # added or removed (Poisson), by at most 1 where one is replaced (fixed), exactly
        # half the update's sensitivity either way (accounting.composed_multiplier)
        rest = sigma**-2 - (count_noise / COUNT_SENSITIVITY) ** -2
        if rest <= 0:
            raise ConfigError(
                f"privacy.count_noise: {count_noise:g} is too small for noise multiplier "
                f"{sigma:.3g} (it needs more than {sigma * COUNT_SENSITIVITY:.3g})"
            )
        sigma_update = rest**-0.5
    ledger = accounting.Ledger(*run, sigma)
    try:  # the PLD of a tiny multiplier is too wide to represent: say so before round 1
        ledger.epsilon(1)
    except (MemoryError, ValueError, OverflowError):
        if run[0].accountant != "pld":
            raise
        if cfg.accountant == "pld":
            raise ConfigError(
                f"privacy.accountant: pld cannot represent noise multiplier {sigma:.3g} "
                "(too small); use accountant=rdp"
            ) from None
        run = (run[0].model_copy(update={"accountant": "rdp"}), *run[1:])
        ledger = accounting.Ledger(*run, sigma)  # auto: the tightest that can represent it
    return Plan(cfg, population, per_round, rounds, sigma, sigma_update, count_noise, ledger)


SURVIVABLE = 10.0
"""The noise-to-clip ratio above which a run is warned before round 1 (`noise_to_clip`):
FedAvg on UCI-HAR diverged at every ratio measured from 90 up and trained at 1.7
(docs/privacy.md, "A private example that trains")."""


def noise_to_clip(dp: Plan, weights: int) -> float:
    """The norm of the Gaussian noise on the round's mean update over the update's clip norm:
    sigma_update x sqrt(G) x sqrt(d) / m for d weights (the whole model: an upper bound for
    methods that share a part), one group (G = 1: the update alone). Central mode adds the
    noise once to the sum of m; in local mode each of the m replies carries its own, so the
    mean's noise is sqrt(m) times larger."""
    clients = dp.per_round if dp.cfg.mode == "central" else math.sqrt(dp.per_round)
    return dp.sigma_update * math.sqrt(weights) / clients


class Private(Algorithm):
    """An algorithm behind the privacy layer (module docstring); built by `private`."""

    name = "private"
    summary = "an algorithm with client-level differential privacy"

    def __init__(self, inner: Algorithm, dp: Plan) -> None:
        super().__init__(inner.params, inner.setting)
        self.inner = inner
        self.dp = dp
        self.secure = dp.cfg.noise == "secure"

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
        inner, privacy = _apart(server)  # a client gets the clip norm, nothing else
        return {**self.inner.configure(inner, client, server_round), PRIVACY: {CLIP: privacy[CLIP]}}

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        inner, privacy = _apart(message)
        result = self.inner.fit(client, inner, state)
        clip = float(privacy[CLIP])
        reply, norm = clip_reply(result.reply, inner, clip, self.dp.cfg.prototype_clip)
        if self.dp.cfg.mode == "local":
            stds = self._stds(split(reply, inner).count, clip)
            source = client_noise(self.secure, self.setting.seed, client.server_round, client.id)
            reply = noise_reply(reply, inner, stds, source)
        elif self.dp.cfg.adaptive:  # the bit adaptive clipping counts, centred (server noises)
            reply[PRIVACY] = {
                **reply.get(PRIVACY, {}),
                UNCLIPPED: torch.tensor(float(norm <= clip) - COUNT_SENSITIVITY),
            }
        return FitResult(reply, {}, result.state)

    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        inner, privacy = _apart(server)
        received = list(replies)
        clip = float(privacy[CLIP])
        source = server_noise(self.secure, self.setting.seed, server_round)
        observed: dict[str, torch.Tensor] | None = {} if self.dp.cfg.audit else None
        if received and SECURE_SUM in received[0].records:  # Flower's SecAgg+: the sum only
            released, unclipped, updates = self._release_secure_sum(
                server, received, server_round, clip, source, observed
            )
        elif self.dp.cfg.secure_aggregation and received:
            raise ConfigError(
                "privacy.secure_aggregation: the server received the clients' individual "
                "replies; secure aggregation runs on Flower only (--engine flower)"
            )
        else:
            released, unclipped, updates = self._release(
                server, received, server_round, clip, source, observed
            )
        if released:
            result = self.inner.aggregate(inner, released, server_round)
        else:  # Poisson sampling drew nobody: the model stays (docs/privacy.md)
            result = AggregateResult(inner)
        new_clip = self._next_clip(clip, unclipped, source)
        metrics = {
            **result.metrics,
            "epsilon": self.dp.epsilon(server_round),
            "noise_multiplier": self.dp.sigma,
            CLIP: clip,
        }
        if not self.secure:  # every progress line says so (tracking.epsilon_text)
            metrics[SEEDED_METRIC] = 1.0
        layer = {CLIP: torch.tensor(new_clip)}
        if PRESENCE in privacy or any(
            is_prototypes(arrays) for r in released for arrays in r.records.values()
        ):  # some reply sent class indices in the clear: epsilon says so from now on
            layer[PRESENCE] = torch.tensor(1.0)
        if self.dp.cfg.audit:
            layer.update(self._observe(privacy, observed or {}, clip, updates))
        server_state = {**result.server, PRIVACY: layer}
        return AggregateResult(server_state, metrics)

    def _release(
        self,
        server: Records,
        received: list[Reply],
        server_round: int,
        clip: float,
        source: NoiseSource,
        observed: dict[str, torch.Tensor] | None,
    ) -> tuple[list[Reply], float, set[str]]:
        """The round's release from the individual replies: (the replies the algorithm
        aggregates, the sum of adaptive clipping's bits, the update records' names)."""
        unclipped = sum(float(r.records.get(PRIVACY, {}).get(UNCLIPPED, 0.0)) for r in received)
        released = [Reply(r.client, _apart(r.records)[0], {}, 1.0) for r in received]
        needs_sent = self.dp.cfg.mode == "central" or self.dp.cfg.audit
        sent = [  # what each client was sent: its reply's updates are measured against it
            _apart(self.configure(server, r.client, server_round))[0]
            for r in (released if needs_sent else [])
        ]
        canaries = self._canaries(released, sent, server_round, clip)
        groups = split(released[0].records, sent[0]) if sent else None
        updates = set(groups.update) if groups is not None else set()
        stds = self._stds(groups.count, clip) if groups is not None else (0.0, 0.0)
        if self.dp.cfg.mode == "central" and released:
            every = released + [Reply(-1, c, {}, 1.0) for c in canaries]
            released = central_mean(
                every,
                sent + [sent[0]] * len(canaries),
                stds,
                self.dp.per_round,
                self.setting.num_classes,
                source,
                observed,
            )[: len(released)]
        elif observed is not None and released:  # local: the noised replies, canaries too
            noised = [noise_reply(c, sent[0], stds, source) for c in canaries]
            seen = [r.records for r in released] + noised
            observed.update(self._summed(seen, sent + [sent[0]] * len(noised)))
        released = [  # binary records back as bits (mechanisms.py): post-processing
            Reply(out.client, decode_binary(out.records, binary_names(r.records)), {}, 1.0)
            for out, r in zip(released, received, strict=True)
        ]
        return released, unclipped, updates

    def _release_secure_sum(
        self,
        server: Records,
        received: list[Reply],
        server_round: int,
        clip: float,
        source: NoiseSource,
        observed: dict[str, torch.Tensor] | None,
    ) -> tuple[list[Reply], float, set[str]]:
        """The round's release from a secure aggregation's sum (flower/secagg.py): the same
        noise on the same sums as `_release`, without any individual reply."""
        sums = secure_sums(received, self.setting.num_classes)
        clients = [r.client for r in received]
        sent = [_apart(self.configure(server, c, server_round))[0] for c in clients]
        stds = self._stds(sums.groups.count, clip)
        means, others = release(sums, stds, self.dp.per_round, source, observed)
        released = [
            Reply(out.client, decode_binary(out.records, sums.binary), {}, 1.0)
            for out in released_replies(sums, means, others, clients, sent)
        ]
        return released, sums.unclipped, set(sums.groups.update)

    # the audit (audit.py) ----------------------------------------------------------------
    def _canaries(
        self, released: list[Reply], sent: list[Records], server_round: int, clip: float
    ) -> list[Records]:
        """The clipped replies of the inserted canaries taking part in `server_round`, shaped
        as the round's first reply: a unit direction at the full bound in every group."""
        cfg = self.dp.cfg
        if not cfg.audit or not released:
            return []
        rate = self.dp.per_round / self.setting.num_clients
        template, message = released[0].records, sent[0]
        groups = split(template, message)
        out = []
        for canary in audit.taking_part(self.setting.seed, server_round, cfg.audit, rate):
            reply: Records = {}
            for name in groups.update:
                floats = deltas(template[name], message[name])
                unit = audit.direction(self.setting.seed, canary, name, _size(floats))
                moved = _unflat(unit * clip, floats)
                reply[name] = {
                    k: message[name][k] + moved[k] if k in moved else message[name][k]
                    for k in template[name]
                }
            for name in groups.others:
                arrays = template[name]
                if is_prototypes(arrays):
                    dim = arrays["means"].shape[1]
                    size = self.setting.num_classes * dim
                    unit = audit.direction(self.setting.seed, canary, name, size)
                    means = (unit * cfg.prototype_clip).reshape(-1, dim).to(arrays["means"].dtype)
                    table = pack_prototypes(means, torch.ones(self.setting.num_classes))
                    reply[name] = {k: table[k] for k in arrays}
                    continue
                values = {k: v for k, v in arrays.items() if v.is_floating_point()}
                unit = audit.direction(self.setting.seed, canary, name, _size(values))
                reply[name] = {**arrays, **_unflat(unit * cfg.prototype_clip, values)}
            out.append(reply)
        return out

    def _summed(self, replies: list[Records], messages: list[Records]) -> dict[str, torch.Tensor]:
        """Local mode's observation: each group of the noised replies (each against what its
        client was sent), summed, as one vector (prototype tables over every class, as the
        central sum)."""
        groups = split(replies[0], messages[0])
        out: dict[str, torch.Tensor] = {}
        for reply, message in zip(replies, messages, strict=True):
            for name in groups.update:
                part = flat(deltas(reply[name], message[name]))
                out[name] = out[name] + part if name in out else part
            for name in groups.others:
                arrays = reply[name]
                if is_prototypes(arrays):
                    part = unpack_prototypes(arrays, self.setting.num_classes)[0].double().flatten()
                else:
                    part = flat({k: v for k, v in arrays.items() if v.is_floating_point()})
                out[name] = out[name] + part if name in out else part
        return out

    def _observe(
        self, privacy: Arrays, observed: dict[str, torch.Tensor], clip: float, updates: set[str]
    ) -> Arrays:
        """The audit's running observation: every round's release, each group in units of
        its bound (the update's clip moves under adaptive clipping), kept in the server
        state (so a resumed run goes on with it) and never sent to a client."""
        kept = {k: v for k, v in privacy.items() if k.startswith(OBSERVED)}
        for name, released in observed.items():
            bound = clip if name in updates else self.dp.cfg.prototype_clip
            key = OBSERVED + name
            scaled = released / bound
            kept[key] = kept[key] + scaled if key in kept else scaled
        return kept

    def empirical_epsilon(self, server: Records) -> float | None:
        """The audit's estimate from what the run released so far (None without audit)."""
        privacy = _apart(server)[1]
        observed = {k[len(OBSERVED) :]: v for k, v in privacy.items() if k.startswith(OBSERVED)}
        if not self.dp.cfg.audit or not observed:
            return None
        return audit.estimate(self.setting.seed, self.dp.cfg.audit, observed, self.dp.cfg.delta)

    def _next_clip(self, clip: float, unclipped: float, source: NoiseSource) -> float:
        """Adaptive clipping's geometric step toward the target quantile (Andrew et al.
        2021): the noised fraction of unclipped updates against `target_quantile`. The
        centred bits' noised sum, over the round's expected size m, plus 1/2, estimates the
        fraction (the paper's centring: the round's actual size is never used)."""
        cfg = self.dp.cfg
        if not cfg.adaptive:
            return clip
        noise = self.dp.count_noise * float(source.normal((1,))[0])
        fraction = (unclipped + noise) / self.dp.per_round + COUNT_SENSITIVITY
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
            accountant=self.dp.ledger.cfg.accountant,
            noise=cfg.noise,
            audit_canaries=cfg.audit,
            empirical_epsilon=self.empirical_epsilon(server),
            caveats=caveats(
                self.secure,
                bool(_apart(server)[1].get(PRESENCE, False)),
                cfg.clear_evaluation,
            ),
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


def summand_bound(server: Records, cfg: PrivacyConfig) -> float:
    """The largest magnitude a coordinate of a client's summand can have this round (the
    range SecAgg+ quantizes within): a clipped vector's entries stay within its bound, a
    presence flag within 1, adaptive clipping's bit within 1/2."""
    clip = float(_apart(server)[1].get(CLIP, torch.tensor(cfg.clip_norm)))
    return max(clip, cfg.prototype_clip, 1.0)


PUBLIC_EXAMPLES = 1.0
"""What a private client reports as its example count: a public constant. Its real size is
data about it that no mechanism noises (and privacy weighs every reply alike anyway)."""


def released_examples(private: bool, examples: int) -> float:
    """The example count a client's reply carries: its own, or the public constant."""
    return PUBLIC_EXAMPLES if private else float(examples)


def caveats(secure: bool, class_presence: bool, clear_evaluation: bool = False) -> list[str]:
    """What a run's epsilon does not cover, in the words every output prints beside it:
    seeded noise (no guarantee at all); class presence, released in the clear by the
    methods that send prototype tables (FedProto, PFPL, FedDPA, ProtoHAR, FedNH, FedPAC);
    a deployment's evaluation counts where `privacy.clear_evaluation` lets them go."""
    out = [] if secure else [NOT_A_GUARANTEE]
    out += [CLASS_PRESENCE] if class_presence else []
    return out + [CLEAR_EVALUATION] if clear_evaluation else out


def _size(arrays: Arrays) -> int:
    return sum(v.numel() for v in arrays.values())


def _unflat(vector: torch.Tensor, like: Arrays) -> Arrays:
    """`vector` cut into tensors shaped (and typed) as `like`'s, in its key order."""
    out, start = {}, 0
    for key, value in like.items():
        out[key] = vector[start : start + value.numel()].reshape(value.shape).to(value.dtype)
        start += value.numel()
    return out


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
    weights = sum(v.numel() for v in algorithm.setting.init_model.values() if v.is_floating_point())
    if (ratio := noise_to_clip(dp, weights)) > SURVIVABLE:
        log.warning(
            "privacy: the noise on the mean update is %.0f times its clip norm (sigma %.3g, "
            "%d weights, %d clients a round); FedAvg-style training diverged at such "
            "ratios on UCI-HAR and trained at 1.7: more clients a round, a larger epsilon "
            "or fewer rounds (docs/privacy.md)",
            ratio,
            dp.sigma_update,
            weights,
            dp.per_round,
        )
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
