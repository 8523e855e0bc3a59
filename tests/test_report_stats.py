"""`protofed report --compare A B` and `--cd` on real runs (3 algorithms x 3 seeds on
digits): the paired difference is the mean of the per-seed differences, its CI and p-value
are scipy's on the same numbers (read here from each summary.json), the CD diagram's average
ranks are a hand count, and bad input is one line with exit code 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from protofed.cli import app
from protofed.config import load_config
from protofed.report import Group, collect, group_runs, nemenyi_cd, rank_table
from protofed.runtime import start

runner = CliRunner()
ALGORITHMS = ("fedavg", "local", "fedper")
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_data) -> Path:
    root = tmp_path_factory.mktemp("stats")
    for algo in ALGORITHMS:
        for seed in SEEDS:
            cfg = load_config(
                None,
                [
                    "data.name=digits",
                    f"data.dir={shared_data}",
                    "data.num_clients=4",
                    "model.name=mlp",
                    "model.hidden=[16]",
                    "train.rounds=2",
                    "train.lr=0.1",
                    f"algorithm.name={algo}",
                    f"seed={seed}",
                ],
            )
            start(cfg, root / f"{algo}_s{seed}").run()
    return root


def _f1(root: Path, algo: str, key: str = "pers_f1") -> np.ndarray:
    """Per seed (0, 1, 2), from summary.json: 100 x the selected round's F1."""
    section = {"pers_f1": "personalization", "gen_f1": "generalization"}[key]
    out = []
    for seed in SEEDS:
        summary = json.loads((root / f"{algo}_s{seed}" / "summary.json").read_text())
        out.append(100 * summary["selected"][section]["f1"])
    return np.array(out)


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    text = (result.stderr or result.output).strip()
    assert len(text.splitlines()) == 1, text
    return text


@pytest.mark.integration
def test_compare_is_the_mean_paired_difference_with_scipys_ci_and_p(runs, tmp_path):
    out = tmp_path / "rep"
    result = runner.invoke(
        app, ["report", str(runs), "--out", str(out), "--compare", "fedavg", "local"]
    )
    assert result.exit_code == 0, result.output
    got = json.loads((tmp_path / "rep-compare.json").read_text())
    a, b = _f1(runs, "fedavg"), _f1(runs, "local")
    d = a - b
    assert got["seeds"] == list(SEEDS)
    assert got["a"] == "algorithm.name=fedavg" and got["b"] == "algorithm.name=local"
    assert np.allclose(got["diffs"], d)
    assert math.isclose(got["mean"], float(np.mean(d)), rel_tol=1e-12)
    n = len(SEEDS)  # the t-interval by hand, and scipy's own test
    half = stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n)
    assert np.allclose(got["ci"], [d.mean() - half, d.mean() + half], rtol=1e-9)
    ref = stats.ttest_rel(a, b)
    assert math.isclose(got["t"], ref.statistic, rel_tol=1e-9)
    assert math.isclose(got["t_p"], ref.pvalue, rel_tol=1e-9)
    assert got["wilcoxon_p"] is None  # n = 3: says so
    assert any("Wilcoxon signed-rank not run: n = 3 < 6" in s for s in got["notes"])
    printed = " ".join(result.output.split())
    assert f"mean difference {d.mean():+.4g}" in printed
    assert f"p = {ref.pvalue:.4g}" in printed
    assert "Wilcoxon signed-rank not run" in printed
    md = (tmp_path / "rep-compare.md").read_text()
    for seed, x, y in zip(SEEDS, a, b, strict=True):
        assert f"| {seed} | {x:.6g} | {y:.6g} | {x - y:+.6g} |" in md


@pytest.mark.integration
def test_compare_takes_another_metric_and_patterns(runs, tmp_path):
    out = tmp_path / "rep"
    args = ["report", str(runs), "--out", str(out), "--compare", "local*", "fedper*"]
    result = runner.invoke(app, [*args, "--metric", "gen_f1"])
    assert result.exit_code == 0, result.output
    got = json.loads((tmp_path / "rep-compare.json").read_text())
    assert got["column"] == "gen_f1"
    d = _f1(runs, "local", "gen_f1") - _f1(runs, "fedper", "gen_f1")
    assert math.isclose(got["mean"], float(d.mean()), rel_tol=1e-12)


