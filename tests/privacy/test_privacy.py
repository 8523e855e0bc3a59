"""Client-level differential privacy: the accountant is dp-accounting's, the clipping bounds
every contribution, the noise has the configured scale, and private runs are real runs
(resumable, one-line errors, epsilon in every record)."""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest
import torch
from dp_accounting import dp_event, pld, rdp
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DIGITS_SMALL, har_slice_config, uci_har_slice
from protofed.config import PrivacyConfig, load_config
from protofed.core.types import Reply
from protofed.errors import ConfigError
from protofed.privacy import accounting, plan
from protofed.privacy.central import central_mean
from protofed.privacy.entropy import SecureNoise, SeededNoise
from protofed.privacy.mechanisms import (
    PRIVACY,
    binary_names,
    clip_reply,
    decode_binary,
    noise_reply,
    split,
)
from protofed.runtime import prepare, simulate
from protofed.runtime.engine import resume, start

DIGITS = DIGITS_SMALL


SAMPLED = ["train.clients_per_round=3"]  # 3 of 6 without replacement: RDP's event only


def _cfg(*extra: str):
    return load_config(None, [*DIGITS, "privacy.enabled=true", *extra])


# the accountant ---------------------------------------------------------------------------
@pytest.mark.parametrize("rounds", [1, 10, 200])
def test_poisson_epsilon_is_dp_accountings_own(rounds) -> None:
    cfg = PrivacyConfig(
        enabled=True, sampling="poisson", noise_multiplier=1.1, delta=1e-5, accountant="rdp"
    )
    theirs = rdp.RdpAccountant()  # add-or-remove-one, its default
    theirs.compose(dp_event.PoissonSampledDpEvent(10 / 300, dp_event.GaussianDpEvent(1.1)), rounds)
    assert accounting.epsilon(cfg, 300, 10, 1.1, rounds) == theirs.get_epsilon(1e-5)


def test_fixed_size_sampling_is_accounted_as_sampling_without_replacement() -> None:
    """Replace-one adjacency: one client's clipped reply moves the sum by twice the bound."""
    cfg = PrivacyConfig(enabled=True, noise_multiplier=2.0, accountant="rdp")
    theirs = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    event = dp_event.SampledWithoutReplacementDpEvent(30, 10, dp_event.GaussianDpEvent(1.0))
    theirs.compose(event, 20)
    assert accounting.epsilon(cfg, 30, 10, 2.0, 20) == theirs.get_epsilon(1e-5)
    # full participation: the Gaussian mechanism alone, every round
    full = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    full.compose(dp_event.GaussianDpEvent(1.0), 20)
    assert accounting.epsilon(cfg, 10, 10, 2.0, 20) == full.get_epsilon(1e-5)


@pytest.mark.integration
def test_epsilon_grows_with_rounds_and_is_infinite_without_noise() -> None:
    cfg = PrivacyConfig(enabled=True, noise_multiplier=1.0)
    spent = [accounting.epsilon(cfg, 30, 10, 1.0, r) for r in (0, 1, 5, 25)]
    assert spent[0] == 0 and spent[1] < spent[2] < spent[3]
    assert accounting.epsilon(cfg, 30, 10, 0.0, 5) == math.inf


