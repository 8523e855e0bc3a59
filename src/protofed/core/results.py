"""What a run produces, typed: a round's scores, its record, and the run's summary.

One definition below the runtime, used by the evaluation, the round loop, tracking, the
report and the API. Each type reads and writes the JSON that `metrics.jsonl` (one
`RoundRecord` a line) and `summary.json` (a `Summary`) have always held, key for key, so runs
written before these types existed load and resume unchanged.

Scores are fractions in [0, 1]; a score that cannot be computed (a client without validation
data, a round that was not scored) is None in memory as in the files (JSON has no NaN).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from protofed.core.types import Metrics

Json = dict[str, Any]


def finite(value: object) -> float | None:
    """A finite float, or None (NaN, infinity, null, a missing value): what JSON can hold."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _floats(values: object) -> list[float | None]:
    return [finite(v) for v in values] if isinstance(values, list) else []


@dataclass(frozen=True)
class Scores:
    """Accuracy and macro-F1 of client models: the mean across clients and its std."""

    acc: float | None
    f1: float | None
    acc_std: float | None = None
    f1_std: float | None = None

    def to_json(self) -> Json:
        return {"acc": self.acc, "acc_std": self.acc_std, "f1": self.f1, "f1_std": self.f1_std}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scores:
        return cls(
            acc=finite(data.get("acc")),
            f1=finite(data.get("f1")),
            acc_std=finite(data.get("acc_std")),
            f1_std=finite(data.get("f1_std")),
        )


@dataclass(frozen=True)
class GlobalScores:
    """The server's model on the union of the clients' test splits (one model: no acc std;
    `f1_std` is the spread of its F1 across the clients' own splits)."""

    acc: float | None
    f1: float | None
    f1_std: float | None = None

    def to_json(self) -> Json:
        return {"acc": self.acc, "f1": self.f1, "f1_std": self.f1_std}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GlobalScores:
        return cls(finite(data.get("acc")), finite(data.get("f1")), finite(data.get("f1_std")))


def _scores(data: object) -> Scores | None:
    return Scores.from_json(data) if isinstance(data, Mapping) and data else None


def _global(data: object) -> GlobalScores | None:
    return GlobalScores.from_json(data) if isinstance(data, Mapping) and data else None


@dataclass(frozen=True)
class ClientScores:
    """Each client's scores, in client order (`client_ids`: which clients, where only some
    were scored, as on a Flower deployment; None: every client, by id)."""

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

    def to_json(self) -> Json:
        out: Json = {
            "pers_acc": self.pers_acc,
            "pers_f1": self.pers_f1,
            "gen_acc": self.gen_acc,
            "gen_f1": self.gen_f1,
            "val_acc": self.val_acc,
            "val_f1": self.val_f1,
        }
        if self.client_ids is not None:
            out["client_ids"] = self.client_ids
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClientScores:
        ids = data.get("client_ids")
        return cls(
            **{f.name: _floats(data.get(f.name)) for f in fields(cls) if f.name != "client_ids"},
            client_ids=[int(i) for i in ids] if isinstance(ids, list) else None,
        )


@dataclass(frozen=True)
class SampleSizes:
    """How many samples were scored: the test union, and the generalization sample."""

    test: int
    generalization: int | None

    def to_json(self) -> Json:
        return {"test": self.test, "generalization": self.generalization}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SampleSizes:
        gen = data.get("generalization")
        return cls(int(data.get("test") or 0), None if gen is None else int(gen))


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class RoundInfo:
    """What training one round gives, evaluated or not (every round's `on_round` gets it)."""

    clients: list[int]  # the round's sampled clients
    train_loss: float | None  # the replies' loss, weighted by their examples
    train_s: float
    aggregate_s: float
    server: Metrics  # the server's own metrics from `aggregate`


@dataclass(frozen=True)
class RoundTime:
    train_s: float
    aggregate_s: float
    eval_s: float

    def to_json(self) -> Json:
        return {"train_s": self.train_s, "aggregate_s": self.aggregate_s, "eval_s": self.eval_s}


@dataclass(frozen=True)
class Traffic:
    """Bytes sent so far, in both directions (message and reply payloads)."""

    up_bytes: int
    down_bytes: int

    def to_json(self) -> Json:
        return {"up_bytes": self.up_bytes, "down_bytes": self.down_bytes}