def test_wilcoxon_runs_from_six_seeds_and_matches_scipy():
    """Six paired seeds (rows built here: the runs would be 6 more per algorithm)."""
    from protofed.report import paired_comparison

    a = [80.0, 82.5, 79.0, 85.0, 81.0, 83.5]
    b = [78.0, 83.0, 75.5, 80.0, 80.0, 79.0]

    def group(name: str, vals: list[float]) -> Group:
        rows = [{"run": f"{name}_s{s}", "seed": s, "pers_f1": v} for s, v in enumerate(vals)]
        return Group(name, {}, rows)

    got = paired_comparison([group("A", a), group("B", b)], ["A", "B"], "A", "B")
    ref = stats.wilcoxon(a, b)
    assert got.wilcoxon == ref.statistic and math.isclose(got.wilcoxon_p or 0, ref.pvalue)
    assert math.isclose(got.t_p or 0, stats.ttest_rel(a, b).pvalue)


@pytest.mark.integration
def test_cd_ranks_are_a_hand_count_over_seeds(runs, tmp_path):
    out = tmp_path / "rep"
    result = runner.invoke(app, ["report", str(runs), "--out", str(out), "--cd"])
    assert result.exit_code == 0, result.output
    for suffix in ("-cd.png", "-cd.pdf", "-cd.md"):
        assert (tmp_path / f"rep{suffix}").stat().st_size > 0
    scores = {algo: _f1(runs, algo) for algo in ALGORITHMS}
    hand = dict.fromkeys(ALGORITHMS, 0.0)  # rank 1 = the best F1 of a seed; ties share
    for i in range(len(SEEDS)):
        for algo in ALGORITHMS:
            mine = scores[algo][i]
            better = sum(scores[o][i] > mine for o in ALGORITHMS)
            tied = sum(scores[o][i] == mine for o in ALGORITHMS)
            hand[algo] += (better + 1 + better + tied) / 2 / len(SEEDS)
    groups = group_runs(collect([runs], "selected"))  # in the order of their folders
    table = rank_table(groups, [g.label for g in groups])
    assert table.block_kind == "seed" and table.blocks == ["0", "1", "2"]
    order = [g.key["algorithm.name"] for g in groups]
    assert sorted(order) == sorted(ALGORITHMS)
    assert np.allclose(table.average_ranks, [hand[a] for a in order])
    # Demšar 2006, table 5(a): q_0.05 = 2.343 for 3 methods; CD = q sqrt(k(k+1)/6N)
    assert math.isclose(table.cd, 2.343 * math.sqrt(3 * 4 / (6 * 3)), rel_tol=1e-3)
    assert math.isclose(nemenyi_cd(5, 10), 2.728 * math.sqrt(5 * 6 / 60), rel_tol=1e-3)
    ref = stats.friedmanchisquare(*(scores[a] for a in order))
    assert math.isclose(table.friedman or 0, ref.statistic)
    md = (tmp_path / "rep-cd.md").read_text()
    for algo in ALGORITHMS:
        assert f"{hand[algo]:.3f}  algorithm.name={algo}" in result.output
        assert f"algorithm.name={algo}" in md


def test_cd_over_data_sets_ranks_each_data_sets_mean():
    """Runs on two data sets: the blocks are the data sets, a method's score there its mean
    over seeds (rows built here: digits is the one built-in data set)."""

    def group(algo: str, ds: str, vals: list[float]) -> Group:
        rows = [{"run": f"{algo}_{ds}_s{s}", "seed": s, "dataset": ds, "pers_f1": v}
                for s, v in enumerate(vals)]  # fmt: skip
        return Group("", {}, rows)

    data = {
        ("a", "x"): [90.0, 92.0], ("b", "x"): [91.0, 89.0], ("c", "x"): [95.0, 95.0],
        ("a", "y"): [60.0, 62.0], ("b", "y"): [70.0, 71.0], ("c", "y"): [50.0, 52.0],
        ("a", "z"): [80.0, 80.0], ("b", "z"): [79.0, 81.0], ("c", "z"): [70.0, 70.0],
    }  # fmt: skip
    groups = [group(a, ds, v) for (a, ds), v in data.items()]
    names = [f"algorithm.name={a}, data.name={ds}" for a, ds in data]
    table = rank_table(groups, names)
    assert table.block_kind == "data set" and table.blocks == ["x", "y", "z"]
    assert table.methods == ["algorithm.name=a", "algorithm.name=b", "algorithm.name=c"]
    # x: means 91, 90, 95 -> ranks 2, 3, 1; y: 61, 70.5, 51 -> 2, 1, 3; z: 80, 80, 70 -> 1.5, 1.5, 3
    assert np.allclose(table.average_ranks, [(2 + 2 + 1.5) / 3, (3 + 1 + 1.5) / 3, (1 + 3 + 3) / 3])


