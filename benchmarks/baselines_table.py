"""The tables of docs/results/baselines.md: every algorithm on one setting, from its run directories.

Usage: python benchmarks/baselines_table.py runs/baselines/cifar10 [--which selected|final]
Prints one Markdown table (the round selected on validation data by default): personalization
accuracy and macro-F1, generalization F1, global F1 (mean ± std across clients, in %), seconds
per round (training, server and evaluation, wall time) and MB per round (up + down, all clients).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from protofed.report import collect

ORDER = [
    "local",
    "centralized",
    "fedavg",
    "fedprox",
    "moon",
    "fedbn",
    "fedper",
    "fedrep",
    "ditto",
    "apfl",
    "fedrod",
    "fedbabu",
    "perfedavg",
    "pfedme",
    "fedala",
    "fedproto",
    "pfpl",
    "fedpac",
    "fednh",
    "protohar",
    "feddpa",
    "fedclar",
    "fedhome",
    "fedsub",
    "fedali",
    "fedavg_vit",
]


def pct(value: float | None, std: float | None = None) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.2f}" + (f" ± {100 * std:.2f}" if std and std > 1e-9 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", type=Path, help="a folder of run directories, one per algorithm")
    parser.add_argument("--which", default="selected", choices=["selected", "final"])
    args = parser.parse_args()
    dirs = sorted(d for d in args.runs.iterdir() if (d / "summary.json").exists())
    rank = {name: i for i, name in enumerate(ORDER)}
    rows = sorted(
        collect(dirs, args.which), key=lambda r: (rank.get(r["run"], len(ORDER)), r["run"])
    )
    print(
        "| algorithm | round | pers. acc | pers. F1 | gen. F1 | global F1 | s / round | MB / round |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        mb = (r["up_MB"] + r["down_MB"]) / max(r["rounds"], 1)
        print(
            f"| `{r['run']}` | {r['round']} | {pct(r['pers_acc'])} | "
            f"{pct(r['pers_f1'], r['pers_f1_std'])} | {pct(r['gen_f1'], r['gen_f1_std'])} | "
            f"{pct(r['global_f1'])} | {r['s_per_round']:.2f} | {mb:.1f} |"
        )


if __name__ == "__main__":
    main()
