"""No user-facing page or config names the development checkout's `../shared` folder.

The project is developed beside a read-only folder `../shared` (data sets, paper texts,
notes) that a user's clone does not have. A page, tutorial or config that tells a reader to
use `../shared/data` or to read `../shared/papers/...` points at nothing: data come from the
user's data root (`protofed data fetch NAME`, `--data-dir DIR` or `PROTOFED_DATA=DIR`) and
papers are cited by title with a public link. Scanned: every file under docs/ (md, py,
ipynb, yml, yaml) and configs/, and README.md, as they are on disk (a new page counts before
it is committed).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS_SUFFIXES = (".md", ".py", ".ipynb", ".yml", ".yaml")
SHARED = "/".join(("..", "shared"))  # built, so that this file does not hold the string itself


def user_facing() -> list[Path]:
    """docs/ files with a page's or a script's suffix, every file of configs/, README.md."""
    docs = [p for p in (ROOT / "docs").rglob("*") if p.is_file() and p.suffix in DOCS_SUFFIXES]
    configs = [p for p in (ROOT / "configs").rglob("*") if p.is_file()]
    return sorted(docs + configs + [ROOT / "README.md"])


def shared_lines(text: str) -> list[str]:
    """The lines of `text` that name the development folder."""
    return [line.strip() for line in text.splitlines() if SHARED in line]


def test_the_rule_finds_the_development_folder():
    assert shared_lines(f"protofed run x.yaml --data-dir {SHARED}/data")
    assert shared_lines(f"see `{SHARED}/papers/000.txt`")
    assert not shared_lines("protofed data fetch uci_har --data-dir /data/protofed")
    assert not shared_lines("the shared copy is a stratified subset")


def test_the_scan_sees_the_pages_configs_and_readme():
    names = {p.relative_to(ROOT).as_posix() for p in user_facing()}
    assert {"README.md", "docs/index.md", "configs/quickstart.yaml"} <= names
    assert any(n.startswith("docs/tutorials/") and n.endswith(".py") for n in names)


def test_no_user_facing_file_names_the_development_folder():
    found = []
    for path in user_facing():
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = path.relative_to(ROOT).as_posix()
        found += [f"{rel}: {line[:160]}" for line in shared_lines(text)]
    assert not found, (
        f"{SHARED} in user-facing files (a user's clone has no such folder; use the data root "
        "or cite the paper by title and link):\n" + "\n".join(found)
    )