def _fresh_epsilon(cfg: PrivacyConfig, event: dp_event.DpEvent, rounds: int) -> float:
    """dp-accounting's own answer: a new accountant, the round's event composed `rounds` times."""
    relation = dp_accounting.NeighboringRelation
    if cfg.accountant == "pld":
        # the events below carry replace-one's doubled sensitivity in their multiplier
        theirs: dp_accounting.PrivacyAccountant = pld.PLDAccountant()
    elif cfg.sampling == "poisson":
        theirs = rdp.RdpAccountant()
    else:
        theirs = rdp.RdpAccountant(neighboring_relation=relation.REPLACE_ONE)
    return theirs.compose(dp_event.SelfComposedDpEvent(event, rounds)).get_epsilon(1e-5)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("settings_", "event", "asked"),
    [
        (
            {"sampling": "fixed"},
            dp_event.SampledWithoutReplacementDpEvent(30, 10, dp_event.GaussianDpEvent(0.6)),
            [1, 2, 40, 7],
        ),
        (
            {"sampling": "poisson", "accountant": "rdp"},
            dp_event.PoissonSampledDpEvent(1 / 3, dp_event.GaussianDpEvent(1.2)),
            [1, 2, 40, 7],
        ),
        (
            {"sampling": "poisson", "accountant": "pld"},
            dp_event.PoissonSampledDpEvent(1 / 3, dp_event.GaussianDpEvent(1.2)),
            [1, 3, 2],
        ),
        ({"mode": "local", "accountant": "rdp"}, dp_event.GaussianDpEvent(0.6), [1, 2, 50]),
        (
            {"mode": "local", "sampling": "fixed", "accountant": "pld"},
            dp_event.GaussianDpEvent(0.6),
            [1, 2, 50],
        ),
    ],
    ids=["fixed-rdp", "poisson-rdp", "poisson-pld", "local-rdp", "local-pld"],
)
def test_each_rounds_epsilon_is_a_fresh_dp_accounting_computations(settings_, event, asked) -> None:
    """The plan composes rounds from what it computed once; every round's epsilon is still
    what a new dp-accounting accountant says for that many rounds, whatever the order the
    rounds are asked in (a run goes forward; a resumed one starts late; the summary asks
    for the last again)."""
    cfg = PrivacyConfig(enabled=True, noise_multiplier=1.2, **settings_)
    dp = plan(cfg, 30, 10, 200)
    spent = {rounds: dp.epsilon(rounds) for rounds in asked}
    for rounds, value in spent.items():
        assert value == pytest.approx(_fresh_epsilon(cfg, event, rounds), rel=1e-9, abs=0)
    again = plan(cfg, 30, 10, 200)  # the same number, asked in another order
    assert [again.epsilon(r) for r in sorted(asked)] == [spent[r] for r in sorted(asked)]


@pytest.mark.integration
@pytest.mark.parametrize("sampling", ["fixed", "poisson"])
@pytest.mark.parametrize("target", [1.0, 4.0])
def test_target_epsilon_calibration_lands_on_the_target(sampling, target) -> None:
    cfg = PrivacyConfig(enabled=True, sampling=sampling, target_epsilon=target)
    sigma = plan(cfg, 30, 10, 40).sigma
    spent = accounting.epsilon(cfg, 30, 10, sigma, 40)
    assert spent <= target * (1 + 1e-3)  # dp-accounting's bisection tolerance
    assert accounting.epsilon(cfg, 30, 10, sigma * 0.98, 40) > target  # and not far above


def test_local_mode_is_accounted_as_each_clients_own_gaussian() -> None:
    cfg = PrivacyConfig(enabled=True, mode="local", noise_multiplier=3.0, accountant="rdp")
    dp = plan(cfg, 30, 10, 50)
    theirs = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    theirs.compose(dp_event.GaussianDpEvent(1.5), 50)  # no credit for sampling
    assert dp.epsilon(50) == theirs.get_epsilon(1e-5)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ([], "privacy: set exactly one"),
        (["privacy.noise_multiplier=1", "privacy.target_epsilon=2"], "privacy: set exactly one"),
        (["privacy.accountant=pld", "privacy.target_epsilon=2", *SAMPLED], "privacy.accountant"),
        (["privacy.accountant=pld", "privacy.noise_multiplier=1", *SAMPLED], "privacy.accountant"),
        (["privacy.target_epsilon=2", "privacy.noise_multiplier=0"], "privacy: set exactly one"),
        (["privacy.noise_multiplier=0"], "privacy.noise_multiplier: 0 adds no noise"),
        (["privacy.mode=local", "privacy.adaptive=true", "privacy.noise_multiplier=1"], "adaptive"),
        (["privacy.adaptive=true", "privacy.noise_multiplier=5", "privacy.count_noise=1"], "count"),
        (["privacy.noise_multiplier=1", "algorithm.name=centralized"], "privacy.enabled"),
        (["privacy.noise_multiplier=1", "eval.client_model=trained"], "client_model=trained"),
    ],
)
def test_a_config_that_cannot_be_accounted_is_one_line(overrides, key) -> None:
    with pytest.raises(ConfigError, match=key) as caught:
        prepare(_cfg(*overrides))
    assert "\n" not in str(caught.value)


# the mechanism ----------------------------------------------------------------------------
vectors = st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=2, max_size=12)