@dataclass(frozen=True)
class RoundRecord:
    """One evaluated round: a line of metrics.jsonl, the same in memory and on disk."""

    round: int
    train_loss: float | None
    personalization: Scores
    generalization: Scores | None
    global_: GlobalScores | None
    val: Scores
    samples: SampleSizes | None
    server: Metrics
    time: RoundTime
    comm: Traffic
    clients: ClientScores

    @classmethod
    def of(
        cls, info: RoundInfo, scores: RoundScores, server_round: int, comm: Traffic
    ) -> RoundRecord:
        return cls(
            round=server_round,
            train_loss=finite(info.train_loss),
            personalization=scores.personalization,
            generalization=scores.generalization,
            global_=scores.global_,
            val=scores.val,
            samples=scores.samples,
            server=dict(info.server),
            time=RoundTime(info.train_s, info.aggregate_s, scores.eval_s),
            comm=comm,
            clients=scores.clients,
        )

    def to_json(self) -> Json:
        """The metrics.jsonl line (non-finite numbers as null: strict JSON)."""
        return _strict(
            {
                "round": self.round,
                "train_loss": self.train_loss,
                "personalization": self.personalization.to_json(),
                "generalization": _json(self.generalization),
                "global": _json(self.global_),
                "val": self.val.to_json(),
                "samples": _json(self.samples),
                "server": dict(self.server),
                "time": self.time.to_json(),
                "comm": self.comm.to_json(),
                "clients": self.clients.to_json(),
            }
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RoundRecord:
        """From a metrics.jsonl line, as this or an earlier version wrote it."""
        time_ = data.get("time") or {}
        comm = data.get("comm") or {}
        samples = data.get("samples")
        return cls(
            round=int(data["round"]),
            train_loss=finite(data.get("train_loss")),
            personalization=_scores(data.get("personalization")) or Scores(None, None),
            generalization=_scores(data.get("generalization")),
            global_=_global(data.get("global")),
            val=_scores(data.get("val")) or Scores(None, None),
            samples=SampleSizes.from_json(samples) if isinstance(samples, Mapping) else None,
            server=_metrics(data.get("server")),
            time=RoundTime(
                float(time_.get("train_s") or 0.0),
                float(time_.get("aggregate_s") or 0.0),
                float(time_.get("eval_s") or 0.0),
            ),
            comm=Traffic(int(comm.get("up_bytes") or 0), int(comm.get("down_bytes") or 0)),
            clients=ClientScores.from_json(data.get("clients") or {}),
        )


def _metrics(data: object) -> Metrics:
    if not isinstance(data, Mapping):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, int | float)}


def _json(part: Scores | GlobalScores | SampleSizes | None) -> Json | None:
    return None if part is None else part.to_json()


