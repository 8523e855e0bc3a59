"""Comparison tables from run directories: runs found, grouped over seeds, summarised.

    runs, skipped = find_runs(["runs/fedsub_claims"])       # recursively; unfinished ones skipped
    rows = collect(runs, "selected")                          # one row per run
    groups = group_runs(rows, "auto")                         # runs that differ only in the seed
    table = summarize(groups)                                 # mean, std, n of every column
    to_markdown(table), to_csv(table)

Units are fixed everywhere (printed, Markdown, CSV): scores in percent, communication in MB
per round (up + down, all clients), time in seconds per round (wall time of the whole run /
rounds). A group's spread is the sample standard deviation over its runs (ddof = 1; no std
for a single run); `*_client_std` is the std of the clients' scores across clients within a
run (population std, as `evaluation.py` records it) - what the papers write after ±.
"""

from __future__ import annotations

import csv
import fnmatch
import io
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from protofed.config import EXECUTION_KEYS, build_config, flatten
from protofed.core.results import ReportedRound, RoundRecord, Summary
from protofed.errors import ConfigError
from protofed.runs import CONFIG, PARTITION, SUMMARY, RunDir, reading
from protofed.runs import METRICS as METRICS_FILE

# per-run columns: (name, unit, decimals); the order is the tables' order
METRICS: list[tuple[str, str, int]] = [
    ("round", "round", 0),
    ("rounds", "round", 0),
    ("pers_acc", "%", 2),
    ("pers_f1", "%", 2),
    ("pers_f1_client_std", "%", 2),
    ("gen_acc", "%", 2),
    ("gen_f1", "%", 2),
    ("gen_f1_client_std", "%", 2),
    ("global_acc", "%", 2),
    ("global_f1", "%", 2),
    ("unseen_acc", "%", 2),
    ("unseen_f1", "%", 2),
    ("unseen_f1_client_std", "%", 2),
    ("unseen_global_acc", "%", 2),
    ("unseen_global_f1", "%", 2),
    ("pers_f1_all_rounds", "%", 2),
    ("train_loss", "", 4),
    ("MB_per_round", "MB", 3),
    ("up_MB_per_round", "MB", 3),
    ("down_MB_per_round", "MB", 3),
    ("s_per_round", "s", 2),
    ("epsilon", "", 2),
]
UNITS = {name: (unit, decimals) for name, unit, decimals in METRICS}
INFO = ["algorithm", "dataset", "seed", "status"]  # per run, not averaged
COMPLETE = "complete"
# a run's status: summary.json's (complete, diverged), or `incomplete` for a complete one
# that trained fewer rounds than its config's train.rounds (stopped early, config edited)
STATUSES = (COMPLETE, "diverged", "incomplete")
CSV_DECIMALS = 6  # the CSV carries the same units with more decimals
STD_NOTE = "sample std over runs (ddof = 1), blank for n = 1"

# the seed, and the keys that say where or how fast a run ran, not what it computed
# (config.EXECUTION_KEYS): never a group key
IGNORED_KEYS = ("seed", *EXECUTION_KEYS)
# the columns the printed table keeps (a terminal is narrow; the Markdown has them all)
PRINTED = (
    "round",
    "rounds",
    "pers_acc",
    "pers_f1",
    "pers_f1_client_std",
    "gen_acc",
    "gen_f1",
    "global_acc",
    "global_f1",
    "unseen_f1",
    "MB_per_round",
    "s_per_round",
    "epsilon",
)
# the printed columns dropped first when the terminal is too narrow for the table
DROP_FIRST = (
    "s_per_round",
    "MB_per_round",
    "global_acc",
    "gen_acc",
    "pers_acc",
    "pers_f1_client_std",
    "epsilon",
    "global_f1",
    "unseen_f1",
    "gen_f1",
)
WHICH = ("selected", "final")
LABEL_FIRST = ("algorithm.name", "data.name")  # a group label starts with these keys
ABSENT = "<absent>"  # a config key this run's algorithm (or data set) does not have
_SEED_SUFFIX = re.compile(r"[_-]?s(?:eed)?\d+$")


class NotScored(LookupError):
    """A finished run without scores for the reported round: listed as skipped."""


