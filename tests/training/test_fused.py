"""The autograd-free path must train exactly as autograd + torch's optimizers do."""

from __future__ import annotations

import copy

import pytest
import torch

from protofed.config import ModelConfig, TrainConfig
from protofed.models import build_model
from protofed.nn import linear
from protofed.training import loop
from protofed.training.fused import Kernels, sequential_layers
from protofed.training.loop import _fused_layers, cross_entropy, make_optimizer, train_epochs


def _count_fused_steps(monkeypatch) -> list[int]:
    """Spy on the autograd-free step: one entry per step it takes, so a test comparing the
    two paths can tell that `fused=True` really ran without autograd (else both arms would run
    the autograd loop and agree vacuously)."""
    calls: list[int] = []
    real = loop.fused_step

    def spy(layers, x, y, update):
        calls.append(len(y))
        return real(layers, x, y, update)

    monkeypatch.setattr(loop, "fused_step", spy)
    return calls


@pytest.mark.integration
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
@pytest.mark.parametrize("onednn", [False, True], ids=["torch", "onednn"])
def test_fused_sgd_equals_autograd(name, shape, hidden, threads, onednn, monkeypatch):
    if onednn and linear.POINTWISE is None:
        pytest.skip("this torch build has no oneDNN linear op")
    monkeypatch.setattr(linear, "USE_ONEDNN", onednn)  # both kernels, whichever this CPU picks
    torch.set_num_threads(threads)
    assert Kernels().onednn == (onednn and threads == 1)
    torch.manual_seed(0)
    cfg = ModelConfig(name=name, **({"hidden": hidden} if hidden else {}))
    model = build_model(cfg, shape, 6)
    assert sequential_layers(model) is not None
    x, y = torch.randn(53, *shape), torch.randint(0, 6, (53,))
    steps = _count_fused_steps(monkeypatch)
    results = []
    for fused in (True, False):
        m = copy.deepcopy(model)
        train = TrainConfig(batch_size=10, lr=0.05, local_epochs=2, fused=fused)
        metrics = train_epochs(m, x, y, train, torch.Generator().manual_seed(1))
        results.append((m.state_dict(), metrics))
        assert len(steps) == 12  # fused: all 12 steps without autograd; not fused: none more
    (fast, fast_m), (ref, ref_m) = results
    assert fast_m["steps"] == ref_m["steps"] == 12
    assert fast_m["loss"] == pytest.approx(ref_m["loss"], rel=1e-5)
    for k in ref:
        torch.testing.assert_close(fast[k], ref[k], rtol=1e-4, atol=1e-5)


OPTIMIZERS = {
    "momentum": TrainConfig(momentum=0.9, lr=0.05),
    "nesterov_wd": TrainConfig(momentum=0.9, nesterov=True, weight_decay=1e-3, lr=0.05),
    # Adam's L2 decay at 1e-2, not 1e-4: at 1e-4, wd * w is about harcnn's smallest gradients
    # (~1e-6), so thousands of coordinates' g + wd * w cancel to ~1e-9, where each path's fp32
    # rounding decides the sign of an lr-sized step. Both paths then drift apart by up to 4e-3
    # (measured on an AVX-512 Xeon, 2026-11-27; at 1e-2 or 0 they agree to 2e-5).
    "adam": TrainConfig(optimizer="adam", lr=1e-3, weight_decay=1e-2),
    "adamw": TrainConfig(optimizer="adamw", lr=1e-3, weight_decay=0.01),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize(("name", "shape"), [("harcnn", (9, 128)), ("cnn1d", (6, 128))])
def test_every_optimizer_without_autograd_equals_autograd(optimizer, name, shape, monkeypatch):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=name), shape, 6)
    x, y = torch.randn(53, *shape), torch.randint(0, 6, (53,))
    base = OPTIMIZERS[optimizer].model_copy(update={"batch_size": 10, "local_epochs": 2})
    steps = _count_fused_steps(monkeypatch)
    results = []
    for fused in (True, False):
        m = copy.deepcopy(model)
        train = base.model_copy(update={"fused": fused})
        metrics = train_epochs(m, x, y, train, torch.Generator().manual_seed(1))
        results.append((m, metrics))
        assert len(steps) == 12  # fused: all 12 steps without autograd; not fused: none more
    (fast, fast_m), (ref, ref_m) = results
    assert fast_m["steps"] == ref_m["steps"] == 12
    assert fast_m["loss"] == pytest.approx(ref_m["loss"], rel=1e-5)
    # Adam divides each coordinate's step by its own gradient scale, so a gradient that is zero
    # up to rounding can step either way by up to lr: a few of harcnn's 2.25 M weights differ
    # by ~2e-5 after 12 steps of 1e-3 (they moved by 1e-2), which is fp32 rounding, amplified.
    atol = 1e-4 if train.optimizer != "sgd" else 1e-5
    for (k, a), b in zip(fast.state_dict().items(), ref.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=atol, msg=k)
    assert all(p.grad is None for p in fast.parameters())  # no gradient left behind


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_fused_kernels_do_torchs_foreach_arithmetic(optimizer):
    """make_optimizer's fused kernel against torch's foreach one, over several steps."""
    train = OPTIMIZERS[optimizer]
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(64, 33, generator=gen), torch.randn(17, generator=gen)]
    grads = [[torch.randn(t.shape, generator=gen) for t in start] for _ in range(5)]
    finals = []
    for fused in (True, False):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        if fused:
            opt = make_optimizer(params, train)
            assert opt.defaults["fused"] is True
        elif train.optimizer == "sgd":
            opt = torch.optim.SGD(
                params,
                lr=train.lr,
                momentum=train.momentum,
                weight_decay=train.weight_decay,
                nesterov=train.nesterov,
                foreach=True,
            )
        else:
            cls = torch.optim.AdamW if train.optimizer == "adamw" else torch.optim.Adam
            opt = cls(params, lr=train.lr, weight_decay=train.weight_decay, foreach=True)
        for step in grads:
            for p, g in zip(params, step, strict=True):
                p.grad = g.clone()
            opt.step()
        finals.append(params)
    for a, b in zip(*finals, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_the_autograd_loop_where_the_maths_would_change():
    model = build_model(ModelConfig(name="resnet18"), (3, 32, 32), 10)
    assert sequential_layers(model) is None  # BatchNorm, residuals
    mlp = build_model(ModelConfig(name="mlp"), (4,), 3)
    x = torch.randn(20, 4)
    train = TrainConfig(momentum=0.9)
    assert _fused_layers(mlp, x, train, cross_entropy, None, None) is not None
    other_loss = lambda m, xb, yb: cross_entropy(m, xb, yb) * 2  # noqa: E731
    assert _fused_layers(mlp, x, train, other_loss, None, None) is None
    assert _fused_layers(mlp, x, train, cross_entropy, list(mlp.parameters()), None) is None
    assert _fused_layers(mlp, x, train, cross_entropy, None, lambda: None) is None
    assert _fused_layers(mlp, x.double(), train, cross_entropy, None, None) is None
    off = train.model_copy(update={"fused": False})
    assert _fused_layers(mlp, x, off, cross_entropy, None, None) is None


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
