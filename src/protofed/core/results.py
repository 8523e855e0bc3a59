"""What a run produces, typed: a round's scores, its record, and the run's summary.

One definition below the runtime, used by the evaluation, the round loop, tracking, the
report and the API. Each type reads and writes the JSON that `metrics.jsonl` (one
`RoundRecord` a line) and `summary.json` (a `Summary`) have always held, key for key and in
the same order (a field's order is its key's order; `global_` is the key "global"), so runs
written before these types existed load and resume unchanged.

Scores are fractions in [0, 1]; a score that cannot be computed (a client without validation
data, a round that was not scored) is None in memory as in the files (JSON has no NaN).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, TypeVar, cast

from protofed.core.caveats import stated
from protofed.core.types import Metrics

Json = dict[str, Any]


def finite(value: object) -> float | None:
    """A finite float, or None (NaN, infinity, null, a missing value): what JSON can hold."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def to_json(value: Any) -> Any:
    """Plain JSON data from results: dataclasses field by field (a trailing underscore
    dropped from a name; the fields a class lists in `omitted_when_empty` left out while
    None, 0 or empty; an `extra` mapping merged in), non-finite floats as None."""
    if is_dataclass(value) and not isinstance(value, type):
        skip: tuple[str, ...] = getattr(value, "omitted_when_empty", ())
        out = {
            f.name.rstrip("_"): to_json(getattr(value, f.name))
            for f in fields(value)
            if f.name != "extra" and not (f.name in skip and not getattr(value, f.name))
        }
        out.update(to_json(getattr(value, "extra", {})))
        return out
    if isinstance(value, Mapping):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, float):
        return finite(value)
    return value


class JsonRecord:
    """Results that write themselves as the JSON they came from."""

    def to_json(self) -> Json:
        out = to_json(self)
        assert isinstance(out, dict)
        return out


_R = TypeVar("_R", bound="JsonRecord")


def _numbers(cls: type[_R], data: Mapping[str, Any], read: Callable[[Any], Any]) -> _R:
    """A record whose fields are all numbers, each read from its key by `read`."""
    return cls(**{f.name: read(data.get(f.name)) for f in fields(cast(Any, cls))})


def _seconds(value: object) -> float:
    return float(cast(float, value) or 0.0)


class Fractions(JsonRecord):
    """Scores: every field a fraction, None where it cannot be computed."""

    @classmethod
    def from_json(cls: type[_R], data: Mapping[str, Any]) -> _R:
        return _numbers(cls, data, finite)


class Seconds(JsonRecord):
    """Timings: every field in seconds, 0 where an earlier file lacks it."""

    @classmethod
    def from_json(cls: type[_R], data: Mapping[str, Any]) -> _R:
        return _numbers(cls, data, _seconds)


def _floats(values: object) -> list[float | None]:
    return [finite(v) for v in values] if isinstance(values, list) else []


def _metrics(data: object) -> Metrics:
    if not isinstance(data, Mapping):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, int | float)}


def _section(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True, kw_only=True)
class Scores(Fractions):
    """Accuracy and macro-F1 of client models: the mean across clients and its std."""

    acc: float | None
    acc_std: float | None = None
    f1: float | None
    f1_std: float | None = None

    @classmethod
    def absent(cls) -> Scores:
        return cls(acc=None, f1=None)


@dataclass(frozen=True, kw_only=True)
class GlobalScores(Fractions):
    """The server's model on the union of the clients' test splits (one model: no acc std;
    `f1_std` is the spread of its F1 across the clients' own splits)."""

    acc: float | None
    f1: float | None
    f1_std: float | None = None


def _scores(data: object) -> Scores | None:
    return Scores.from_json(data) if isinstance(data, Mapping) and data else None


def _global(data: object) -> GlobalScores | None:
    return GlobalScores.from_json(data) if isinstance(data, Mapping) and data else None


