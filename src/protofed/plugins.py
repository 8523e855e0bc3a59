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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from protofed.config import ExperimentConfig

GROUPS = {
    "algorithms": "protofed.algorithms",
    "models": "protofed.models",
    "datasets": "protofed.datasets",
}

_loaded: set[str] = set()
_current: str | None = None  # the distribution whose entry point is being loaded
ORIGINS: dict[tuple[str, str], str] = {}  # (kind, name) -> the distribution that provides it


DEFINITIONS: dict[tuple[str, str], tuple[str, str]] = {}  # (kind, name) -> (module, qualname)


def _definition(obj: Any) -> tuple[str, str]:
    return getattr(obj, "__module__", "?"), getattr(obj, "__qualname__", repr(obj))


def register(kind: str, table: dict[str, Any], name: str, entry: Any, source: Any = None) -> None:
    """Put `entry` (made from `source`, the decorated class or function; default `entry`) in a
    registry's `table` under `name`, remembering the plugin it came from.

    Registering an equal entry again is a no-op, and so is re-registering a redefinition of the
    same module and qualified name (a notebook cell run twice, a reloaded module), which
    replaces the old entry; another entry of the name is an error naming it (ConfigError, one
    line).
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


def registered_here_only(kind: str, name: str) -> str | None:
    """The module that registered `name` if no other process can see it: user code that is
    neither protofed's own nor in a package with an entry point of the group (a script, a
    notebook). A sweep's runs and Flower's nodes are new processes: they would miss it."""
    defined = DEFINITIONS.get((kind, name))
    if defined is None or (kind, name) in ORIGINS:
        return None
    module = defined[0]
    package = module.split(".")[0]
    if package == "protofed":
        return None
    if module != "__main__" and any(
        ep.module.split(".")[0] == package for ep in entry_points(group=GROUPS[kind])
    ):
        return None
    return module


def require_visible_elsewhere(cfg: ExperimentConfig, where: str) -> None:
    """A one-line ConfigError when the config's algorithm, model or data set was registered by
    this process only, so `where` (new processes) cannot load it."""
    from protofed.errors import ConfigError

    names = {"algorithms": cfg.algorithm.name, "models": cfg.model.name}
    names["datasets"] = cfg.data.name
    for kind, name in names.items():
        module = registered_here_only(kind, name)
        if module is not None:
            raise ConfigError(
                f"{kind[:-1]} '{name}' is registered by this process only (module {module}); "
                f"{where} run in new processes, which see protofed's own parts and installed "
                "plugins only: declare it as an entry point (docs/architecture.md, Adding an algorithm)"
            )
