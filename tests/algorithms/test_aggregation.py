"""Robust aggregation (`aggregation.*`, docs/aggregation.md): each rule on small tensors, the
update-norm checks, and one poisoned round of real replies from sklearn's digits.

The poisoned round: nine honest clients train FedAvg's model one epoch on their own digits;
a tenth replies with every weight at 1e6 and claims 1e12 examples. The example-weighted mean
follows the attacker; the robust rules and the norm checks stay with the honest clients.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats

import protofed
from protofed.algorithms import MODEL, Arrays, Records, Reply, Setting
from protofed.algorithms.common.aggregation import (
    DROPPED,
    KRUM_FALLBACK,
    average,
    coordinate_median,
    krum,
    trimmed_mean,
    update_norms,
    weighted_mean,
)
from protofed.algorithms.fedavg import FedAvg
from protofed.config import AggregationConfig, ModelConfig, TrainConfig, load_config
from protofed.data.federated import ClientData
from protofed.errors import ConfigError
from protofed.models import build_model

HONEST = 9
ATTACK = 1e6  # every weight of the attacker's reply: huge, but finite
ATTACK_EXAMPLES = 1e12


def replies_of(*tensors: torch.Tensor, examples: list[float] | None = None) -> list[Reply]:
    """One reply per tensor, as record `model`, name `w`, plus an integer counter `n`."""
    counts = examples or [1.0] * len(tensors)
    return [
        Reply(i, {MODEL: {"w": t, "n": torch.tensor(i)}, "extra": {"x": t}}, {}, counts[i])
        for i, t in enumerate(tensors)
    ]


def stacked(n: int, shape: tuple[int, ...] = (3, 4), seed: int = 0) -> torch.Tensor:
    return torch.randn((n, *shape), generator=torch.Generator().manual_seed(seed))


def distance(a: Arrays, b: Arrays) -> float:
    """L2 distance over the floating tensors of `a`."""
    squares = sum(
        float((a[k].double() - b[k].double()).square().sum()) for k in a if a[k].is_floating_point()
    )
    return math.sqrt(squares)


@pytest.mark.integration
def test_weighted_mean_of_large_tensors_is_the_whole_float64_sum_bit_for_bit() -> None:
    """Tensors past the cast's chunk (and a ragged last chunk, a non-contiguous reply) give
    exactly the float64 sum taken whole, then divided and cast back."""
    n = 3 * (1 << 16) + 17
    gen = torch.Generator().manual_seed(3)
    tensors = [torch.randn(n, generator=gen) * 10 ** float(i) for i in range(-2, 3)]
    tensors[2] = torch.randn(2, n, generator=gen)[1]  # a view into a larger buffer
    wide = torch.randn(n, 3, generator=gen).t()[0]  # strided: not contiguous
    tensors.append(wide)
    examples = [3.0, 17.0, 1.0, 250.0, 9.0, 41.0]
    averaged, _ = weighted_mean(replies_of(*tensors, examples=examples))
    whole = torch.zeros(n, dtype=torch.float64)
    for t, w in zip(tensors, examples, strict=True):
        whole += t.to(torch.float64) * w
    expected = (whole / sum(examples)).to(torch.float32)
    assert torch.equal(averaged[MODEL]["w"], expected)


def test_weighted_mean_of_some_records_streams_and_keeps_the_others() -> None:
    replies = [
        Reply(
            i,
            {"w": {"x": torch.tensor([float(i)])}, "p": {"x": torch.tensor([10.0 + i])}},
            {},
            1.0 + i,
        )
        for i in range(3)
    ]
    consumed: list[int] = []

    def stream():
        for r in replies:
            consumed.append(r.client)  # lazy: the mean reads one reply at a time
            yield r

    mean, seen = weighted_mean(stream(), records=["w"])
    assert consumed == [0, 1, 2] and set(mean) == {"w"}
    assert float(mean["w"]["x"]) == pytest.approx((0 * 1 + 1 * 2 + 2 * 3) / 6)
    assert [r.client for r in seen] == [0, 1, 2] and all(set(r.records) == {"p"} for r in seen)
    assert [float(r.records["p"]["x"]) for r in seen] == [10.0, 11.0, 12.0]
    assert [r.num_examples for r in seen] == [1.0, 2.0, 3.0]
    assert set(replies[0].records) == {"w", "p"}  # the replies themselves are not changed


def test_weighted_mean_never_writes_into_a_reply():
    """The running sum is float64: a float64 reply must be copied, not scaled in place."""
    for dtype in (torch.float32, torch.float64):
        first, second = torch.ones(3, dtype=dtype), torch.zeros(3, dtype=dtype)
        mean, _ = weighted_mean(
            [Reply(0, {"r": {"w": first}}, {}, 3.0), Reply(1, {"r": {"w": second}}, {}, 1.0)]
        )
        assert torch.equal(mean["r"]["w"], torch.full((3,), 0.75))
        assert torch.equal(first, torch.ones(3, dtype=dtype))


# the rules on small tensors ---------------------------------------------------------------
@pytest.mark.parametrize("n", [5, 6])
def test_coordinate_median_is_numpys(n: int) -> None:
    x = stacked(n)
    mean, seen = coordinate_median(replies_of(*x), records=[MODEL])
    expected = np.median(x.numpy().astype(np.float64), axis=0).astype(np.float32)
    np.testing.assert_array_equal(mean[MODEL]["w"].numpy(), expected)
    assert mean[MODEL]["n"] == n - 1  # integers: the maximum, as weighted_mean
    # the records not averaged stay in the replies, as weighted_mean returns them
    assert [r.records.keys() for r in seen] == [{"extra"}] * n


@pytest.mark.parametrize(
    ("n", "trim", "cut"), [(10, 0.2, 2), (10, 0.1, 1), (9, 0.1, 1), (3, 0.4, 1)]
)
def test_trimmed_mean_cuts_ceil_trim_n_at_each_end(n: int, trim: float, cut: int) -> None:
    x = stacked(n).numpy()
    mean, _ = trimmed_mean(replies_of(*torch.from_numpy(x)), records=[MODEL], trim=trim)
    expected = np.sort(x.astype(np.float64), axis=0)[cut : n - cut].mean(axis=0)
    np.testing.assert_allclose(mean[MODEL]["w"].numpy(), expected.astype(np.float32), rtol=1e-6)
    if (trim * n).is_integer():  # then scipy's trim_mean cuts as many
        np.testing.assert_allclose(mean[MODEL]["w"].numpy(), stats.trim_mean(x, trim), rtol=1e-6)


@pytest.mark.integration
def test_trimmed_mean_without_trim_is_the_unweighted_mean() -> None:
    x = stacked(4)
    mean, _ = trimmed_mean(replies_of(*x, examples=[1, 2, 3, 4]), trim=0.0)
    torch.testing.assert_close(mean[MODEL]["w"], x.mean(0))


def test_krum_scores_by_the_nearest_n_minus_f_minus_2() -> None:
    """Points 0, 1, 2, 3, 100 and f = 1: each is scored on its 2 nearest others, so 1 and 2
    tie (1 + 1) and the first of them wins; the outlier never can."""
    points = [torch.full((2,), v) for v in (0.0, 1.0, 2.0, 3.0, 100.0)]
    mean, _ = krum(replies_of(*points), records=[MODEL], byzantine=1)
    assert torch.equal(mean[MODEL]["w"], points[1])


def test_krum_picks_an_honest_reply_against_f_attackers() -> None:
    honest = list(stacked(5, seed=1) * 0.1 + 1.0)
    bad = [torch.full((3, 4), 50.0), torch.full((3, 4), -50.0)]  # far, and far apart
    replies = replies_of(*bad[:1], *honest, *bad[1:])
    mean, _ = krum(replies, records=[MODEL], byzantine=2)
    assert any(torch.equal(mean[MODEL]["w"], h) for h in honest)
    with pytest.raises(ValueError, match="needs 7 replies, got 6"):
        krum(replies[:6], byzantine=2)


def test_default_average_is_the_streaming_weighted_mean_bit_for_bit() -> None:
    x = stacked(4)
    examples = [3.0, 1.0, 7.0, 2.0]
    expected, _ = weighted_mean(replies_of(*x, examples=examples))
    got = average(iter(replies_of(*x, examples=examples)), AggregationConfig())
    assert got.metrics == {}  # the server metrics of a default run do not change
    assert all(
        torch.equal(got.records[r][k], expected[r][k]) for r in expected for k in expected[r]
    )


def test_krum_with_too_few_replies_falls_back_to_the_median_and_says_so() -> None:
    x = stacked(4)
    with pytest.warns(UserWarning, match="2 \\* byzantine \\+ 3"):
        got = average(replies_of(*x), AggregationConfig(rule="krum", byzantine=1))
    assert got.metrics == {DROPPED: 0.0, KRUM_FALLBACK: 1.0}
    assert torch.equal(got.records[MODEL]["w"], coordinate_median(replies_of(*x))[0][MODEL]["w"])


def test_update_norms_are_distances_to_the_server_over_shared_floating_tensors() -> None:
    server: Records = {MODEL: {"w": torch.zeros(3, 4), "n": torch.tensor(0)}}
    x = stacked(2)
    norms = update_norms(replies_of(*x), server, records=[MODEL])  # "extra" is not compared
    assert norms == pytest.approx([float(t.double().norm()) for t in x])
    with pytest.raises(ValueError, match="shares no weights"):
        update_norms(replies_of(*x), {"other": {"w": torch.zeros(3, 4)}})


def test_norm_checks_need_a_reference_and_a_bound_some_reply_meets() -> None:
    x = stacked(3)
    with pytest.raises(ValueError, match="reference"):
        average(replies_of(*x), AggregationConfig(max_norm_ratio=10))
    server = {MODEL: {"w": torch.zeros(3, 4)}}
    with pytest.raises(ValueError, match="all 3 replies exceed aggregation.max_update_norm"):
        average(replies_of(*x), AggregationConfig(max_update_norm=1e-3), reference=server)


def test_a_non_finite_reply_fails_any_norm_bound() -> None:
    x = list(stacked(5))
    x[2] = torch.full((3, 4), math.nan)
    server = {MODEL: {"w": torch.zeros(3, 4)}}
    got = average(replies_of(*x), AggregationConfig(max_norm_ratio=100), [MODEL], reference=server)
    assert got.metrics[DROPPED] == 1 and [r.client for r in got.replies] == [0, 1, 3, 4]
    assert torch.isfinite(got.records[MODEL]["w"]).all()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("rule", "mode"),
        ("trim", 0.5),
        ("trim", -0.1),
        ("byzantine", -1),
        ("max_update_norm", 0),
        ("max_norm_ratio", 0.5),
        ("max_update_norm", ".inf"),
    ],
)
def test_config_errors_name_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"aggregation.{key}"):
        load_config(None, [f"aggregation.{key}={value}"])


@pytest.mark.integration
def test_krum_that_no_round_can_satisfy_is_refused_before_the_run() -> None:
    from protofed.runtime.prepare import check_krum

    cfg = load_config(None, ["aggregation.rule=krum", "aggregation.byzantine=4"])
    check_krum(cfg, 11)  # 11 = 2 * 4 + 3 clients a round: enough
    with pytest.raises(ConfigError, match="aggregation.byzantine=4 needs 11 replies"):
        check_krum(cfg, 10)
    cfg.train.client_fraction = 0.5
    with pytest.raises(ConfigError, match="samples 10 clients"):
        check_krum(cfg, 20)


# a poisoned round of real replies --------------------------------------------------------
@pytest.fixture(scope="module")
def poisoned_round() -> tuple[Setting, Records, list[Reply]]:
    """FedAvg's first round on digits: nine honest replies, then the attacker's."""
    from sklearn.datasets import load_digits

    from protofed.training.client import Client

    X, y = load_digits(return_X_y=True)
    x, t = torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y)
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="mlp", hidden=[32]), (64,), 10)
    train = TrainConfig(lr=0.05, batch_size=32, threads=1)
    setting = Setting(10, 10, train, {k: v.clone() for k, v in model.state_dict().items()})
    server = FedAvg(FedAvg.Params(), setting).init_server()
    replies = []
    for i, (xs, ys) in enumerate(zip(x.chunk(HONEST), t.chunk(HONEST), strict=True)):
        a, b = int(0.7 * len(xs)), int(0.8 * len(xs))
        data = ClientData(f"c{i}", None, xs[:a], ys[:a], xs[a:b], ys[a:b], xs[b:], ys[b:])
        gen = torch.Generator().manual_seed(i)
        client = Client(id=i, data=data, model=model, train=train, server_round=1, generator=gen)
        fit = FedAvg(FedAvg.Params(), setting).fit(client, server, {})
        replies.append(Reply(i, fit.reply, fit.metrics, float(client.num_examples)))
    poison = {k: torch.full_like(v, ATTACK) for k, v in server[MODEL].items()}
    replies.append(Reply(HONEST, {MODEL: poison}, {}, ATTACK_EXAMPLES))
    return setting, server, replies


def aggregate(setting: Setting, server: Records, replies: list[Reply], **rule) -> tuple:
    """FedAvg's aggregate under the `aggregation` config `rule`: (model, server metrics)."""
    robust = replace(setting, aggregation=AggregationConfig(**rule))
    result = FedAvg(FedAvg.Params(), robust).aggregate(server, iter(replies), 1)
    return result.server[MODEL], result.metrics


