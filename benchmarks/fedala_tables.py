"""The tables of docs/results/fedala.md, from the CSVs that `protofed report` wrote.

Run directories are named `<dataset>_<setting>_<algorithm>[_<variant>]_s<seed>` (see
benchmarks/fedala_results.sh); this groups the report's rows by everything but the seed and
writes, per table, personalization accuracy as mean ± std over seeds (n = number of seeds).

Usage: python benchmarks/fedala_tables.py runs/fedala    (writes runs/fedala/tables.md)
"""

from __future__ import annotations

import csv
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

NAME = re.compile(r"^(?P<dataset>[a-z0-9]+)_(?P<setting>path|dir)_(?P<rest>.+)_s(?P<seed>\d+)$")
SETTINGS = {"path": "pathological", "dir": "Dirichlet 0.1"}
ALGORITHMS = ["fedavg", "fedprox", "ditto", "fedrep", "local", "fedper", "fedala"]


def load(report_csv: Path) -> dict[tuple[str, str, str], list[dict]]:
    """(dataset, setting, algorithm[_variant]) -> the rows of its seeds."""
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    with report_csv.open() as f:
        for row in csv.DictReader(f):
            m = NAME.match(row["run"])
            if m is None:
                raise SystemExit(
                    f"{report_csv}: run name {row['run']!r} does not follow the scheme"
                )
            groups[(m["dataset"], m["setting"], m["rest"])].append(row)
    return groups


def cell(rows: list[dict], key: str = "pers_acc", std: bool = True) -> str:
    values = [100 * float(r[key]) for r in rows if r[key] not in ("", "None")]
    if not values:
        return "-"
    if len(values) == 1 or not std:
        return f"{statistics.fmean(values):.2f}"
    return f"{statistics.fmean(values):.2f} ± {statistics.pstdev(values):.2f}"


def pivot(groups, rows_order, columns, title) -> str:
    """Rows = algorithms, columns = (dataset, setting); cells = pers. accuracy mean ± std."""
    head = "| " + " | ".join(["algorithm", *[f"{d} {SETTINGS[s]}" for d, s in columns]]) + " |"
    lines = [f"#### {title}", "", head, "|" + "---|" * (len(columns) + 1)]
    for algo in rows_order:
        cells = [cell(groups.get((d, s, algo), [])) for d, s in columns]
        if any(c != "-" for c in cells):
            lines.append("| " + " | ".join([algo, *cells]) + " |")
    seeds = sorted({len(v) for (d, s, a), v in groups.items() if (d, s) in columns})
    lines += [
        "",
        f"Seeds per cell: {', '.join(map(str, seeds))} (mean ± population std over seeds; one number = one seed).",
    ]
    return "\n".join(lines)


def ala_weights_per_p(dataset: str) -> list[tuple[int, list[str], int]]:
    """(p, layers, number of trained ALA weights) for `pflcnn` on `dataset`'s input shape."""
    import torch

    from protofed.algorithms.common.ala import ala_parameters, top_layers
    from protofed.config import ModelConfig
    from protofed.models import build_model

    shape, classes = {
        "mnist": ((1, 28, 28), 10),
        "cifar10": ((3, 32, 32), 10),
        "cifar100": ((3, 32, 32), 100),
    }[dataset]
    model = build_model(ModelConfig(name="pflcnn"), shape, classes)
    weights = {k: v for k, v in model.state_dict().items()}
    out = []
    for p in range(1, len(model.layers()) + 1):
        names = ala_parameters(model, weights, weights, p)
        count = sum(int(torch.tensor(weights[n].shape).prod()) for n in names)
        out.append((p, top_layers(model, weights, p), count))
    return out


