"""`protofed report` on real runs: grouped numbers are the runs' own (checked with numpy from
each summary.json), the printed, Markdown and CSV tables agree, figures draw those numbers,
and bad input is one line with exit code 2."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from rich.console import Console
from scipy.stats import t as student_t
from typer.testing import CliRunner

from protofed.cli import app
from protofed.config import load_config
from protofed.report import PRINTED, cells, collect, group_runs, summarize, to_csv, to_markdown
from protofed.runtime import start

runner = CliRunner()
ALGORITHMS = ("fedavg", "local")
SEEDS = (0, 1)
ROUNDS = 3
CLIENTS = 4


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, shared_data) -> Path:
    """2 configs x 2 seeds of tiny real runs in a sweep's layout (one folder nested), with a
    sweep.yaml and an unfinished run beside them."""
    root = tmp_path_factory.mktemp("sweep")
    for algo in ALGORITHMS:
        for seed in SEEDS:
            cfg = load_config(
                None,
                [
                    "data.name=digits",
                    f"data.dir={shared_data}",
                    f"data.num_clients={CLIENTS}",
                    "model.name=mlp",
                    "model.hidden=[16]",
                    f"train.rounds={ROUNDS}",
                    "train.lr=0.1",
                    f"algorithm.name={algo}",
                    f"seed={seed}",
                ],
            )
            folder = root if algo == "fedavg" else root / "more"
            start(cfg, folder / f"{algo}_s{seed}").run()
    (root / "sweep.yaml").write_text("# a sweep's record\n")
    unfinished = root / "more" / "killed_s0"
    unfinished.mkdir()
    shutil.copy(root / "fedavg_s0" / "config.yaml", unfinished / "config.yaml")
    return root


def _summaries(root: Path, algo: str) -> list[dict]:
    found = sorted(root.rglob(f"{algo}_s*/summary.json"))
    assert len(found) == len(SEEDS)
    return [json.loads(p.read_text()) for p in found]


def _expected(summaries: list[dict], value) -> tuple[float | None, float | None]:
    vals = [value(s) for s in summaries]
    if any(v is None for v in vals):
        return None, None
    arr = np.array(vals, dtype=float)
    return float(arr.mean()), float(arr.std(ddof=1))


EXPECTED = {  # column -> its value, computed here from summary.json
    "pers_acc": lambda s: 100 * s["selected"]["personalization"]["acc"],
    "pers_f1": lambda s: 100 * s["selected"]["personalization"]["f1"],
    "pers_f1_client_std": lambda s: 100 * s["selected"]["personalization"]["f1_std"],
    "gen_f1": lambda s: 100 * s["selected"]["generalization"]["f1"],
    "global_f1": lambda s: (
        None if s["selected"]["global"] is None else 100 * s["selected"]["global"]["f1"]
    ),
    "round": lambda s: s["selected"]["round"],
    "MB_per_round": lambda s: (s["comm"]["up_bytes"] + s["comm"]["down_bytes"]) / 1e6 / ROUNDS,
    "s_per_round": lambda s: s["time"]["total_s"] / ROUNDS,
}


def test_groups_are_the_seeds_of_one_config_with_numpy_statistics(sweep):
    skipped: list = []
    rows = collect([sweep], "selected", skipped)
    assert [p.name for p, _ in skipped] == ["killed_s0"]
    assert "unfinished" in skipped[0][1]
    groups = group_runs(rows, "auto")
    assert [(g.label, g.n) for g in groups] == [
        ("algorithm.name=fedavg", 2),
        ("algorithm.name=local", 2),
    ]
    table = summarize(groups)
    for algo, row in zip(ALGORITHMS, table, strict=True):
        assert row["n"] == 2 and row["algorithm"] == algo and row["seeds"] == "0 1"
        summaries = _summaries(sweep, algo)
        for column, value in EXPECTED.items():
            mean, std = _expected(summaries, value)
            if mean is None:
                assert row[f"{column}_mean"] is None and row[f"{column}_std"] is None
            else:
                assert row[f"{column}_mean"] == pytest.approx(mean, rel=1e-12), column
                assert row[f"{column}_std"] == pytest.approx(std, rel=1e-9, abs=1e-12), column
    # one group per run; explicit keys; a key nobody has is an error
    assert [g.n for g in group_runs(rows, "none")] == [1, 1, 1, 1]
    alone = group_runs(rows, "train.lr")
    assert len(alone) == 1 and alone[0].n == 4 and alone[0].label == "all runs"
    one = summarize(group_runs(rows[:1], "auto"))[0]
    assert one["n"] == 1 and one["pers_f1_std"] is None and one["group"] == "fedavg"


def _printed(output: str) -> tuple[list[str], list[list[str]]]:
    lines = [ln for ln in output.splitlines() if ln.startswith(("┃", "│"))]
    split = [[c.strip() for c in ln.strip("┃│").split("┃" if "┃" in ln else "│")] for ln in lines]
    return split[0], split[1:]


def _markdown(text: str) -> tuple[list[str], list[list[str]]]:
    lines = [ln for ln in text.splitlines() if ln.startswith("| ")]
    split = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    return split[0], split[1:]


def test_printed_markdown_and_csv_carry_the_same_numbers(sweep, tmp_path):
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["report", str(sweep), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "skipped" in result.output and "killed_s0" in result.output
    assert "sample std over runs (ddof = 1)" in result.output
    head, body = _printed(result.output)
    md_head, md_body = _markdown((out.with_suffix(".md")).read_text())
    assert "ddof = 1" in out.with_suffix(".md").read_text()
    assert len(body) == len(md_body) == 2
    for col in head:  # every printed cell is the Markdown's
        j = md_head.index(col)
        assert [r[head.index(col)] for r in body] == [r[j] for r in md_body], col
    assert set(head) - {"group", "n"} <= set(PRINTED)
    rows = list(csv.DictReader(out.with_suffix(".csv").open()))
    for row, md in zip(rows, md_body, strict=True):
        assert row["group"] == md[0] and row["n"] == md[1] == "2"
        for col in ("pers_acc", "pers_f1", "pers_f1_client_std", "gen_f1"):
            cell = md[md_head.index(col)]
            mean, std = float(row[f"{col}_mean"]), float(row[f"{col}_std"])
            assert cell == f"{mean:.2f} ± {std:.2f}", col
    assert rows[1]["global_f1_mean"] == "" and md_body[1][md_head.index("global_f1")] == "-"
    # the per-run view: one row per run, the same units
    per_run = runner.invoke(
        app, ["report", str(sweep), "--group-by", "none", "--out", str(tmp_path / "runs")]
    )
    assert per_run.exit_code == 0, per_run.output
    runs = list(csv.DictReader((tmp_path / "runs.csv").open()))
    assert [r["run"] for r in runs] == [
        "fedavg_s0",
        "fedavg_s1",
        "more/local_s0",
        "more/local_s1",
    ]
    first = json.loads((sweep / "fedavg_s0" / "summary.json").read_text())
    assert float(runs[0]["pers_f1"]) == pytest.approx(
        100 * first["selected"]["personalization"]["f1"], abs=1e-6
    )


def test_a_long_label_folds_and_leaves_every_number_whole(sweep, tmp_path, monkeypatch):
    """Runs that differ in many keys get labels wider than the table may be: the label wraps
    onto more lines, no number column is squeezed (they once shrank to nothing), and a
    name that looks like markup prints as it is."""
    # an 80-column terminal; a wide one would leave nothing to fold
    monkeypatch.setattr("protofed.cli.report.console", Console(width=80))
    long = tmp_path / ("a_run_folder_named_at_length_[lr]_" * 6)
    shutil.copytree(sweep / "fedavg_s0", long)
    out = tmp_path / "cmp"
    runs = [str(long), str(sweep / "more" / "local_s0")]
    result = runner.invoke(app, ["report", *runs, "--group-by", "none", "--out", str(out)])
    assert result.exit_code == 0, result.output
    head, body = _printed(result.output)
    md_head, md_body = _markdown(out.with_suffix(".md").read_text())
    assert set(head) <= set(md_head)
    rows = [r for r in body if r[head.index("pers_f1")]]  # a label's later lines: blank there
    assert len(rows) == 2 and len(body) > 2
    for col in set(head) - {"run"}:
        assert [r[head.index(col)] for r in rows] == [r[md_head.index(col)] for r in md_body]
    assert long.name in "".join(r[head.index("run")] for r in body)


def test_runs_of_one_name_in_two_folders_get_distinct_labels(sweep, tmp_path):
    """Two run folders given by path with the same name (a sweep's scratch/ and pretrained/
    halves) are told apart by their parent folders, in the table and so in the legends."""
    for half in ("scratch", "pretrained"):
        shutil.copytree(sweep / "fedavg_s0", tmp_path / half / "fedavg_s0")
    runs = [tmp_path / "scratch" / "fedavg_s0", tmp_path / "pretrained" / "fedavg_s0"]
    assert [r["run"] for r in collect(runs, "final")] == [
        "scratch/fedavg_s0",
        "pretrained/fedavg_s0",
    ]
    alone = collect([tmp_path / "scratch" / "fedavg_s0", sweep / "more" / "local_s0"], "final")
    assert [r["run"] for r in alone] == ["fedavg_s0", "local_s0"]


def test_a_round_number_reports_that_round(sweep):
    rows = collect([sweep / "fedavg_s0"], 2)
    record = json.loads((sweep / "fedavg_s0" / "metrics.jsonl").read_text().splitlines()[1])
    assert rows[0]["round"] == 2
    assert rows[0]["pers_f1"] == pytest.approx(100 * record["personalization"]["f1"])
    assert rows[0]["train_loss"] == pytest.approx(record["train_loss"])
    md = to_markdown(rows, 2)
    assert "round 2" in md and to_csv(rows).count("\n") == 2
    assert cells(rows)[0][:4] == ["run", "algorithm", "dataset", "seed"]
    # digits has no domains: every client is in the one group "-", its mean the run's
    by_domain = collect([sweep / "fedavg_s0"], "final", domains=True)[0]
    assert by_domain["pers_acc[-]"] == pytest.approx(by_domain["pers_acc"], rel=1e-12)
    assert "pers_acc[-]" in to_markdown([by_domain])


def _curve(root: Path, algo: str) -> np.ndarray:
    """runs x rounds personalization F1 (%), read from metrics.jsonl here."""
    out = []
    for path in sorted(root.rglob(f"{algo}_s*/metrics.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        out.append([100 * r["personalization"]["f1"] for r in records])
    return np.array(out)


def test_figures_draw_the_runs_numbers(sweep, tmp_path):
    from protofed.plots.curves import client_distributions, learning_curves, pers_vs_gen

    groups = group_runs(collect([sweep], "selected", []), "auto")
    fig = learning_curves(groups, band="ci")
    pers = fig.axes[0]
    assert (pers.get_xlabel(), pers.get_ylabel()) == ("round", "personalization macro-F1 (%)")
    labels = [ax.get_ylabel() for ax in fig.axes if ax.get_visible()]
    assert labels == [
        "personalization macro-F1 (%)",
        "generalization macro-F1 (%)",
        "global model macro-F1 (%)",
        "training loss (log scale, geometric mean)",
    ]
    assert len(pers.lines) == 2  # one per group
    bands = [c for c in pers.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2
    for algo, line, band in zip(ALGORITHMS, pers.lines, bands, strict=True):
        values = _curve(sweep, algo)
        np.testing.assert_allclose(line.get_ydata(), values.mean(0), rtol=1e-12)
        half = student_t.ppf(0.975, 1) * values.std(0, ddof=1) / np.sqrt(2)
        verts = band.get_paths()[0].vertices
        last = verts[np.isclose(verts[:, 0], ROUNDS), 1]
        lo = max(values.mean(0)[-1] - half[-1], 0.0)
        hi = min(values.mean(0)[-1] + half[-1], 100.0)
        assert last.min() == pytest.approx(lo) and last.max() == pytest.approx(hi)
    assert fig.legends and len(fig.legends[0].get_texts()) == 2
    assert "n=" not in fig.legends[0].get_texts()[0].get_text()  # one n: the caption says it

    box = client_distributions(groups)
    ax = box.axes[0]
    assert ax.get_ylabel() == "personalization macro-F1 per client (%)"
    points = [len(c.get_offsets()) for c in ax.collections if len(c.get_offsets())]
    assert points == [CLIENTS * len(SEEDS)] * 2

    scatter = pers_vs_gen(groups)
    ax = scatter.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == (
        "generalization macro-F1 (%)",
        "personalization macro-F1 (%)",
    )
    means = [c.get_offsets()[0] for c in ax.collections if len(c.get_offsets()) == 1]
    assert len(means) == 2
    assert means[0][1] == pytest.approx(groups[0].stats("pers_f1")[0])

    result = runner.invoke(
        app, ["report", str(sweep), "--plot", "--out", str(tmp_path / "fig" / "r")]
    )
    assert result.exit_code == 0, result.output
    for name in ("curves", "clients", "pers_gen"):
        png, pdf = (tmp_path / "fig" / f"r-{name}.{ext}" for ext in ("png", "pdf"))
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 1000


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    text = (result.stderr or result.output).strip()
    assert len(text.splitlines()) == 1, text
    return text


def test_bad_input_is_one_line_exit_2(sweep, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    assert "no run directory" in _one_line_error(
        runner.invoke(app, ["report", str(empty), "--out", str(out)])
    )
    assert "no such" in _one_line_error(
        runner.invoke(app, ["report", str(tmp_path / "nope"), "--out", str(out)])
    )
    broken = tmp_path / "broken"
    shutil.copytree(sweep / "fedavg_s0", broken)
    (broken / "summary.json").write_text('{"rounds": 3, "comm"')
    assert "summary.json" in _one_line_error(
        runner.invoke(app, ["report", str(sweep), str(broken), "--out", str(out)])
    )
    assert "--group-by" in _one_line_error(
        runner.invoke(app, ["report", str(sweep), "--group-by", "train.lrr", "--out", str(out)])
    )
    assert "--which" in _one_line_error(
        runner.invoke(app, ["report", str(sweep), "--which", "best", "--out", str(out)])
    )
    assert not list(tmp_path.glob("out*"))  # nothing half-written
    only_unfinished = runner.invoke(app, ["report", str(sweep / "more" / "killed_s0")])
    assert re.search("no finished run", _one_line_error(only_unfinished))


def test_files_that_parse_but_are_not_protofeds_are_one_line(sweep, tmp_path):
    """An edited, emptied or foreign summary.json, metrics.jsonl, run.json or partition.json
    names its file in one line (exit 2): never a KeyError from inside the report."""
    out = tmp_path / "out"
    damage = {
        "summary.json": ["{}", '{"rounds": 3, "comm": {}, "time": {}, "selected": "x"}'],
        "metrics.jsonl": ["7\n", '{"f1": 1}\n{"round": 1}\n', 'not json\n{"round": 1}\n'],
        "partition.json": ["[]"],
    }
    for name, texts in damage.items():
        for i, text in enumerate(texts):
            run = tmp_path / f"{name}{i}"
            shutil.copytree(sweep / "fedavg_s0", run)
            (run / name).write_text(text)
            args = ["report", str(run), "--out", str(out), "--domains"]
            assert name in _one_line_error(runner.invoke(app, args)), (name, text)
            if name == "summary.json":  # resuming a complete run prints its summary
                line = _one_line_error(runner.invoke(app, ["run", "--resume", str(run), "-q"]))
                assert name in line
    for text, expected in (("", "nothing to plot"), ('{"round": 1}\n', "metrics.jsonl")):
        run = tmp_path / f"plot{len(text)}"
        shutil.copytree(sweep / "fedavg_s0", run)
        (run / "metrics.jsonl").write_text(text)  # the table is fine, the figures are not
        line = _one_line_error(runner.invoke(app, ["report", str(run), "--plot", "-o", str(out)]))
        assert expected in line
    (tmp_path / "out-clients.pdf").mkdir()  # a blocked figure: no table, no other figure
    args = ["report", str(sweep / "fedavg_s0"), "--plot", "-o", str(out)]
    assert "out-clients.pdf is a folder" in _one_line_error(runner.invoke(app, args))
    assert not [p.name for p in tmp_path.glob("out*") if p.name != "out-clients.pdf"]
    (tmp_path / "out-clients.pdf").rmdir()
    unfinished = tmp_path / "unfinished"
    shutil.copytree(sweep / "more" / "killed_s0", unfinished)
    (unfinished / "run.json").write_text("[]")
    line = _one_line_error(runner.invoke(app, ["run", "--resume", str(unfinished), "-q"]))
    assert "run.json" in line
    assert not list(tmp_path.glob("out*"))


def test_a_run_named_twice_or_inside_a_named_folder_is_reported_once(sweep, tmp_path):
    def rows(*paths: Path) -> list[str]:
        out = tmp_path / "r"
        args = ["report", *map(str, paths), "--group-by", "none", "-o", str(out)]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        return (tmp_path / "r.csv").read_text().splitlines()

    assert rows(sweep, sweep) == rows(sweep, sweep / "fedavg_s0") == rows(sweep)
    assert rows(sweep / "fedavg_s0", sweep / "fedavg_s0") == rows(sweep / "fedavg_s0")
    assert len(rows(sweep / "fedavg_s0")) == 2  # the header and one run


def test_out_must_be_a_file_prefix(sweep, tmp_path):
    """`--out .` names no file: `..md` beside the folder, or a crash on an empty name."""
    for out in (".", "/", str(tmp_path) + "/.."):
        line = _one_line_error(runner.invoke(app, ["report", str(sweep), "--out", out]))
        assert "--out" in line and "file prefix" in line
    assert list(tmp_path.iterdir()) == []
