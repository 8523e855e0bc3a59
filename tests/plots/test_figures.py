"""The partition heat map, kept prototypes and the t-SNE figures (docs/figures.md), on real
data: what each figure draws is the run's numbers, and keeping prototypes changes none."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from protofed.api import Run
from protofed.cli import app
from protofed.config import load_config
from protofed.core.results import RoundInfo, RoundRecord
from protofed.data import build_federated
from protofed.plots import save_figure
from protofed.plots.embed import (
    EMBED_STREAM,
    embedding_figure,
    federation,
    other_clients,
    tsne,
)
from protofed.plots.heatmap import HEATMAP, client_domains, partition_figure
from protofed.runtime import resume, start
from protofed.runtime.kept_prototypes import read_kept

runner = CliRunner()
SMALL = [
    "data.name=digits",
    "data.num_clients=4",
    "model.name=mlp",
    "model.hidden=[16]",
    "train.rounds=4",
    "train.lr=0.1",
    "train.threads=1",  # tiny models: threads only spin against each other on 2 cores
]
KEEP = "eval.keep_prototypes_every=2"


def _sets(overrides: list[str]) -> list[str]:
    return [arg for item in overrides for arg in ("-s", item)]


def _heatmap(fig):
    return next(ax for ax in fig.axes if ax.get_label() == HEATMAP)


def _without_time(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "time"}


def _records_without_time(path: Path) -> list[dict]:
    lines = (path / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in lines]


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """PFPL with and without kept prototypes, PFPL kept and killed after round 2 then
    resumed, and FedProto kept (it has global prototypes)."""
    root = tmp_path_factory.mktemp("figures")
    threads = torch.get_num_threads()  # train.threads sets it for the process: restored below
    out = {}
    for name, extra in (
        ("plain", ["algorithm.name=pfpl"]),
        ("kept", ["algorithm.name=pfpl", KEEP]),
        ("fedproto", ["algorithm.name=fedproto", KEEP]),
    ):
        out[name] = root / name
        start(load_config(None, [*SMALL, *extra]), out[name]).run()

    def kill(r: int, info: RoundInfo, record: RoundRecord | None) -> None:
        if r == 2:
            raise Killed

    out["resumed"] = root / "resumed"
    with pytest.raises(Killed):
        cfg = load_config(None, [*SMALL, "algorithm.name=pfpl", KEEP])
        start(cfg, out["resumed"]).run(on_round=kill)
    assert sorted(p.name for p in (out["resumed"] / "prototypes").iterdir()) == ["round_0002.npz"]
    resume(out["resumed"]).run()
    torch.set_num_threads(threads)
    return out


# partition --plot -----------------------------------------------------------------------
@pytest.mark.integration
def test_partition_plot_draws_the_counts_matrix(tmp_path):
    prefix = tmp_path / "part"
    sets = [*SMALL, "data.num_clients=6", "data.partition=dirichlet", "data.alpha=0.3"]
    result = runner.invoke(app, ["partition", *_sets(sets), "--plot", "--out", str(prefix)])
    assert result.exit_code == 0, result.output
    assert "client_005" in result.output  # the table is still printed
    for suffix in ("png", "pdf"):
        path = tmp_path / f"part.{suffix}"
        assert path.stat().st_size > 1000, path
    assert (tmp_path / "part.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "blocked.pdf").mkdir()  # no PNG written beside a PDF that cannot be
    result = runner.invoke(
        app, ["partition", *_sets(sets), "--plot", "-o", str(tmp_path / "blocked")]
    )
    assert result.exit_code == 2 and "blocked.pdf is a folder" in result.output
    assert not (tmp_path / "blocked.png").exists()

    fed = build_federated(load_config(None, sets).data, 0)
    fig = partition_figure(fed)
    ax = _heatmap(fig)
    drawn = np.asarray(ax.images[0].get_array())
    np.testing.assert_array_equal(drawn, fed.counts)
    assert drawn.shape == (6, 10) and drawn.sum() == 1797  # every digits sample, once
    assert ax.get_xlabel() == "class" and ax.get_ylabel().startswith("client")
    assert [t.get_text() for t in ax.get_xticklabels()] == fed.class_names
    assert [t.get_text() for t in ax.get_yticklabels()] == [c.name for c in fed.clients]
    annotated = {t.get_text() for t in ax.texts}
    assert {str(int(v)) for v in fed.counts.flat if v} == annotated  # every nonzero cell
    assert fig.axes[1].get_ylabel() == "samples (train + val + test)"  # the colour bar
    assert client_domains(fed) is None  # digits has no domains


def test_partition_plot_of_a_large_federation_has_no_numbers(tmp_path):
    sets = [*SMALL, "data.num_clients=120", "data.partition=iid"]
    fed = build_federated(load_config(None, sets).data, 0)
    ax = _heatmap(partition_figure(fed))
    assert len(ax.texts) == 0 and len(ax.get_yticklabels()) <= 20
    assert np.asarray(ax.images[0].get_array()).shape == (120, 10)


@pytest.mark.integration
def test_partition_plot_shows_each_clients_domain(shared_data, tmp_path):
    sets = [
        "data.name=office_caltech",
        f"data.dir={shared_data}",
        "data.partition=mixed",
        "data.num_clients=8",
        "data.classes_per_client=2",
    ]
    fed = build_federated(load_config(None, sets).data, 0)
    index, names = client_domains(fed)
    used = sorted({c.group for c in fed.clients})
    assert len(used) == 4 and names == [fed.meta["group_names"][g] for g in used]
    assert [names[k] for k in index] == [fed.meta["group_names"][c.group] for c in fed.clients]
    fig = partition_figure(fed)
    ax = _heatmap(fig)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == names
    strip = [line.get_color() for line in ax.get_lines()]  # one coloured cell per client
    assert len(strip) == 8 and len(set(map(str, strip))) == len(set(index))
    assert all(p.stat().st_size > 1000 for p in save_figure(fig, tmp_path / "oc"))


# eval.keep_prototypes_every --------------------------------------------------------------
@pytest.mark.integration
def test_kept_prototypes_have_the_runs_shapes(runs):
    fed = federation(Run(runs["fedproto"]))
    train = fed.counts_by_split()["train"]
    kept = read_kept(runs["fedproto"])
    assert sorted(kept) == [2, 4]
    for sets in kept.values():
        assert sorted(sets) == ["client_0", "client_1", "client_2", "client_3", "global"]
        glob, glob_ids = sets["global"]
        assert glob.shape == (len(glob_ids), 16) and glob.dtype == np.float32
        np.testing.assert_array_equal(glob_ids, np.flatnonzero(train.sum(0)))  # eq. 6's classes
        for k in range(4):
            rows, ids = sets[f"client_{k}"]
            np.testing.assert_array_equal(ids, np.flatnonzero(train[k]))
            assert rows.shape == (len(ids), 16) and np.isfinite(rows).all()
    # the count-weighted mean of the clients' prototypes is the global one (FedProto eq. 6)
    last = kept[4]
    dense = np.zeros((4, 10, 16))
    for k in range(4):
        rows, ids = last[f"client_{k}"]
        dense[k, ids] = rows
    merged = (dense * train[:, :, None]).sum(0) / train.sum(0)[:, None]
    np.testing.assert_allclose(last["global"][0], merged[last["global"][1]], atol=1e-5)
    with np.load(runs["fedproto"] / "prototypes" / "round_0004.npz", allow_pickle=False) as f:
        assert int(f["round"]) == 4


@pytest.mark.integration
def test_keeping_prototypes_changes_no_number_and_survives_resume(runs):
    plain, kept, resumed = (Run(runs[k]) for k in ("plain", "kept", "resumed"))
    assert not (runs["plain"] / "prototypes").exists()
    assert _without_time(kept.summary.as_dict()) == _without_time(plain.summary.as_dict())
    assert _records_without_time(runs["kept"]) == _records_without_time(runs["plain"])
    assert _without_time(resumed.summary.as_dict()) == _without_time(kept.summary.as_dict())
    for name in ("round_0002.npz", "round_0004.npz"):  # round 2 written before the kill
        a, b = (np.load(r / "prototypes" / name) for r in (runs["kept"], runs["resumed"]))
        assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)
    # PFPL keeps no global set: its clients' prototypes are the server's bank
    assert sorted(read_kept(runs["kept"])[4]) == [f"client_{k}" for k in range(4)]


@pytest.mark.integration
def test_damaged_kept_prototypes_are_one_line(runs, tmp_path):
    """Files of two runs mixed in one folder, NaN prototypes, or an object array: named,
    never unpickled."""
    import shutil

    from protofed.errors import ConfigError
    from protofed.plots.embed import prototype_figure

    mixed = tmp_path / "mixed"
    shutil.copytree(runs["fedproto"], mixed)
    with np.load(mixed / "prototypes" / "round_0004.npz", allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    original = arrays["global"]
    arrays["global"] = np.zeros((len(arrays["global_classes"]), 8), np.float32)
    np.savez(mixed / "prototypes" / "round_0004.npz", **arrays)
    with pytest.raises(ConfigError, match="differ in width"):
        prototype_figure(mixed)
    arrays["global"] = np.full(original.shape, np.nan, np.float32)
    np.savez(mixed / "prototypes" / "round_0004.npz", **arrays)
    with pytest.raises(ConfigError, match="round 4's global prototypes are not all finite"):
        prototype_figure(mixed)  # before: a raw error from inside t-SNE
    with pytest.raises(ConfigError, match="1 of the 3 points to map hold NaN"):
        tsne(np.array([[0.0, 1.0], [np.inf, 0.0], [1.0, 1.0]]), seed=0)
    np.savez(mixed / "prototypes" / "round_0004.npz", global_=np.array([{}], dtype=object))
    with pytest.raises(ConfigError, match="never unpickled") as caught:
        read_kept(mixed)
    assert "allow_pickle" not in str(caught.value)


# embed ----------------------------------------------------------------------------------
@pytest.mark.integration
def test_embed_draws_own_and_other_clients_test_data(runs, tmp_path):
    fed = federation(Run(runs["kept"]))
    fig = embedding_figure(runs["kept"], client=1, others=2, max_points=60)
    ax = fig.axes[0]
    other, own = (np.asarray(c.get_offsets()) for c in ax.collections)
    chosen = other_clients(0, 1, 4, 2)
    assert len(chosen) == 2 and 1 not in chosen
    sizes = [min(60, len(c.test_y)) for c in fed.clients]
    assert len(own) == sizes[1] and len(other) == sum(sizes[k] for k in chosen)
    assert np.isfinite(own).all() and np.isfinite(other).all()
    classes = set()
    for k in [1, *chosen]:
        classes |= set(fed.clients[k].test_y.tolist())
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["own data", "other clients", *(fed.class_names[k] for k in sorted(classes))]
    paths = save_figure(fig, tmp_path / "embed")
    assert all(p.stat().st_size > 1000 for p in paths)

    result = runner.invoke(
        app, ["embed", str(runs["fedproto"]), "--prototypes", "--out", str(tmp_path / "protos")]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "protos.png").stat().st_size > 1000


@pytest.mark.integration
def test_embed_prototypes_of_a_run_that_kept_none_is_one_line_exit_2(runs):
    result = runner.invoke(app, ["embed", str(runs["plain"]), "--prototypes"])
    text = (result.stderr or result.output).strip()
    assert result.exit_code == 2, (result.output, result.exception)
    assert len(text.splitlines()) == 1 and "eval.keep_prototypes_every" in text, text


def test_a_negative_keep_prototypes_every_is_one_line_exit_2(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["run", "-q", "--out", str(out), *_sets([*SMALL, "eval.keep_prototypes_every=-1"])]
    )
    text = (result.stderr or result.output).strip()
    assert result.exit_code == 2 and "eval.keep_prototypes_every" in text, text
    assert len(text.splitlines()) == 1 and not out.exists()


def test_nearest_own_agreement_counts_the_others_whose_nearest_own_point_shares_the_class():
    from protofed.plots.embed import nearest_own_agreement

    points = np.array([[0.0], [10.0], [1.0], [9.0], [4.0]])
    labels = np.array([0, 1, 0, 0, 1])
    own = np.array([True, True, False, False, False])
    # 1.0 -> own 0.0 (class 0: agrees); 9.0 -> own 10.0 (class 1: not); 4.0 -> 0.0 (not)
    assert nearest_own_agreement(points, labels, own) == pytest.approx(1 / 3)
    assert np.isnan(nearest_own_agreement(points, labels, np.ones(5, bool)))


def test_activities_and_channels_mean_the_same_across_har_sets():
    from protofed.data.harmonize import canonical_activity, canonical_channel

    assert {canonical_activity(a) for a in ("WALKING_UPSTAIRS", "upstairs", "stairs_up")} == {
        "stairs_up"
    }
    assert canonical_activity("LAYING") == "lie" and canonical_activity("bike") == "bike"
    assert canonical_channel("total_acc_x") == "acc_x" and canonical_channel("body_acc_x") == (
        "body_acc_x"
    )


@pytest.mark.integration
def test_embed_other_data_draws_one_user_of_another_har_set(tmp_path, shared_data):
    """FedAli's Fig. 4: an HHAR client's model embeds its own test windows and one UCI-HAR
    user's windows (the activities both sets have, labelled as the run's classes)."""
    from protofed.config import DataConfig
    from protofed.data import load_dataset
    from protofed.data.harmonize import canonical_activity
    from protofed.plots.embed import other_data_windows

    out = tmp_path / "hhar"
    small = ["data.name=hhar", "model.name=cnn1d", "train.rounds=1", "train.threads=1"]
    data = ["--data-dir", str(shared_data)]
    result = runner.invoke(app, ["run", "-q", "--out", str(out), *_sets(small), *data])
    assert result.exit_code == 0, result.output
    run = Run(out)
    fed = federation(run, shared_data)
    x, y, user = other_data_windows(run, fed, "uci_har", 80, shared_data)
    uci = load_dataset(DataConfig(name="uci_har", channels="all", dir=str(shared_data)))
    assert x.shape == (80, 3, 128) and x.dtype == np.float32
    shared = {canonical_activity(c) for c in uci.class_names}
    assert {fed.class_names[k] for k in y} <= {c for c in fed.class_names if c in shared}
    assert "bike" not in {fed.class_names[k] for k in y}  # HHAR's only, never UCI-HAR's
    assert user in {str(g) for g in uci.group_names}
    fig = embedding_figure(out, 0, max_points=80, data_dir=shared_data, other_data="uci_har")
    other, own = (np.asarray(c.get_offsets()) for c in fig.axes[0].collections)
    assert len(other) == 80 and len(own) == min(80, len(fed.clients[0].test_y))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[:2] == ["own data", f"uci_har ({user})"]
    prefix = str(tmp_path / "fig4")
    result = runner.invoke(app, ["embed", str(out), "--other-data", "wisdm", "-o", prefix, *data])
    assert result.exit_code == 0, result.output
    assert "nearest own point of their class: " in result.output
    assert (tmp_path / "fig4.png").stat().st_size > 1000
    result = runner.invoke(app, ["embed", str(out), "--other-data", "hhar", *data])
    text = (result.stderr or result.output).strip()
    assert result.exit_code == 2 and len(text.splitlines()) == 1 and "--other-data" in text, text
    result = runner.invoke(app, ["embed", str(out), "--pooled", *data])  # cnn1d: none
    text = (result.stderr or result.output).strip()
    assert result.exit_code == 2 and len(text.splitlines()) == 1 and "--pooled" in text, text


def test_hart_pooled_output_is_the_encoder_before_its_embedding_layer():
    """FedAli's Figs. 4-5 map HART's 192-d pooled encoder output (the official code's), the
    input of the 1024-unit embedding layer that `features` ends with."""
    from protofed.config import ModelConfig
    from protofed.models import build_model
    from protofed.prototypes import embed

    model = build_model(ModelConfig(name="hart"), (3, 128), 6)
    x = torch.randn(5, 3, 128, generator=torch.Generator().manual_seed(0))
    pooled = embed(model, x, batch_size=2, pooled=True)
    assert pooled.shape == (5, 192)
    f = model.features
    expected = f.dropout.eval()(f.embed_activation(f.embed(pooled)))
    torch.testing.assert_close(embed(model, x), expected)


@pytest.mark.integration
def test_embed_in_a_combined_federation_figs_4_and_5(tmp_path, shared_data):
    """In a federation of HHAR and WISDM users: an HHAR client's model on a WISDM client's
    test data (Fig. 4, `--with`), and each client's own model on its own training data
    (Fig. 5, `--own-models`), checked against embeddings computed here."""
    from protofed.plots.embed import embedding_map, nearest_own_agreement
    from protofed.prototypes import embed

    out = tmp_path / "combined"
    small = ["data.name=har_combined", "data.partition=natural", "algorithm.name=local"]
    small += ["model.name=cnn1d", "train.rounds=1", "train.threads=1"]
    data = ["--data-dir", str(shared_data)]
    result = runner.invoke(app, ["run", "-q", "--out", str(out), *_sets(small), *data])
    assert result.exit_code == 0, result.output
    run = Run(out)
    fed = federation(run, shared_data)
    hhar, wisdm = 0, 9  # the first user of each set
    assert fed.clients[hhar].name.startswith("hhar:") and fed.clients[wisdm].name.startswith(
        "wisdm:"
    )
    for own_models in (False, True):
        m = embedding_map(
            run, hhar, max_points=60, data_dir=shared_data, pick=[wisdm], own_models=own_models
        )
        parts = []
        for i in (hhar, wisdm):
            c = fed.clients[i]
            xs, ys = (c.train_x, c.train_y) if own_models else (c.test_x, c.test_y)
            keep = np.sort(
                np.random.default_rng(
                    np.random.SeedSequence([run.config.seed, EMBED_STREAM, 1, i])
                ).permutation(len(ys))[:60]
            )
            model = run.client_model(i if own_models else hhar)
            parts.append((embed(model, xs[keep]).numpy(), ys.numpy()[keep], i == hhar))
        points = np.concatenate([p for p, _, _ in parts])
        labels = np.concatenate([y for _, y, _ in parts])
        own = np.concatenate([np.full(len(y), mine) for _, y, mine in parts])
        np.testing.assert_array_equal(m.labels, labels)
        assert m.agreement == pytest.approx(nearest_own_agreement(points, labels, own))
        assert m.other_label == fed.clients[wisdm].name
    assert "each client's own model on its own training data" in m.title
    prefix = str(tmp_path / "fig5")
    args = ["embed", str(out), "--with", str(wisdm), "--own-models", "-o", prefix, *data]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "fig5.png").stat().st_size > 1000
    result = runner.invoke(app, ["embed", str(out), "--with", "0", *data])
    text = (result.stderr or result.output).strip()
    assert result.exit_code == 2 and len(text.splitlines()) == 1 and "--with 0" in text, text
    result = runner.invoke(app, ["embed", str(out), "--other-data", "wisdm", *data])  # a member
    text = (result.stderr or result.output).strip()
    assert result.exit_code == 2 and "the run's own data set" in text, text


# figures ready for a paper: labels, bands, ticks, titles, styles (docs/reporting.md) --------
def _pdf_strings(path: Path) -> str:
    """The text a PDF shows (both of matplotlib's font types), as the path scan reads it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "scan", Path(__file__).parents[1] / "test_no_machine_paths.py"
    )
    assert spec is not None and spec.loader is not None
    scan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scan)
    return scan.pdf_text(path.read_bytes())