@pytest.mark.integration
@settings(max_examples=60, deadline=None)
@given(sent=vectors, moved=vectors, bound=st.floats(1e-3, 50.0), proto=vectors)
def test_no_clipped_contribution_exceeds_its_bound(sent, moved, bound, proto) -> None:
    n = min(len(sent), len(moved))
    message = {"model": {"w": torch.tensor(sent[:n]), "steps": torch.tensor(7)}}
    reply = {
        "model": {"w": torch.tensor(moved[:n]), "steps": torch.tensor(99)},
        "protos": {
            "classes": torch.tensor([0, 2]),
            "means": torch.tensor(proto).repeat(2, 1),
            "counts": torch.tensor([5.0, 40.0]),
        },
    }
    clipped, norm = clip_reply(reply, message, bound, 2 * bound)
    update = clipped["model"]["w"] - message["model"]["w"]
    assert float(update.norm()) <= bound * (1 + 1e-5) + 1e-6
    assert norm == pytest.approx(float((reply["model"]["w"] - message["model"]["w"]).norm()))
    assert float(clipped["protos"]["means"].norm()) <= 2 * bound * (1 + 1e-5) + 1e-6
    assert clipped["model"]["steps"] == 7  # an integer the client does not get to send
    assert clipped["protos"]["counts"].tolist() == [1.0, 1.0]  # presence, not size
    assert torch.equal(clipped["protos"]["classes"], reply["protos"]["classes"])
    if float((reply["model"]["w"] - message["model"]["w"]).norm()) <= bound:
        torch.testing.assert_close(clipped["model"]["w"], reply["model"]["w"])


def test_a_prototype_table_is_never_an_update_of_what_was_sent() -> None:
    """PFPL sends each client prototypes under the name its reply uses: same shapes or not,
    the reply's table is the client's own statistics (clipped as such, counts dropped)."""
    table = {"classes": torch.tensor([0, 1]), "means": torch.ones(2, 3)}
    groups = split({"protos": table}, {"protos": {k: v.clone() for k, v in table.items()}})
    assert groups.update == () and groups.others == ("protos",)


def _replies(m: int, size: int) -> tuple[list[Reply], list[dict]]:
    sent = [{"model": {"w": torch.zeros(size)}} for _ in range(m)]
    replies = [
        Reply(i, {"model": {"w": torch.zeros(size)}}, {"loss": 1.0}, 10.0 * i) for i in range(m)
    ]
    return replies, sent


def test_central_noise_on_the_mean_has_the_configured_scale() -> None:
    m, size, std = 8, 200_000, 1.7
    replies, sent = _replies(m, size)
    out = central_mean(
        replies, sent, (std, 0.0), m, 2, SeededNoise(torch.Generator().manual_seed(0))
    )
    noised = out[0].records["model"]["w"]
    assert float(noised.std()) == pytest.approx(std / m, rel=0.01)
    assert abs(float(noised.mean())) < 5 * std / m / math.sqrt(size)
    # every reply is the one release, weighted alike, its metrics not sent
    assert all(torch.equal(r.records["model"]["w"], noised) for r in out)
    assert {r.num_examples for r in out} == {1.0} and all(r.metrics == {} for r in out)


def test_local_noise_has_the_configured_scale_on_every_group() -> None:
    message = {"model": {"w": torch.zeros(100_000)}}
    reply = {
        "model": {"w": torch.zeros(100_000)},
        "banks": {"b": torch.zeros(50_000)},
    }
    assert split(reply, message).count == 2
    out = noise_reply(reply, message, (0.3, 2.0), SecureNoise())
    assert float(out["model"]["w"].std()) == pytest.approx(0.3, rel=0.02)
    assert float(out["banks"]["b"].std()) == pytest.approx(2.0, rel=0.02)


def test_central_prototypes_are_a_noised_mean_per_class_over_its_holders() -> None:
    records = [
        {"protos": {"classes": torch.tensor([0, 1]), "means": torch.tensor([[1.0], [3.0]])}},
        {"protos": {"classes": torch.tensor([1]), "means": torch.tensor([[5.0]])}},
    ]
    replies = [Reply(i, r) for i, r in enumerate(records)]
    out = central_mean(replies, [{}, {}], (0.0, 0.0), 2, 3, SecureNoise())
    protos = out[1].records["protos"]
    assert protos["classes"].tolist() == [0, 1]  # class 2: nobody holds it
    assert protos["means"].flatten().tolist() == [1.0, 4.0]


