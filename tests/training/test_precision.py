"""train.precision=bf16: autocast in local training, fp32 master weights, fp32 prediction."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from protofed.config import AlpConfig, ModelConfig, TrainConfig, load_config
from protofed.errors import ConfigError
from protofed.models import build_model
from protofed.nn import Linear
from protofed.runtime import prepare, simulate
from protofed.training.loop import predict, train_epochs

# bf16 keeps 8 bits of mantissa: a few epochs of fp32 and bf16 training from the same start
# must end within these margins of each other (measured here: the same digits accuracy and
# epoch losses within 0.1 %; HART within 1 %).
ACC_MARGIN = 0.05
LOSS_MARGIN = 0.05  # relative


def _digits_run(client, precision: str, threads: int) -> tuple[dict, list[float], float]:
    """mlp on one digits client, 4 epochs one at a time: weights, epoch losses, test accuracy."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="mlp", hidden=[64]), (64,), 10)
    train = TrainConfig(batch_size=16, lr=0.1, local_epochs=1, precision=precision)
    generator = torch.Generator().manual_seed(1)
    losses = [
        train_epochs(model, client.train_x, client.train_y, train, generator)["loss"]
        for _ in range(4)
    ]
    acc = (predict(model, client.test_x) == client.test_y).float().mean().item()
    return model.state_dict(), losses, acc


@pytest.mark.integration
@pytest.mark.parametrize("threads", [1, 2])  # 1: the oneDNN Linear must step aside
def test_bf16_trains_close_to_fp32_and_repeats_exactly(digits_clients, threads):
    client = digits_clients(600)[0]
    ref_w, ref_loss, ref_acc = _digits_run(client, "fp32", threads)
    w, loss, acc = _digits_run(client, "bf16", threads)
    again_w, again_loss, again_acc = _digits_run(client, "bf16", threads)

    assert all(p.dtype == torch.float32 for p in w.values())  # master weights stay fp32
    assert loss[-1] < 0.75 * loss[0] and acc > 0.5  # it trains (10 classes: chance is 0.1)
    assert any(not torch.equal(w[k], ref_w[k]) for k in w)  # bf16 did run
    assert loss != ref_loss
    assert acc == pytest.approx(ref_acc, abs=ACC_MARGIN)
    for a, b in zip(loss, ref_loss, strict=True):
        assert a == pytest.approx(b, rel=LOSS_MARGIN)
    assert again_loss == loss and again_acc == acc  # same seed, same bf16 numbers
    for k in w:
        assert torch.equal(w[k], again_w[k])


def test_bf16_takes_the_autograd_loop():
    """Plain SGD would take the fused fp32 path; with bf16 `fused` must make no difference."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="cnn1d"), (6, 32), 4)
    x, y = torch.randn(40, 6, 32), torch.randint(0, 4, (40,))
    out = []
    for fused in (True, False):
        m = copy.deepcopy(model)
        train = TrainConfig(batch_size=10, lr=0.05, precision="bf16", fused=fused)
        out.append((train_epochs(m, x, y, train, torch.Generator().manual_seed(1)), m))
    (a, ma), (b, mb) = out
    assert a == b
    for (k, v), w in zip(ma.state_dict().items(), mb.state_dict().values(), strict=True):
        assert torch.equal(v, w), k


@pytest.mark.parametrize("threads", [1, 2])
def test_linear_follows_autocast_and_stays_fp32_without(threads):
    torch.set_num_threads(threads)
    layer, x = Linear(8, 4), torch.randn(3, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16
    assert layer(x).dtype == torch.float32


@pytest.mark.integration
def test_hart_with_alp_trains_in_bf16_on_uci_har(shared_data):
    """HART with ALP layers, a few bf16 Adam steps on a slice of real UCI-HAR windows: the
    matching stays fp32 (the banks too), the loss is finite and close to fp32's."""
    from protofed.config import DataConfig
    from protofed.data import load_dataset
    from protofed.nn.alp import BETA, alp_layers

    torch.set_num_threads(1)
    ds = load_dataset(DataConfig(name="uci_har", dir=str(shared_data)))
    x = torch.as_tensor(ds.X[::100][:96], dtype=torch.float32)  # every class, many subjects
    y = torch.as_tensor(ds.y[::100][:96], dtype=torch.long)
    torch.manual_seed(0)
    cfg = ModelConfig(name="hart", alp=AlpConfig(enabled=True, prototypes=[64]))
    model = build_model(cfg, tuple(x.shape[1:]), 6)
    for layer in alp_layers(model).values():  # beta > 0: aligned tokens enter the forward pass
        getattr(layer, BETA).fill_(0.2)
    results = {}
    for precision in ("fp32", "bf16"):
        m = copy.deepcopy(model)
        train = TrainConfig(batch_size=32, optimizer="adam", lr=1e-3, precision=precision)
        metrics = train_epochs(m, x, y, train, torch.Generator().manual_seed(1), epochs=2)
        results[precision] = (metrics["loss"], m.state_dict())
    (loss32, w32), (loss16, w16) = results["fp32"], results["bf16"]
    assert math.isfinite(loss16) and loss16 != loss32
    assert loss16 == pytest.approx(loss32, rel=LOSS_MARGIN)
    assert all(v.dtype == w32[k].dtype for k, v in w16.items())  # banks and weights fp32


@pytest.mark.integration
def test_a_bf16_run_on_uci_har_natural_clients(shared_data):
    cfg = load_config(
        None,
        [
            f"data.dir={shared_data}",
            "data.name=uci_har",
            "data.partition=natural",
            "model.name=cnn1d",
            "train.rounds=2",
            "train.clients_per_round=3",
            "train.batch_size=32",
            "train.lr=0.05",
            "train.threads=1",
            "train.precision=bf16",
            "eval.every=2",
            "eval.generalization=false",
        ],
    )
    losses: list[float] = []
    summary = simulate(prepare(cfg)).run(
        on_round=lambda r, info, rec: losses.append(info.train_loss)
    )
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    assert summary.final.personalization.acc > 0.3  # 6 classes: chance ~0.17


def test_config_rejects_an_unknown_precision():
    assert TrainConfig().precision == "fp32"
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.precision=fp16"])
    message = str(err.value)
    assert "train.precision" in message and "\n" not in message


def test_fp32_leaves_the_fingerprint_as_before_and_bf16_changes_it():
    """Checkpoints from before the key resume; switching precision does not, silently."""
    from protofed.runtime.fingerprint import check_fingerprint, fingerprint

    base = ["data.name=synthetic", "data.num_clients=2", "model.name=mlp"]
    fp32 = fingerprint(prepare(load_config(None, base)))
    assert "train.precision" not in fp32["config"]
    bf16 = fingerprint(prepare(load_config(None, [*base, "train.precision=bf16"])))
    with pytest.raises(ConfigError, match="train.precision"):
        check_fingerprint(fp32, bf16, "run", 1)
