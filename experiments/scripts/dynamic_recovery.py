"""How fast personalization recovers when a withheld class returns (data.dynamic, FedSub's
dynamic scenario): the table of experiments/results/fedsub.md, over `protofed report`'s groups.

Usage: python experiments/scripts/dynamic_recovery.py RUNS_OR_DIRS... > recovery.md

For each group of runs (`protofed.report.group_runs`, "auto": the seeds of one config) and each
arrival round a (a class returns every `data.dynamic.every` rounds), over the clients that get
a class back at a: their mean personalization F1 in round a - 1 (on data without the class) is
the level to regain; the drop is F1(a) - F1(a - 1) (round a's model, trained one round with the
class, scored on test data that now holds it); the recovery time is the first r >= a with
F1(r) >= level - 1 point, in rounds after a ("> run": not within the run). Mean ± sample std
over the group's runs (ddof = 1), as in `protofed report`.
"""

from __future__ import annotations

import sys

import numpy as np

import protofed
from protofed.report import collect, group_runs
from protofed.runs import PARTITION

TOL = 1.0  # points of F1 (%)


def recovery(path: str) -> list[tuple[int, float, float, int | None]]:
    """(arrival round, F1 before in %, drop in points, rounds to recover or None) per arrival."""
    run = protofed.load_run(path)
    dyn = (run.dir.read_json(PARTITION).get("meta") or {}).get("dynamic")
    if not dyn:
        return []
    f1 = run.history.pivot(index="round", columns="client", values="pers_f1").astype(float)
    last, out = int(f1.index.max()), []
    for k in range(1, max(len(v) for v in dyn["withheld"].values()) + 1):
        arrival = k * int(dyn["every"])
        if arrival > last or arrival - 1 not in f1.index:
            break
        clients = [int(c) for c, v in dyn["withheld"].items() if len(v) >= k]
        score = 100 * f1[clients].mean(axis=1, skipna=True)
        before = float(score.loc[arrival - 1])
        back = next(
            (r - arrival for r in score.index if r >= arrival and score[r] >= before - TOL), None
        )
        out.append((arrival, before, float(score.loc[arrival]) - before, back))
    return out


def pm(values: list[float]) -> str:
    arr = np.asarray(values, dtype=float)
    return f"{arr.mean():.2f}" + (f" ± {arr.std(ddof=1):.2f}" if len(arr) > 1 else "")


def main(paths: list[str]) -> None:
    print(
        "| group | n | arrival round | F1 of those clients before (%) | drop (points) | rounds to recover |"
    )
    print("|---|---|---|---|---|---|")
    for group in group_runs(collect(paths, "final", skipped=[]), "auto"):
        per_run = [recovery(r["path"]) for r in group.runs]
        for i in range(min((len(p) for p in per_run), default=0)):
            rows = [p[i] for p in per_run]
            backs = ", ".join("> run" if b is None else str(b) for *_, b in rows)
            print(
                f"| {group.label} | {group.n} | {rows[0][0]} | {pm([r[1] for r in rows])} "
                f"| {pm([r[2] for r in rows])} | {backs} |"
            )


if __name__ == "__main__":
    main(sys.argv[1:] or ["runs/fedsub_claims/wisdm_dynamic"])