# binary records (FedSub's masks) ----------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    bits=st.lists(st.booleans(), min_size=2, max_size=300),
    bound=st.floats(1e-3, 50.0),
)
def test_a_binary_record_is_sent_at_exactly_its_bound_and_decodes_to_its_bits(bits, bound) -> None:
    """Centred and scaled, every mask has norm `prototype_clip` (no mask exceeds it, and the
    server cannot tell masks apart by their norm); its sign gives the bits back."""
    half = len(bits) // 2
    masks = {"a": torch.tensor(bits[:half]).reshape(-1, 1), "b": torch.tensor(bits[half:])}
    clipped, _ = clip_reply({"masks": masks}, {}, 1.0, bound)
    sent = clipped["masks"]
    assert all(v.is_floating_point() for v in sent.values())
    norm = math.sqrt(sum(float(v.double().pow(2).sum()) for v in sent.values()))
    assert norm <= bound * (1 + 1e-6) and norm == pytest.approx(bound, rel=1e-5)
    assert binary_names(clipped) == ["masks"]
    decoded = decode_binary({k: v for k, v in clipped.items() if k != PRIVACY}, ["masks"])
    assert all(torch.equal(decoded["masks"][k], masks[k]) for k in masks)


def test_central_masks_are_the_noised_majority_of_the_round() -> None:
    """Without noise the sign of the mean of centred bits is the majority vote, whatever
    the denominator (Poisson divides by the expected count)."""
    votes = [[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 0]]
    replies, sent = [], []
    for i, bits in enumerate(votes):
        reply, _ = clip_reply({"masks": {"m": torch.tensor(bits, dtype=torch.bool)}}, {}, 1, 2)
        replies.append(Reply(i, {"masks": reply["masks"]}))
        sent.append({})
    out = central_mean(replies, sent, (0.0, 0.0), 7.5, 2, SecureNoise())
    assert decode_binary(out[0].records, ["masks"])["masks"]["m"].tolist() == [
        True,
        True,
        True,
        False,
    ]


def _fedsub_on_har(folder, *extra: str):
    path = uci_har_slice(folder / "har6.npz", [1, 3, 5, 6, 7, 8], every=8)
    return har_slice_config(
        path,
        "model.name=mlp",
        "model.hidden=[64]",
        "algorithm.name=fedsub",
        "eval.generalization=false",
        "privacy.enabled=true",
        "privacy.noise_multiplier=1",
        *extra,
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    ("mode", "event"),
    [
        ("central", dp_event.SampledWithoutReplacementDpEvent(6, 4, dp_event.GaussianDpEvent(0.5))),
        ("local", dp_event.GaussianDpEvent(0.5)),
    ],
)
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_fedsub_runs_private_with_binary_masks_and_dp_accountings_epsilon(
    shared_data, tmp_path, mode, event
) -> None:
    """Real UCI-HAR clients: the masks FedSub's server fuses are bits again, and every
    round's epsilon is dp-accounting's own for the round's event (replace-one adjacency)."""
    cfg = _fedsub_on_har(
        tmp_path, f"privacy.mode={mode}", "train.clients_per_round=4", "privacy.accountant=rdp"
    )
    loop = simulate(prepare(cfg))
    fused = loop.algorithm.inner
    seen: list[torch.Tensor] = []

    def spy(server, replies, server_round):
        replies = list(replies)
        seen.extend(t for r in replies for t in r.records["masks"].values())
        return type(fused).aggregate(fused, server, replies, server_round)

    fused.aggregate = spy
    summary = loop.run()
    assert summary.status == "complete" and seen
    assert all(t.dtype == torch.bool for t in seen)
    relation = dp_accounting.NeighboringRelation.REPLACE_ONE
    for record in loop.history:
        theirs = rdp.RdpAccountant(neighboring_relation=relation)
        theirs.compose(event, record.round)
        assert record.epsilon == theirs.get_epsilon(1e-5)
    assert summary.privacy is not None and summary.privacy.epsilon == loop.history[-1].epsilon


# private runs -----------------------------------------------------------------------------
@pytest.mark.integration
def test_a_private_run_records_epsilon_every_round(tmp_path) -> None:
    cfg = _cfg("privacy.target_epsilon=4", "train.clients_per_round=3")
    loop = start(cfg, tmp_path / "run")
    summary = loop.run()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    spent = [line["server"]["epsilon"] for line in lines]
    assert spent == sorted(spent) and spent[-1] == pytest.approx(4.0, rel=1e-3)
    assert [r.epsilon for r in loop.history] == spent
    assert summary.privacy is not None and summary.privacy.epsilon == spent[-1]
    assert summary.privacy.noise_multiplier == lines[-1]["server"]["noise_multiplier"] > 0
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["privacy"]["epsilon"] == spent[-1] and written["privacy"]["mode"] == "central"
    assert all(line["train_loss"] is None for line in lines)  # the loss is not sent


