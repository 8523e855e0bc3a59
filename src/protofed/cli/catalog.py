"""`protofed list` and `protofed info`: what this installation can run."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from protofed.cli.common import console, user_errors


def list_() -> None:
    """Every algorithm, data set, partitioner and model, one line each (plugins included)."""
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

    for title, items in (
        (
            "algorithms",
            lines("algorithms", {k: v.summary for k, v in algorithms.load_plugins().items()}),
        ),
        ("datasets", lines("datasets", {k: v.description for k, v in data.load_plugins().items()})),
        (
            "partitioners",
            {k: v[0] if isinstance(v, tuple) else v.description for k, v in PARTITIONERS.items()},
        ),
        ("models", lines("models", {k: v.description for k, v in models.load_plugins().items()})),
    ):
        table = Table(title=title, show_header=False, box=None, title_justify="left")
        table.add_column(style="bold cyan")
        table.add_column()
        for name, line in items.items():
            table.add_row(name, line)
        console.print(table)


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
