"""Stacked training as a runtime strategy: whether a run's clients train stacked, and how.

`training.stacked` trains a round's clients as one batched program (`train_stacked`, its
`Trainer`). Which algorithms can use it is not part of the `Algorithm` interface (one `fit`,
client by client): an algorithm opts in with one registration of its round written for all
clients at once (`register_stacked`, registry.py); the built-in ones are in builtin.py. What
runs stacked is decided once per run, here (`use_stacked`, from `train.stacked`), and the
transport is handed the decision (runtime/in_process.py).
"""

from __future__ import annotations

import torch

from protofed.algorithms import Algorithm
from protofed.config import ExperimentConfig
from protofed.errors import ConfigError
from protofed.models.base import FedModel
from protofed.runtime.stacking import builtin
from protofed.runtime.stacking.registry import (
    ADAPTERS,
    NOT_WRITTEN,
    StackedFit,
    adapter_for,
    register_stacked,
    stack_reason,
)
from protofed.training.stacked import model_reason

__all__ = ["ADAPTERS", "NOT_WRITTEN", "StackedFit", "adapter_for", "builtin"]
__all__ += ["register_stacked", "stack_reason", "stacked_faster", "stacked_reason"]
__all__ += ["use_stacked"]


def stacked_reason(cfg: ExperimentConfig, algorithm: Algorithm, model: FedModel) -> str | None:
    """Why this experiment cannot train stacked (None: it can)."""
    if cfg.privacy.enabled:
        return "privacy.enabled wraps each client's fit, which stacked training would bypass"
    why = stack_reason(type(algorithm))
    if why is not None:
        return f"{algorithm.name} cannot: {why}"
    return model_reason(model)


def stacked_faster(device: torch.device) -> bool:
    """`train.stacked=auto`'s rule: stacked where it measured faster than one client at a
    time. Nowhere yet: no GPU sitting has measured it (benchmarks/gpu_throughput.py), and on
    the CPU a first probe found it slower; a measurement changes this, not a guess."""
    return False


def use_stacked(cfg: ExperimentConfig, algorithm: Algorithm, model: FedModel) -> bool:
    """Whether the round's clients train stacked (`train.stacked`): true where it can (else
    a one-line ConfigError), false never, auto where it can and measured faster."""
    mode = cfg.train.stacked
    if mode == "false":
        return False
    reason = stacked_reason(cfg, algorithm, model)
    if mode == "true" and reason is not None:
        raise ConfigError(f"train.stacked=true: {reason} (set train.stacked=auto or false)")
    if mode == "true":
        return True
    return reason is None and stacked_faster(torch.device(cfg.train.device))