def _strict(obj: Any) -> Any:
    """NaN and infinity become null, recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_strict(v) for v in obj]
    return obj


@dataclass(frozen=True)
class ReportedRound:
    """The scores a summary reports: the final round's, or the round its selection rule
    picked (`rule`; under `best_test` the global score is the global model's own best round,
    `global_round`)."""

    round: int
    personalization: Scores
    generalization: Scores | None
    global_: GlobalScores | None
    server: Metrics
    rule: str | None = None  # None: the final round
    global_round: int | None = None

    def to_json(self) -> Json:
        out: Json = {"round": self.round}
        if self.rule is not None:
            out["rule"] = self.rule
        out["personalization"] = self.personalization.to_json()
        out["generalization"] = _json(self.generalization)
        out["global"] = _json(self.global_)
        if self.rule is not None:
            out["global_round"] = self.global_round
        out["server"] = dict(self.server)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReportedRound:
        global_round = data.get("global_round")
        return cls(
            round=int(data["round"]),
            personalization=_scores(data.get("personalization")) or Scores(None, None),
            generalization=_scores(data.get("generalization")),
            global_=_global(data.get("global")),
            server=_metrics(data.get("server")),
            rule=data.get("rule"),
            global_round=None if global_round is None else int(global_round),
        )

    @classmethod
    def final(cls, record: RoundRecord) -> ReportedRound:
        return cls(
            record.round,
            record.personalization,
            record.generalization,
            record.global_,
            dict(record.server),
        )


@dataclass(frozen=True)
class CommSummary:
    """Bytes over the whole run, and per round."""

    up_bytes: int
    down_bytes: int
    up_bytes_per_round: float
    down_bytes_per_round: float

    def to_json(self) -> Json:
        return {
            "up_bytes": self.up_bytes,
            "down_bytes": self.down_bytes,
            "up_bytes_per_round": self.up_bytes_per_round,
            "down_bytes_per_round": self.down_bytes_per_round,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CommSummary:
        return cls(
            int(data.get("up_bytes") or 0),
            int(data.get("down_bytes") or 0),
            float(data.get("up_bytes_per_round") or 0.0),
            float(data.get("down_bytes_per_round") or 0.0),
        )


@dataclass(frozen=True)
class TimeSummary:
    """Seconds over the whole run (all its sessions), by phase."""

    total_s: float
    train_s: float
    aggregate_s: float
    eval_s: float
    train_s_per_round: float
    client_updates_per_s: float

    def to_json(self) -> Json:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TimeSummary:
        return cls(**{f.name: float(data.get(f.name) or 0.0) for f in fields(cls)})


SUMMARY_KEYS = (
    "status",
    "diverged",
    "algorithm",
    "dataset",
    "model",
    "engine",
    "num_clients",
    "seed",
    "rounds",
    "final",
    "selected",
    "comm",
    "time",
    "warnings",
    "dropped_nonfinite",
)
"""summary.json's keys, in the order it is written; any other key is an engine's own."""


@dataclass(frozen=True)
class Summary:
    """A run's outcome (summary.json): its final and selected scores, cost and warnings.

    `status` is "complete", or "diverged" when a reply or the server state held NaN or
    infinity (`diverged` says where; `final` and `selected` are None if no round was scored).
    """

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
    status: str = "complete"
    diverged: str | None = None
    warnings: list[str] = field(default_factory=list)  # e.g. validation never beat chance
    dropped_nonfinite: int = 0  # replies left out for NaN or inf (train.on_nonfinite=drop)
    extra: dict[str, Any] = field(default_factory=dict)  # an engine's own entries (Flower's)

    def to_json(self) -> Json:
        """summary.json's dict (empty `warnings`, zero `dropped_nonfinite` and a missing
        `diverged` left out, as always)."""
        out: Json = {"status": self.status}
        if self.diverged is not None:
            out["diverged"] = self.diverged
        out.update(
            algorithm=self.algorithm,
            dataset=self.dataset,
            model=self.model,
            engine=self.engine,
            num_clients=self.num_clients,
            seed=self.seed,
            rounds=self.rounds,
            final=_json_round(self.final),
            selected=_json_round(self.selected),
            comm=self.comm.to_json(),
            time=self.time.to_json(),
        )
        if self.warnings:
            out["warnings"] = list(self.warnings)
        if self.dropped_nonfinite:
            out["dropped_nonfinite"] = self.dropped_nonfinite
        out.update(self.extra)
        return _strict(out)

    def as_dict(self) -> Json:
        """The same as `to_json`: summary.json's contents."""
        return self.to_json()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Summary:
        """From summary.json's dict, as this or an earlier version wrote it; keys this
        version does not know go to `extra`."""
        final, selected = data.get("final"), data.get("selected")
        return cls(
            algorithm=str(data["algorithm"]),
            dataset=str(data["dataset"]),
            model=str(data["model"]),
            engine=str(data.get("engine", "builtin")),
            num_clients=int(data["num_clients"]),
            seed=int(data["seed"]),
            rounds=int(data["rounds"]),
            final=ReportedRound.from_json(final) if isinstance(final, Mapping) else None,
            selected=ReportedRound.from_json(selected) if isinstance(selected, Mapping) else None,
            comm=CommSummary.from_json(data.get("comm") or {}),
            time=TimeSummary.from_json(data.get("time") or {}),
            status=str(data.get("status", "complete")),
            diverged=data.get("diverged"),
            warnings=[str(w) for w in data.get("warnings") or []],
            dropped_nonfinite=int(data.get("dropped_nonfinite") or 0),
            extra={k: v for k, v in data.items() if k not in SUMMARY_KEYS},
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Summary:
        """The same as `from_json`."""
        return cls.from_json(data)


def _json_round(part: ReportedRound | None) -> Json | None:
    return None if part is None else part.to_json()
