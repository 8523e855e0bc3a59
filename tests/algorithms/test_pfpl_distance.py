"""PFPL's `distance` option: the squared L2 (default) or the unsquared norm the paper's
notation writes, in the neighbour weights and in the consistency loss, on tiny tensors."""

from __future__ import annotations

import pytest
import torch

from protofed.algorithms import Setting, build_algorithm
from protofed.algorithms.pfpl import (
    pair_distances,
    personalized_prototypes,
    unsquared_prototype_distance,
)
from protofed.config import ModelConfig, TrainConfig
from protofed.errors import ConfigError
from protofed.models import build_model

# 3 clients, 1 class, D = 2: client 0 at the origin, client 1 at (3, 4) (distance 5, squared
# 25), client 2 at (0, 1) (distance 1, squared 1).
MEANS = torch.tensor([[[0.0, 0.0]], [[3.0, 4.0]], [[0.0, 1.0]]])
COUNTS = torch.ones(3, 1)


def test_pair_distances_squared_and_unsquared() -> None:
    own, theirs = MEANS[0, 0], MEANS[1:, 0]
    assert pair_distances(theirs, own).tolist() == [25.0, 1.0]
    assert pair_distances(theirs, own, "unsquared").tolist() == [5.0, 1.0]
    with pytest.raises(ValueError, match="distance"):
        pair_distances(theirs, own, "cosine")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("distance", "weights"),
    [("squared", [25 / 26, 1 / 26]), ("unsquared", [5 / 6, 1 / 6])],
)
def test_literal_weights_from_either_distance(distance: str, weights: list[float]) -> None:
    """weights='literal' is k_im = d_im / sum d: with the unsquared norm, the paper's
    ||C_i, C_m||_2 / sum ||.||_2 as its notation writes it (the default squared form gives
    the far client 25/26, the unsquared 5/6)."""
    out, present = personalized_prototypes(
        MEANS,
        COUNTS,
        0,
        alpha=0.5,
        mode="literal",
        distance=distance,  # type: ignore[arg-type]
    )
    expected = 0.5 * (weights[0] * MEANS[1, 0] + weights[1] * MEANS[2, 0])
    assert out[0].tolist() == pytest.approx(expected.tolist())
    assert present.tolist() == [True]


def test_inverse_weights_from_the_unsquared_norm() -> None:
    out, _ = personalized_prototypes(MEANS, COUNTS, 0, alpha=0.0, distance="unsquared")
    w_far, w_near = (1 / 5) / (1 / 5 + 1), 1 / (1 / 5 + 1)
    assert out[0].tolist() == pytest.approx((w_far * MEANS[1, 0] + w_near * MEANS[2, 0]).tolist())


def test_unsquared_consistency_loss_on_a_tiny_batch() -> None:
    """Rows at distances 5 and 0 from their class prototype, a third of a class without one:
    the mean norm over the two kept rows (2.5), or divided by sqrt(D) with 'mean'; zero
    gradient (not NaN) for the row on its prototype."""
    f = torch.tensor([[3.0, 4.0], [1.0, 1.0], [7.0, 7.0]], requires_grad=True)
    y = torch.tensor([0, 1, 2])
    protos = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    present = torch.tensor([True, True, False])
    whole = unsquared_prototype_distance(f, y, protos, present, "squared_l2")
    assert whole.item() == pytest.approx(2.5)
    per_dim = unsquared_prototype_distance(f, y, protos, present, "mean")
    assert per_dim.item() == pytest.approx(2.5 / 2**0.5)
    whole.backward()
    assert f.grad is not None
    assert f.grad[0].tolist() == pytest.approx([0.5 * 3 / 5, 0.5 * 4 / 5])
    assert f.grad[1].tolist() == [0.0, 0.0] and f.grad[2].tolist() == [0.0, 0.0]
    # class means: class 0's mean (3, 4) against (0, 0) and class 1's (1, 1) on its prototype
    means = unsquared_prototype_distance(f, y, protos, present, "squared_l2", "class_mean")
    assert means.item() == pytest.approx(2.5)


def _pfpl(params: dict) -> tuple[torch.nn.Module, object]:
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="mlp", hidden=[4]), (3,), 2)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    setting = Setting(2, 2, TrainConfig(local_epochs=1, batch_size=4, lr=0.1), init)
    return model, build_algorithm("pfpl", params, setting)


def test_pfpl_loss_uses_the_chosen_distance() -> None:
    """The client's loss minus the cross-entropy is lam times the mean distance: squared by
    default (FedProto's form), the unsquared norm with distance=unsquared."""
    model, squared = _pfpl({"reg_reduction": "squared_l2"})
    _, unsquared = _pfpl({"reg_reduction": "squared_l2", "distance": "unsquared"})
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 0])
    protos, present = torch.randn(2, 4), torch.ones(2)
    features = model.features(x).reshape(5, -1)  # type: ignore[operator]
    rows = ((features - protos[y]) ** 2).sum(-1)
    ce = torch.nn.functional.cross_entropy(model(x), y)
    got_sq = squared.local_loss(protos, present)(model, x, y) - ce  # type: ignore[attr-defined]
    got_un = unsquared.local_loss(protos, present)(model, x, y) - ce  # type: ignore[attr-defined]
    assert got_sq.item() == pytest.approx(rows.mean().item(), rel=1e-5)
    assert got_un.item() == pytest.approx(rows.sqrt().mean().item(), rel=1e-5)


def test_unsquared_refuses_the_stacked_round() -> None:
    """The stacked round's prototype term is squared: asking it for PFPL's unsquared loss is
    a one-line error naming the switch, not a silent squared loss."""
    _, pfpl = _pfpl({"distance": "unsquared"})
    with pytest.raises(ConfigError, match="train.stacked=false"):
        pfpl.regularizer()  # type: ignore[attr-defined]
    _, default = _pfpl({})
    assert default.params.distance == "squared"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="distance"):
        _pfpl({"distance": "l1"})
