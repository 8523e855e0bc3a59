"""End to end on real data from ../shared/data (skipped when it is absent)."""

from __future__ import annotations

import pytest

from protofed.config import load_config
from protofed.runtime import prepare, simulate

# whole runs on real data
pytestmark = pytest.mark.integration


@pytest.mark.parametrize("algorithm", ["fedavg", "fedper", "ditto"])
def test_uci_har_natural_clients_learn(shared_data, algorithm):
    cfg = load_config(
        None,
        [
            f"data.dir={shared_data}",
            "data.name=uci_har",
            "data.partition=natural",
            "model.name=cnn1d",
            f"algorithm.name={algorithm}",
            "train.rounds=3",
            "train.batch_size=32",
            "train.lr=0.05",
            "train.momentum=0.9",
            "train.clients_per_round=10",
            "eval.every=3",
            "train.workers=2",
        ],
    )
    sim = simulate(prepare(cfg))
    losses = []
    summary = sim.run(on_round=lambda r, info, rec: losses.append(info.train_loss))
    assert summary.num_clients == 30
    assert losses[-1] < losses[0]
    assert summary.final.personalization.acc > 1 / 6 + 0.1  # well above chance
    assert len(sim.history[-1].clients.pers_f1) == 30