@pytest.fixture(scope="module")
def seeded(tmp_path_factory, shared_data) -> Path:
    """fedavg and local, 2 seeds each, 3 rounds, in a sweep's layout (`<entry>_s<seed>`)."""
    root = tmp_path_factory.mktemp("seeded")
    threads = torch.get_num_threads()
    base = [*SMALL, f"data.dir={shared_data}", "train.rounds=3"]
    for algo in ("fedavg", "local"):
        for seed in (0, 1):
            cfg = load_config(None, [*base, f"algorithm.name={algo}", f"seed={seed}"])
            start(cfg, root / f"{algo}_s{seed}").run()
    torch.set_num_threads(threads)
    return root


def _groups(root: Path):
    from protofed.report import collect, group_runs

    return group_runs(collect([root], "selected", []), "auto")


def _bands(ax) -> int:
    from matplotlib.collections import PolyCollection

    return sum(isinstance(c, PolyCollection) for c in ax.collections)


@pytest.mark.integration
def test_report_plot_labels_bands_ticks_and_no_title(seeded, tmp_path):
    """--label, --band none, --title '', --style paper: the legend holds only the given
    labels, no band, the evaluated rounds as ticks, no title; the caption says the band."""
    out = tmp_path / "paper"
    args = ["report", str(seeded), "--plot", "--out", str(out), "--style", "paper"]
    labels = ["--label", "fedavg*=FedAvg", "--label", "local=Local only"]
    result = runner.invoke(app, [*args, *labels, "--band", "none", "--title", ""])
    assert result.exit_code == 0, result.output
    text = _pdf_strings(Path(f"{out}-curves.pdf"))
    assert "FedAvg" in text and "Local only" in text
    assert "algorithm.name" not in text and "fedavg_s0" not in text
    assert "Learning curves" not in text  # title=""
    caption = Path(f"{out}-figures.md").read_text()
    assert "band: no band" in caption and "n = 2 runs (seeds) per group" in caption

    from protofed.plots.curves import figures

    groups = _groups(seeded)
    drawn = figures(
        groups, labels={"fedavg*": "FedAvg", "local": "Local only"}, band="none", title=""
    )
    fig = drawn["curves"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["FedAvg", "Local only"]
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert all(_bands(ax) == 0 for ax in visible)
    assert fig._suptitle is None and all(ax.get_title() == "" for ax in visible)
    for ax in visible:
        assert list(ax.get_xticks()) == [1, 2, 3]  # every round was evaluated
    gen = [t.get_text() for t in drawn["pers_gen"].legends[0].get_texts()]
    assert gen == ["FedAvg", "Local only"]
    assert drawn["clients"].axes[0].get_title() == ""
    import matplotlib.pyplot as plt

    for f in drawn.values():
        plt.close(f)


@pytest.mark.integration
def test_bands_default_to_std_for_two_seeds_and_stay_inside_the_means(seeded):
    """auto is ±1 std for n = 2 (one PolyCollection per group and panel); ci draws the t
    band, yet the axes still show the curves, not a band 12.7 s wide."""
    import matplotlib.pyplot as plt

    from protofed.plots.curves import choose_band, learning_curves, mean_band

    groups = _groups(seeded)
    assert choose_band(groups) == "std"
    for band in ("auto", "ci", "std"):
        fig = learning_curves(groups, band=band)
        pers = fig.axes[0]
        assert _bands(pers) == 2
        means = np.concatenate([line.get_ydata() for line in pers.lines])
        low, high = pers.get_ylim()
        span = means.max() - means.min()
        assert low >= means.min() - 0.6 * span and high <= means.max() + 0.6 * span
        named = "±1 std over 2 seeds" if band != "ci" else "95 % CI over 2 seeds"
        assert named in fig._suptitle.get_text()
        plt.close(fig)
    values = np.array([[1.0, 2.0], [3.0, 6.0]])
    mean, low, high = mean_band(values, "std")
    np.testing.assert_allclose(high - mean, values.std(0, ddof=1))


@pytest.mark.integration
def test_labels_are_short_and_never_a_path(seeded):
    """Without --label: the run folders' entry names; from config keys: their last parts,
    a switch as on/off, a path as its file name. A label that names no group is an error."""
    from protofed.errors import ConfigError
    from protofed.plots.curves import legend_labels
    from protofed.report import Group, parse_labels, readable_labels, relabel

    groups = _groups(seeded)
    assert legend_labels(groups) == ["fedavg", "local"]
    a = Group(
        "x",
        {
            "algorithm.name": "fedali",
            "model.alp.enabled": True,
            "model.init": "/srv/lab/runs/pretrain/hhar_e10.safetensors",
        },
    )
    b = Group("y", {"algorithm.name": "fedavg", "model.alp.enabled": False, "model.init": None})
    a.runs, b.runs = [{"run": "p/fedali_s0"}, {"run": "q/fedali_s1"}], [{"run": "r/fedavg_s0"}]
    keys = ["algorithm.name", "model.alp.enabled", "model.init"]
    assert readable_labels([a, b], keys) == [
        "fedali, alp on, init=hhar_e10.safetensors",
        "fedavg, alp off, init=none",
    ]
    a.short, b.short = readable_labels([a, b], keys)
    assert legend_labels([a, b]) == [
        "fedali, alp on, init=hhar_e10.safetensors (n=2)",
        "fedavg, alp off, init=none (n=1)",
    ]
    assert relabel([a, b], {"fedali": "FedAli"})[0] == "FedAli"
    assert parse_labels(["x=A=B"], [a, b]) == {"x": "A=B"}
    with pytest.raises(ConfigError, match="names no group"):
        relabel(groups, {"nothing*": "X"})
    with pytest.raises(ConfigError, match="names 2 groups"):
        relabel(groups, {"*": "X"})
    with pytest.raises(ConfigError, match="is a path"):
        relabel(groups, {"fedavg": "/srv/lab/runs/fedavg"})


@pytest.mark.integration
def test_paper_style_sizes_a_column_and_plain_log_ticks(seeded, tmp_path):
    """paper: 3.3 in wide, 8-9 pt text, TrueType fonts in the PDF; the loss axis has plain
    tick labels; the style is an rc context: matplotlib's rcParams are left as they were."""
    import matplotlib as mpl
    import matplotlib.pyplot as plt

    from protofed.plots.curves import learning_curves

    before = dict(mpl.rcParams)
    fig = learning_curves(_groups(seeded), style="paper")
    assert fig.get_figwidth() == pytest.approx(3.3)
    loss = [ax for ax in fig.axes if ax.get_visible()][-1]
    assert loss.get_yscale() == "log"
    fig.canvas.draw()
    sizes = {t.get_fontsize() for t in loss.get_yticklabels() + loss.get_xticklabels()}
    assert sizes and all(8 <= s <= 9 for s in sizes)
    shown = [t.get_text() for t in loss.get_yticklabels(which="both") if t.get_text()]
    assert shown and not any("times" in s or "^" in s or "10^" in s for s in shown)
    assert all(float(s) > 0 for s in shown)
    paths = save_figure(fig, tmp_path / "c")
    assert b"/FontFile2" in paths[1].read_bytes()  # TrueType (Type 42), not Type 3
    assert dict(mpl.rcParams) == before
    wide = learning_curves(_groups(seeded), style="paper-wide")
    assert wide.get_figwidth() == pytest.approx(7.0)
    plt.close(wide)


# --style and --title of partition --plot and embed: the report's styles --------------------
def _read_back(prefix: Path) -> tuple[tuple[float, float], tuple[float, float], set[float]]:
    """What the written files say: the PNG's size in inches (pixels / its dpi), the PDF's
    page size in inches and the font sizes (pt) its text is set in."""
    import re
    import zlib

    from PIL import Image

    with Image.open(prefix.with_name(prefix.name + ".png")) as png:
        dpi = png.info["dpi"]
        png_in = (png.size[0] / dpi[0], png.size[1] / dpi[1])
    pdf = prefix.with_name(prefix.name + ".pdf").read_bytes()
    box = re.search(rb"/MediaBox\s*\[\s*0 0 ([\d.]+) ([\d.]+)\s*\]", pdf)
    assert box is not None
    sizes: set[float] = set()
    for m in re.finditer(rb"stream\r?\n(.*?)\r?\nendstream", pdf, re.S):
        try:
            body = zlib.decompress(m.group(1))
        except zlib.error:
            continue
        sizes |= {float(s) for s in re.findall(rb"/\S+\s+([\d.]+)\s+Tf", body)}
    return png_in, (float(box.group(1)) / 72, float(box.group(2)) / 72), sizes


def _check_paper_files(prefix: Path, width: float) -> set[float]:
    """Both files written, `width` inches wide, TrueType fonts; the PDF's font sizes."""
    png_in, pdf_in, sizes = _read_back(prefix)
    assert png_in[0] == pytest.approx(width, abs=0.01) and pdf_in[0] == pytest.approx(width)
    assert png_in[1] == pytest.approx(pdf_in[1], abs=0.01)
    assert b"/FontFile2" in prefix.with_name(prefix.name + ".pdf").read_bytes()
    return sizes


@pytest.mark.integration
def test_partition_plot_takes_the_reports_styles_and_title(tmp_path):
    """--style paper: a 3.3 in column, 8 pt labels and a 9 pt title read back from the PDF,
    a 300 dpi PNG; paper-wide 7 in; --title '' none; the same keywords in Python."""
    import matplotlib as mpl

    sets = [*SMALL, "data.num_clients=6", "data.partition=dirichlet", "data.alpha=0.3"]
    part = ["partition", *_sets(sets), "--plot"]
    result = runner.invoke(app, [*part, "--style", "paper", "-o", str(tmp_path / "col")])
    assert result.exit_code == 0, result.output
    sizes = _check_paper_files(tmp_path / "col", 3.3)
    assert {8.0, 9.0} <= sizes and min(sizes) >= 6 and max(sizes) <= 9
    assert "digits, dirichlet: 6 clients" in _pdf_strings(tmp_path / "col.pdf")
    wide = ["--style", "paper-wide", "--title", "", "-o", str(tmp_path / "wide")]
    result = runner.invoke(app, [*part, *wide])
    assert result.exit_code == 0, result.output
    _check_paper_files(tmp_path / "wide", 7.0)
    assert "6 clients" not in _pdf_strings(tmp_path / "wide.pdf")  # no title

    before = dict(mpl.rcParams)
    fed = build_federated(load_config(None, sets).data, 0)
    fig = partition_figure(fed, "Six clients", style="paper")
    assert fig.get_figwidth() == pytest.approx(3.3) and fig._suptitle.get_text() == "Six clients"
    assert fig._suptitle.get_fontsize() == 9
    ax = _heatmap(fig)
    labels = ax.get_yticklabels() + ax.get_xticklabels() + [ax.xaxis.label, ax.yaxis.label]
    assert {t.get_fontsize() for t in labels} == {8.0}
    np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), fed.counts)
    assert partition_figure(fed, "", style="paper-wide")._suptitle is None
    assert dict(mpl.rcParams) == before  # an rc context: the global settings stay


