"""Tables for docs/results/feddpa.md from the runs of benchmarks/feddpa_results.sh.

Usage: python benchmarks/feddpa_report.py runs/feddpa > runs/feddpa/report.md

Per run (runs/feddpa/<setting>_<variant>_s<seed>/): the global model's accuracy at the round
all runs reached (the shortest run's last round), at the last round and at the round selected
on validation data, the personalization accuracy (each
client's model on its own test split), and the rounds to converge: the first evaluated round
whose accuracy reaches 95 % of the mean of the last two evaluations (the paper's "rounds to
reach stable performance" gives no rule; this is ours). Methods without a global model
(FedProto, FedRep, FedPer) are measured on personalization accuracy instead. Seeds are
summarised as mean ± sample std (ddof 1). FedDPA runs also show the server's diagnostics of
the last round (the server metrics of `summary.json`, `final.server`).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

NAME = re.compile(r"^d(?P<setting>[\d.]+)_(?P<variant>.+)_s(?P<seed>\d+)$")
STATS = ["mean lambda_k", "mean Het_k", "groups", "L_sep before", "L_sep after", "min distance"]
SERVER_METRICS = [
    "lambda_mean",
    "heterogeneity_mean",
    "groups",
    "separation_before",
    "separation_after",
    "min_distance",
]  # FedDPA's server metrics, as STATS


def load(run: Path) -> dict | None:
    summary = run / "summary.json"
    if not summary.is_file():
        return None
    s = json.loads(summary.read_text())
    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    has_global = s["final"]["global"] is not None
    key = "global" if has_global else "personalization"
    curve = [(h["round"], h[key]["acc"]) for h in history if h.get(key)]
    at = {
        h["round"]: (h["global"]["acc"] if h.get("global") else None, h["personalization"]["acc"])
        for h in history
    }
    plateau = statistics.mean(a for _, a in curve[-2:])
    converge = next(r for r, a in curve if a >= 0.95 * plateau)
    out = {
        "global_last": s["final"]["global"]["acc"] if has_global else None,
        "global_sel": s["selected"]["global"]["acc"] if has_global else None,
        "pers_last": s["final"]["personalization"]["acc"],
        "converge": converge,
        "rounds": s["rounds"],
        "curve": curve,
        "at": at,
        "s_per_round": s["time"]["train_s_per_round"],
        "mb_up_per_round": s["comm"]["up_bytes_per_round"] / 1e6,
    }
    server = s["final"].get("server") or {}
    if s["algorithm"] == "feddpa" and server:
        out["stats"] = [server[key] for key in SERVER_METRICS]
    return out


def fmt(values: list[float | None], scale: float = 100.0, digits: int = 2) -> str:
    vals = [v * scale for v in values if v is not None]
    if not vals:
        return "-"
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f}"
    return f"{statistics.mean(vals):.{digits}f} ± {statistics.stdev(vals):.{digits}f}"


def main(root: Path) -> None:
    groups: dict[tuple[str, str], dict[int, dict]] = defaultdict(dict)
    for run in sorted(p for p in root.iterdir() if p.is_dir()):
        m = NAME.match(run.name)
        info = load(run) if m else None
        if m and info:
            groups[(m["setting"], m["variant"])][int(m["seed"])] = info
    short = min((x["rounds"] for runs in groups.values() for x in runs.values()), default=0)
    print(
        f"| Dirichlet | method | seeds | global acc @ round {short} (%) | pers. acc @ round {short} (%) "
        "| last round | global acc, last (%) | global acc, val-selected (%) | rounds to converge "
        "| train s/round | MB up/round |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (setting, variant), runs in sorted(groups.items()):
        r = list(runs.values())
        at = [x["at"].get(short, (None, None)) for x in r]
        lasts = sorted({x["rounds"] for x in r})
        print(
            f"| {setting} | {variant} | {','.join(map(str, sorted(runs)))} "
            f"| {fmt([g for g, _ in at])} | {fmt([q for _, q in at])} "
            f"| {'/'.join(map(str, lasts))} "
            f"| {fmt([x['global_last'] for x in r])} | {fmt([x['global_sel'] for x in r])} "
            f"| {fmt([x['converge'] for x in r], 1, 1)} "
            f"| {fmt([x['s_per_round'] for x in r], 1, 1)} | {fmt([x['mb_up_per_round'] for x in r], 1, 1)} |"
        )
    dpa, avg = groups.get(("0.3", "feddpa"), {}), groups.get(("0.3", "fedavg"), {})
    seeds = sorted(set(dpa) & set(avg))
    if seeds:
        common = sorted(set.intersection(*(set(g[s]["at"]) for g in (dpa, avg) for s in seeds)))
        for rnd in common[-1:]:
            print(f"\nClaim, Dirichlet 0.3: global accuracy at round {rnd}, per seed:\n")
            print("| seed | FedDPA (%) | FedAvg (%) | FedDPA - FedAvg (pp) |")
            print("|---|---|---|---|")
            a = [dpa[s]["at"][rnd][0] for s in seeds]
            b = [avg[s]["at"][rnd][0] for s in seeds]
            for s, x, y in zip(seeds, a, b, strict=True):
                print(f"| {s} | {100 * x:.2f} | {100 * y:.2f} | {100 * (x - y):+.2f} |")
            diffs = [x - y for x, y in zip(a, b, strict=True)]
            print(f"| mean ± std | {fmt(a)} | {fmt(b)} | {fmt(diffs)} |")
    print("\nFedDPA server diagnostics, last round (seed 0 of each variant):\n")
    print("| Dirichlet | variant | " + " | ".join(STATS) + " |")
    print("|---|---|" + "---|" * len(STATS))
    for (setting, variant), runs in sorted(groups.items()):
        first = runs[min(runs)]
        if "stats" in first:
            print(
                f"| {setting} | {variant} | "
                + " | ".join(f"{v:.3g}" for v in first["stats"])
                + " |"
            )
    print("\nCurves (round: accuracy %, global or else personalization):\n")
    for (setting, variant), runs in sorted(groups.items()):
        for seed, info in sorted(runs.items()):
            pts = ", ".join(f"{r}: {100 * a:.1f}" for r, a in info["curve"])
            print(f"- d{setting} {variant} s{seed}: {pts}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/feddpa"))
