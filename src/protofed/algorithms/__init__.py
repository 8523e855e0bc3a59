"""The algorithm registry: one module per algorithm, found by name.

Adding an algorithm means adding one file here that defines an `Algorithm` subclass: every
module of this package whose name does not start with an underscore (and is not `base`) is
imported and searched. Names are unique; an unknown name is an error that lists the valid ones.

An algorithm that names its clients' local model (a class attribute `ala_local`, read by
`common.ala.declared_local`) also accepts the `algorithm.ala.*` section: with
`algorithm.ala.enabled=true` it is built with adaptive local aggregation before its local
training (`common.ala.with_ala`); for any other algorithm that section is an error naming the key.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from typing import Any, TypeVar

from pydantic import ValidationError

from protofed import plugins
from protofed.algorithms.base import (
    MODEL,
    AggregateResult,
    Algorithm,
    Arrays,
    FitResult,
    Hyperparams,
    Metrics,
    Records,
    Reply,
    Setting,
)
from protofed.algorithms.common.ala import (
    ALA_KEY,
    AdaptiveLocalAggregation,
    AlaParams,
    supports_ala,
    with_ala,
)
from protofed.errors import ConfigError

__all__ = ["ALGORITHMS", "algorithm_class", "build_algorithm", "load_plugins", "register_algorithm"]
__all__ += ["MODEL", "AggregateResult", "Algorithm", "Arrays", "FitResult", "Hyperparams"]
__all__ += ["Metrics", "Records", "Reply", "Setting"]

_MODULES = sorted(
    m.name
    for m in pkgutil.iter_modules(__path__)
    if not m.ispkg and not m.name.startswith("_") and m.name != "base"
)


def _discover() -> dict[str, type[Algorithm]]:
    found: dict[str, type[Algorithm]] = {}
    for module_name in _MODULES:
        module = importlib.import_module(f"protofed.algorithms.{module_name}")
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, Algorithm)
                and obj.__module__ == module.__name__
            ):
                if obj.name in found:
                    raise RuntimeError(f"two algorithms are named '{obj.name}'")
                found[obj.name] = obj
    return found


ALGORITHMS: dict[str, type[Algorithm]] = _discover()


def register_algorithm(cls: type[Algorithm]) -> type[Algorithm]:
    """Decorator: make `cls` known by its `name` to configs in this process. The CLI, a
    sweep's runs and Flower's nodes are new processes: they see it through an entry point
    (protofed.plugins)."""
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(f"register_algorithm takes an Algorithm subclass, not {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name or not isinstance(getattr(cls, "summary", None), str):
        raise ConfigError(f"{cls.__name__}: an algorithm needs class attributes name and summary")
    plugins.register("algorithms", ALGORITHMS, name, cls)
    return cls


def load_plugins() -> dict[str, type[Algorithm]]:
    """Every algorithm, installed plugins' included (`protofed.plugins`)."""
    plugins.load("algorithms", register_algorithm)
    return ALGORITHMS


def algorithm_class(name: str) -> type[Algorithm]:
    if name not in ALGORITHMS:
        load_plugins()
    try:
        return ALGORITHMS[name]
    except KeyError:
        close = difflib.get_close_matches(name, ALGORITHMS, n=1)
        hint = (
            f" (did you mean '{close[0]}'?)"
            if close
            else " (your own: import the module that registers it, or install it as a plugin)"
        )
        raise ConfigError(
            f"unknown algorithm.name '{name}'{hint}; valid: {', '.join(sorted(ALGORITHMS))}"
        ) from None


P = TypeVar("P", bound=Hyperparams)  # the hyperparameters `_validate` returns


def _validate(model: type[P], raw: dict[str, Any], prefix: str, name: str) -> P:
    """`model` from `raw`, with errors that name the config key (`algorithm.<prefix><key>`)."""
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        key = prefix + ".".join(str(p) for p in first["loc"])
        if first["type"] == "extra_forbidden":
            valid = ", ".join(prefix + k for k in model.model_fields) or "none"
            raise ConfigError(
                f"unknown config key 'algorithm.{key}' for {name} (its hyperparameters: {valid})"
            ) from None
        raise ConfigError(
            f"invalid value for 'algorithm.{key}': {first['msg']} (got {first.get('input')!r})"
        ) from None


def parse_ala(name: str, raw: dict[str, Any]) -> AlaParams | None:
    """The `algorithm.ala.*` section (the ALA plug-in), or None if it is not set."""
    if ALA_KEY not in raw:
        return None
    cls = algorithm_class(name)
    section = raw[ALA_KEY]
    keys = (
        [f"{ALA_KEY}.{k}" for k in section] if isinstance(section, dict) and section else [ALA_KEY]
    )
    if not supports_ala(cls):
        supported = ", ".join(sorted(n for n, c in ALGORITHMS.items() if supports_ala(c)))
        why = (
            "has ALA built in (set its hyperparameters directly)"
            if issubclass(cls, AdaptiveLocalAggregation)
            else f"does not support the ALA plug-in (supported: {supported})"
        )
        raise ConfigError(f"unknown config key 'algorithm.{keys[0]}': {name} {why}")
    if not isinstance(section, dict):
        raise ConfigError(
            f"'algorithm.{ALA_KEY}' must be a section, e.g. algorithm.{ALA_KEY}.enabled=true (got {section!r})"
        )
    return _validate(AlaParams, section, f"{ALA_KEY}.", name)


def parse_params(name: str, raw: dict[str, Any]) -> Hyperparams:
    """Validate `algorithm.*` keys against the algorithm's typed hyperparameters.

    The `ala` section (the ALA plug-in) is validated too, by `parse_ala`, but not returned.
    """
    cls = algorithm_class(name)
    parse_ala(name, raw)
    own = {k: v for k, v in raw.items() if k != ALA_KEY}
    return _validate(cls.Params, own, "", name)


def build_algorithm(name: str, raw_params: dict[str, Any], setting: Setting) -> Algorithm:
    """The algorithm, with ALA before its local training if `algorithm.ala.enabled`."""
    cls = algorithm_class(name)
    params = parse_params(name, raw_params)
    ala = parse_ala(name, raw_params)
    if ala is not None and ala.enabled:
        return with_ala(cls)(params, setting, ala=ala)
    return cls(params, setting)
