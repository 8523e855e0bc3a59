"""Does PFPL's k_im put its weight on same-domain clients? Measured on a finished run.

PFPL's argument (section 3.2) is that prototypes of the same domain lie nearer, so weights
that fall with distance give a client's personalized prototype mostly same-domain knowledge.
From the final server state of a `pfpl` run (every client's latest local prototypes) and the
partition's domains, this prints, per weighting rule, the mean over (client, class) pairs that
have neighbours of the weight k_im put on neighbours of the client's own domain; "uniform"
(every neighbour alike) is the share of same-domain neighbours, the chance level.

    python benchmarks/pfpl_domain_weights.py runs/pfpl/n3/pfpl/s0 [...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from protofed.algorithms.pfpl import neighbour_weights

RULES = ("uniform", "inverse", "softmax", "literal")


def same_domain_mass(path: Path) -> dict[str, float]:
    server = torch.load(path / "checkpoint.pt", weights_only=True)["server"]
    means, counts = server["means"], server["counts"]
    groups = torch.tensor([c["group"] for c in json.loads((path / "partition.json").read_text())["clients"]])
    mass: dict[str, list[float]] = {r: [] for r in RULES}
    for i in range(len(means)):
        for k in torch.nonzero(counts[i] > 0).flatten().tolist():
            others = counts[:, k] > 0
            others[i] = False
            if not bool(others.any()):
                continue
            same = (groups[others] == groups[i]).double()
            d = ((means[others, k] - means[i, k]) ** 2).sum(-1)
            mass["uniform"].append(float(same.mean()))
            for rule in RULES[1:]:
                mass[rule].append(float((neighbour_weights(d, rule).double() * same).sum()))
    return {r: sum(v) / len(v) for r, v in mass.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    print("| run | " + " | ".join(RULES) + " |")
    print("|---|" + "---|" * len(RULES))
    for run in args.runs:
        m = same_domain_mass(run)
        print(f"| {run} | " + " | ".join(f"{100 * m[r]:.1f}" for r in RULES) + " |")


if __name__ == "__main__":
    main()
