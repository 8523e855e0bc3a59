"""PFPL's Table 1 and Figure 4c from run directories: accuracy per n and per domain, bytes.

Reads runs laid out as ROOT/n{N}/{algorithm}/s{seed} (benchmarks/pfpl_results.sh) and prints
Markdown: mean +- std over seeds of the clients' mean personalization accuracy (round selected
on validation data, and the last round), the per-domain means (`protofed.report.group_scores`),
and the bytes each client sends and receives per round.

    python benchmarks/pfpl_table.py runs/pfpl > runs/pfpl/report.md
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from protofed.report import group_scores
from protofed.runs import SUMMARY, RunDir

ALGORITHMS = ["local", "fedavg", "ditto", "fedproto", "pfpl"]


def _ms(values: list[float]) -> str:
    """Mean +- std (population std over seeds) in percent; a single run has no std."""
    if not values:
        return "-"
    mean = 100 * statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.2f}"
    return f"{mean:.2f} ± {100 * statistics.pstdev(values):.2f}"


def _runs(root: Path, n: str, algo: str) -> list[Path]:
    base = root / n / algo
    return sorted(p for p in base.glob("s*") if (p / SUMMARY).exists()) if base.is_dir() else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    args = parser.parse_args()
    ns = sorted(p.name for p in args.root.glob("n*") if p.is_dir())
    algos = [a for a in ALGORITHMS if any(_runs(args.root, n, a) for n in ns)]

    print("### Mean personalization accuracy (%), mean ± std over seeds\n")
    print(
        "| algorithm | "
        + " | ".join(f"{n} (val-selected)" for n in ns)
        + " | "
        + " | ".join(f"{n} (last round)" for n in ns)
        + " | seeds per n |"
    )
    print("|---|" + "---|" * (2 * len(ns) + 1))
    for algo in algos:
        sel, last, seeds = [], [], []
        for n in ns:
            runs = _runs(args.root, n, algo)
            seeds.append(str(len(runs)))
            sums = [RunDir(r).read_json(SUMMARY) for r in runs]
            sel.append(_ms([s["selected"]["personalization"]["acc"] for s in sums]))
            last.append(_ms([s["final"]["personalization"]["acc"] for s in sums]))
        print(f"| {algo} | " + " | ".join(sel + last) + f" | {'/'.join(seeds)} |")

    for n in ns:
        domains: list[str] = []
        table: dict[str, dict[str, list[float]]] = {}
        for algo in algos:
            for run in _runs(args.root, n, algo):
                for dom, acc in group_scores(run, "selected").items():
                    if dom not in domains:
                        domains.append(dom)
                    table.setdefault(algo, {}).setdefault(dom, []).append(acc)
        if not table:
            continue
        print(f"\n### Per-domain personalization accuracy (%), {n}, val-selected round\n")
        print("| algorithm | " + " | ".join(domains) + " |")
        print("|---|" + "---|" * len(domains))
        for algo in algos:
            row = table.get(algo, {})
            print(f"| {algo} | " + " | ".join(_ms(row.get(d, [])) for d in domains) + " |")

    print("\n### PFPL minus each baseline, same seed (paired), val-selected round\n")
    print("| n | baseline | per-seed differences (points) | mean ± std |")
    print("|---|---|---|---|")
    for n in ns:
        mine = {r.name: RunDir(r).read_json(SUMMARY) for r in _runs(args.root, n, "pfpl")}
        for algo in algos:
            if algo == "pfpl":
                continue
            theirs = {r.name: RunDir(r).read_json(SUMMARY) for r in _runs(args.root, n, algo)}
            common = sorted(set(mine) & set(theirs))
            if not common:
                continue
            diffs = [
                mine[s]["selected"]["personalization"]["acc"]
                - theirs[s]["selected"]["personalization"]["acc"]
                for s in common
            ]
            cells = ", ".join(f"{s}: {100 * d:+.2f}" for s, d in zip(common, diffs, strict=True))
            print(f"| {n} | {algo} | {cells} | {_ms(diffs)} |")

    print("\n### Bytes per round per client (Figure 4c)\n")
    print("| algorithm | " + " | ".join(f"{n} up / down (KB)" for n in ns) + " |")
    print("|---|" + "---|" * len(ns))
    for algo in algos:
        cells = []
        for n in ns:
            runs = _runs(args.root, n, algo)
            if not runs:
                cells.append("-")
                continue
            s = RunDir(runs[0]).read_json(SUMMARY)
            per = s["rounds"] * s["num_clients"]
            cells.append(
                f"{s['comm']['up_bytes'] / per / 1e3:.2f} / {s['comm']['down_bytes'] / per / 1e3:.2f}"
            )
        print(f"| {algo} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
