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

# every test reports on runs it makes first (real data)
pytestmark = pytest.mark.integration

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
    """Header and rows of the printed table; a row folded onto more lines (a `mean ± std`
    cell as `mean` over `± std`, where the terminal is narrow) is joined back, a label's
    later lines too."""
    lines = [ln for ln in output.splitlines() if ln.startswith(("┃", "│"))]
    split = [[c.strip() for c in ln.strip("┃│").split("┃" if "┃" in ln else "│")] for ln in lines]
    rows: list[list[str]] = []
    for row in split[1:]:
        if rows and row[1] == "" and any(c.startswith("± ") for c in row):
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], row, strict=True)]
        else:
            rows.append(row)
    return split[0], rows


def _markdown(text: str) -> tuple[list[str], list[list[str]]]:
    lines = [ln for ln in text.splitlines() if ln.startswith("| ")]
    split = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    return split[0], split[1:]


def test_printed_markdown_and_csv_carry_the_same_numbers(sweep, tmp_path):
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["report", str(sweep), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "skipped" in result.output and "killed_s0" in result.output
    assert "sample std over runs (ddof = 1)" in " ".join(result.output.split())
    head, body = _printed(result.output)
    md_head, md_body = _markdown((out.with_suffix(".md")).read_text())
    assert "ddof = 1" in out.with_suffix(".md").read_text()
    assert len(body) == len(md_body) == 2
    for col in head:  # every printed cell is the Markdown's
        j = md_head.index(col)
        assert [r[head.index(col)] for r in body] == [r[j] for r in md_body], col
    assert set(head) - {"group", "n", "status"} <= set(PRINTED)
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
    # an emptied or edited metrics.jsonl no longer matches the run's checksums.json
    for text, expected in (("", "metrics.jsonl"), ('{"round": 1}\n', "metrics.jsonl")):
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


# runs that stopped early: marked in the table and on the curves (issue 57) -----------------
STOP_ROUNDS = 6  # evaluated every 2 rounds: 2, 4, 6


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, shared_data) -> Path:
    """FedAvg over all its rounds beside Ditto forced to diverge in round 5 (the guard told
    that the server state holds NaN, through the runtime's own path): Ditto's summary.json
    says diverged after 4 rounds, scored at rounds 2 and 4."""
    import protofed.runtime.loop as loop

    root = tmp_path_factory.mktemp("stopped")
    base = [
        "data.name=digits",
        f"data.dir={shared_data}",
        f"data.num_clients={CLIENTS}",
        "model.name=mlp",
        "model.hidden=[16]",
        f"train.rounds={STOP_ROUNDS}",
        "train.lr=0.1",
        "train.threads=1",
        "eval.every=2",
    ]
    start(load_config(None, [*base, "algorithm.name=fedavg"]), root / "fedavg_s0").run()
    done = {"round": 0}
    real = loop.nonfinite

    def forced(records):
        return "model/forced" if done["round"] >= 4 else real(records)

    def count(r, info, record) -> None:
        done["round"] = r

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "nonfinite", forced)
        cfg = load_config(None, [*base, "algorithm.name=ditto"])
        summary = start(cfg, root / "ditto_s0").run(on_round=count)
    assert summary.status == "diverged" and summary.rounds == 4
    return root


def test_a_diverged_run_is_marked_in_every_table(stopped, tmp_path):
    """The diverged run is no ordinary row: its status and its rounds (4 of 6) are printed,
    and written to the Markdown and the CSV, grouped or one run per row."""
    rows = collect([stopped], "final")
    by_algo = {r["algorithm"]: r for r in rows}
    assert by_algo["ditto"]["status"] == "diverged" and by_algo["ditto"]["rounds"] == 4
    assert by_algo["ditto"]["round"] == 4 and "round 5" in by_algo["ditto"]["diverged"]
    assert by_algo["fedavg"]["status"] == "complete" and by_algo["fedavg"]["rounds"] == 6
    for group_by, key in (("auto", "group"), ("none", "run")):
        out = tmp_path / group_by
        args = ["report", str(stopped), "--which", "final", "--group-by", group_by]
        result = runner.invoke(app, [*args, "-o", str(out)])
        assert result.exit_code == 0, result.output
        head, body = _printed(result.output)
        md_head, md_body = _markdown(out.with_suffix(".md").read_text())
        csv_rows = list(csv.DictReader(out.with_suffix(".csv").open()))
        for h, b in ((head, body), (md_head, md_body)):
            status = {r[h.index(key)]: r[h.index("status")] for r in b}
            rounds = {r[h.index(key)]: r[h.index("rounds")] for r in b}
            ditto = next(k for k in status if "ditto" in k)
            fedavg = next(k for k in status if "fedavg" in k)
            expected = "1/1 diverged" if group_by == "auto" else "diverged"
            assert (status[ditto], rounds[ditto]) == (expected, "4"), (group_by, b)
            assert (status[fedavg], rounds[fedavg]) == ("complete", "6")
        assert {r["status"] for r in csv_rows} == {"complete", expected}


