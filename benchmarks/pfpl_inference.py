"""Re-evaluate finished FedProto / PFPL runs with the other inference rule, no retraining.

FedProto and PFPL train the same way whatever `inference` says (it only changes the
evaluated model: the personal model's own head, or nearest-prototype classification from
the prototypes in the next message), so the final checkpoint of a run answers both. Prints
the final round's mean personalization accuracy for each rule, per run and mean +- std.

    python benchmarks/pfpl_inference.py runs/pfpl/n3/pfpl/s* runs/pfpl/n3/fedproto/s*
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from protofed.algorithms import build_algorithm
from protofed.runtime.simulation import resume


def evaluate(path: Path, inference: str) -> float:
    sim = resume(path)
    algo = sim.algorithm
    raw = {**algo.params.model_dump(), "inference": inference}
    sim.algorithm = build_algorithm(algo.name, raw, algo.setting)
    return sim.evaluate(sim.progress.round)["personalization"]["acc"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    table: dict[tuple[str, str], list[float]] = {}
    print("| run | inference=head | inference=prototype |")
    print("|---|---|---|")
    for run in args.runs:
        accs = {rule: evaluate(run, rule) for rule in ("head", "prototype")}
        name = run.parent.name
        for rule, acc in accs.items():
            table.setdefault((name, rule), []).append(acc)
        print(f"| {run} | {100 * accs['head']:.2f} | {100 * accs['prototype']:.2f} |")
    print("\n| algorithm | inference=head | inference=prototype | runs |")
    print("|---|---|---|---|")
    for name in sorted({k[0] for k in table}):
        cells = []
        for rule in ("head", "prototype"):
            v = table[(name, rule)]
            std = f" ± {100 * statistics.pstdev(v):.2f}" if len(v) > 1 else ""
            cells.append(f"{100 * statistics.fmean(v):.2f}{std}")
        print(f"| {name} | {' | '.join(cells)} | {len(table[(name, 'head')])} |")


if __name__ == "__main__":
    main()
