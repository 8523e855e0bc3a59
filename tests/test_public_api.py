"""The public API: docs/python-api.md's table of public names, the facades that hold them
(protofed.extend, protofed.analysis), py.typed, and docs whose examples import only them."""

from __future__ import annotations

import ast
import importlib
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SRC = ROOT / "src" / "protofed"

ROW = re.compile(r"^\| `(protofed[\w.]*)` \| (.+?) \| .+ \|$")


def public_names(page: Path = DOCS / "python-api.md") -> dict[str, set[str]]:
    """Module -> its public names, from the table of docs/python-api.md (`__all__` first in
    the names' cell: every name of the module's `__all__`)."""
    table: dict[str, set[str]] = {}
    for line in page.read_text().splitlines():
        match = ROW.match(line)
        if match is None:
            continue
        module, cell = match.groups()
        if cell.startswith("`__all__`"):
            table[module] = set(importlib.import_module(module).__all__)
        else:
            table[module] = set(re.findall(r"`(\w+)`", cell))
    return table


def python_sources() -> list[tuple[str, str]]:
    """(where, code): every tutorial script and every ```python block of the docs."""
    found = [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted(DOCS.glob("tutorials/*.py"))]
    block = re.compile(r"^([ \t]*)```python[^\n]*\n(.*?)^\1```", re.M | re.S)
    for page in sorted(DOCS.rglob("*.md")):
        for match in block.finditer(page.read_text()):
            code = textwrap.dedent(match.group(2))
            if "--8<--" not in code:  # a snippet include: the file itself is checked
                line = page.read_text()[: match.start()].count("\n") + 1
                found.append((f"{page.relative_to(ROOT)}:{line}", code))
    return found


def _imports(code: str) -> list[tuple[str, str | None]]:
    """(module, name) of each protofed import (name None: `import module`)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:  # a fragment: read its import lines alone
        lines = [ln.strip() for ln in code.splitlines()]
        tree = ast.parse("\n".join(ln for ln in lines if re.match(r"(from|import) \w", ln)))
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "protofed":
                found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "protofed"]
    return found


def private_imports(code: str, public: dict[str, set[str]]) -> list[str]:
    """The imports in `code` of anything docs/python-api.md does not declare public."""
    bad = []
    for module, name in _imports(code):
        if name is None:
            if module not in public:
                bad.append(f"import {module}")
        elif f"{module}.{name}" in public:  # `from protofed import extend`
            continue
        elif name not in public.get(module, ()):
            bad.append(f"from {module} import {name}")
    return bad


def test_the_table_declares_the_facades() -> None:
    public = public_names()
    assert {"protofed", "protofed.extend", "protofed.analysis"} <= set(public)
    assert {"Algorithm", "Client", "FitResult", "register_algorithm"} <= public["protofed.extend"]
    for module, names in public.items():
        imported = importlib.import_module(module)
        missing = sorted(n for n in names if not hasattr(imported, n))
        assert not missing, f"{module} lacks the public names {missing}"


def test_docs_and_tutorials_import_only_public_names() -> None:
    public = public_names()
    sources = python_sources()
    assert any(where.startswith("docs/tutorials/") for where, _ in sources)
    assert any(where.startswith("docs/python-api.md") for where, _ in sources)
    bad = [f"{where}: {use}" for where, code in sources for use in private_imports(code, public)]
    assert not bad, "docs import non-public names (docs/python-api.md):\n" + "\n".join(bad)


def test_the_checker_sees_a_private_import() -> None:
    public = {"protofed": {"run"}, "protofed.extend": {"Algorithm"}}
    code = (
        "import protofed\nimport protofed.report\nfrom protofed import run, extend\n"
        "from protofed.extend import Algorithm, _hidden\n"
        "from protofed.algorithms.base import Algorithm\n"
    )
    assert private_imports(code, public) == [
        "import protofed.report",
        "from protofed.extend import _hidden",
        "from protofed.algorithms.base import Algorithm",
    ]
    fragment = "    from protofed.report import collect\nrows = collect(...)\n  oops(\n"
    assert private_imports(fragment, public) == ["from protofed.report import collect"]


@pytest.mark.parametrize("facade", ["protofed.extend", "protofed.analysis"])
def test_a_facade_re_exports_protofeds_own_objects(facade: str) -> None:
    """Every name of the facade is the object of the internal module it comes from (a
    subclass of `protofed.extend.Algorithm` is an algorithm to the registry), and unique."""
    module = importlib.import_module(facade)
    names = module.__all__
    assert len(names) == len(set(names))
    assert names, facade
    tree = ast.parse(Path(module.__file__).read_text())
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            assert node.module is not None
            source = importlib.import_module(node.module)
            for alias in node.names:
                assert alias.asname is None
                assert getattr(module, alias.name) is getattr(source, alias.name)
                assert alias.name in names, f"{facade} imports {alias.name} but omits it"


def test_extend_is_what_the_internals_use() -> None:
    from protofed.algorithms import ALGORITHMS, algorithm_class
    from protofed.algorithms.base import Algorithm as Internal
    from protofed.extend import Algorithm, Client, FitResult

    assert Algorithm is Internal
    assert issubclass(algorithm_class("fedavg"), Algorithm)
    assert all(issubclass(cls, Algorithm) for cls in ALGORITHMS.values())
    assert FitResult.__module__ == "protofed.core.types"
    assert Client.__module__ == "protofed.training.client"


def test_the_package_is_typed() -> None:
    """py.typed (PEP 561) ships with the package, so users' mypy reads the annotations."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    assert (SRC / "py.typed").is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["protofed"]