@pytest.mark.integration
@pytest.mark.parametrize(
    "rule",
    [
        {"rule": "trimmed_mean", "trim": 0.1},
        {"rule": "median"},
        {"rule": "krum", "byzantine": 1},
    ],
    ids=["trimmed_mean", "median", "krum"],
)
def test_robust_rules_stay_with_the_honest_clients(poisoned_round, rule) -> None:
    """Each robust aggregate lies within the honest clients' radius of the clean mean (the
    farthest honest reply's distance to it); the plain mean is over 1e3 radii off."""
    setting, server, replies = poisoned_round
    clean, _ = weighted_mean(replies[:HONEST])
    radius = max(distance(r.records[MODEL], clean[MODEL]) for r in replies[:HONEST])
    plain, metrics = aggregate(setting, server, replies)
    assert metrics == {} and distance(plain, clean[MODEL]) > 1e3 * radius
    robust, metrics = aggregate(setting, server, replies, **rule)
    assert distance(robust, clean[MODEL]) <= radius
    assert metrics[DROPPED] == 0  # the rules outvote the attacker; none is left out


@pytest.mark.integration
@pytest.mark.parametrize(
    "checks", [{"max_norm_ratio": 10.0}, {"max_update_norm": 100.0}], ids=["ratio", "bound"]
)
def test_norm_checks_drop_the_attacker_and_count_it(poisoned_round, checks) -> None:
    """With the attacker dropped, the mean is the clean mean exactly."""
    setting, server, replies = poisoned_round
    clean, _ = weighted_mean(replies[:HONEST])
    norms = update_norms(replies, server)
    assert max(norms[:HONEST]) < 10 < 100 < norms[HONEST]  # the bounds separate them
    model, metrics = aggregate(setting, server, replies, **checks)
    assert metrics == {DROPPED: 1.0}
    assert all(torch.equal(model[k], clean[MODEL][k]) for k in clean[MODEL])


