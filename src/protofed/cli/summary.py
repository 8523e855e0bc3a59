"""A finished run's summary as the commands print it: the scores table, the cost line, the
warnings; and the one line of a run that diverged."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.table import Table

from protofed.cli.common import EXIT_DIVERGED, console, err_console, pct
from protofed.core.caveats import NOT_A_GUARANTEE, stated

SummaryView = tuple[Table, str, list[str]]


def finished_view(run_dir: Path, diverged_then: str) -> SummaryView:
    """A finished run's summary view, from its summary.json; for a run that diverged, its
    line (ending with `diverged_then`) and exit code instead."""
    from protofed.runs import SUMMARY, RunDir, reading

    existing = RunDir.open(run_dir)
    with reading(existing.path / SUMMARY):
        summary = existing.read_json(SUMMARY)
        if summary.get("status") == "diverged":  # over: its state is not finite
            exit_diverged(summary, diverged_then)
        return summary_view(summary)


def exit_diverged(summary: dict[str, Any], then: str) -> NoReturn:
    """A diverged run's one line (what diverged; `then`), and its exit code."""
    err_console.print(
        f"[bold red]diverged:[/] {summary['diverged']}; {then}", highlight=False, soft_wrap=True
    )
    raise typer.Exit(code=EXIT_DIVERGED)


def summary_view(summary: dict[str, Any]) -> SummaryView:
    """The scores table, the time and traffic line, the warnings (built before printing, so
    a damaged summary.json fails before anything is shown)."""
    sel = summary["selected"]
    table = Table(
        title=f"{summary['algorithm']} on {summary['dataset']}: "
        f"{summary['num_clients']} clients, {summary['rounds']} rounds",
        caption=f"%, mean ± std across clients; last = round {summary['final']['round']}, "
        f"sel = round {sel['round']} ({sel['rule']} rule)"
        + ("; one model: every client holds the same model" if _one_model_in(summary) else ""),
    )
    table.add_column("score", no_wrap=True)
    for when in ("last", "sel"):
        table.add_column(f"{when} acc", justify="right", no_wrap=True)
        table.add_column(f"{when} F1", justify="right", no_wrap=True)
    for key in ("personalization", "generalization", "global"):
        cells = []
        for part in (summary["final"][key], sel[key]):
            if part is None:
                cells += ["-", "-"]
            elif key == "generalization" and one_model(part):
                cells += [pct(part["acc"]), f"{pct(part['f1'])} (one model)"]
            else:
                cells += [pct(part["acc"]), f"{pct(part['f1'])} ± {pct(part['f1_std'])}"]
        table.add_row(key, *cells)
    if summary["final"].get("unseen"):  # eval.unseen_clients: held out of training
        epochs = summary["final"]["unseen"].get("finetune_epochs", 0)
        for label, key in (
            (f"unseen (fine-tuned {epochs} ep)", "personalized"),
            ("unseen global", "global"),
        ):
            cells = []
            for part in (summary["final"]["unseen"].get(key), (sel.get("unseen") or {}).get(key)):
                if not part:
                    cells += ["-", "-"]
                else:
                    cells += [pct(part["acc"]), f"{pct(part['f1'])} ± {pct(part['f1_std'])}"]
            table.add_row(label, *cells)
    t, c = summary["time"], summary["comm"]
    cost = (
        f"time {t['total_s']:.1f} s (train {t['train_s']:.1f}, eval {t['eval_s']:.1f}); "
        f"communication up {c['up_bytes'] / 1e6:.2f} MB, down {c['down_bytes'] / 1e6:.2f} MB"
    )
    if scoring := summary.get("scoring"):  # the scores are not computed the default way
        cost += "\nscoring: " + ", ".join(
            f"{key}={_text(rule.get('value'))} (default {_text(rule.get('default'))})"
            for key, rule in scoring.items()
        )
    if (privacy := summary.get("privacy")) is not None:
        spent = "inf" if privacy["epsilon"] is None else f"{privacy['epsilon']:.3g}"
        cost += (
            f"\nprivacy ({privacy['mode']}): epsilon {spent} at delta {privacy['delta']:g}, "
            f"noise multiplier {privacy['noise_multiplier']:.3g}, clip norm "
            f"{privacy['clip_norm']:.3g}, {privacy.get('accountant', 'rdp')} accountant"
        )
        if privacy.get("empirical_epsilon") is not None:
            cost += (
                f"; audit: empirical epsilon {privacy['empirical_epsilon']:.3g} from "
                f"{privacy['audit_canaries']} canaries"
            )
        for caveat in stated(privacy):
            said = (
                f"epsilon is {caveat}" if caveat == NOT_A_GUARANTEE else f"epsilon holds {caveat}"
            )
            cost += "\n  " + said
    return table, cost, [str(w) for w in summary.get("warnings", [])]


def _text(value: Any) -> str:
    """A config value as a `-s` override writes it (None as null)."""
    return "null" if value is None else str(value)


def one_model(part: dict[str, Any]) -> bool:
    """Whether a generalization score came from one model: every client scored the same
    accuracy and F1 on the same sample (FedAvg's: every client holds the global model), so
    its spread across clients says nothing and is not shown."""
    stds = (part.get("acc_std"), part.get("f1_std"))
    return all(isinstance(v, int | float) and abs(v) < 1e-9 for v in stds)


def _one_model_in(summary: dict[str, Any]) -> bool:
    parts = (summary["final"].get("generalization"), summary["selected"].get("generalization"))
    return any(isinstance(p, dict) and one_model(p) for p in parts)


def print_summary(view: SummaryView, run_dir: Path | None = None) -> None:
    table, cost, warnings = view
    console.print(table)
    console.print(cost, highlight=False)
    for warning in warnings:
        err_console.print(f"[bold yellow]warning:[/] {warning}", highlight=False)
    if run_dir is not None:
        console.print(f"run directory: {run_dir}", highlight=False)
