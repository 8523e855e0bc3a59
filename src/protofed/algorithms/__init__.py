"""The algorithm registry: one module per algorithm, found by name.

Adding an algorithm means adding one file here that defines an `Algorithm` subclass and
listing its module in `_MODULES`. Names are unique; an unknown name is an error that lists the
valid ones.
"""

from __future__ import annotations

import difflib
import importlib

from pydantic import ValidationError

from protofed.algorithms.base import Algorithm, Arrays, Hyperparams, Metrics, Reply, Setting
from protofed.errors import ConfigError

__all__ = ["Algorithm", "Arrays", "Hyperparams", "Metrics", "Reply", "Setting", "ALGORITHMS", "build_algorithm"]

_MODULES = [
    "local",
    "centralized",
    "fedavg",
    "fedprox",
    "fedper",
    "fedrep",
    "ditto",
]


def _discover() -> dict[str, type[Algorithm]]:
    found: dict[str, type[Algorithm]] = {}
    for module_name in _MODULES:
        module = importlib.import_module(f"protofed.algorithms.{module_name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Algorithm) and obj.__module__ == module.__name__:
                if obj.name in found:
                    raise RuntimeError(f"two algorithms are named '{obj.name}'")
                found[obj.name] = obj
    return found


ALGORITHMS: dict[str, type[Algorithm]] = _discover()


def algorithm_class(name: str) -> type[Algorithm]:
    try:
        return ALGORITHMS[name]
    except KeyError:
        close = difflib.get_close_matches(name, ALGORITHMS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(
            f"unknown algorithm.name '{name}'{hint}; valid: {', '.join(sorted(ALGORITHMS))}"
        ) from None


def parse_params(name: str, raw: dict) -> Hyperparams:
    """Validate `algorithm.*` keys against the algorithm's typed hyperparameters."""
    cls = algorithm_class(name)
    try:
        return cls.Params.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        if first["type"] == "extra_forbidden":
            valid = ", ".join(cls.Params.model_fields) or "none"
            raise ConfigError(
                f"unknown config key 'algorithm.{key}' for {name} (its hyperparameters: {valid})"
            ) from None
        raise ConfigError(
            f"invalid value for 'algorithm.{key}': {first['msg']} (got {first.get('input')!r})"
        ) from None


def build_algorithm(name: str, raw_params: dict, setting: Setting) -> Algorithm:
    cls = algorithm_class(name)
    return cls(parse_params(name, raw_params), setting)
