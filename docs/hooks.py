"""MkDocs hook (mkdocs.yml `hooks:`): serve the papers' results pages from experiments/.

The results pages live in `experiments/results/` (with their figures) and the notebook's
index in `experiments/README.md`; they are written to be read on GitHub too. Instead of a
copy in docs/, this hook adds those files to the build under `results/` (the README as
`results/experiments.md`), so there is one source, and their relative links and images
(`figures/x.png`, `fedsub/claims/...`) keep working unchanged. A link in any page that
points at one of those files, or from them at a docs page, by its path in the repository
(`../../experiments/results/fedali.md` from docs/algorithms/, `../docs/sweeps.md` from
experiments/README.md) is pointed at the same file's place in the site; every other link is
left as written, for `mkdocs build --strict` to check. No network, no copy, no source edit.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = ROOT / "experiments" / "results"
NOTEBOOK = ROOT / "experiments" / "README.md"
NOTEBOOK_SITE = "results/experiments.md"
# Left out: written by a script since removed, linked from no page, and its image links are
# relative to experiments/results/ instead of its own folder (broken on GitHub as well).
SKIP = {"fedsub/tables.md"}

# [text](target) and <img src="target">, not URLs, not anchors alone
LINK = re.compile(r"(\]\(|src=\")(?![a-z]+:|#|/)([^)\"\s#]+)(#[^)\"\s]*)?")


def _site_path(repo_file: Path) -> str | None:
    """Where a file of the repository is in the site, if it is there."""
    if repo_file == NOTEBOOK:
        return NOTEBOOK_SITE
    for root, prefix in ((RESULTS, "results/"), (DOCS, "")):
        if repo_file.is_relative_to(root):
            return prefix + repo_file.relative_to(root).as_posix()
    return None


def on_files(files: Files, config: Any) -> Files:
    """Add experiments/results/** as results/** and experiments/README.md."""
    for path in sorted(RESULTS.rglob("*")):
        rel = path.relative_to(RESULTS).as_posix()
        if path.is_file() and rel not in SKIP:
            if files.get_file_from_path(f"results/{rel}") is not None:
                raise ValueError(f"docs/results/{rel} would hide experiments/results/{rel}")
            files.append(
                File(
                    f"results/{rel}",
                    src_dir=str(RESULTS.parent),
                    dest_dir=config["site_dir"],
                    use_directory_urls=config["use_directory_urls"],
                )
            )
    notebook = File.generated(config, NOTEBOOK_SITE, abs_src_path=str(NOTEBOOK))
    files.append(notebook)
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Point repository-relative links to served files at their place in the site."""
    source = Path(page.file.abs_src_path).resolve()
    here = Path(page.file.src_uri).parent

    def fix(match: re.Match[str]) -> str:
        opener, target, anchor = match.group(1), match.group(2), match.group(3) or ""
        site = _site_path((source.parent / target).resolve())
        if site is None or files.get_file_from_path(site) is None:
            return match.group(0)
        return f"{opener}{Path(os.path.relpath(site, here)).as_posix()}{anchor}"

    return LINK.sub(fix, markdown)
