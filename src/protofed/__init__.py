"""protofed: personalized federated learning on heterogeneous real-world data.

The public API: `run`, `load_run`, `Run`, `Summary`, `resolve_config` (protofed.api), and the
decorators that add your own algorithm, model or data set to the registries.
"""

from __future__ import annotations

from typing import Any

from protofed.api import Run, Summary, load_run, resolve_config, run

__version__ = "0.1.0"


def register_algorithm(cls: Any) -> Any:
    """Decorator: an `Algorithm` subclass, known by its `name` (protofed.algorithms)."""
    from protofed.algorithms import register_algorithm as register

    return register(cls)


def register_model(name: str, description: str, inputs: str = "any") -> Any:
    """Decorator for a model builder `(cfg, input_shape, num_classes) -> FedModel`."""
    from protofed.models import register_model as register

    return register(name, description, inputs)


def register_dataset(
    name: str, description: str, source: str = "", needs_root: bool = False
) -> Any:
    """Decorator for a data-set loader `(cfg: DataConfig) -> Dataset`."""
    from protofed.data import register_dataset as register

    return register(name, description, source, needs_root)


__all__ = [
    "Run",
    "Summary",
    "__version__",
    "load_run",
    "register_algorithm",
    "register_dataset",
    "register_model",
    "resolve_config",
    "run",
]
