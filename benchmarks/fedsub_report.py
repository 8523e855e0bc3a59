"""Figures and tables of docs/results/fedsub.md from the runs of benchmarks/fedsub_results.sh.

Usage: python benchmarks/fedsub_report.py [RUNS=runs/fedsub] [OUT=docs/results/fedsub]

Reads every runs/fedsub/<scenario>/<name>_s<seed>/ (metrics.jsonl, summary.json,
partition.json) and writes, per scenario, <scenario>.png (personalization F1 and training
loss per round, mean over seeds with a +-1 std band) and tables.md: final values (mean +- std
over seeds), the dynamic scenario's drop and recovery after each class arrival, and the
fusion-strategy / Partial-vs-Full comparison.

Recovery: for the clients that get a class back in round a, their mean personalization F1
just before (round a - 1, on the data without the class) is the level to regain; the drop is
F1(a) - F1(a - 1) (round a's model trained one round with the new class and is scored on
test data that now holds it) and the recovery time is the first r >= a with F1(r) >= level -
1 point, in rounds after a (">N": not within the run).
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ORDER = [
    "fedsub",
    "fedavg",
    "fedrep",
    "fedproto",
    "local",
    "fedsub-cluster_avg",
    "fedsub-leadership",
    "fedsub-full",
]
MAIN = ["fedsub", "fedavg", "fedrep", "fedproto", "local"]
TOL = 0.01


def load(runs: Path) -> dict[str, dict[str, list[dict]]]:
    """scenario -> name -> [run] with history, summary and the dynamic schedule."""
    found: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for summary in sorted(runs.glob("*/*/summary.json")):
        d = summary.parent
        m = re.fullmatch(r"(.+)_s(\d+)", d.name)
        if m is None:
            continue
        history = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        part = json.loads((d / "partition.json").read_text())
        found[d.parent.name][m.group(1)].append(
            {
                "seed": int(m.group(2)),
                "history": history,
                "summary": json.loads(summary.read_text()),
                "dynamic": part.get("meta", {}).get("dynamic"),
            }
        )
    return found


def curve(runs: list[dict], key) -> tuple[np.ndarray, np.ndarray]:
    rounds = np.array([h["round"] for h in runs[0]["history"]])
    values = np.array([[key(h) for h in r["history"]] for r in runs], dtype=float)
    return rounds, values


def pers_f1(h: dict) -> float:
    return h["personalization"]["f1"]


def train_loss(h: dict) -> float:
    return np.nan if h["train_loss"] is None else h["train_loss"]


def pm(values: np.ndarray, scale: float = 100.0, digits: int = 2) -> str:
    values = np.asarray(values, dtype=float) * scale
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std():.{digits}f}"


def plot(scenario: str, by_name: dict[str, list[dict]], names: list[str], out: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name in names:
        for ax, key, label in (
            (axes[0], pers_f1, "personalization macro-F1"),
            (axes[1], train_loss, "training loss"),
        ):
            rounds, values = curve(by_name[name], key)
            mean, std = np.nanmean(values, 0), np.nanstd(values, 0)
            ax.plot(
                rounds, mean, label=f"{name} ({len(values)} seed{'s' * (len(values) > 1)})", lw=1.2
            )
            if len(values) > 1:
                ax.fill_between(rounds, mean - std, mean + std, alpha=0.2)
            ax.set_xlabel("round")
            ax.set_ylabel(label)
    dyn = by_name[names[0]][0]["dynamic"]
    if dyn:
        longest = max(len(v) for v in dyn["withheld"].values())
        for k in range(1, longest + 1):
            for ax in axes:
                ax.axvline(k * dyn["every"], color="grey", ls=":", lw=0.8)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(scenario)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def final_table(by_name: dict[str, list[dict]], names: list[str]) -> list[str]:
    lines = [
        "| algorithm | seeds | pers. F1 (%) | pers. acc (%) | mean F1 over rounds (%) | final train loss |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        runs = by_name[name]
        f1 = [r["summary"]["final"]["personalization"]["f1"] for r in runs]
        acc = [r["summary"]["final"]["personalization"]["acc"] for r in runs]
        avg = [np.mean([pers_f1(h) for h in r["history"]]) for r in runs]
        loss = [r["history"][-1]["train_loss"] for r in runs]
        lines.append(
            f"| {name} | {len(runs)} | {pm(f1)} | {pm(acc)} | {pm(avg)} | {pm(loss, 1.0, 3)} |"
        )
    return lines


def recovery(run: dict) -> list[tuple[int, float, float, float | None]]:
    """(arrival round, F1 before, drop, rounds to recover or None) per arrival."""
    dyn = run["dynamic"]
    every = dyn["every"]
    by_round = {h["round"]: h for h in run["history"]}
    last = max(by_round)
    out = []
    for k in range(1, max(len(v) for v in dyn["withheld"].values()) + 1):
        arrival = k * every
        if arrival > last or arrival - 1 not in by_round:
            break
        clients = [int(c) for c, v in dyn["withheld"].items() if len(v) >= k]

        def score(r: int, clients=clients) -> float:
            return float(np.nanmean([by_round[r]["clients"]["pers_f1"][c] for c in clients]))

        before = score(arrival - 1)
        drop = score(arrival) - before
        back = next(
            (
                r - arrival
                for r in range(arrival, last + 1)
                if r in by_round and score(r) >= before - TOL
            ),
            None,
        )
        out.append((arrival, before, drop, back))
    return out


def recovery_table(by_name: dict[str, list[dict]], names: list[str]) -> list[str]:
    lines = [
        "| algorithm | seeds | arrival round | F1 of those clients before (%) | drop (points) | rounds to recover |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        per_seed = [recovery(r) for r in by_name[name]]
        for i in range(min(len(p) for p in per_seed)):
            rows = [p[i] for p in per_seed]
            backs = [b for *_, b in rows]
            shown = ", ".join("> run" if b is None else str(b) for b in backs)
            lines.append(
                f"| {name} | {len(rows)} | {rows[0][0]} | {pm([b for _, b, _, _ in rows])} | "
                f"{pm([d for _, _, d, _ in rows])} | {shown} |"
            )
    return lines


def main() -> None:
    runs = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/fedsub")
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "docs/results/fedsub")
    out.mkdir(parents=True, exist_ok=True)
    data = load(runs)
    md = ["# FedSub results (generated by benchmarks/fedsub_report.py)", ""]
    for scenario in sorted(data):
        by_name = data[scenario]
        names = [n for n in MAIN if n in by_name]
        if not names:
            continue
        plot(scenario, by_name, names, out / f"{scenario}.png")
        md += [f"## {scenario}", "", f"![{scenario}](fedsub/{scenario}.png)", ""]
        md += final_table(by_name, names) + [""]
        if by_name[names[0]][0]["dynamic"]:
            md += recovery_table(by_name, names) + [""]
        variants = [n for n in ORDER if n in by_name and n not in MAIN]
        if variants:
            plot(
                f"{scenario}: FedSub variants",
                by_name,
                ["fedsub", *variants],
                out / f"{scenario}_variants.png",
            )
            md += [
                f"### {scenario}: fusion strategies and Partial vs Full (seed 0)",
                "",
                f"![variants](fedsub/{scenario}_variants.png)",
                "",
            ]
            seed0 = {n: [r for r in by_name[n] if r["seed"] == 0] for n in ["fedsub", *variants]}
            md += final_table(seed0, ["fedsub", *variants]) + [""]
    (out / "tables.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
