"""The tables of experiments/results/fedali.md, section "FedAli as its official code runs it".

Reads the runs of experiments/sweeps/fedali_official.yaml for one data set and prints, per
run and seed, F1 (%) under the paper's selection rule (the evaluated round with the best
mean personalization test accuracy; the global score at the global model's own best round)
and under validation selection (with its round), then the paired differences by seed of
generalization F1 under both rules and at the final round (the same round for both runs).

    python experiments/scripts/fedali_official_table.py runs/fedali_official/hhar --seeds 0 1 2

`--up-to R` reads only the rounds up to R, so runs stopped at different rounds (the GPU
campaign, fedali_official_gpu.yaml) compare on one budget; a run counts once it evaluated R.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from protofed import load_run
from protofed.core.results import RoundRecord
from protofed.evaluation import select_global_round, select_round

RUNS = {
    "fedali_official": "FedAli, official defaults",
    "fedali_official_beta0": "its beta = 0 control",
    "fedali_protofed": "FedAli, protofed's defaults",
    "fedali_protofed_beta0": "its beta = 0 control",
    "fedavg_hart": "FedAvg, official HART",
    "fedavg_hart_l2norm": "FedAvg, official HART + ALP's L2 normalisation only",
}
PAIRS = {
    "the alignment, official defaults (FedAli - its control)": (
        "fedali_official",
        "fedali_official_beta0",
    ),
    "the alignment, protofed's defaults (FedAli - its control)": (
        "fedali_protofed",
        "fedali_protofed_beta0",
    ),
    "FedAli official - FedAvg": ("fedali_official", "fedavg_hart"),
    "the L2 normalisation alone (FedAvg + normalisation - FedAvg)": (
        "fedavg_hart_l2norm",
        "fedavg_hart",
    ),
    "FedAli official - FedAvg + normalisation": ("fedali_official", "fedavg_hart_l2norm"),
}


def evaluated_rounds(run_dir: Path, up_to: int | None) -> list[RoundRecord] | None:
    """The run's evaluated rounds (up to `up_to`), or None while it has not finished that
    budget: no summary yet, or no evaluation of round `up_to`."""
    if up_to is None and not (run_dir / "summary.json").is_file():
        return None
    if not (run_dir / "metrics.jsonl").is_file():
        return None
    history = [RoundRecord.from_json(line) for line in load_run(run_dir).dir.history()]
    evaluated = [
        r for r in history if r.personalization is not None and (up_to is None or r.round <= up_to)
    ]
    if up_to is not None and not any(r.round == up_to for r in evaluated):
        return None
    return evaluated


def scores(evaluated: list[RoundRecord]) -> dict[str, float]:
    best = select_round(evaluated, "best_test")
    best_global = select_global_round(evaluated, "best_test")
    val = select_round(evaluated, "val")
    final = evaluated[-1]
    assert final.generalization is not None
    assert best.generalization is not None and val.generalization is not None
    assert best_global.global_ is not None
    return {
        "pers": 100 * best.personalization.f1,
        "gen": 100 * best.generalization.f1,
        "global": 100 * best_global.global_.f1,
        "gen_val": 100 * val.generalization.f1,
        "gen_final": 100 * final.generalization.f1,
        "val_round": val.round,
        "best_round": best.round,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the sweep's folder for one data set")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--up-to", type=int, help="read only the rounds up to this one")
    args = parser.parse_args()
    read = {
        (n, s): evaluated_rounds(args.folder / f"{n}_s{s}", args.up_to)
        for n in RUNS
        for s in args.seeds
    }
    # a run whose seeds are not all finished is left out, and every pair it is in
    names = [n for n in RUNS if all(read[n, s] is not None for s in args.seeds)]
    got = {key: scores(rounds) for key, rounds in read.items() if rounds and key[0] in names}

    def cells(name: str, key: str) -> str:
        values = [got[name, s][key] for s in args.seeds]
        return " / ".join(f"{v:.2f}" for v in values) + f" ({statistics.mean(values):.2f})"

    print(
        "| run | best-test round | pers. best-test | gen. best-test | global best-test "
        "| gen. val (round) |"
    )
    print("|---|---|---|---|---|---|")
    for name, label in ((n, RUNS[n]) for n in names):
        val = " / ".join(
            f"{got[name, s]['gen_val']:.2f} ({got[name, s]['val_round']})" for s in args.seeds
        )
        best = " / ".join(str(got[name, s]["best_round"]) for s in args.seeds)
        print(
            f"| {label} | {best} | {cells(name, 'pers')} | {cells(name, 'gen')} | "
            f"{cells(name, 'global')} | {val} |"
        )
    print()
    print("| pair | best-test rule | validation selection | final round |")
    print("|---|---|---|---|")
    for label, (a, b) in PAIRS.items():
        if a not in names or b not in names:
            continue
        row = []
        for key in ("gen", "gen_val", "gen_final"):
            diffs = [got[a, s][key] - got[b, s][key] for s in args.seeds]
            row.append(
                " / ".join(f"{d:+.2f}" for d in diffs) + f" (mean {statistics.mean(diffs):+.2f})"
            )
        print(f"| {label} | {' | '.join(row)} |")


if __name__ == "__main__":
    main()
