"""Comparison tables from run directories: printed, and written as Markdown and CSV."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from protofed.errors import ConfigError
from protofed.runs import SUMMARY, RunDir

SCORES = ("personalization", "generalization", "global")
COLUMNS = [
    "run", "algorithm", "dataset", "rounds", "round",
    "pers_acc", "pers_f1", "pers_f1_std", "gen_acc", "gen_f1", "gen_f1_std",
    "global_acc", "global_f1", "up_MB", "down_MB", "s_per_round",
]


def _row(path: Path, summary: dict, which: str) -> dict:
    part = summary[which]
    row: dict = {
        "run": path.name,
        "algorithm": summary.get("algorithm"),
        "dataset": summary.get("dataset"),
        "rounds": summary["rounds"],
        "round": part.get("round"),
    }
    for short, key in (("pers", "personalization"), ("gen", "generalization")):
        s = part.get(key)
        row[f"{short}_acc"] = None if s is None else s["acc"]
        row[f"{short}_f1"] = None if s is None else s["f1"]
        row[f"{short}_f1_std"] = None if s is None else s["f1_std"]
    g = part.get("global")
    row["global_acc"] = None if g is None else g["acc"]
    row["global_f1"] = None if g is None else g["f1"]
    row["up_MB"] = summary["comm"]["up_bytes"] / 1e6
    row["down_MB"] = summary["comm"]["down_bytes"] / 1e6
    row["s_per_round"] = summary["time"]["total_s"] / max(summary["rounds"], 1)
    return row


def collect(dirs: list[str | Path], which: str = "selected") -> list[dict]:
    if which not in ("selected", "final"):
        raise ConfigError(f"--which must be 'selected' or 'final', not '{which}'")
    rows = []
    for d in dirs:
        run = RunDir.open(d)
        if not run.complete:
            raise ConfigError(f"{run.path} has no {SUMMARY}: the run is unfinished (resume it)")
        rows.append(_row(run.path, run.read_json(SUMMARY), which))
    return rows


def _fmt(value, key: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if key.endswith(("acc", "f1", "std")):
            return f"{100 * value:.2f}"
        return f"{value:.2f}"
    return str(value)


def to_markdown(rows: list[dict]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in COLUMNS) + "|"
    body = ["| " + " | ".join(_fmt(r[c], c) for c in COLUMNS) + " |" for r in rows]
    note = "\nScores in percent: mean over clients (std across clients for *_std)."
    return "\n".join([head, sep, *body]) + "\n" + note + "\n"


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
