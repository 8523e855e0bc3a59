"""A run's summary and warnings, from its evaluated rounds and its counters.

The round loop hands over what it has (the history, the progress counters, the transport's
name) and gets the typed `Summary` that becomes summary.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from protofed.config import ExperimentConfig
from protofed.core.results import (
    CommSummary,
    PrivacySummary,
    ReportedRound,
    RoundRecord,
    Summary,
    TimeSummary,
)
from protofed.data.federated import FederatedData
from protofed.evaluation import select_global_round, select_round


@dataclass
class Progress:
    """Counters that survive a resume (they are checkpointed)."""

    server_round: int = 0
    up_bytes: int = 0
    down_bytes: int = 0
    train_s: float = 0.0
    eval_s: float = 0.0
    aggregate_s: float = 0.0
    guard_s: float = 0.0  # the non-finite checks (before they had their own: in aggregate_s)
    checkpoint_s: float = 0.0  # writing checkpoints (before the one that holds these)
    client_updates: int = 0
    dropped_nonfinite: int = 0  # replies dropped for NaN/inf (train.on_nonfinite=drop)


def reported_rounds(
    history: list[RoundRecord], cfg: ExperimentConfig
) -> tuple[ReportedRound | None, ReportedRound | None]:
    """The final round's scores and the selected round's (`eval.selection`; under
    `best_test` the global score from the global model's own best round)."""
    if not history:
        return None, None
    rule, metric = cfg.eval.selection, cfg.eval.metric
    chosen = select_round(history, rule, metric)
    best_global = select_global_round(history, rule, metric)
    selected = ReportedRound(
        round=chosen.round,
        personalization=chosen.personalization,
        generalization=chosen.generalization,
        global_=best_global.global_,
        server=dict(chosen.server),
        rule=rule,
        global_round=best_global.round,
        unseen=chosen.unseen,
    )
    return ReportedRound.final(history[-1]), selected


SCORING_KEYS = (
    "selection",
    "metric",
    "client_model",
    "f1_labels",
    "generalization_samples",
    "unseen_clients",
    "finetune_epochs",
)
"""The `eval.*` keys that change how a run's reported scores are computed: which round is
reported, by which metric it is chosen, which model is a client's own, which classes a
macro-F1 averages over, which test samples generalization is scored on, which clients are
held out as unseen users and how they adapt before they are scored."""


def scoring_protocol(cfg: ExperimentConfig) -> dict[str, dict[str, Any]]:
    """The scoring keys (`SCORING_KEYS`) a config sets away from their defaults, each with
    its value and its default, for summary.json's `scoring`."""
    defaults = type(cfg.eval)()
    return {
        f"eval.{key}": {"value": value, "default": default}
        for key in SCORING_KEYS
        if (value := getattr(cfg.eval, key)) != (default := getattr(defaults, key))
    }


def build_summary(
    cfg: ExperimentConfig,
    history: list[RoundRecord],
    progress: Progress,
    *,
    algorithm: str,
    engine: str,
    num_clients: int,
    total_s: float,
    warnings: list[str],
    diverged: str | None = None,
    extra: dict[str, Any] | None = None,
    privacy: PrivacySummary | None = None,
) -> Summary:
    """`diverged`: why the run stopped early (status "diverged"), else None ("complete")."""
    if not history and diverged is None:
        raise RuntimeError("no round was evaluated")
    p, rounds = progress, progress.server_round
    per_round = max(rounds, 1)
    final, selected = reported_rounds(history, cfg)
    return Summary(
        status="complete" if diverged is None else "diverged",
        diverged=diverged,
        algorithm=algorithm,  # "fedavg+ala" when the ALA plug-in is on
        dataset=cfg.data.name,
        model=cfg.model.name,
        engine=engine,
        num_clients=num_clients,
        seed=cfg.seed,
        rounds=rounds,
        final=final,
        selected=selected,
        comm=CommSummary(
            up_bytes=p.up_bytes,
            down_bytes=p.down_bytes,
            up_bytes_per_round=p.up_bytes / per_round,
            down_bytes_per_round=p.down_bytes / per_round,
        ),
        time=TimeSummary(
            total_s=total_s,
            train_s=p.train_s,
            guard_s=p.guard_s,
            aggregate_s=p.aggregate_s,
            eval_s=p.eval_s,
            train_s_per_round=p.train_s / per_round,
            client_updates_per_s=p.client_updates / max(p.train_s, 1e-9),
            checkpoint_s=p.checkpoint_s,
        ),
        warnings=warnings,
        dropped_nonfinite=p.dropped_nonfinite,
        privacy=privacy,
        scoring=scoring_protocol(cfg),
        extra=dict(extra or {}),
    )


def chance_warnings(
    history: list[RoundRecord], fed: FederatedData, private: bool = False
) -> list[str]:
    """A warning when no evaluated round's validation accuracy beat chance.

    Chance is the better of uniform guessing and predicting each client's most frequent
    training class on its validation data (their mean over clients; the validation split's
    own majority would be 100 % for a client with one validation sample); one point of
    margin. Worded for whoever runs
    the experiment: too few rounds, a learning rate far off, no momentum, or features left on
    raw scales (data.standardize=false) are the usual causes; in a `private` run, the noise.
    """
    split = fed.counts_by_split()
    counts, guess = split["val"], split["train"].argmax(axis=1)
    sizes = counts.sum(axis=1)
    if not history or sizes.sum() == 0:
        return []
    hits = counts[np.arange(len(counts)), guess]
    majority = float((hits[sizes > 0] / sizes[sizes > 0]).mean())
    chance = max(1.0 / fed.num_classes, majority)
    best = max((h.val.acc for h in history if h.val.acc is not None), default=None)
    if best is None or best > chance + 0.01:
        return []
    never = f"validation accuracy never beat chance ({100 * best:.1f} % vs {100 * chance:.1f} %)"
    if private:  # the usual cause then: noise far above what the clipped updates carry
        return [
            f"{never}: the models did not learn; with privacy.enabled the noise may drown the "
            "clipped updates: more clients a round, a larger epsilon or fewer rounds help "
            "(docs/privacy.md)"
        ]
    return [
        f"{never}: the models did not learn; try more rounds (train.rounds), another learning "
        "rate (train.lr, e.g. 10x lower or higher), momentum (train.momentum=0.9) and "
        "standardized features (data.standardize=true)"
    ]
