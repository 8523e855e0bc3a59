"""`protofed list` and `protofed info`: what this installation can run."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from protofed.cli.common import console, user_errors
from protofed.errors import ConfigError

if TYPE_CHECKING:
    from protofed.algorithms import Algorithm


def list_() -> None:
    """Every algorithm, data set, partitioner and model, one line each (plugins included)."""
    for title, items in catalog():
        table = Table(title=title, show_header=False, box=None, title_justify="left")
        table.add_column(style="bold cyan")
        table.add_column()
        for name, line in items.items():
            table.add_row(name, line)
        console.print(table)


Catalog = list[tuple[str, dict[str, str]]]
PLUGIN_GROUPS = ("protofed.algorithms", "protofed.models", "protofed.datasets")


def catalog() -> Catalog:
    """`protofed list`'s sections: (title, {name: line}). Listing them imports every
    algorithm, model and data set module, and so torch (seconds); the lines are kept in the
    user cache folder, keyed by protofed's version, the interpreter, its source files' sizes
    and modification times and the installed plugins, so a later `protofed list` of the same
    installation prints them without importing any of it. Where this process has imported
    the registries already (`protofed list` called in-process, after registering parts of
    one's own), they are listed as they are."""
    import sys

    if any(m in sys.modules for m in ("protofed.algorithms", "protofed.data", "protofed.models")):
        return _build_catalog()  # already imported here, maybe with parts of this process's own
    key = _catalog_key()
    cached = _read_cached(key)
    if cached is not None:
        return cached
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = _build_catalog()
    for warning in caught:  # e.g. a plugin that failed to load: shown, and nothing cached
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    if not caught:
        _write_cached(key, built)
    return built


def _build_catalog() -> Catalog:
    from protofed import algorithms, data, models
    from protofed.data import PARTITIONERS
    from protofed.plugins import provider

    def lines(kind: str, described: dict[str, str]) -> dict[str, str]:
        """Each entry's line, with the distribution that provides it where a plugin does."""
        out = {}
        for name, line in described.items():
            dist = provider(kind, name)
            out[name] = line if dist is None else f"{line} (plugin: {dist})"
        return out

    registry = algorithms.load_plugins()
    return [
        (
            _algorithms_title(registry),
            lines("algorithms", {k: v.summary for k, v in registry.items()}),
        ),
        ("datasets", lines("datasets", {k: v.description for k, v in data.load_plugins().items()})),
        (
            "partitioners",
            {k: v[0] if isinstance(v, tuple) else v.description for k, v in PARTITIONERS.items()},
        ),
        ("models", lines("models", {k: v.description for k, v in models.load_plugins().items()})),
    ]


def _algorithms_title(registry: dict[str, type[Algorithm]]) -> str:
    """The algorithms table's title, naming those whose clients can train stacked."""
    from protofed.runtime.local import unstackable

    names = ", ".join(name for name, cls in registry.items() if unstackable(cls) is None)
    return f"algorithms (train.stacked trains a round's clients together for: {names or 'none'})"


def _catalog_key() -> str:
    """What the listed lines depend on: protofed's version and source files, the interpreter,
    and the plugins installed (entry points, with their distributions' versions)."""
    import hashlib
    import json
    import sys
    from importlib.metadata import entry_points

    import protofed

    root = Path(protofed.__file__).parent
    files = []
    for path in sorted(root.rglob("*.py")):
        stat = path.stat()
        files.append((path.relative_to(root).as_posix(), stat.st_mtime_ns, stat.st_size))
    plugins = [
        (
            group,
            ep.name,
            ep.value,
            ep.dist.name if ep.dist else "",
            ep.dist.version if ep.dist else "",
        )
        for group in PLUGIN_GROUPS
        for ep in entry_points(group=group)
    ]
    text = json.dumps([protofed.__version__, sys.executable, str(root), files, sorted(plugins)])
    return hashlib.sha256(text.encode()).hexdigest()


def _cache_file() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("protofed")) / "cli" / "list.json"


def _read_cached(key: str) -> Catalog | None:
    import json

    try:
        saved = json.loads(_cache_file().read_text())
        if saved.get("key") != key:
            return None
        return [
            (str(title), {str(k): str(v) for k, v in items.items()})
            for title, items in saved["sections"]
        ]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # none yet, or unreadable: listed afresh


def _write_cached(key: str, sections: Catalog) -> None:
    import json

    from protofed.core.files import atomic_write_text

    try:
        path = _cache_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"key": key, "sections": sections}, indent=1))
    except (OSError, ConfigError):
        pass  # a read-only home: the next `protofed list` imports everything again


def info(
    name: Annotated[str, typer.Argument(help="An algorithm name (see `protofed list`).")],
) -> None:
    """An algorithm's reference and its hyperparameters with defaults and meaning.

    For an algorithm that takes the ALA plug-in, its `ala.*` keys too.
    """
    from protofed.algorithms import algorithm_class
    from protofed.algorithms.common.ala import ALA_KEY, AlaParams, supports_ala

    with user_errors():
        cls = algorithm_class(name)
    console.print(f"[bold]{cls.name}[/]: {cls.summary}", highlight=False)
    if cls.reference:
        console.print(f"reference: {cls.reference}", highlight=False)
    from protofed.runtime.local import unstackable

    why_not = unstackable(cls)
    stacked = "yes" if why_not is None else f"no: {why_not}"
    console.print(f"stacked training (train.stacked): {stacked}", highlight=False)
    table = Table(
        title="hyperparameters (set with -s algorithm.<name>=<value>)", title_justify="left"
    )
    for col in ("name", "type", "default", "meaning"):
        table.add_column(col)
    for key, field in cls.Params.model_fields.items():
        table.add_row(
            key, _type_name(field.annotation), repr(field.default), field.description or ""
        )
    if not cls.Params.model_fields:
        table.add_row("-", "-", "-", "no hyperparameters")
    if supports_ala(cls):  # the ALA plug-in's keys, `enabled` first
        table.add_section()
        fields = AlaParams.model_fields
        for key in sorted(fields, key=lambda k: k != "enabled"):
            field = fields[key]
            table.add_row(
                f"{ALA_KEY}.{key}",
                _type_name(field.annotation),
                repr(field.default),
                f"ALA plug-in: {field.description or ''}",
            )
    console.print(table)


def _type_name(annotation: object) -> str:
    """int, float | None, 'hat' | 'trained': as a user writes the value."""
    from typing import Literal, get_args, get_origin

    if get_origin(annotation) is Literal:
        return " | ".join(repr(a) for a in get_args(annotation))
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))