def test_a_bad_style_or_a_style_without_plot_is_one_line_exit_2(tmp_path):
    for args, said in (
        (["--plot", "--style", "poster", "-o", str(tmp_path / "p")], "unknown style 'poster'"),
        (["--style", "paper"], "add --plot"),
    ):
        result = runner.invoke(app, ["partition", *_sets(SMALL), *args])
        text = (result.stderr or result.output).strip()
        assert result.exit_code == 2 and len(text.splitlines()) == 1 and said in text, text
    assert not (tmp_path / "p.png").exists()


@pytest.mark.integration
def test_embed_takes_the_reports_styles_and_title(runs, tmp_path):
    """embed and embed --prototypes in the paper styles: the width, 8-9 pt text and both
    files read back; the legend below the map; --title replaces the title, '' drops it."""
    from protofed.plots.embed import draw_embedding, embedding_map

    out = tmp_path / "emb"
    args = ["embed", str(runs["kept"]), "--client", "1", "--other", "2", "--style", "paper"]
    result = runner.invoke(app, [*args, "--title", "Client 1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    sizes = _check_paper_files(out, 3.3)
    assert {8.0, 9.0} <= sizes and max(sizes) <= 9
    text = _pdf_strings(out.with_name("emb.pdf"))
    assert "Client 1" in text and "personalized embeddings" not in text
    protos = tmp_path / "protos"
    args = ["embed", str(runs["fedproto"]), "--prototypes", "--style", "paper-wide"]
    result = runner.invoke(app, [*args, "--title", "", "-o", str(protos)])
    assert result.exit_code == 0, result.output
    sizes = _check_paper_files(protos, 7.0)
    assert sizes == {8.0}  # ticks, labels and legend; no title
    assert "class prototypes over rounds" not in _pdf_strings(protos.with_name("protos.pdf"))

    fig = draw_embedding(embedding_map(runs["kept"], 1, 2, max_points=40), style="paper")
    ax = fig.axes[0]
    assert fig.get_figwidth() == pytest.approx(3.3) and ax.get_legend() is None
    assert fig.legends[0].get_texts()[0].get_text() == "own data"
    assert ax.title.get_fontsize() == 9
    assert max(map(len, ax.get_title().split("\n"))) < 50  # wrapped to the column
    result = runner.invoke(app, ["embed", str(runs["kept"]), "--style", "poster"])
    assert result.exit_code == 2 and "unknown style 'poster'" in result.output


# one colour per label, panels, ticks at the evaluated rounds, an honest title (issue 57) ---
def _legend_colors(fig) -> dict[str, str]:
    """{legend label: its handle's colour (hex)} of a figure's legend."""
    from matplotlib.colors import to_hex

    out = {}
    for text, handle in zip(fig.legends[0].get_texts(), fig.legends[0].legend_handles, strict=True):
        color = handle.get_color() if hasattr(handle, "get_color") else None
        if not isinstance(color, str):
            color = handle.get_facecolor()[0]
        out[text.get_text()] = to_hex(color)
    return out


@pytest.mark.integration
def test_a_label_keeps_its_colour_in_every_figure_and_apart_from_the_group_order(seeded):
    """A group's colour is its label's, in the curves, the clients' boxes and pers. vs gen.;
    the order the groups come in changes no colour; two labels have two dash styles."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from protofed.plots.curves import figures, label_styles

    groups = _groups(seeded)
    labels = {"fedavg*": "FedAvg", "local*": "Local"}
    drawn = figures(groups, labels=labels)
    curves, pers_gen = _legend_colors(drawn["curves"]), _legend_colors(drawn["pers_gen"])
    assert curves["FedAvg"] != curves["Local"]
    assert {k: curves[k] for k in ("FedAvg", "Local")} == pers_gen
    box = drawn["clients"].axes[0]
    ticks = [t.get_text() for t in box.get_xticklabels()]
    dots = [c for c in box.collections if len(c.get_offsets())]
    assert {t: to_hex(c.get_facecolor()[0]) for t, c in zip(ticks, dots, strict=True)} == {
        k: curves[k] for k in ("FedAvg", "Local")
    }
    reverse = figures(groups[::-1], labels=labels)
    assert _legend_colors(reverse["curves"]) == curves
    styles = label_styles(["FedAvg", "Local"])
    assert styles["FedAvg"][1] != styles["Local"][1]
    assert label_styles(["Local", "FedAvg"]) == styles  # the labels' order: no matter
    handles = dict(
        zip(
            [t.get_text() for t in drawn["curves"].legends[0].get_texts()],
            drawn["curves"].legends[0].legend_handles,
            strict=True,
        )
    )
    assert handles["FedAvg"].get_linestyle() != handles["Local"].get_linestyle()
    for f in [*drawn.values(), *reverse.values()]:
        plt.close(f)


@pytest.mark.integration
def test_panels_choose_the_curves_and_an_unknown_one_is_one_line(seeded, tmp_path):
    import matplotlib.pyplot as plt

    from protofed.errors import ConfigError
    from protofed.plots.curves import learning_curves, parse_panels

    fig = learning_curves(_groups(seeded), panels=["train_loss", "pers_f1"])
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_ylabel() for ax in shown] == [
        "training loss (log scale, geometric mean)",
        "personalization macro-F1 (%)",
    ]
    assert shown[0].get_title() == "training loss (as reported by each client's fit)"
    plt.close(fig)
    assert parse_panels("pers_f1, gen_f1") == ["pers_f1", "gen_f1"]
    with pytest.raises(ConfigError, match="unknown panel 'loss'"):
        parse_panels("pers_f1,loss")
    out = tmp_path / "p"
    args = ["report", str(seeded), "--plot", "-o", str(out)]
    result = runner.invoke(app, [*args, "--panels", "pers_f1,nope"])
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert len(text.splitlines()) == 1 and "unknown panel 'nope'" in text
    assert not list(tmp_path.iterdir())  # nothing written
    result = runner.invoke(app, ["report", str(seeded), "-o", str(out), "--panels", "pers_f1"])
    assert result.exit_code == 2 and "add --plot" in result.output
    result = runner.invoke(app, [*args, "--panels", "gen_f1,pers_f1"])
    assert result.exit_code == 0, result.output


def test_round_ticks_are_evaluated_rounds_thinned_from_the_last():
    from protofed.plots.curves import round_ticks

    assert round_ticks([5, 10, 15, 20, 25, 30], 10) == [5, 10, 15, 20, 25, 30]
    assert round_ticks(range(5, 105, 5), 5) == [20, 40, 60, 80, 100]
    assert round_ticks([1, 2, 3, 4, 5, 6, 7], 3) == [1, 4, 7]


@pytest.mark.integration
def test_the_title_names_a_band_only_where_one_is_drawn(seeded):
    """n = 1 per group: no band drawn, none named; n = 2: the band and n in the title."""
    import matplotlib.pyplot as plt

    from protofed.plots.curves import learning_curves
    from protofed.report import collect, group_runs

    alone = group_runs(collect([seeded / "fedavg_s0", seeded / "local_s0"], "selected"), "auto")
    fig = learning_curves(alone)
    title = fig._suptitle.get_text()
    assert "std" not in title and "band" not in title and "CI" not in title
    assert all(_bands(ax) == 0 for ax in fig.axes)
    plt.close(fig)
    fig = learning_curves(_groups(seeded), band="std")
    assert "±1 std over 2 seeds" in fig._suptitle.get_text()
    plt.close(fig)
