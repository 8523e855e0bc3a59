"""protofed: personalized federated learning on heterogeneous real-world data.

The public API: `run`, `resume`, `pretrain`, `load_run`, `Run`, `resolve_config`
(protofed.api); the typed results (`Summary`, `RoundRecord`, `RoundInfo`, `Scores`, ...:
protofed.core.results); `ConfigError` (what every bad config, file or argument raises); and
the decorators that add your own algorithm, model or data set to the registries.
What an extension needs (the `Algorithm` base class, `Client`, records, shared mechanics) is
in `protofed.extend`; reports and figures as functions in `protofed.analysis`
(docs/python-api.md lists every public name).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from protofed.errors import ConfigError

if TYPE_CHECKING:
    from protofed.algorithms.base import Algorithm
    from protofed.api import Run, load_run, pretrain, resolve_config, resume, run
    from protofed.core.results import (
        ClientScores,
        GlobalScores,
        PrivacySummary,
        ReportedRound,
        RoundInfo,
        RoundRecord,
        Scores,
        Summary,
        UnseenScores,
    )

_LAZY = {
    **dict.fromkeys(("Run", "load_run", "pretrain", "resolve_config", "resume", "run"), "api"),
    **dict.fromkeys(
        (
            "ClientScores",
            "GlobalScores",
            "PrivacySummary",
            "ReportedRound",
            "RoundInfo",
            "RoundRecord",
            "Scores",
            "Summary",
            "UnseenScores",
        ),
        "core.results",
    ),
}
"""The public names imported on first use (they import torch): `import protofed`, and the
CLI's start-up (`protofed --help`), stay light."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'protofed' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"protofed.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__version__ = "0.1.0"
_A = TypeVar("_A", bound="type[Algorithm]")
_F = TypeVar("_F", bound=Callable[..., Any])


def register_algorithm(cls: _A) -> _A:
    """Decorator: an `Algorithm` subclass, known by its `name` in this process (a sweep's
    runs, Flower's nodes and the CLI see it through an entry point: docs/architecture.md)."""
    from protofed.algorithms import register_algorithm as register

    return cast(_A, register(cls))  # the registry hands back the class it was given


def register_model(name: str, description: str, inputs: str = "any") -> Callable[[_F], _F]:
    """Decorator for a model builder `(cfg, input_shape, num_classes) -> FedModel`."""
    from protofed.models import register_model as register

    return cast(Callable[[_F], _F], register(name, description, inputs))


def register_dataset(
    name: str, description: str, source: str = "", needs_root: bool = False
) -> Callable[[_F], _F]:
    """Decorator for a data-set loader `(cfg: DataConfig) -> Dataset`."""
    from protofed.data import register_dataset as register

    return cast(Callable[[_F], _F], register(name, description, source, needs_root))


__all__ = [
    "ClientScores",
    "ConfigError",
    "GlobalScores",
    "PrivacySummary",
    "ReportedRound",
    "RoundInfo",
    "RoundRecord",
    "Run",
    "Scores",
    "Summary",
    "UnseenScores",
    "__version__",
    "load_run",
    "pretrain",
    "register_algorithm",
    "register_dataset",
    "register_model",
    "resolve_config",
    "resume",
    "run",
]