# the config key, end to end ----------------------------------------------------------------
DIGITS = {
    "data": {"name": "digits", "num_clients": 5, "alpha": 1.0},
    "model": {"name": "mlp", "hidden": [32]},
    "train": {"rounds": 2, "lr": 0.1, "threads": 1},
}


# FedAli needs ALP layers: a small HART on random windows of 3 channels
WINDOWS = {
    "data": {"name": "arrays", "partition": "iid", "num_clients": 5},
    "model": {"name": "hart", "alp": {"enabled": True, "prototypes": [8, 8, 4, 4, 2, 2]}},
    "train": {"rounds": 2, "threads": 1, "optimizer": "adam", "lr": 0.002},
    "algorithm": {"kmeans_iters": 2},
}


@pytest.mark.integration
@pytest.mark.parametrize(
    "algorithm", ["fedavg", "pfedme", "fedclar", "fedpac", "protohar", "fednh", "feddpa", "fedali"]
)
def test_a_run_aggregates_with_the_configured_rule(tmp_path, monkeypatch, algorithm: str) -> None:
    """Every method that averages through `Algorithm.average` runs under aggregation.rule=median
    with a norm check against its own server state, and reports the dropped replies."""
    from protofed.algorithms.common import aggregation

    medians: list[int] = []  # the rule really taken: replies per coordinate_median call
    real = aggregation.coordinate_median

    def spy(replies, records=None):
        medians.append(len(replies))
        return real(replies, records)

    monkeypatch.setattr(aggregation, "coordinate_median", spy)
    config, extra = DIGITS, {}
    if algorithm == "fedclar":
        extra = {"algorithm.cluster_round": 1}
    if algorithm == "fedali":
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(200, 3, 32)).astype(np.float32), np.arange(200) % 4
        np.savez(tmp_path / "windows.npz", X=x, y=y)
        config, extra = WINDOWS, {"data.path": str(tmp_path / "windows.npz")}
    run = protofed.run(
        config,
        tmp_path / algorithm,
        aggregation={"rule": "median", "max_norm_ratio": 10},
        **{"algorithm.name": algorithm, **extra},
    )
    assert run.config.aggregation.rule == "median"
    assert run.summary.rounds == 2
    assert run.history["server.dropped_replies"].eq(0).all()  # honest clients only
    assert sum(medians) >= 2 * 5  # every reply of both rounds (FedCLAR: cluster by cluster)


def test_setting_defaults_to_the_plain_mean() -> None:
    assert Setting(2, 2, TrainConfig(), {}).aggregation.rule == "mean"