# finding runs ----------------------------------------------------------------------------
def find_runs(paths: Iterable[str | Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The finished run directories under `paths` (each a run or a folder searched
    recursively), and the unfinished ones as (path, reason). A path that does not exist is an
    error; a folder with no run directory at all is an error."""
    runs: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    seen: set[Path] = set()

    def visit(path: Path) -> None:
        real = path.resolve()
        if real in seen:
            return
        seen.add(real)
        if (path / CONFIG).is_file():
            if (path / SUMMARY).is_file():
                runs.append(path)
            else:
                skipped.append((path, f"no {SUMMARY}: unfinished (resume it)"))
            return
        for child in sorted(path.iterdir()):
            if child.is_dir() and not child.name.startswith("."):
                visit(child)

    for p in paths:
        path = Path(p)
        if not path.is_dir():
            raise ConfigError(f"{path}: no such run directory or folder")
        if path.resolve() in seen:  # named twice, or inside a folder already searched
            continue
        found = len(runs) + len(skipped)
        visit(path)
        if len(runs) + len(skipped) == found:
            raise ConfigError(f"{path}: no run directory in it (none has {CONFIG})")
    return runs, skipped


# one row per run --------------------------------------------------------------------------
def _scored_part(
    history: list[RoundRecord], summary: Summary, which: str | int
) -> RoundRecord | ReportedRound | None:
    """The scores of the reported round: the summary's selected or final part, or the
    metrics.jsonl record of round `which`."""
    if isinstance(which, int):
        return next((r for r in history if r.round == which), None)
    return summary.selected if which == "selected" else summary.final


def parse_which(which: str | int) -> str | int:
    """'selected', 'final' or an evaluated round number."""
    if isinstance(which, int) or str(which).isdigit():
        return int(which)
    if which not in WHICH:
        raise ConfigError(f"--which must be 'selected', 'final' or a round number, not '{which}'")
    return which


def _pct(value: Any) -> float | None:
    return None if value is None else 100.0 * float(value)


def run_row(
    path: str | Path, which: str | int = "selected", name: str | None = None, domains: bool = False
) -> dict[str, Any]:
    """One run's row: scores in %, MB and s per round, plus `path` and its flat `config`.

    Raises ConfigError for an unreadable summary.json, NotScored when the reported round has
    no scores (a diverged run, a round that was not evaluated).
    """
    which = parse_which(which)
    run = RunDir.open(path)
    raw_summary = run.read_json(SUMMARY)
    raw_history = run.history()
    with reading(run.path / SUMMARY):
        summary = Summary.from_json(raw_summary)
    with reading(run.path / METRICS_FILE):
        history = [RoundRecord.from_json(r) for r in raw_history]
    source = run.path / (METRICS_FILE if isinstance(which, int) else SUMMARY)
    with reading(source):
        part = _scored_part(history, summary, which)
        if part is None:
            unscored = f"round {which} was not evaluated" if isinstance(which, int) else None
            raise NotScored(unscored or "no round scored")
        scores: dict[str, float | None] = {}
        sections = {
            "pers": part.personalization,
            "gen": part.generalization,
            "global": part.global_,
        }
        for short, s in sections.items():
            scores[f"{short}_acc"] = _pct(s.acc if s is not None else None)
            scores[f"{short}_f1"] = _pct(s.f1 if s is not None else None)
            if short != "global":
                scores[f"{short}_f1_client_std"] = _pct(s.f1_std if s is not None else None)
        # unseen users (eval.unseen_clients): the held-out clients' own models, and the
        # global model on their data; absent (None) in runs without them
        unseen = part.unseen
        mine = unseen.personalized if unseen is not None else None
        theirs = unseen.global_ if unseen is not None else None
        scores["unseen_acc"] = _pct(mine.acc if mine is not None else None)
        scores["unseen_f1"] = _pct(mine.f1 if mine is not None else None)
        scores["unseen_f1_client_std"] = _pct(mine.f1_std if mine is not None else None)
        scores["unseen_global_acc"] = _pct(theirs.acc if theirs is not None else None)
        scores["unseen_global_f1"] = _pct(theirs.f1 if theirs is not None else None)
        server = dict(part.server)
        scored_round = part.round
    rounds = max(summary.rounds, 1)
    config = flatten(_resolved(run.config()), keep_empty=False)
    up, down = summary.comm.up_bytes / 1e6, summary.comm.down_bytes / 1e6
    row: dict[str, Any] = {
        "run": name or run.path.name,
        "algorithm": summary.algorithm,
        "dataset": summary.dataset,
        "seed": summary.seed,
        "status": run_status(summary, config.get("train.rounds")),
        "round": scored_round,
        "rounds": summary.rounds,
    }
    if summary.diverged:
        row["diverged"] = summary.diverged
    row.update(scores)
    f1s = [r.personalization.f1 for r in history if r.personalization.f1 is not None]
    at = next((r for r in history if r.round == scored_round), None)
    row["pers_f1_all_rounds"] = _pct(float(np.mean(f1s))) if f1s else None
    row["train_loss"] = None if at is None else at.train_loss
    row["MB_per_round"] = (up + down) / rounds
    row["up_MB_per_round"] = up / rounds
    row["down_MB_per_round"] = down / rounds
    row["s_per_round"] = summary.time.total_s / rounds
    # what the whole run spent (privacy.enabled): every round's release counts
    privacy = summary.privacy
    row["epsilon"] = privacy.epsilon if privacy is not None else None
    if privacy is not None:  # what the number does not cover, and the audit's estimate
        row["epsilon_caveats"] = "; ".join(privacy.caveats)
        row["empirical_epsilon"] = privacy.empirical_epsilon
    if domains:  # the clients' mean personalization accuracy per natural group (domain)
        if at is None or not at.clients.pers_acc:
            raise ConfigError(f"{run.path}: no per-client scores recorded for round {row['round']}")
        for label, value in _domain_means(run, at, "pers_acc").items():
            row[f"pers_acc[{label}]"] = 100.0 * value
    for key, value in server.items():  # the server's own metrics
        if isinstance(value, int | float) and not isinstance(value, bool):
            row[f"server.{key}"] = float(value)
    row["path"] = str(run.path)
    row["config"] = config
    return row


def run_status(summary: Summary, planned: Any) -> str:
    """`diverged` (summary.json's status), `incomplete` (complete, but fewer rounds than the
    config's train.rounds), else `complete`."""
    if summary.status != COMPLETE:
        return summary.status
    if isinstance(planned, int) and summary.rounds < planned:
        return "incomplete"
    return COMPLETE


def group_status(runs: Sequence[Mapping[str, Any]]) -> str:
    """A group's status: `complete` when all its runs are, else how many are not, per kind
    (`1/2 diverged`, `1/3 diverged, 1/3 incomplete`)."""
    counts = Counter(str(r.get("status", COMPLETE)) for r in runs)
    counts.pop(COMPLETE, None)
    if not counts:
        return COMPLETE
    return ", ".join(f"{k}/{len(runs)} {status}" for status, k in sorted(counts.items()))


def _resolved(raw: dict[str, Any]) -> dict[str, Any]:
    """The run's config with today's defaults filled in, so that a key added to protofed
    after some runs were made (their config.yaml lacks it) does not split their group; the
    file as written if it no longer validates."""
    try:
        return build_config(raw).to_dict()
    except ConfigError:
        return raw


def distinct_names(paths: Sequence[Path], names: Sequence[str]) -> list[str]:
    """`names`, except that runs sharing one (scratch/fedali_s0 and pretrained/fedali_s0,
    both given as run folders) get as many of their parent folders as tell them apart: a
    table or a legend with two identical labels cannot be read."""
    out = list(names)
    for depth in range(2, max((len(p.parts) for p in paths), default=0) + 1):
        taken = Counter(out)
        clashing = [i for i, n in enumerate(out) if taken[n] > 1]
        if not clashing:
            break
        for i in clashing:
            if len(Path(out[i]).parts) < depth:
                out[i] = "/".join(paths[i].parts[-depth:])
    return out


def collect(
    paths: Sequence[str | Path],
    which: str | int = "selected",
    skipped: list[tuple[Path, str]] | None = None,
    domains: bool = False,
) -> list[dict[str, Any]]:
    """One row per finished run under `paths` (see `run_row`). Runs that are unfinished,
    diverged or did not score the reported round are appended to `skipped` with the reason;
    with `skipped` None, any of them is an error. `domains`: also `pers_acc[<domain>]`, the
    clients' mean personalization accuracy per natural group (PFPL's per-domain table)."""
    which = parse_which(which)
    runs, unfinished = find_runs(paths)
    roots = [Path(p) for p in paths]
    names = []
    for path in runs:
        root = next((r for r in roots if r != path and r in path.parents), None)
        names.append(str(path.relative_to(root)) if root is not None else path.name)
    rows, left = [], list(unfinished)
    for path, name in zip(runs, distinct_names(runs, names), strict=True):
        try:
            rows.append(run_row(path, which, name, domains))
        except NotScored as exc:
            left.append((path, str(exc)))
    if skipped is None and left:
        path, reason = left[0]
        raise ConfigError(f"{path}: {reason}")
    if skipped is not None:
        skipped.extend(left)
    if not rows:
        raise ConfigError(
            "no finished run to report" + (f" ({left[0][0]}: {left[0][1]})" if left else "")
        )
    return rows


# groups -----------------------------------------------------------------------------------
@dataclass
class Group:
    """Runs that differ only in their seed (or agree on the `--group-by` keys)."""

    label: str
    key: dict[str, Any]
    runs: list[dict[str, Any]] = field(default_factory=list)
    short: str = ""  # the figures' label: see `readable_labels`

    @property
    def n(self) -> int:
        return len(self.runs)

    def values(self, column: str) -> np.ndarray:
        """The runs' values of `column`, the missing ones left out."""
        vals = [r.get(column) for r in self.runs]
        return np.array([v for v in vals if v is not None and not math.isnan(v)], dtype=float)

    def stats(self, column: str) -> tuple[float | None, float | None]:
        """(mean, sample std with ddof = 1) over the runs; std None for fewer than 2."""
        vals = self.values(column)
        if len(vals) == 0:
            return None, None
        return float(vals.mean()), (float(vals.std(ddof=1)) if len(vals) > 1 else None)


def _text(value: Any) -> str:
    """A config value as a user writes it: true, [16, 16], 0.1; a path as its file name (a
    label never carries the folders of the machine that made the run)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and ("/" in value or "\\" in value):
        return re.split(r"[/\\]", value.rstrip("/\\"))[-1] or value
    return json.dumps(value) if isinstance(value, list | dict) else str(value)


def _strip_seed(name: str) -> str:
    parts = name.split("/")
    last = _SEED_SUFFIX.sub("", parts[-1])
    return "/".join([*parts[:-1], last] if last else parts[:-1]) or name


def group_runs(rows: list[dict[str, Any]], by: str | Sequence[str] = "auto") -> list[Group]:
    """Group the runs: "auto" (every config key but the seed and IGNORED_KEYS), "none" (one
    group per run), or a list of config keys. Groups keep the order of their first run; a
    group is labelled by the keys that differ between groups, `key=value, ...`."""
    if isinstance(by, str) and by not in ("auto", "none"):
        by = [k.strip() for k in by.split(",") if k.strip()]
    if by == "none":
        return [Group(r["run"], {}, [r]) for r in rows]
    if by == "auto":
        keys = sorted({k for r in rows for k in r["config"]} - set(IGNORED_KEYS))
    else:
        keys = list(by)
        known = {k for r in rows for k in r["config"]}
        unknown = [k for k in keys if k not in known]
        if unknown or not keys:
            raise ConfigError(
                f"--group-by: unknown config key '{unknown[0] if unknown else ''}' "
                "(auto, none, or config keys such as algorithm.name,data.alpha)"
            )
    groups: dict[str, Group] = {}
    for r in rows:  # a key one algorithm has and another lacks: ABSENT, never in a label
        key = {k: r["config"].get(k, ABSENT) for k in keys}
        ident = json.dumps(key, sort_keys=True, default=str)
        groups.setdefault(ident, Group("", key)).runs.append(r)
    out = list(groups.values())
    differ = [k for k in keys if len({json.dumps(g.key[k], default=str) for g in out}) > 1]
    differ.sort(key=lambda k: (LABEL_FIRST.index(k) if k in LABEL_FIRST else len(LABEL_FIRST), k))
    for g in out:
        if differ:
            g.label = ", ".join(f"{k}={_text(g.key[k])}" for k in differ if g.key[k] != ABSENT)
        else:  # one group: the runs' common name, seed suffix removed
            names = {_strip_seed(r["run"]) for r in g.runs}
            g.label = names.pop() if len(names) == 1 else "all runs"
    for g, short in zip(out, readable_labels(out, differ), strict=True):
        g.short = short
    return out


# the figures' labels -------------------------------------------------------------------------
def _short_keys(keys: Sequence[str]) -> dict[str, str]:
    """Each config key by its last part (`model.alp.enabled` by `alp`), with as many parts
    before it as tell apart two keys of one last part (`train.lr`, `finetune.lr`)."""

    def parts(key: str, depth: int) -> str:
        names = key.split(".")
        if names[-1] == "enabled" and len(names) > 1:
            names = names[:-1]
        return ".".join(names[-depth:])

    out = {k: parts(k, 1) for k in keys}
    for depth in range(2, max((k.count(".") + 1 for k in keys), default=1) + 1):
        taken = Counter(out.values())
        if all(taken[v] == 1 for v in out.values()):
            break
        out = {k: parts(k, depth) if taken[v] > 1 else v for k, v in out.items()}
    return out


def _short_part(key: str, short: str, value: Any) -> str:
    """One differing key in a figure's label: `fedali` (a `*.name`), `alp on` (a switch),
    `beta=0`, `init=hhar_e10.safetensors` (a path: its file name)."""
    if key.endswith(".name") or key == "name":
        return _text(value)
    if isinstance(value, bool):
        return f"{short} {'on' if value else 'off'}"
    return f"{short}={'none' if value is None else _text(value)}"


def readable_labels(groups: Sequence[Group], differ: Sequence[str]) -> list[str]:
    """The figures' label of each group: the run folders' common name without the seed suffix
    (a sweep names its runs by its entries: `fedali_pretrained_s0` -> `fedali_pretrained`)
    when each group has one and they differ; else the differing config keys in short,
    `fedali, alp on`; one group: its table label."""
    folders = []
    for g in groups:
        names = {_strip_seed(r["run"]) for r in g.runs}
        folders.append(names.pop() if len(names) == 1 else None)
    if len(groups) > 1 and None not in folders and len(set(folders)) == len(groups):
        return [str(f) for f in folders]
    shorts = _short_keys(differ)
    out = []
    for g in groups:
        parts = [_short_part(k, shorts[k], g.key[k]) for k in differ if g.key[k] != ABSENT]
        out.append(", ".join(parts) if parts else g.label)
    return out


def _names_of(group: Group) -> set[str]:
    """The run folder names a `--label` pattern is matched against: each run's name, its last
    part, and both without the seed suffix."""
    out = set()
    for r in group.runs:
        name = str(r["run"])
        for n in (name, name.rsplit("/", 1)[-1]):
            out |= {n, _strip_seed(n)}
    return out


def label_matches(key: str, group: Group) -> bool:
    """Whether a `--label KEY=TEXT` (or `labels={KEY: TEXT}`) KEY names `group`: KEY is its
    label as the table or the figures show it (exactly), or a shell pattern (`*`, `?`, `[]`)
    that matches one of its runs' folder names, with or without the seed suffix."""
    if key in (group.label, group.short):
        return True
    return any(fnmatch.fnmatchcase(n, key) for n in _names_of(group))


def relabel(groups: Sequence[Group], labels: Mapping[str, str] | None) -> list[str]:
    """The figures' label of each group: `labels[KEY]` for the group KEY names (see
    `label_matches`), else its readable label (`Group.short`). A KEY that names no group, or
    more than one, or two KEYs naming one group, is a ConfigError."""
    given = _given_labels(groups, labels)
    return [given.get(i, g.short or g.label) for i, g in enumerate(groups)]


def table_labels(groups: Sequence[Group], labels: Mapping[str, str] | None) -> list[str]:
    """The table's label of each group: `labels[KEY]` for the group KEY names (as
    `relabel`), else its table label (`Group.label`: `algorithm.name=fedavg`, or the run's
    name in a table of one run per row)."""
    given = _given_labels(groups, labels)
    return [given.get(i, g.label) for i, g in enumerate(groups)]


def _given_labels(groups: Sequence[Group], labels: Mapping[str, str] | None) -> dict[int, str]:
    """{group index: TEXT} of `labels`, checked (see `relabel`)."""
    out = [g.short or g.label for g in groups]
    given: dict[int, str] = {}
    for key, text in (labels or {}).items():
        hits = [i for i, g in enumerate(groups) if label_matches(key, g)]
        if len(hits) != 1:
            known = "; ".join(g.short or g.label for g in groups)
            what = "no group" if not hits else f"{len(hits)} groups"
            raise ConfigError(f"label '{key}' names {what} (the groups: {known})")
        if hits[0] in given:
            raise ConfigError(f"two labels for the group '{out[hits[0]]}': give one")
        given[hits[0]] = text
    for label in given.values():
        if re.search(r"(^|[\s=])(/|[A-Za-z]:\\)", label):
            raise ConfigError(f"label '{label}' is a path: give the group a name")
    return given


def parse_labels(items: Sequence[str], groups: Sequence[Group]) -> dict[str, str]:
    """`--label KEY=TEXT` options as {KEY: TEXT}. A group's label may itself hold `=`
    (`algorithm.name=fedali`): each option is split at the first `=` whose left side names a
    group (`label_matches`); TEXT may hold `=` too."""
    out: dict[str, str] = {}
    for item in items:
        cuts = [i for i, ch in enumerate(item) if ch == "="]
        key = next(
            (item[:i] for i in cuts if any(label_matches(item[:i], g) for g in groups)), None
        )
        if not cuts or not item[cuts[0] + 1 :].strip():
            raise ConfigError(f"--label '{item}': write KEY=TEXT (a group's label or run name)")
        if key is None:
            known = "; ".join(g.short or g.label for g in groups)
            raise ConfigError(f"--label '{item}': no group is named so (the groups: {known})")
        out[key] = item[len(key) + 1 :]
    return out


def n_suffixes(groups: Sequence[Group]) -> list[str]:
    """` (n=3)` after each label when the groups differ in n (the runs each mean is over),
    nothing when they agree (the caption says n once)."""
    if len({g.n for g in groups}) <= 1:
        return ["" for _ in groups]
    return [f" (n={g.n})" for g in groups]


def metric_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The per-run metric columns present: the fixed ones, the per-domain ones (in the order
    met), then the server metrics (sorted)."""
    domains = list(dict.fromkeys(k for r in rows for k in r if k.startswith("pers_acc[")))
    server = sorted({k for r in rows for k in r if k.startswith("server.")})
    return [name for name, _, _ in METRICS] + domains + server


def summarize(groups: list[Group]) -> list[dict[str, Any]]:
    """One row per group: label, algorithm, dataset, n, seeds, status, and `<metric>_mean`,
    `<metric>_std` (sample std over the group's runs, ddof = 1) of every metric."""
    all_rows = [r for g in groups for r in g.runs]
    out = []
    for g in groups:
        row: dict[str, Any] = {"group": g.label}
        for info in ("algorithm", "dataset"):
            seen = sorted({str(r.get(info)) for r in g.runs})
            row[info] = seen[0] if len(seen) == 1 else "/".join(seen)
        row["n"] = g.n
        row["seeds"] = " ".join(str(r.get("seed")) for r in g.runs)
        row["status"] = group_status(g.runs)
        for col in metric_columns(all_rows):
            row[f"{col}_mean"], row[f"{col}_std"] = g.stats(col)
        out.append(row)
    return out


# formatting --------------------------------------------------------------------------------
def _unit(column: str) -> tuple[str, int | None]:
    if column in UNITS:
        return UNITS[column]
    return UNITS.get(re.sub(r"(\[.*\])?(_mean|_std)?$", "", column), ("", None))


def format_value(value: Any, column: str) -> str:
    """One number as the tables show it: fixed decimals per unit (2 for %, 3 for MB, 2 for s,
    4 for the loss), 4 significant digits for server metrics, '-' for missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    unit, decimals = _unit(column)
    if unit == "round":  # a count: a mean over seeds may fall between rounds
        return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
    if decimals is None:
        return f"{value:.4g}"
    return f"{value:.{decimals}f}"


def is_grouped(rows: list[dict[str, Any]]) -> bool:
    return bool(rows) and "group" in rows[0]


def shown_metrics(rows: list[dict[str, Any]]) -> list[str]:
    """The metric columns of the printed and Markdown tables: those with a value somewhere."""
    grouped = is_grouped(rows)
    base = (
        [c[: -len("_mean")] for c in rows[0] if c.endswith("_mean")]
        if grouped
        else metric_columns(rows)
    )
    key = (lambda c: f"{c}_mean") if grouped else (lambda c: c)
    return [c for c in base if any(r.get(key(c)) is not None for r in rows)]


def cells(
    rows: list[dict[str, Any]], only: Sequence[str] | None = None
) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the printed and Markdown tables (the same strings in both): a
    grouped cell is `mean ± std` (std over runs), a per-run cell the run's value. `only`:
    the metric columns to keep (the printed table keeps PRINTED)."""
    metrics = [m for m in shown_metrics(rows) if only is None or m in only]
    if is_grouped(rows):
        head = ["group", "n", "status", *metrics]
        body = []
        for r in rows:
            line = [str(r["group"]), str(r["n"]), str(r.get("status", COMPLETE))]
            for m in metrics:
                mean, std = r.get(f"{m}_mean"), r.get(f"{m}_std")
                text = format_value(mean, m)
                if mean is not None and std is not None:
                    text += f" ± {format_value(std, m)}"
                line.append(text)
            body.append(line)
        return head, body
    head = ["run", *INFO, *metrics]
    body = [
        [
            str(r["run"]),
            *(str(r.get(i)) for i in INFO),
            *(format_value(r.get(m), m) for m in metrics),
        ]
        for r in rows
    ]
    return head, body


def note(rows: list[dict[str, Any]], which: str | int = "selected") -> str:
    """What the numbers are: units, the std definition, the reported round."""
    when = f"round {which}" if isinstance(which, int) else f"the {which} round"
    spread = (
        f"cells: mean ± {STD_NOTE}; n = runs (seeds) per group. "
        if is_grouped(rows)
        else "one run per row. "
    )
    return (
        f"Scores of {when}, in % (mean over clients; *_client_std: population std across "
        f"clients); {spread}MB per round (up + down, all clients), s per round (wall time); "
        "pers_f1_all_rounds: mean pers. F1 over the evaluated rounds; train_loss at the "
        "reported round; server.*: the server's metrics, 4 significant digits; rounds: the "
        "rounds each run trained; status: complete, diverged (stopped at NaN or inf) or "
        "incomplete (fewer rounds than its train.rounds): a run that stopped early is scored "
        "over the rounds it trained."
    ) + (_UNSEEN_NOTE if any(r.get(k) is not None for r in rows for k in _UNSEEN_KEYS) else "")


_UNSEEN_KEYS = ("unseen_f1", "unseen_f1_mean")
_UNSEEN_NOTE = (
    " unseen_*: the clients held out of training (eval.unseen_clients), each with the model "
    "the method gives it (after eval.finetune_epochs of its own fit; unseen_global_*: the "
    "global model), mean over them."
)


def to_markdown(rows: list[dict[str, Any]], which: str | int = "selected") -> str:
    """The report's table (`cells` of `rows`) as GitHub markdown, as report.md writes it."""
    head, body = cells(rows)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(line) + " |" for line in body]
    return "\n".join(lines) + "\n\n" + note(rows, which) + "\n"


def csv_columns(rows: list[dict[str, Any]]) -> list[str]:
    """CSV columns: grouped, `group, algorithm, dataset, n, seeds, status, <m>_mean, <m>_std`;
    per run, `run, algorithm, dataset, seed, status, <m>`, over every metric (empty ones
    too)."""
    if is_grouped(rows):
        fixed = ["group", "algorithm", "dataset", "n", "seeds", "status"]
        return fixed + [c for c in rows[0] if c.endswith(("_mean", "_std"))]
    return ["run", *INFO, *metric_columns(rows)]


def to_csv(rows: list[dict[str, Any]]) -> str:
    """The same numbers and units as the tables, with CSV_DECIMALS decimals; empty = missing."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=csv_columns(rows), extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow(
            {
                k: (round(v, CSV_DECIMALS) if isinstance(v, float) else v)
                for k, v in r.items()
                if v is not None and not (isinstance(v, float) and math.isnan(v))
            }
        )
    return buf.getvalue()


# per-domain scores -------------------------------------------------------------------------
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
    if which not in WHICH:
        raise ConfigError(f"which must be 'selected' or 'final', not '{which}'")
    with reading(run.path / SUMMARY):
        round_ = run.read_json(SUMMARY)[which]["round"]
    with reading(run.path / METRICS_FILE):
        history = [RoundRecord.from_json(r) for r in run.history()]
    record = next((r for r in history if r.round == round_), None)
    values = None if record is None else getattr(record.clients, key, None)
    if record is None or not values:
        raise ConfigError(f"{run.path}: no per-client '{key}' recorded for round {round_}")
    return _domain_means(run, record, key)


def _domain_means(run: RunDir, record: RoundRecord, key: str) -> dict[str, float]:
    """A per-client score of one metrics.jsonl record, averaged per natural group."""
    partition = run.read_json(PARTITION)
    with reading(run.path / PARTITION):
        names = (partition.get("meta") or {}).get("group_names") or []
        group = [c.get("group") for c in partition["clients"]]
    with reading(run.path / METRICS_FILE):
        scores: list[float | None] = getattr(record.clients, key)
        pairs = [
            (int(c), float(v))
            for c, v in zip(record.clients.ids, scores, strict=True)
            if v is not None and v == v  # not NaN
        ]
    values: dict[object, list[float]] = {}
    for cid, value in pairs:
        with reading(run.path / PARTITION):  # a client the partition does not have
            values.setdefault(group[cid], []).append(value)
    ordered = sorted(values, key=lambda g: (g is None, g if g is not None else 0))

    def label(g: object) -> str:
        if g is None:
            return "-"
        return names[g] if isinstance(g, int) and g < len(names) else f"group_{g}"

    return {label(g): sum(values[g]) / len(values[g]) for g in ordered}


# seed statistics that decide: --compare A B and --cd (docs/reporting.md#seed-statistics) ------
LOWER_IS_BETTER = (
    "train_loss",
    "MB_per_round",
    "up_MB_per_round",
    "down_MB_per_round",
    "s_per_round",
    "epsilon",
)
CONFIDENCE = 0.95
# the exact two-sided Wilcoxon p is at least 2 / 2^n: below 0.05 only from n = 6 on
WILCOXON_MIN_N = 6


def find_group(key: str, groups: Sequence[Group], names: Sequence[str]) -> int:
    """The index of the one group `key` names: its table label, its figures' label, a
    `--label` text, or a pattern of its run folders' names (`label_matches`)."""
    hits = [i for i, g in enumerate(groups) if key == names[i] or label_matches(key, g)]
    if len(hits) != 1:
        known = "; ".join(names)
        what = "no group" if not hits else f"{len(hits)} groups"
        raise ConfigError(f"--compare '{key}' names {what} (the groups: {known})")
    return hits[0]


def check_metric(groups: Sequence[Group], column: str) -> None:
    known = metric_columns([r for g in groups for r in g.runs])
    if column not in known:
        raise ConfigError(f"--metric '{column}' is no column of the report (pers_f1, gen_f1, ...)")


def by_seed(group: Group, name: str, column: str) -> dict[int, float]:
    """{seed: value of `column`} of a group's runs; a seed run twice, or a run without the
    value, is a ConfigError (a pairing by seed needs one number per seed)."""
    out: dict[int, float] = {}
    for r in group.runs:
        value = r.get(column)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            raise ConfigError(f"run {r['run']} of '{name}' has no {column}")
        if r["seed"] in out:
            raise ConfigError(
                f"'{name}' has two runs of seed {r['seed']}: group them apart (--group-by)"
            )
        out[int(r["seed"])] = float(value)
    return out


def _paired_seeds(maps: Sequence[dict[int, float]], names: Sequence[str]) -> list[int]:
    seeds = [sorted(m) for m in maps]
    for name, s in zip(names[1:], seeds[1:], strict=True):
        if s != seeds[0]:
            raise ConfigError(
                f"unpaired seeds: '{names[0]}' has seeds {_seeds_text(seeds[0])}, '{name}' has "
                f"{_seeds_text(s)}; runs are paired by seed: give each group the same seeds"
            )
    return seeds[0]


def _seeds_text(seeds: Sequence[int]) -> str:
    return "{" + ", ".join(map(str, seeds)) + "}"


@dataclass
class PairedComparison:
    """`--compare A B`: A - B of `column` over the seeds both ran, paired by seed."""

    a: str
    b: str
    column: str
    seeds: list[int]
    a_values: list[float]
    b_values: list[float]
    mean: float  # the mean of the per-seed differences A - B
    ci: tuple[float, float] | None  # 95 % t-interval of that mean (None: no spread)
    t: float | None  # paired t-test (scipy.stats.ttest_rel), two-sided
    t_p: float | None
    wilcoxon: float | None  # Wilcoxon signed-rank (scipy.stats.wilcoxon), two-sided
    wilcoxon_p: float | None
    notes: list[str] = field(default_factory=list)  # why a test was not run

    @property
    def diffs(self) -> list[float]:
        return [x - y for x, y in zip(self.a_values, self.b_values, strict=True)]

    @property
    def n(self) -> int:
        return len(self.seeds)

    def lines(self) -> list[str]:
        unit = _unit(self.column)[0]
        tail = f" {unit}" if unit and unit != "%" else ""
        head = (
            f"{self.column}{' (%)' if unit == '%' else ''}: '{self.a}' - '{self.b}', paired by "
            f"seed over n = {self.n} seeds {_seeds_text(self.seeds)}"
        )
        out = [head, f"mean difference {self.mean:+.4g}{tail}"]
        if self.ci is not None:
            out.append(
                f"95 % CI [{self.ci[0]:+.4g}, {self.ci[1]:+.4g}]{tail} "
                f"(t-interval, df = {self.n - 1})"
            )
        if self.t_p is not None and self.t is not None:
            out.append(
                f"paired t-test (scipy.stats.ttest_rel): t = {self.t:.4g}, p = {self.t_p:.4g}"
            )
        if self.wilcoxon_p is not None and self.wilcoxon is not None:
            out.append(
                f"Wilcoxon signed-rank (scipy.stats.wilcoxon): W = {self.wilcoxon:.4g}, "
                f"p = {self.wilcoxon_p:.4g}"
            )
        return out + self.notes

    def to_markdown(self) -> str:
        head = f"| seed | {self.a} | {self.b} | difference |\n|---:|---:|---:|---:|\n"
        body = "".join(
            f"| {s} | {x:.6g} | {y:.6g} | {x - y:+.6g} |\n"
            for s, x, y in zip(self.seeds, self.a_values, self.b_values, strict=True)
        )
        text = "\n".join(f"- {line}" for line in self.lines()[1:])
        return f"# {self.lines()[0]}\n\n{head}{body}\n{text}\n"

    def to_json(self) -> str:
        keys = ("a", "b", "column", "seeds", "a_values", "b_values", "mean", "ci", "t", "t_p")
        data = {k: getattr(self, k) for k in keys}
        data.update(
            diffs=self.diffs, wilcoxon=self.wilcoxon, wilcoxon_p=self.wilcoxon_p, notes=self.notes
        )
        return json.dumps(data, indent=2) + "\n"


def paired_comparison(
    groups: Sequence[Group], names: Sequence[str], a: str, b: str, column: str = "pers_f1"
) -> PairedComparison:
    """A - B of `column` paired by seed: mean of the per-seed differences, its 95 %
    t-interval and the paired t-test (scipy.stats.ttest_rel), and the Wilcoxon signed-rank
    test (scipy.stats.wilcoxon, exact) where n >= 6 (below, its p cannot reach 0.05)."""
    from scipy import stats

    check_metric(groups, column)
    ia, ib = find_group(a, groups, names), find_group(b, groups, names)
    if ia == ib:
        raise ConfigError(f"--compare '{a}' '{b}': both name the group '{names[ia]}'")
    pair = (names[ia], names[ib])
    maps = [by_seed(groups[i], names[i], column) for i in (ia, ib)]
    seeds = _paired_seeds(maps, pair)
    if len(seeds) < 2:
        raise ConfigError(f"--compare needs at least 2 paired seeds (got {len(seeds)})")
    xa = np.array([maps[0][s] for s in seeds])
    xb = np.array([maps[1][s] for s in seeds])
    d = xa - xb
    n = len(seeds)
    notes: list[str] = []
    ci: tuple[float, float] | None = None
    t = t_p = w = w_p = None
    if np.ptp(d) == 0:
        notes.append("no t-interval or t-test: every seed's difference is the same")
    else:
        res = stats.ttest_rel(xa, xb)
        low, high = res.confidence_interval(CONFIDENCE)
        ci, t, t_p = (float(low), float(high)), float(res.statistic), float(res.pvalue)
    if n < WILCOXON_MIN_N:
        notes.append(
            f"Wilcoxon signed-rank not run: n = {n} < {WILCOXON_MIN_N} "
            f"(its smallest two-sided p, 2/2^n, is {2 / 2**n:.3g})"
        )
    elif not d.any():
        notes.append("Wilcoxon signed-rank not run: every difference is 0")
    else:
        wres = stats.wilcoxon(xa, xb)
        w, w_p = float(wres.statistic), float(wres.pvalue)
    return PairedComparison(
        pair[0], pair[1], column, seeds, xa.tolist(), xb.tolist(), float(d.mean()),
        ci, t, t_p, w, w_p, notes,
    )  # fmt: skip


@dataclass
class RankTable:
    """`--cd`: methods ranked within each block (a data set, or a seed when the runs are on
    one data set), Friedman's test over the ranks and Nemenyi's critical difference
    (Demšar 2006)."""

    column: str
    methods: list[str]
    blocks: list[str]
    block_kind: str  # "data set" or "seed"
    scores: np.ndarray  # blocks x methods
    ranks: np.ndarray  # blocks x methods, 1 = best, ties share their mean rank
    cd: float
    friedman: float | None  # scipy.stats.friedmanchisquare: None for 2 methods
    friedman_p: float | None
    alpha: float = 1 - CONFIDENCE

    @property
    def average_ranks(self) -> np.ndarray:
        return self.ranks.mean(axis=0)

    def cliques(self) -> list[tuple[int, int]]:
        """Runs of methods (positions in the order of average rank) whose ranks lie less
        than the CD apart: Nemenyi finds no difference within each; maximal runs only."""
        r = np.sort(self.average_ranks)
        out: list[tuple[int, int]] = []
        for i in range(len(r)):
            j = max(k for k in range(i, len(r)) if r[k] - r[i] < self.cd)
            if j > i and not any(lo <= i and j <= hi for lo, hi in out):
                out.append((i, j))
        return out

    def lines(self) -> list[str]:
        order = np.argsort(self.average_ranks, kind="stable")
        out = [
            f"{self.column}: {len(self.methods)} methods ranked over {len(self.blocks)} "
            f"{self.block_kind}s (1 = best)",
            *(f"  {self.average_ranks[i]:.3f}  {self.methods[i]}" for i in order),
            f"Nemenyi critical difference (alpha = {self.alpha:.2g}): CD = {self.cd:.4g}",
        ]
        if self.friedman is None or self.friedman_p is None:
            out.append("Friedman test not run: scipy's needs 3 methods (2 here: see --compare)")
        else:
            out.append(
                f"Friedman test (scipy.stats.friedmanchisquare): chi2 = {self.friedman:.4g}, "
                f"p = {self.friedman_p:.4g}"
            )
        return out

    def to_markdown(self) -> str:
        head = f"| {self.block_kind} | " + " | ".join(self.methods) + " |\n"
        head += "|---" * (len(self.methods) + 1) + "|\n"
        body = "".join(
            f"| {b} | "
            + " | ".join(
                f"{s:.6g} ({r:g})" for s, r in zip(self.scores[i], self.ranks[i], strict=True)
            )
            + " |\n"
            for i, b in enumerate(self.blocks)
        )
        text = "\n".join(f"- {line.strip()}" for line in self.lines()[1:])
        return f"# {self.lines()[0]}\n\n{self.column} (rank) per {self.block_kind}:\n\n{head}{body}\n{text}\n"


def nemenyi_cd(k: int, n: int, alpha: float = 1 - CONFIDENCE) -> float:
    """Nemenyi's critical difference of average ranks, k methods over n blocks:
    q_alpha / sqrt(2) * sqrt(k (k + 1) / (6 n)), q_alpha the studentized range quantile
    with infinite degrees of freedom (Demšar 2006's table, computed)."""
    from scipy.stats import studentized_range

    q = float(studentized_range.ppf(1 - alpha, k, np.inf))
    return q / math.sqrt(2) * math.sqrt(k * (k + 1) / (6 * n))


def _method_name(name: str) -> str:
    parts = [p for p in name.split(", ") if not p.startswith("data.name=")]
    return ", ".join(parts)


def rank_table(groups: Sequence[Group], names: Sequence[str], column: str = "pers_f1") -> RankTable:
    """The report's groups as methods, ranked by `column` within each block: the data sets
    (each method's mean over its seeds there) when the runs span several, else the seeds
    (runs paired by seed)."""
    from scipy import stats

    check_metric(groups, column)
    datasets = list(dict.fromkeys(str(r["dataset"]) for g in groups for r in g.runs))
    if len(datasets) > 1:
        cells_: dict[tuple[str, str], float] = {}
        methods: list[str] = []
        for g, name in zip(groups, names, strict=True):
            mine = {str(r["dataset"]) for r in g.runs}
            if len(mine) > 1:
                raise ConfigError(f"'{name}' mixes data sets: group by data.name too")
            method = _method_name(name)
            if not method:
                raise ConfigError(f"'{name}' differs from the others in its data set only")
            if (method, mine.pop()) in cells_:
                raise ConfigError(f"two groups are '{method}' on one data set: --group-by")
            vals = g.values(column)
            if len(vals) < g.n:
                raise ConfigError(f"a run of '{name}' has no {column}")
            cells_[(method, str(g.runs[0]["dataset"]))] = float(vals.mean())
            methods += [] if method in methods else [method]
        for m in methods:
            for ds in datasets:
                if (m, ds) not in cells_:
                    raise ConfigError(
                        f"'{m}' has no runs on data set {ds}: ranks need every method on every one"
                    )
        blocks, kind = datasets, "data set"
        scores = np.array([[cells_[(m, ds)] for m in methods] for ds in datasets])
    else:
        methods = list(names)
        maps = [by_seed(g, n, column) for g, n in zip(groups, names, strict=True)]
        seeds = _paired_seeds(maps, names) if len(maps) > 1 else sorted(maps[0]) if maps else []
        blocks, kind = [str(s) for s in seeds], "seed"
        scores = np.array([[m[s] for m in maps] for s in seeds]).reshape(len(seeds), len(maps))
    if len(methods) < 2:
        raise ConfigError(f"--cd needs at least 2 groups to rank (got {len(methods)})")
    if len(blocks) < 2:
        raise ConfigError(f"--cd needs at least 2 {kind}s to rank over (got {len(blocks)})")
    sign = 1.0 if column in LOWER_IS_BETTER else -1.0
    ranks = np.array([stats.rankdata(sign * row) for row in scores])
    k, n = len(methods), len(blocks)
    chi = p = None
    if k >= 3:
        res = stats.friedmanchisquare(*scores.T)
        chi, p = float(res.statistic), float(res.pvalue)
    return RankTable(column, methods, blocks, kind, scores, ranks, nemenyi_cd(k, n), chi, p)
