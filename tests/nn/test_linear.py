"""protofed.nn.Linear must be nn.Linear in everything but speed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from protofed.nn import Linear
from protofed.nn.linear import POINTWISE, matmul_nt, onednn_applies, onednn_products

# Both kernels (oneDNN needs the op in the torch build).
KERNELS = [False, True] if POINTWISE is not None else [False]


@pytest.fixture(params=KERNELS, ids=lambda on: "onednn" if on else "torch")
def kernel(request):
    with onednn_products(request.param):
        yield request.param


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("batch", "fan_in", "fan_out"), [(10, 1664, 1024), (10, 512, 6), (3, 7, 5)]
)
def test_fast_path_matches_f_linear(one_thread, kernel, batch, fan_in, fan_out):
    torch.manual_seed(0)
    layer = Linear(fan_in, fan_out)
    x = torch.randn(batch, fan_in, requires_grad=True)
    assert onednn_applies(x, layer.weight) == kernel
    out = layer(x)
    grad = torch.randn_like(out)
    out.backward(grad)
    fast = (out.detach(), x.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone())
    x.grad = layer.weight.grad = layer.bias.grad = None
    ref = F.linear(x, layer.weight, layer.bias)
    ref.backward(grad)
    slow = (ref.detach(), x.grad, layer.weight.grad, layer.bias.grad)
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_same_state_dict_as_nn_linear():
    assert list(Linear(4, 3).state_dict()) == list(torch.nn.Linear(4, 3).state_dict())


def test_no_bias_and_frozen_weight(one_thread, kernel):
    layer = Linear(8, 4, bias=False)
    layer.weight.requires_grad_(False)
    x = torch.randn(5, 8, requires_grad=True)
    layer(x).sum().backward()
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(5, 8))
    assert layer.weight.grad is None


@pytest.mark.integration
@pytest.mark.parametrize("threads", [1, 2])
def test_matmul_nt_is_a_times_b_transposed(threads, kernel):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        a, b = torch.randn(300, 192, generator=gen), torch.randn(517, 192, generator=gen)
        torch.testing.assert_close(matmul_nt(a, b), a @ b.T, rtol=1e-5, atol=1e-4)
        assert matmul_nt(a, b).shape == (300, 517)
        batched = torch.randn(3, 7, 192, generator=gen)  # batched operands take torch's path
        torch.testing.assert_close(matmul_nt(batched, b), batched @ b.T)
        w = b.clone().requires_grad_(True)  # inside autograd: torch's path, gradient intact
        matmul_nt(a, w).sum().backward()
        torch.testing.assert_close(w.grad, a.sum(0).expand_as(w).contiguous(), rtol=1e-5, atol=1e-4)
    finally:
        torch.set_num_threads(before)


def test_torchs_kernel_unless_a_caller_asks_for_onednn(one_thread):
    layer, x = Linear(8, 4), torch.randn(5, 8, requires_grad=True)
    assert not onednn_applies(x, layer.weight)  # the default: torch's own kernel
    with onednn_products():
        assert onednn_applies(x, layer.weight) == (POINTWISE is not None)
        with onednn_products(False):  # an inner context wins, and is undone on leaving
            assert not onednn_applies(x, layer.weight)
        assert onednn_applies(x, layer.weight) == (POINTWISE is not None)
    assert not onednn_applies(x, layer.weight)
