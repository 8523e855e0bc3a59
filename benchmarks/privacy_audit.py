"""The privacy audit's grid: the empirical epsilon beside the accounted one, every point.

For every setting of (mode, sampling, adaptive clipping, algorithm) and seed, one private run
with `privacy.audit` canaries (docs/privacy.md, "The audit"): the table gives the accounted
epsilon and the audit's estimate, and the script exits 1 if any estimate exceeds its
accounted epsilon. Noise is secure (the default), so two sittings differ.

    python benchmarks/privacy_audit.py --out benchmarks/out/privacy_audit.md

The default federation is the digits data set that ships with protofed (no download), 6
clients, 3 rounds, sigma 1, 32 canaries inserted and 32 held out; `--set KEY=VALUE` adds
overrides (e.g. a real data set).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

from protofed.config import load_config
from protofed.errors import ConfigError
from protofed.runtime import prepare, simulate

BASE = [
    "data.name=digits",
    "data.num_clients=6",
    "model.hidden=[32]",
    "train.rounds=3",
    "train.lr=0.1",
    "train.momentum=0.9",
    "train.local_epochs=2",
    "data.standardize=true",
    "train.threads=1",
    "train.workers=1",
    "eval.every=3",
    "privacy.enabled=true",
    "privacy.noise_multiplier=1",
]
GRID = {
    "mode": ["central", "local"],
    "sampling": ["fixed", "poisson"],
    "adaptive": ["false", "true"],
    "algorithm": ["fedavg", "fedproto"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--canaries", type=int, default=32)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=None, help="Markdown table file")
    args = parser.parse_args()
    rows = ["| mode | sampling | adaptive | algorithm | seed | accounted | empirical |"]
    rows.append("|" + "---|" * 7)
    worst = 0.0
    started = time.perf_counter()
    for mode, sampling, adaptive, algorithm in itertools.product(*GRID.values()):
        for seed in range(args.seeds):
            overrides = [
                *BASE,
                f"privacy.mode={mode}",
                f"privacy.sampling={sampling}",
                f"privacy.adaptive={adaptive}",
                "privacy.count_noise=2",
                f"algorithm.name={algorithm}",
                f"seed={seed}",
                f"privacy.audit={args.canaries}",
                "train.clients_per_round=3" if sampling == "poisson" else "train.client_fraction=1",
                *args.set,
            ]
            if adaptive == "false":
                overrides.remove("privacy.count_noise=2")
            try:
                summary = simulate(prepare(load_config(None, overrides))).run()
            except ConfigError as err:  # e.g. adaptive clipping in local mode
                print(f"skipped {mode} {sampling} adaptive={adaptive} {algorithm}: {err}")
                break
            privacy = summary.privacy
            assert privacy is not None and privacy.epsilon is not None
            empirical = privacy.empirical_epsilon or 0.0
            worst = max(worst, empirical / privacy.epsilon)
            row = (
                f"| {mode} | {sampling} | {adaptive} | {algorithm} | {seed} | "
                f"{privacy.epsilon:.2f} | {empirical:.2f} |"
            )
            rows.append(row)
            print(row, flush=True)
    table = "\n".join(rows)
    took = time.perf_counter() - started
    footer = f"\nlargest empirical / accounted: {worst:.2f}; {took:.0f} s"
    print(footer)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table + "\n" + footer + "\n")
    return 0 if worst <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
