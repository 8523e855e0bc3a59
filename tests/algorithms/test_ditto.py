"""Ditto's personal step is Algorithm 1's: v <- v - lr * (grad f(v) + lam * (v - w)), the
pull toward w beside the optimizer, not through its momentum (docs/algorithms/ditto.md).

Real clients from scikit-learn's digits (conftest.digits_clients), a small MLP, one round.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from protofed.algorithms import MODEL, Setting
from protofed.algorithms.common.ala import PERSONAL
from protofed.algorithms.common.regularizers import proximal_loss
from protofed.algorithms.ditto import Ditto
from protofed.config import ModelConfig, TrainConfig
from protofed.models import build_model
from protofed.training.client import Client
from protofed.training.loop import batches


def _model(seed: int):
    torch.manual_seed(seed)
    return build_model(ModelConfig(name="mlp", hidden=[32]), (64,), 10)


def _weights(seed: int):
    return {k: v.detach().clone() for k, v in _model(seed).state_dict().items()}


def _client(data, model, train: TrainConfig) -> Client:
    return Client(0, data, model, train, 1, torch.Generator().manual_seed(11))


def _ditto_personal(data, train: TrainConfig, lam: float, w, v0):
    setting = Setting(num_clients=1, num_classes=10, train=train, init_model=w)
    algo = Ditto(Ditto.Params(lam=lam), setting)
    return algo.fit(_client(data, _model(0), train), {MODEL: w}, {PERSONAL: v0}).state[PERSONAL]


def _reference(data, train: TrainConfig, lam: float, w, v0, *, coupled: bool = False):
    """Algorithm 1 written out: the global phase (to draw the same batches), then per batch
    torch's SGD on the data loss and v -= lr * lam * (v_before - w). `coupled`: the old rule,
    lam/2 * ||v - w||^2 in the loss, so its gradient went through the momentum."""
    model = _model(0)
    client = _client(data, model, train)
    client.load(w)
    client.train_model()  # Ditto's global phase: the generator draws as in `fit`
    client.load(v0)
    if coupled:
        client.train_model(loss_fn=proximal_loss(w, lam))
        return client.weights()
    params = dict(model.named_parameters())
    opt = torch.optim.SGD(params.values(), lr=train.lr, momentum=train.momentum)
    x, y = data.train_x, data.train_y
    for _ in range(train.local_epochs):
        for idx in batches(len(x), train.batch_size, client.generator):
            before = {n: p.detach().clone() for n, p in params.items()}
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
            with torch.no_grad():
                for n, p in params.items():
                    p -= train.lr * lam * (before[n] - w[n])
    return client.weights()


@pytest.mark.integration
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_the_personal_step_pulls_toward_w_outside_the_momentum(digits_clients, momentum):
    data = digits_clients(300)[0]
    train = TrainConfig(local_epochs=2, batch_size=32, lr=0.05, momentum=momentum)
    w, v0 = _weights(1), _weights(2)
    got = _ditto_personal(data, train, 1.0, w, v0)
    want = _reference(data, train, 1.0, w, v0)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6)
    old = _reference(data, train, 1.0, w, v0, coupled=True)
    gap = max(float((got[n] - old[n]).abs().max()) for n in old)
    if momentum == 0:  # plain SGD: Algorithm 1 is SGD on CE + lam/2 ||v - w||^2, as before
        assert gap < 1e-5
    else:  # the pull through momentum 0.9 swung v past w (what diverged on UCI-HAR)
        assert gap > 1e-2
