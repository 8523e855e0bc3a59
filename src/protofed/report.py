"""Comparison tables from run directories: printed, and written as Markdown and CSV."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from protofed.errors import ConfigError
from protofed.runs import PARTITION, SUMMARY, RunDir

SCORES = ("personalization", "generalization", "global")
COLUMNS = [
    "run",
    "algorithm",
    "dataset",
    "rounds",
    "round",
    "pers_acc",
    "pers_f1",
    "pers_f1_std",
    "gen_acc",
    "gen_f1",
    "gen_f1_std",
    "global_acc",
    "global_f1",
    "up_MB",
    "down_MB",
    "s_per_round",
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
    for key, value in (part.get("server") or {}).items():  # the server's own metrics
        row[f"server.{key}"] = value
    return row


def columns(rows: list[dict]) -> list[str]:
    """The fixed columns, then the server metrics any run reports (sorted)."""
    extra = sorted({k for r in rows for k in r if k.startswith("server.")})
    return [*COLUMNS, *extra]


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


def group_scores(
    path: str | Path, which: str = "selected", key: str = "pers_acc"
) -> dict[str, float]:
    """One per-client score averaged within each natural group (domain, site), for one round.

    The round is the run's selected (or final) one; the per-client values come from its
    `metrics.jsonl` record (`clients`), each client's group from `partition.json`. Groups are
    named by the data set's group names where it has them (PFPL's per-domain Table 1).
    Clients without a group fall under "-"; NaN scores (no test data) are skipped.
    """
    run = RunDir.open(path)
    if not run.complete:
        raise ConfigError(f"{run.path} has no {SUMMARY}: the run is unfinished (resume it)")
    if which not in ("selected", "final"):
        raise ConfigError(f"which must be 'selected' or 'final', not '{which}'")
    round_ = run.read_json(SUMMARY)[which]["round"]
    record = next((r for r in run.history() if r["round"] == round_), None)
    if record is None or key not in record.get("clients", {}):
        raise ConfigError(f"{run.path}: no per-client '{key}' recorded for round {round_}")
    partition = run.read_json(PARTITION)
    names = (partition.get("meta") or {}).get("group_names") or []
    values: dict[object, list[float]] = {}
    for client, value in zip(partition["clients"], record["clients"][key], strict=True):
        if value is not None and value == value:  # not NaN
            values.setdefault(client.get("group"), []).append(float(value))
    ordered = sorted(values, key=lambda g: (g is None, g if g is not None else 0))

    def label(g: object) -> str:
        if g is None:
            return "-"
        return names[g] if isinstance(g, int) and g < len(names) else f"group_{g}"

    return {label(g): sum(values[g]) / len(values[g]) for g in ordered}


def format_value(value, key: str) -> str:
    """A table cell: scores in percent, other floats with two decimals, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if key.endswith(("acc", "f1", "std")):
            return f"{100 * value:.2f}"
        return f"{value:.2f}"
    return str(value)


def to_markdown(rows: list[dict]) -> str:
    cols = columns(rows)
    head = "| " + " | ".join(cols) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    body = ["| " + " | ".join(format_value(r.get(c), c) for c in cols) + " |" for r in rows]
    note = "\nScores in percent: mean over clients (std across clients for *_std)."
    return "\n".join([head, sep, *body]) + "\n" + note + "\n"


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns(rows))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