def curves(part: Path) -> str:
    """Personalization accuracy at every evaluated round of the runs in `part` (metrics.jsonl)."""
    import json

    runs = sorted(d for d in part.glob("*_s[0-9]*") if (d / "summary.json").is_file())
    if not runs:
        return ""
    table = {
        d.name: {
            r["round"]: r["personalization"]["acc"]
            for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
        }
        for d in runs
    }
    rounds = sorted({r for v in table.values() for r in v})
    lines = [
        f"#### {part.name}: personalization accuracy (%) by round",
        "",
        "| run | " + " | ".join(map(str, rounds)) + " |",
        "|---|" + "---|" * len(rounds),
    ]
    for name, acc in table.items():
        lines.append(
            f"| {name} | "
            + " | ".join(f"{100 * acc[r]:.2f}" if r in acc else "-" for r in rounds)
            + " |"
        )
    return "\n".join(lines)


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/fedala")
    parts = []
    accept = load(root / "accept" / "report.csv")
    parts.append(
        pivot(
            accept,
            ["fedala", "fedavg", "ditto", "fedrep"],
            [("mnist", "path"), ("cifar10", "path")],
            "(a) acceptance: pathological, personalization accuracy (%)",
        )
    )
    table = load(root / "table" / "report.csv")
    cols = [(d, s) for s in ("path", "dir") for d in ("mnist", "cifar10", "cifar100")]
    parts.append(
        pivot(table, ALGORITHMS, cols, "(b) the slides' big table, personalization accuracy (%)")
    )
    plugin = (
        load(root / "plugin" / "report.csv") if (root / "plugin" / "report.csv").exists() else {}
    )
    lines = [
        "#### (c) X + ALA vs X, personalization accuracy (%)",
        "",
        "| X | setting | X | X + ALA | gain |",
        "|---|---|---|---|---|",
    ]
    for (d, s, rest), rows in sorted(plugin.items()):
        x = (
            "fedavg"
            if rest == "fedala"
            else rest[: -len("+ala")]
            if rest.endswith("+ala")
            else None
        )
        base = plugin.get((d, s, x), []) if x else []
        if not base:
            continue
        a = statistics.fmean(100 * float(r["pers_acc"]) for r in rows)
        b = statistics.fmean(100 * float(r["pers_acc"]) for r in base)
        shown = "fedavg (+ ALA = fedala)" if rest == "fedala" else x
        lines.append(f"| {shown} | {d} {SETTINGS[s]} | {b:.2f} | {a:.2f} | {a - b:+.2f} |")
    parts.append("\n".join(lines))
    sens = load(root / "sens" / "report.csv") if (root / "sens" / "report.csv").exists() else {}
    for key, label in (("p", "p (s = 80)"), ("s", "s (p = 1)")):
        found = []
        for (d, s, rest), rows in sens.items():
            m = re.fullmatch(rf"fedala_{key}(\d+)", rest)
            if m:
                found.append((int(m[1]), d, s, rows))
        found.sort()
        if not found:
            continue
        d, s = found[0][1], found[0][2]
        header = f"| {key} | " + " | ".join(str(v) for v, *_ in found) + " |"
        lines = [
            f"#### (d) sensitivity to {label}: FedALA on {d} {SETTINGS[s]}",
            "",
            header,
            "|---|" + "---|" * len(found),
            "| pers. acc (%) | " + " | ".join(cell(r, std=False) for *_, r in found) + " |",
        ]
        if key == "p":
            counts = {p: n for p, _, n in ala_weights_per_p(d)}
            lines.append(
                "| trained ALA weights | " + " | ".join(f"{counts[v]:,}" for v, *_ in found) + " |"
            )
            lines.append(
                "| s / round | "
                + " | ".join(f"{float(r[0]['s_per_round']):.1f}" for *_, r in found)
                + " |"
            )
            lines += [
                "",
                "Layers per p: "
                + "; ".join(
                    f"p = {p}: {', '.join(layers)}" for p, layers, _ in ala_weights_per_p(d)
                )
                + ".",
            ]
        parts.append("\n".join(lines))
    parts.append(curves(root / "long"))
    text = "\n\n".join(p for p in parts if p) + "\n"
    (root / "tables.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