def test_a_diverged_runs_curve_ends_with_a_mark(stopped):
    """Its curve stops at its last evaluated round with an x there, the legend says so; the
    complete run's curve has none; the ticks are the evaluated rounds."""
    import matplotlib.pyplot as plt

    from protofed.plots.curves import STOP_MARKER, figures

    groups = group_runs(collect([stopped], "final"), "auto")
    drawn = figures(groups, labels={"ditto*": "Ditto", "fedavg*": "FedAvg"})
    fig = drawn["curves"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert set(legend[:2]) == {"FedAvg", "Ditto"} and "a run stopped early (diverged)" in legend
    curves = dict(zip(legend, fig.legends[0].legend_handles, strict=False))
    for ax in [ax for ax in fig.axes if ax.get_visible()]:
        marks = [ln for ln in ax.lines if ln.get_marker() == STOP_MARKER]
        assert len(marks) == 1, ax.get_ylabel()
        ditto = next(
            ln
            for ln in ax.lines
            if ln.get_color() == curves["Ditto"].get_color() and ln.get_marker() != STOP_MARKER
        )
        assert list(ditto.get_xdata()) == [2, 4]  # the curve ends where the run did
        assert marks[0].get_xdata()[0] == 4
        assert marks[0].get_ydata()[0] == pytest.approx(ditto.get_ydata()[-1])
        assert marks[0].get_color() == ditto.get_color()
        assert [t for t in ax.get_xticks()] == [2, 4, 6]  # the evaluated rounds
    # Ditto and FedAvg share the global model's curve for a while: two dash styles
    assert curves["Ditto"].get_linestyle() != curves["FedAvg"].get_linestyle()
    loss = [ax for ax in fig.axes if ax.get_visible()][-1]
    assert "as reported by each client's fit" in loss.get_title()
    assert "Ditto: the global model's loss" in " ".join(loss.get_xlabel().split())
    title = fig._suptitle.get_text()
    assert "std" not in title and "band" not in title  # n = 1: no band, none named
    pg = drawn["pers_gen"].axes[0]
    early = [c for c in pg.collections if c.get_label() == "_stopped early"]
    assert len(early) == 1 and len(early[0].get_offsets()) == 1  # Ditto's run: an x there
    ditto_row = next(r for g in groups for r in g.runs if r["algorithm"] == "ditto")
    assert list(early[0].get_offsets()[0]) == pytest.approx(
        [ditto_row["gen_f1"], ditto_row["pers_f1"]]
    )
    for f in drawn.values():
        plt.close(f)


def test_label_renames_the_tables_rows(sweep, tmp_path):
    """--label names a group in the table as in the figures, and needs no --plot."""
    out = tmp_path / "named"
    args = ["report", str(sweep), "-o", str(out), "--label", "local*=Local only"]
    result = runner.invoke(app, [*args, "--label", "algorithm.name=fedavg=FedAvg"])
    assert result.exit_code == 0, result.output
    head, body = _printed(result.output)
    assert [r[0] for r in body] == ["FedAvg", "Local only"]
    md_head, md_body = _markdown(out.with_suffix(".md").read_text())
    assert [r[0] for r in md_body] == ["FedAvg", "Local only"]
    assert [r["group"] for r in csv.DictReader(out.with_suffix(".csv").open())] == [
        "FedAvg",
        "Local only",
    ]
    per_run = runner.invoke(
        app, ["report", str(sweep), "--group-by", "none", "-o", str(out), "--label", "*_s0=first"]
    )
    assert _one_line_error_text(per_run).startswith("error: label '*_s0' names 2 groups")


def _one_line_error_text(result) -> str:
    assert result.exit_code == 2, result.output
    text = (result.stderr or result.output).strip()
    assert len(text.splitlines()) == 1, text
    return text


def test_the_printed_table_fits_the_terminal(sweep, tmp_path, monkeypatch):
    """At 80 columns every printed line fits: `mean ± std` cells fold, and columns that
    still do not fit are left out and named; the files keep every column."""
    monkeypatch.setattr("protofed.cli.report.console", Console(width=80))
    out = tmp_path / "narrow"
    result = runner.invoke(app, ["report", str(sweep), "-o", str(out)])
    assert result.exit_code == 0, result.output
    table = [ln for ln in result.output.splitlines() if ln.startswith(("┃", "│", "┏", "└"))]
    assert table and max(len(ln) for ln in table) <= 80
    head, body = _printed(result.output)
    assert {"group", "n", "status", "round", "rounds", "pers_f1"} <= set(head)
    assert "left out here for the terminal's width" in " ".join(result.output.split())
    md_head, md_body = _markdown(out.with_suffix(".md").read_text())
    assert set(PRINTED) - {"epsilon", "unseen_f1"} <= set(md_head)  # optional: not in these runs
    for col in head:  # the folded cells read back as the Markdown's
        assert [r[head.index(col)] for r in body] == [r[md_head.index(col)] for r in md_body]