@pytest.mark.integration
def test_a_private_run_resumes_to_the_uninterrupted_numbers(tmp_path) -> None:
    overrides = [
        "privacy.noise_multiplier=0.8",
        "privacy.adaptive=true",
        "privacy.count_noise=2",
        "privacy.sampling=poisson",
        "privacy.noise=seeded",  # replayable noise: research on simulations only
    ]
    whole = start(_cfg(*overrides), tmp_path / "whole").run()

    cut = _cfg(*overrides)
    loop = start(cut, tmp_path / "cut")
    stop = {"after": 2}

    def interrupt(server_round, *_):
        if server_round == stop["after"]:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        loop.run(on_round=interrupt)
    resumed = resume(tmp_path / "cut").run()
    assert resumed.final == whole.final and resumed.privacy == whole.privacy


@pytest.mark.integration
def test_a_poisson_round_that_draws_nobody_leaves_the_model() -> None:
    cfg = _cfg(
        "privacy.noise_multiplier=1",
        "privacy.sampling=poisson",
        "train.clients_per_round=1",
        "train.rounds=6",
        "privacy.noise=seeded",
    )
    loop = simulate(prepare(cfg))
    drawn = [len(loop.sample(r)) for r in range(1, 7)]
    assert 0 in drawn and max(drawn) > 0  # seed 0 draws some empty rounds, some not
    summary = loop.run()
    assert summary.status == "complete" and summary.privacy is not None


def test_adaptive_clipping_moves_the_clip_norm_toward_the_quantile(tmp_path) -> None:
    """Noise off and a bound no update reaches: every update is unclipped, so the norm
    shrinks by exp(-clip_lr x (1 - target_quantile)) each round."""
    cfg = _cfg(
        "privacy.noise_multiplier=1e-6",
        "privacy.count_noise=1e-6",
        "privacy.adaptive=true",
        "privacy.clip_norm=1000",
        "privacy.clip_lr=0.5",
    )
    loop = simulate(prepare(cfg))
    loop.run()
    clips = [r.server["clip_norm"] for r in loop.history]
    factor = math.exp(-0.5 * 0.5)
    assert clips == pytest.approx([1000 * factor**k for k in range(3)], rel=1e-4)


def test_a_private_algorithm_copies_and_delegates_its_helpers() -> None:
    import copy

    algorithm = prepare(_cfg("privacy.noise_multiplier=1", "algorithm.name=fedproto")).algorithm
    twin = copy.deepcopy(algorithm)
    assert twin.name == "fedproto" and twin.dp == algorithm.dp
    assert twin.local_loss is not None  # FedProto's own helper, through the wrapper


def test_privacy_off_leaves_the_records_as_they_were(tmp_path) -> None:
    loop = simulate(prepare(load_config(None, DIGITS)))
    summary = loop.run()
    assert summary.privacy is None and "privacy" not in summary.to_json()
    assert all(r.epsilon is None and "epsilon" not in r.server for r in loop.history)
    assert all(r.train_loss is not None for r in loop.history)


def test_clipping_alone_without_noise_changes_the_model(tmp_path) -> None:
    """The privacy layer is on the path: a tiny bound slows FedAvg to a crawl."""
    plain = simulate(prepare(load_config(None, DIGITS))).run()
    clipped = simulate(
        prepare(_cfg("privacy.noise_multiplier=1e-6", "privacy.clip_norm=1e-4"))
    ).run()
    assert plain.final is not None and clipped.final is not None
    assert plain.final.personalization.acc > 0.7
    assert clipped.final.personalization.acc < plain.final.personalization.acc - 0.3
    # where it learns nothing, the warning names the privacy layer, not the learning rate
    assert all("privacy.enabled" in w for w in clipped.warnings if "never beat chance" in w)


@pytest.mark.integration
def test_the_cli_refuses_an_unaccountable_config_in_one_line(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    protofed = Path(sys.executable).with_name("protofed")
    args = [str(protofed), "run", "--out", str(tmp_path / "r"), "-s", "data.name=digits"]
    done = subprocess.run(
        [*args, "-s", "privacy.enabled=true"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "privacy.target_epsilon" in done.stderr
    assert not (tmp_path / "r").exists()  # nothing half-written
