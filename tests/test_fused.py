"""The autograd-free SGD path must train exactly as autograd + torch.optim.SGD does."""

from __future__ import annotations

import copy

import pytest
import torch

from protofed.config import ModelConfig, TrainConfig
from protofed.models import build_model
from protofed.training.fused import sequential_layers
from protofed.training.loop import train_epochs


@pytest.mark.parametrize(
    ("name", "shape", "hidden"),
    [
        ("harcnn", (9, 128), None),
        ("cnn1d", (6, 128), None),
        ("mlp", (1, 8, 8), [32, 16]),
        ("cnn1d", (3, 37), None),
    ],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_sgd_equals_autograd(name, shape, hidden, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = ModelConfig(name=name, **({"hidden": hidden} if hidden else {}))
    model = build_model(cfg, shape, 6)
    assert sequential_layers(model) is not None
    x, y = torch.randn(53, *shape), torch.randint(0, 6, (53,))
    results = []
    for fused in (True, False):
        m = copy.deepcopy(model)
        train = TrainConfig(batch_size=10, lr=0.05, local_epochs=2, fused=fused)
        metrics = train_epochs(m, x, y, train, torch.Generator().manual_seed(1))
        results.append((m.state_dict(), metrics))
    (fast, fast_m), (ref, ref_m) = results
    assert fast_m["steps"] == ref_m["steps"] == 12
    assert fast_m["loss"] == pytest.approx(ref_m["loss"], rel=1e-5)
    for k in ref:
        torch.testing.assert_close(fast[k], ref[k], rtol=1e-4, atol=1e-5)


def test_not_used_where_it_would_change_the_maths():
    model = build_model(ModelConfig(name="resnet18"), (3, 32, 32), 10)
    assert sequential_layers(model) is None  # BatchNorm, residuals
    mlp = build_model(ModelConfig(name="mlp"), (4,), 3)
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    for train in (
        TrainConfig(momentum=0.9),
        TrainConfig(weight_decay=1e-4),
        TrainConfig(optimizer="adam", lr=1e-3),
    ):
        a, b = copy.deepcopy(mlp), copy.deepcopy(mlp)
        train_epochs(a, x, y, train, torch.Generator().manual_seed(0))
        off = train.model_copy(update={"fused": False})
        train_epochs(b, x, y, off, torch.Generator().manual_seed(0))
        for k, v in a.state_dict().items():
            assert torch.equal(v, b.state_dict()[k])  # both took the autograd loop


def test_optimizers_are_torchs_own_with_nesterov_and_adamw() -> None:
    """momentum, Nesterov and AdamW come from torch.optim, so their arithmetic is torch's."""
    from protofed.config import TrainConfig
    from protofed.training.loop import make_optimizer

    params = [torch.nn.Parameter(torch.zeros(3))]
    sgd = make_optimizer(params, TrainConfig(momentum=0.9, nesterov=True), None)
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["nesterov"] is True
    plain = make_optimizer(params, TrainConfig(nesterov=True), None)  # no momentum: no Nesterov
    assert plain.defaults["nesterov"] is False
    adamw = make_optimizer(params, TrainConfig(optimizer="adamw", weight_decay=0.01), 1e-3)
    assert type(adamw) is torch.optim.AdamW and adamw.defaults["lr"] == 1e-3
