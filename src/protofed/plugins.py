"""Entry points: algorithms, models and data sets that installed distributions provide.

A distribution declares, in its `pyproject.toml`,

    [project.entry-points."protofed.algorithms"]
    myalgo = "mypackage.algorithms"          # a module whose import registers (decorators)

(groups `protofed.algorithms`, `protofed.models`, `protofed.datasets`). Each group is loaded
once, the first time a registry lists its names or misses one. Loading a module registers
whatever it decorates (`protofed.register_algorithm`, ...); an entry point that names an
object instead is handed to the registry's own registration function. A plugin that fails
to load is a one-line warning naming its distribution and entry point, never a crash.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

GROUPS = {
    "algorithms": "protofed.algorithms",
    "models": "protofed.models",
    "datasets": "protofed.datasets",
}

_loaded: set[str] = set()
_current: str | None = None  # the distribution whose entry point is being loaded
ORIGINS: dict[tuple[str, str], str] = {}  # (kind, name) -> the distribution that provides it


def register(kind: str, table: dict[str, Any], name: str, entry: Any) -> None:
    """Put `entry` in a registry's `table` under `name`, remembering the plugin it came from.

    Registering an equal entry again is a no-op; another entry of the name is an error naming
    it (ConfigError, one line).
    """
    from protofed.errors import ConfigError

    if name in table and table[name] != entry:
        raise ConfigError(f"a {kind[:-1]} named '{name}' is already registered ({table[name]!r})")
    table[name] = entry
    if _current is not None:
        ORIGINS[(kind, name)] = _current


def registrar(
    kind: str, table: dict[str, Any], name: str, entry: Callable[[Any], Any]
) -> Callable[[Any], Any]:
    """A decorator that registers `entry(decorated)` under `name` and returns it unchanged."""

    def decorate(obj: Any) -> Any:
        register(kind, table, name, entry(obj))
        return obj

    return decorate


def provider(kind: str, name: str) -> str | None:
    """The distribution that provides `name` (None for protofed's own or the user's code)."""
    return ORIGINS.get((kind, name))


def load(kind: str, register: Callable[[Any], Any] | None = None) -> None:
    """Load the entry points of `kind` (once); objects that are not modules go to `register`
    (without one, an entry point must name a module that registers with the decorator)."""
    global _current
    if kind in _loaded:
        return
    _loaded.add(kind)
    for ep in entry_points(group=GROUPS[kind]):
        dist = ep.dist.name if ep.dist is not None else "?"
        _current = dist
        try:
            obj = ep.load()
            if not isinstance(obj, ModuleType):
                if register is None:
                    raise TypeError(
                        f"{obj!r} is not a module (use the register decorator in the module the entry point names)"
                    )
                register(obj)
        except Exception as err:  # noqa: BLE001 - a broken plugin must not stop protofed
            warnings.warn(
                f"plugin {dist}: entry point '{ep.name}' of {GROUPS[kind]} failed "
                f"to load ({type(err).__name__}: {err})",
                RuntimeWarning,
                stacklevel=2,
            )
        finally:
            _current = None