@dataclass(frozen=True, kw_only=True)
class UnseenScores(JsonRecord):
    """Unseen users (`eval.unseen_clients`): clients held out of training, each scored on its
    own test split. `personalized`: the model the algorithm's own client procedure gives it
    (`finetune_epochs` local epochs of its `fit` on its training split from an empty state,
    or its model with an empty state when 0); `global_`: the server's model (None: the
    method has none). Each is the mean over the unseen clients and its std across them;
    `pers_*` and `global_*` hold each unseen client's score, in `clients` order."""

    clients: list[int]
    finetune_epochs: int
    personalized: Scores
    global_: Scores | None
    pers_acc: list[float | None]
    pers_f1: list[float | None]
    global_acc: list[float | None]  # empty without a global model
    global_f1: list[float | None]

    @property
    def acc(self) -> float | None:
        """The unseen clients' own models' mean accuracy (`personalized.acc`)."""
        return self.personalized.acc

    @property
    def f1(self) -> float | None:
        """The unseen clients' own models' mean macro-F1 (`personalized.f1`)."""
        return self.personalized.f1

    @property
    def f1_std(self) -> float | None:
        """The std of that macro-F1 across the unseen clients (`personalized.f1_std`)."""
        return self.personalized.f1_std

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UnseenScores:
        ids = data.get("clients")
        return cls(
            clients=[int(i) for i in ids] if isinstance(ids, list) else [],
            finetune_epochs=int(data.get("finetune_epochs") or 0),
            personalized=_scores(data.get("personalized")) or Scores.absent(),
            global_=_scores(data.get("global")),
            pers_acc=_floats(data.get("pers_acc")),
            pers_f1=_floats(data.get("pers_f1")),
            global_acc=_floats(data.get("global_acc")),
            global_f1=_floats(data.get("global_f1")),
        )


def _unseen(data: object) -> UnseenScores | None:
    return UnseenScores.from_json(data) if isinstance(data, Mapping) and data else None


@dataclass(frozen=True, kw_only=True)
class ClientScores(JsonRecord):
    """Each client's scores, in client order (`client_ids`: which clients, where only some
    were scored, as on a Flower deployment; None: every client, by id)."""

    omitted_when_empty: ClassVar[tuple[str, ...]] = ("client_ids",)

    pers_acc: list[float | None]
    pers_f1: list[float | None]
    gen_acc: list[float | None]  # empty when generalization is not scored
    gen_f1: list[float | None]
    val_acc: list[float | None]
    val_f1: list[float | None]
    client_ids: list[int] | None = None

    @property
    def ids(self) -> list[int]:
        return self.client_ids if self.client_ids is not None else list(range(len(self.pers_acc)))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClientScores:
        ids = data.get("client_ids")
        return cls(
            **{f.name: _floats(data.get(f.name)) for f in fields(cls) if f.name != "client_ids"},
            client_ids=[int(i) for i in ids] if isinstance(ids, list) else None,
        )


@dataclass(frozen=True, kw_only=True)
class SampleSizes(JsonRecord):
    """How many samples were scored: the test union, and the generalization sample."""

    test: int
    generalization: int | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SampleSizes:
        gen = data.get("generalization")
        return cls(
            test=int(data.get("test") or 0), generalization=None if gen is None else int(gen)
        )


@dataclass(frozen=True, kw_only=True)
class RoundScores:
    """What an evaluation mode returns for one round: the protocol's three scores, the
    validation score that selects rounds, each client's scores, and the time it took."""

    personalization: Scores
    generalization: Scores | None  # None: eval.generalization=false
    val: Scores
    global_: GlobalScores | None  # None: the method has no global model
    clients: ClientScores
    samples: SampleSizes | None = None  # None: not known (scored on the clients)
    eval_s: float = 0.0
    unseen: UnseenScores | None = None  # None: no held-out clients (eval.unseen_clients=0)


@dataclass(frozen=True, kw_only=True)
class RoundInfo:
    """What training one round gives, evaluated or not (every round's `on_round` gets it)."""

    clients: list[int]  # the round's sampled clients
    train_loss: float | None  # the replies' loss, weighted by their examples
    train_s: float
    guard_s: float = 0.0
    aggregate_s: float
    server: Metrics  # the server's own metrics from `aggregate`


@dataclass(frozen=True, kw_only=True)
class RoundTime(Seconds):
    """Seconds one round took in the process that runs the loop, by phase: `train_s`, the
    clients' training as waiting for and receiving their replies (workers train meanwhile,
    also while this process checks and aggregates); `guard_s`, the non-finite checks of the
    replies and the aggregate; `aggregate_s`, the algorithm's aggregation; `eval_s`, the
    evaluation. Files written before `guard_s` existed lack it (read as 0, written back
    without it) and count the guard in `aggregate_s`."""

    omitted_when_empty: ClassVar[tuple[str, ...]] = ("guard_s",)

    train_s: float
    guard_s: float = 0.0
    aggregate_s: float
    eval_s: float