@pytest.mark.integration
def test_bad_statistics_input_is_one_line_exit_2(runs, tmp_path):
    out = tmp_path / "rep"
    base = ["report", "--out", str(out)]
    one = runner.invoke(app, [*base, str(runs / "fedavg_s0"), str(runs / "fedavg_s1"), "--cd"])
    assert "at least 2 groups" in _one_line_error(one)
    single = [str(runs / f"{a}_s0") for a in ALGORITHMS]
    assert "at least 2 seeds" in _one_line_error(runner.invoke(app, [*base, *single, "--cd"]))
    unpaired = [str(runs / "fedavg_s0"), str(runs / "fedavg_s1"), str(runs / "local_s2"),
                str(runs / "local_s1")]  # fmt: skip
    for extra in (["--cd"], ["--compare", "fedavg", "local"]):
        text = _one_line_error(runner.invoke(app, [*base, *unpaired, *extra]))
        assert "unpaired seeds" in text and "{0, 1}" in text and "{1, 2}" in text
    nameless = runner.invoke(app, [*base, str(runs), "--compare", "fedavg", "nope"])
    assert "names no group" in _one_line_error(nameless)
    metric = runner.invoke(app, [*base, str(runs), "--cd", "--metric", "pers_f2"])
    assert "--metric" in _one_line_error(metric)
    assert "--metric" in _one_line_error(
        runner.invoke(app, [*base, str(runs), "--metric", "gen_f1"])
    )
    assert not list(tmp_path.glob("rep*"))  # nothing half-written


@pytest.mark.integration
def test_the_cd_diagram_draws_the_ranks_and_the_cd(runs):
    import matplotlib.pyplot as plt

    from protofed.plots.cd import cd_diagram

    groups = group_runs(collect([runs], "selected"))
    table = rank_table(groups, [g.label for g in groups])
    fig = cd_diagram(table, labels=[g.key["algorithm.name"] for g in groups])
    ax = fig.axes[0]
    texts = {t.get_text() for t in ax.texts}
    for g, rank in zip(groups, table.average_ranks, strict=True):
        assert f"{g.key['algorithm.name']} ({rank:.2f})" in texts
    assert f"CD = {table.cd:.3g}" in texts
    bars = [line.get_xdata() for line in ax.lines]
    assert any(len(x) == 2 and np.allclose(x, [1, 1 + table.cd]) for x in bars)
    for lo, hi in table.cliques():  # each joins methods less than the CD apart
        r = np.sort(table.average_ranks)
        assert r[hi] - r[lo] < table.cd
    plt.close(fig)


def test_cd_over_data_sets_needs_every_method_on_every_one():
    from protofed.errors import ConfigError

    def group(algo: str, ds: str) -> Group:
        return Group("", {}, [{"run": f"{algo}_{ds}", "seed": 0, "dataset": ds, "pers_f1": 1.0}])

    cells = [("a", "x"), ("b", "x"), ("a", "y")]
    groups = [group(a, ds) for a, ds in cells]
    names = [f"algorithm.name={a}, data.name={ds}" for a, ds in cells]
    with pytest.raises(ConfigError, match="'algorithm.name=b' has no runs on data set y"):
        rank_table(groups, names)
    mixed = Group("", {}, [*group("a", "x").runs, *group("a", "y").runs])
    with pytest.raises(ConfigError, match="mixes data sets"):
        rank_table([mixed, group("b", "x")], ["algorithm.name=a", "algorithm.name=b"])
