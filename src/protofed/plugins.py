"""Entry points: algorithms, models and data sets that installed distributions provide.

A distribution declares, in its `pyproject.toml`,

    [project.entry-points."protofed.algorithms"]
    myalgo = "mypackage.algorithms"          # a module whose import registers (decorators)

(groups `protofed.algorithms`, `protofed.models`, `protofed.datasets`, and `protofed.loggers`
for `--log` destinations: `protofed.tracking.register_logger`). Each group is loaded once, the
first time a registry lists its names or misses one. Loading a module registers whatever it
decorates (`protofed.register_algorithm`, ...); an entry point that names an
object instead is handed to the registry's own registration function. A plugin that fails
to load is a one-line warning naming its distribution and entry point, never a crash.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any, Protocol

GROUPS = {
    "algorithms": "protofed.algorithms",
    "models": "protofed.models",
    "datasets": "protofed.datasets",
    "loggers": "protofed.loggers",
}

_loaded: set[str] = set()
_current: str | None = None  # the distribution whose entry point is being loaded
ORIGINS: dict[tuple[str, str], str] = {}  # (kind, name) -> the distribution that provides it


DEFINITIONS: dict[tuple[str, str], tuple[str, str]] = {}  # (kind, name) -> (module, qualname)


def _definition(obj: Any) -> tuple[str, str]:
    qualname = getattr(obj, "__qualname__", None)
    if qualname is None or "<lambda>" in qualname:  # no name to tell two of them apart
        return "?", repr(obj)
    return getattr(obj, "__module__", "?"), qualname


def register(kind: str, table: dict[str, Any], name: str, entry: Any, source: Any = None) -> None:
    """Put `entry` (made from `source`, the decorated class or function; default `entry`) in a
    registry's `table` under `name`, remembering the plugin it came from.

    Registering an equal entry again changes nothing; a redefinition of the same module and
    qualified name (a notebook cell run twice, a reloaded module) replaces the old entry;
    another entry of the name is an error naming it (ConfigError, one line).
    """
    from protofed.errors import ConfigError

    defined = _definition(entry if source is None else source)
    if name in table and table[name] != entry and DEFINITIONS.get((kind, name)) != defined:
        article = "an" if kind[0] in "aeiou" else "a"
        raise ConfigError(
            f"{article} {kind[:-1]} named '{name}' is already registered ({table[name]!r})"
        )
    table[name] = entry
    DEFINITIONS[(kind, name)] = defined
    if _current is not None:
        ORIGINS[(kind, name)] = _current


def registrar(
    kind: str, table: dict[str, Any], name: str, entry: Callable[[Any], Any]
) -> Callable[[Any], Any]:
    """A decorator that registers `entry(decorated)` under `name` and returns it unchanged."""

    def decorate(obj: Any) -> Any:
        register(kind, table, name, entry(obj), source=obj)
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


_REGISTRIES = {  # the module whose `load_plugins()` lists a kind's names
    "algorithms": "protofed.algorithms",
    "models": "protofed.models",
    "datasets": "protofed.data",
}


@functools.cache
def _known_to_a_new_process(kind: str, name: str) -> bool:
    """Whether a fresh interpreter (this one's executable, environment and folder: what a
    sweep's runs and a simulation's nodes start as) finds `name` among protofed's parts and
    installed plugins. Asked, not guessed: a plugin's module may register what another
    module of its own defines. A few seconds, once per part."""
    probe = (
        "import importlib, sys; "
        f"sys.exit(0 if {name!r} in importlib.import_module({_REGISTRIES[kind]!r})"
        ".load_plugins() else 1)"
    )
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, timeout=300, check=False
    )
    return done.returncode == 0


def registered_here_only(kind: str, name: str) -> str | None:
    """The module that registered `name` if a new process cannot see it (a script's or a
    notebook's own part, not installed as a plugin): a sweep's runs and Flower's nodes
    would miss it. None for protofed's own parts and those a new process finds."""
    defined = DEFINITIONS.get((kind, name))
    if defined is None or defined[0].split(".")[0] == "protofed":
        return None
    return None if _known_to_a_new_process(kind, name) else defined[0]


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class NamedParts(Protocol):
    """What `require_visible_elsewhere` reads of a config (an `ExperimentConfig` is one)."""

    @property
    def algorithm(self) -> _Named: ...

    @property
    def model(self) -> _Named: ...

    @property
    def data(self) -> _Named: ...


def require_visible_elsewhere(cfg: NamedParts, where: str) -> None:
    """A one-line ConfigError when the config's algorithm, model or data set was registered by
    this process only, so `where` (new processes) cannot load it."""
    from protofed.errors import ConfigError

    names = {"algorithms": cfg.algorithm.name, "models": cfg.model.name, "datasets": cfg.data.name}
    for kind, name in names.items():
        module = registered_here_only(kind, name)
        if module is not None:
            raise ConfigError(
                f"{kind[:-1]} '{name}' is registered by this process only (module {module}); "
                f"{where} run in new processes, which see protofed's own parts and installed "
                "plugins only: declare it as an entry point (docs/architecture.md, Adding an algorithm)"
            )
