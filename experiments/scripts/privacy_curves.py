"""The privacy-utility figure and table of experiments/results/privacy.md.

Reads the runs of experiments/sweeps/privacy_uci_har.yaml (and of privacy_uci_har_fedali.yaml,
FedAli in a setting that fits the CPU, where given) and draws, per method, the final
round's personalization and generalization F1 against epsilon (inf: privacy off), mean and
sample std over seeds. A run that diverged (NaN weights) scores nothing, even where an
earlier round was scored: the table says how many of a point's runs finished, and the figure
leaves the point out.

    python experiments/scripts/privacy_curves.py runs/privacy runs/privacy_fedali \
        --out experiments/results/figures/privacy_uci_har
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

from protofed.plots import new_grid, save_figure, style_context
from protofed.report import collect

NAMES = {
    "fedavg": "FedAvg",
    "fedproto": "FedProto",
    "fedproto:head": "FedProto, own head",
    "pfpl": "PFPL",
    "fedala": "FedALA",
    "fedali": "FedAli (small banks)",
}
EPSILONS = [1.0, 2.0, 4.0, 8.0, math.inf]


def point(run: Path) -> tuple[str, float, int]:
    """(method, epsilon it was run at, seed) from a run's config.yaml; FedProto scored with
    its clients' own heads is a method of its own ("fedproto:head")."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    method = config["algorithm"]["name"]
    if config["algorithm"].get("inference") == "head":
        method += ":head"
    privacy = config["privacy"]
    target = float(privacy["target_epsilon"]) if privacy["enabled"] else math.inf
    return method, target, int(config["seed"])


def table(folders: list[Path]) -> dict[tuple[str, float], dict]:
    rows = collect(folders, which="final", skipped=[])
    scored: dict[tuple[str, float], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        run = Path(row["path"])
        if json.loads((run / "summary.json").read_text())["status"] != "complete":
            continue  # diverged: its last scored round is not the run's result
        method, epsilon, _ = point(run)
        for key in ("pers_f1", "gen_f1"):
            if row.get(key) is not None:
                scored[method, epsilon][key].append(row[key])
    runs: dict[tuple[str, float], int] = defaultdict(int)
    for run in (run for folder in folders for run in folder.iterdir()):
        if (run / "summary.json").exists():
            method, epsilon, _ = point(run)
            runs[method, epsilon] += 1
    return {key: {"runs": runs[key], **scored.get(key, {})} for key in runs}


def draw(stats: dict, prefix: Path) -> None:
    with style_context("paper-wide") as style:
        width = style.width or 7.0
        fig, axes = new_grid(width, width * 0.4, 1, 2, layout="constrained", style=style)
        for ax, key, title in zip(
            axes, ("pers_f1", "gen_f1"), ("personalization", "generalization"), strict=True
        ):
            for method, name in NAMES.items():
                xs, means, stds = [], [], []
                for i, epsilon in enumerate(EPSILONS):
                    values = stats.get((method, epsilon), {}).get(key, [])
                    if values:
                        xs.append(i)
                        means.append(np.mean(values))
                        stds.append(np.std(values, ddof=1) if len(values) > 1 else 0.0)
                ax.errorbar(xs, means, yerr=stds, marker="o", capsize=2, label=name)
            ax.set_xticks(range(len(EPSILONS)), ["1", "2", "4", "8", "∞"])
            ax.set_xlabel("ε (δ = 1e-5)")
            ax.set_ylabel(f"{title} F1 (%)")
            ax.set_title(title)
            gone = [
                name
                for method, name in NAMES.items()
                if not any(stats.get((method, e), {}).get(key) for e in EPSILONS[:-1])
            ]
            if gone:  # no finished run at any finite epsilon: say it on the figure
                ax.text(1.5, 15, f"{', '.join(gone)}:\ndiverged at every ε ≤ 8", ha="center")
        axes[0].legend(loc="upper left")
        save_figure(fig, prefix)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, required=True, help="figure prefix (.png and .pdf)")
    args = parser.parse_args()
    stats = table(args.folders)
    print("| method | epsilon | runs finished / run | pers F1 | gen F1 |")
    print("|---|---|---|---|---|")
    for method, name in NAMES.items():
        for epsilon in EPSILONS:
            entry = stats.get((method, epsilon))
            if entry is None:
                continue
            cells = []
            for key in ("pers_f1", "gen_f1"):
                values = entry.get(key, [])
                sd = f" ± {np.std(values, ddof=1):.2f}" if len(values) > 1 else ""
                cells.append(f"{np.mean(values):.2f}{sd}" if values else "diverged")
            scored = len(entry.get("pers_f1", []))
            eps = "∞" if math.isinf(epsilon) else f"{epsilon:g}"
            print(f"| {name} | {eps} | {scored} / {entry['runs']} | {cells[0]} | {cells[1]} |")
    draw(stats, args.out)


if __name__ == "__main__":
    main()