@dataclass(frozen=True, kw_only=True)
class Traffic(JsonRecord):
    """Bytes sent so far, in both directions (message and reply payloads)."""

    up_bytes: int
    down_bytes: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Traffic:
        return cls(
            up_bytes=int(data.get("up_bytes") or 0), down_bytes=int(data.get("down_bytes") or 0)
        )


@dataclass(frozen=True, kw_only=True)
class RoundRecord(JsonRecord):
    """One evaluated round: a line of metrics.jsonl, the same in memory and on disk
    (`unseen`, the held-out clients' scores, only where eval.unseen_clients holds some)."""

    omitted_when_empty: ClassVar[tuple[str, ...]] = ("unseen",)

    round: int
    train_loss: float | None
    personalization: Scores
    generalization: Scores | None
    global_: GlobalScores | None
    unseen: UnseenScores | None = None
    val: Scores
    samples: SampleSizes | None
    server: Metrics
    time: RoundTime
    comm: Traffic
    clients: ClientScores

    @property
    def epsilon(self) -> float | None:
        """The privacy spent up to this round (privacy.enabled), else None."""
        value = self.server.get("epsilon")
        return None if value is None else float(value)

    @classmethod
    def of(
        cls, info: RoundInfo, scores: RoundScores, server_round: int, comm: Traffic
    ) -> RoundRecord:
        """The record of round `server_round` from its training and its scores."""
        return cls(
            round=server_round,
            train_loss=finite(info.train_loss),
            personalization=scores.personalization,
            generalization=scores.generalization,
            global_=scores.global_,
            unseen=scores.unseen,
            val=scores.val,
            samples=scores.samples,
            server=dict(info.server),
            time=RoundTime(
                train_s=info.train_s,
                guard_s=info.guard_s,
                aggregate_s=info.aggregate_s,
                eval_s=scores.eval_s,
            ),
            comm=comm,
            clients=scores.clients,
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RoundRecord:
        """From a metrics.jsonl line, as this or an earlier version wrote it."""
        samples = data.get("samples")
        return cls(
            round=int(data["round"]),
            train_loss=finite(data.get("train_loss")),
            personalization=_scores(data.get("personalization")) or Scores.absent(),
            generalization=_scores(data.get("generalization")),
            global_=_global(data.get("global")),
            unseen=_unseen(data.get("unseen")),
            val=_scores(data.get("val")) or Scores.absent(),
            samples=SampleSizes.from_json(samples) if isinstance(samples, Mapping) else None,
            server=_metrics(data.get("server")),
            time=RoundTime.from_json(_section(data, "time")),
            comm=Traffic.from_json(_section(data, "comm")),
            clients=ClientScores.from_json(_section(data, "clients")),
        )


@dataclass(frozen=True, kw_only=True)
class ReportedRound(JsonRecord):
    """The scores a summary reports: the final round's, or the round its selection rule
    picked (`rule`; under `best_test` the global score is the global model's own best round,
    `global_round`)."""

    omitted_when_empty: ClassVar[tuple[str, ...]] = ("rule", "global_round", "unseen")

    round: int
    rule: str | None = None  # None: the final round
    personalization: Scores
    generalization: Scores | None
    global_: GlobalScores | None
    global_round: int | None = None
    unseen: UnseenScores | None = None  # that round's held-out clients (eval.unseen_clients)
    server: Metrics

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReportedRound:
        global_round = data.get("global_round")
        return cls(
            round=int(data["round"]),
            rule=data.get("rule"),
            personalization=_scores(data.get("personalization")) or Scores.absent(),
            generalization=_scores(data.get("generalization")),
            global_=_global(data.get("global")),
            global_round=None if global_round is None else int(global_round),
            unseen=_unseen(data.get("unseen")),
            server=_metrics(data.get("server")),
        )

    @classmethod
    def final(cls, record: RoundRecord) -> ReportedRound:
        return cls(
            round=record.round,
            personalization=record.personalization,
            generalization=record.generalization,
            global_=record.global_,
            unseen=record.unseen,
            server=dict(record.server),
        )


@dataclass(frozen=True, kw_only=True)
class CommSummary(JsonRecord):
    """Bytes over the whole run, and per round."""

    up_bytes: int
    down_bytes: int
    up_bytes_per_round: float
    down_bytes_per_round: float

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CommSummary:
        return cls(
            up_bytes=int(data.get("up_bytes") or 0),
            down_bytes=int(data.get("down_bytes") or 0),
            up_bytes_per_round=float(data.get("up_bytes_per_round") or 0.0),
            down_bytes_per_round=float(data.get("down_bytes_per_round") or 0.0),
        )


@dataclass(frozen=True, kw_only=True)
class TimeSummary(Seconds):
    """Seconds over the whole run (all its sessions), by phase (as `RoundTime`), and
    `checkpoint_s`, writing the checkpoints; `guard_s` and `checkpoint_s` are left out where
    they are 0 (summaries written before they existed, engines that write no checkpoint)."""

    omitted_when_empty: ClassVar[tuple[str, ...]] = ("guard_s", "checkpoint_s")

    total_s: float
    train_s: float
    guard_s: float = 0.0
    aggregate_s: float
    eval_s: float
    train_s_per_round: float
    client_updates_per_s: float
    checkpoint_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class PrivacySummary(JsonRecord):
    """What a private run guarantees (summary.json's `privacy`): (epsilon, delta) at the
    client level after its last round, and the mechanism's settings."""

    mode: str  # central | local
    epsilon: float | None  # None: infinite (no noise)
    delta: float
    noise_multiplier: float
    clip_norm: float  # the bound the run ended with (adaptive clipping moves it)
    sampling: str
    accountant: str
    noise: str = "seeded"  # secure | seeded (runs before the key existed: seeded)
    caveats: list[str] = field(default_factory=list)  # what epsilon does not cover
    audit_canaries: int = 0  # privacy.audit: canaries inserted (as many held out)
    empirical_epsilon: float | None = None  # the audit's estimate (privacy/audit.py)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PrivacySummary:
        """From summary.json's `privacy` (JSON already holds each field's type)."""
        values: dict[str, Any] = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values.setdefault("epsilon", None)
        values["caveats"] = stated(data)
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class Summary(JsonRecord):
    """A run's outcome (summary.json): its final and selected scores, cost and warnings.

    `status` is "complete", or "diverged" when a reply or the server state held NaN or
    infinity (`diverged` says where; `final` and `selected` are None if no round was scored).
    `to_json()` leaves out a missing `diverged`, empty `warnings` and `scoring` and zero
    `dropped_nonfinite`, as summary.json always has.
    """

    omitted_when_empty: ClassVar[tuple[str, ...]] = (
        "diverged",
        "warnings",
        "dropped_nonfinite",
        "privacy",
        "scoring",
    )

    status: str = "complete"
    diverged: str | None = None
    algorithm: str
    dataset: str
    model: str
    engine: str
    num_clients: int
    seed: int
    rounds: int
    final: ReportedRound | None
    selected: ReportedRound | None
    comm: CommSummary
    time: TimeSummary
    warnings: list[str] = field(default_factory=list)  # e.g. validation never beat chance
    dropped_nonfinite: int = 0  # replies left out for NaN or inf (train.on_nonfinite=drop)
    privacy: PrivacySummary | None = None  # privacy.enabled: the guarantee after the run
    # the eval.* keys that change how the scores are computed, where not at their default:
    # {"eval.f1_labels": {"value": "union", "default": "true"}} (`SCORING_KEYS`)
    scoring: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # an engine's own entries (Flower's)

    def as_dict(self) -> Json:
        """summary.json's contents (the same as `to_json`)."""
        return self.to_json()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Summary:
        """From summary.json's dict, as this or an earlier version wrote it; keys this
        version does not know go to `extra`."""
        final, selected = data.get("final"), data.get("selected")
        privacy = data.get("privacy")
        known = {f.name for f in fields(cls)}
        return cls(
            status=str(data.get("status", "complete")),
            diverged=data.get("diverged"),
            algorithm=str(data["algorithm"]),
            dataset=str(data["dataset"]),
            model=str(data["model"]),
            engine=str(data.get("engine", "builtin")),
            num_clients=int(data["num_clients"]),
            seed=int(data["seed"]),
            rounds=int(data["rounds"]),
            final=ReportedRound.from_json(final) if isinstance(final, Mapping) else None,
            selected=ReportedRound.from_json(selected) if isinstance(selected, Mapping) else None,
            comm=CommSummary.from_json(_section(data, "comm")),
            time=TimeSummary.from_json(_section(data, "time")),
            warnings=[str(w) for w in data.get("warnings") or []],
            dropped_nonfinite=int(data.get("dropped_nonfinite") or 0),
            privacy=PrivacySummary.from_json(privacy) if isinstance(privacy, Mapping) else None,
            scoring={
                str(k): dict(v)
                for k, v in (data.get("scoring") or {}).items()
                if isinstance(v, Mapping)
            },
            extra={k: v for k, v in data.items() if k not in known},
        )

    from_dict = from_json
