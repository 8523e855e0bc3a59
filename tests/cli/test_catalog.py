"""`protofed list`: its built-in lines shipped as package data (catalog.json), never stale
and read without torch; plugins listed from the registries and kept in the user cache."""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from protofed.cli.catalog import (
    SHIPPED,
    WRITE_COMMAND,
    builtin_catalog,
    catalog,
    shipped_catalog,
)

ROOT = Path(__file__).resolve().parents[2]
LIST = [sys.executable, "-m", "protofed", "list"]
NO_TORCH = (  # lists in-process, then says whether the registries (and torch) were imported
    "import sys, io, contextlib; from protofed.cli import catalog\n"
    "with contextlib.redirect_stdout(io.StringIO()): catalog.list_()\n"
    "print('torch' in sys.modules, 'protofed.algorithms' in sys.modules)"
)


def _env(cache: Path, site: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "COLUMNS": "200"}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return env


def test_the_shipped_catalog_is_what_the_registries_list():
    """catalog.json must equal the live registries' built-in lines: it is what `protofed
    list` prints, so a change to an algorithm, data set, partitioner or model that it does
    not follow fails here."""
    shipped = shipped_catalog()
    assert shipped is not None, f"{SHIPPED.name} is missing or unreadable: run {WRITE_COMMAND}"
    live = builtin_catalog()
    if shipped != live:
        diff = difflib.unified_diff(
            json.dumps(shipped, indent=1).splitlines(),
            json.dumps(live, indent=1).splitlines(),
            "shipped",
            "registries",
            lineterm="",
        )
        pytest.fail(
            f"src/protofed/cli/{SHIPPED.name} differs from the registries: an algorithm, data "
            "set, partitioner or model was added, removed or re-described (its summary, "
            "description, or whether it trains stacked). Regenerate it with "
            f"`{WRITE_COMMAND}` and commit it.\n" + "\n".join(diff)
        )


def test_the_built_in_catalog_leaves_out_what_this_process_registered(monkeypatch):
    """An algorithm registered here (a notebook's, a test's) is listed in-process, but is
    not written into catalog.json."""
    from protofed import algorithms

    class Probe(algorithms.Algorithm):
        name = "probe_only_here"
        summary = "registered by a test"

    monkeypatch.setitem(algorithms.ALGORITHMS, Probe.name, Probe)
    assert Probe.name in catalog()[0][1]  # the registries are imported: listed as they are
    assert Probe.name not in builtin_catalog()[0][1]
    assert builtin_catalog() == shipped_catalog()


def test_the_first_protofed_list_after_an_install_imports_no_torch(tmp_path):
    """An empty user cache (the first run after an install): the built-in lines come from
    catalog.json; neither torch nor a registry is imported and nothing is cached."""
    from importlib.metadata import entry_points

    from protofed.cli.catalog import PLUGIN_GROUPS

    if any(entry_points(group=g) for g in PLUGIN_GROUPS):
        pytest.skip("plugins are installed here: protofed list imports them")
    probe = subprocess.run(
        [sys.executable, "-c", NO_TORCH], env=_env(tmp_path), capture_output=True, text=True
    )
    assert probe.stdout.split() == ["False", "False"], probe.stderr
    listed = subprocess.run(LIST, env=_env(tmp_path), capture_output=True, text=True, check=True)
    shipped = shipped_catalog()
    assert shipped is not None
    for _, items in shipped:
        for name in items:
            assert any(line.split()[:1] == [name] for line in listed.stdout.splitlines()), name
    assert not (tmp_path / "protofed").exists()


def _fake_plugin(site: Path) -> Path:
    """A distribution with a `protofed.models` entry point whose module registers nothing:
    protofed list must import the registries for it, and lists the same lines."""
    info = site / "protofed_nothing-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: protofed-nothing\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[protofed.models]\nnothing = protofed_nothing\n")
    (site / "protofed_nothing.py").write_text('"""Registers nothing."""\n')
    return site


@pytest.mark.integration
def test_with_a_plugin_the_lines_are_kept_in_the_user_cache(tmp_path):
    """With a plugin installed the first `protofed list` imports the registries and keeps its
    lines; the next prints the same from the cache without torch; a listing kept under
    another key (another installation, an edit) is listed afresh. Without the plugin,
    catalog.json gives the same lines."""
    site, cache = _fake_plugin(tmp_path / "site"), tmp_path / "cache"
    env = _env(cache, site)
    first = subprocess.run(LIST, env=env, capture_output=True, text=True, check=True)
    kept = cache / "protofed" / "cli" / "list.json"
    assert kept.is_file() and "fedavg" in first.stdout
    probe = subprocess.run(
        [sys.executable, "-c", NO_TORCH], env=env, capture_output=True, text=True
    )
    assert probe.stdout.split() == ["False", "False"], probe.stderr
    second = subprocess.run(LIST, env=env, capture_output=True, text=True, check=True)
    assert second.stdout == first.stdout
    key = json.loads(kept.read_text())["key"]
    kept.write_text(json.dumps({"key": "another installation", "sections": [["x", {}]]}))
    again = subprocess.run(LIST, env=env, capture_output=True, text=True, check=True)
    assert again.stdout == first.stdout and json.loads(kept.read_text())["key"] == key
    plain = subprocess.run(
        LIST, env=_env(tmp_path / "empty"), capture_output=True, text=True, check=True
    )
    assert plain.stdout == first.stdout


def test_catalog_json_is_package_data():
    """A wheel and an editable install carry catalog.json beside catalog.py."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert SHIPPED.name in setuptools["package-data"]["protofed.cli"]
    assert SHIPPED.is_file()
