"""The architecture's contracts that import-linter does not check.

(The layers themselves are import-linter's contract in pyproject.toml, run by `make test`.)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "protofed"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private_uses(path: Path) -> list[str]:
    """`from protofed.x import _name` and `alias._name` (alias a protofed module) in a file."""
    tree = ast.parse(path.read_text())
    here = _module_name(path)
    found: list[str] = []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("protofed"):
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and node.module != here:
                    found.append(f"{here}: from {node.module} import {alias.name}")
                aliases[alias.asname or alias.name] = target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("protofed"):
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{here}: {node.value.id}.{node.attr}")
    return found


def test_no_module_imports_a_private_name_of_another() -> None:
    uses = [use for path in sorted(SRC.rglob("*.py")) for use in _private_uses(path)]
    assert not uses, "private names used across modules:\n" + "\n".join(uses)


def test_the_checker_sees_a_private_import(tmp_path, monkeypatch) -> None:
    probe = tmp_path / "protofed" / "zz_probe.py"
    probe.parent.mkdir()
    probe.write_text("from protofed.report import _hidden\nimport protofed.report as r\nr._x\n")
    monkeypatch.setitem(globals(), "SRC", tmp_path / "protofed")
    assert _private_uses(probe) == [
        "protofed.zz_probe: from protofed.report import _hidden",
        "protofed.zz_probe: r._x",
    ]


def test_the_documented_layer_diagram_is_the_checked_contract() -> None:
    """docs/architecture.md's diagram lists import-linter's layers, top to bottom."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = SRC.parents[1]
    contract = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in contract["contracts"] if c["type"] == "layers"]
    checked = [
        [name.strip().removeprefix("protofed.") for name in row.split("|")] for row in layers
    ]
    doc = (root / "docs" / "architecture.md").read_text()
    diagram = doc.split("```\n", 2)[1]  # the first code block is the diagram
    drawn = [
        [name.strip() for name in re.split(r"\s{2,}", line)[0].split("|")]
        for line in diagram.splitlines()
        if line.strip()
    ]
    assert drawn == checked


def _layers() -> list[list[str]]:
    """import-linter's layers, top to bottom, each a list of package names."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    (layers,) = [
        c["layers"] for c in contract["importlinter"]["contracts"] if c["type"] == "layers"
    ]
    return [[name.strip() for name in re.split(r"[|:]", row)] for row in layers]


def _layer_of(module: str, layers: list[list[str]]) -> int | None:
    for index, row in enumerate(layers):
        if any(module == name or module.startswith(name + ".") for name in row):
            return index
    return None


def _upward_imports(path: Path, layers: list[list[str]]) -> list[str]:
    """Every protofed import of a file (TYPE_CHECKING blocks and function bodies included)
    that reaches a layer above the file's own."""
    here = _module_name(path)
    own = _layer_of(here, layers)
    if own is None:
        return []
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            layer = _layer_of(target, layers)
            if layer is not None and layer < own:
                found.append(f"{here}:{node.lineno} imports {target}")
    return found


def test_no_import_runs_up_a_layer_not_even_for_type_checking() -> None:
    """import-linter skips TYPE_CHECKING imports (exclude_type_checking_imports); this reads
    every import statement, so a type-only import cannot hide a dependency on a layer
    above."""
    layers = _layers()
    upward = [use for path in sorted(SRC.rglob("*.py")) for use in _upward_imports(path, layers)]
    assert not upward, "imports that run up a layer:\n" + "\n".join(upward)


def test_the_layer_checker_sees_a_type_checking_import(tmp_path, monkeypatch) -> None:
    probe = tmp_path / "protofed" / "core" / "zz_probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from protofed.config import X\n"
    )
    monkeypatch.setitem(globals(), "SRC", tmp_path / "protofed")
    assert _upward_imports(probe, _layers()) == ["protofed.core.zz_probe:3 imports protofed.config"]


# pytest's own markers; every other one must be registered in pyproject's markers
BUILTIN_MARKERS = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings"}


def _registered_markers() -> set[str]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    lines = options["ini_options"].get("markers", [])
    return {re.split(r"[:(]", line, maxsplit=1)[0].strip() for line in lines}


def _markers_used(path: Path) -> list[tuple[int, str]]:
    """Every `pytest.mark.NAME` in a test module (decorators, `pytestmark`, `marks=` of
    `pytest.param`), and `mark.NAME` where the module imports `mark` from pytest."""
    tree = ast.parse(path.read_text())
    owners = {"pytest.mark"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "pytest":
            owners |= {alias.asname or alias.name for alias in node.names if alias.name == "mark"}
    return sorted(
        (node.lineno, node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) in owners
    )


def _unregistered_markers(paths: list[Path], registered: set[str], root: Path) -> list[str]:
    known = registered | BUILTIN_MARKERS
    return [
        f"{path.relative_to(root).as_posix()}:{line} {name}"
        for path in paths
        for line, name in _markers_used(path)
        if name not in known
    ]


def test_every_marker_a_test_takes_is_registered() -> None:
    """`make test-fast` runs `-m "not integration"`: a misspelt marker (`integraton`) would
    silently put a slow test in the fast tier. pytest's --strict-markers (addopts) fails the
    collection too; this names every offender at once, without collecting."""
    registered = _registered_markers()
    assert "integration" in registered
    paths = sorted((ROOT / "tests").rglob("*.py"))
    bad = _unregistered_markers(paths, registered, ROOT)
    assert not bad, "markers not registered in pyproject's [tool.pytest.ini_options]:\n" + (
        "\n".join(bad)
    )


def test_the_marker_checker_sees_an_unregistered_marker(tmp_path) -> None:
    probe = tmp_path / "tests" / "test_probe.py"
    probe.parent.mkdir()
    probe.write_text(
        "import pytest\nfrom pytest import mark\n"
        "pytestmark = pytest.mark.integraton\n"
        "@pytest.mark.parametrize('x', [pytest.param(1, marks=pytest.mark.slowish)])\n"
        "@mark.integration\n@mark.gpu\ndef test_x(x): pass\n"
    )
    assert _unregistered_markers([probe], {"integration"}, tmp_path) == [
        "tests/test_probe.py:3 integraton",
        "tests/test_probe.py:4 slowish",
        "tests/test_probe.py:6 gpu",
    ]
