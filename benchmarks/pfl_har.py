"""pfl-research (Apple's `pfl`) on PFLlib's UCI-HAR work: the pfl side of pfllib_side_by_side.py.

Why: pfl is a simulator built for speed; protofed's speed claim should hold against it too,
on the same work and in the same sitting as PFLlib and protofed.

How (run by pfllib_side_by_side.py --pfl-python, in pfl's own environment, which has neither
protofed nor PFLlib; nothing here imports them):
  PYTHON benchmarks/pfl_har.py --arrays ARRAYS.npz --rounds R
Install pfl beside its own torch, as its README does, with torch pinned to protofed's:
  python -m venv /tmp/pfl-venv && /tmp/pfl-venv/bin/pip install torch==2.13.0
  echo torch==2.13.0 > /tmp/torch.txt && /tmp/pfl-venv/bin/pip install -c /tmp/torch.txt pfl

The work: FedAvg (pfl's `FederatedAveraging`, the average of the clients' model differences
weighted by their training samples, `WeightByDatapoints`, applied by a central SGD with
learning rate 1), the HARCNN of PFLlib and protofed (2,253,958 parameters; written here
with Conv1d, the same products as PFLlib's (1, 9) Conv2d), plain SGD lr 0.005, batch 10,
1 local epoch, all 30 clients a round, and every round each client's test data scored by the
central model (pfl's central evaluation on a federated validation set of the 30 test sets).
ARRAYS.npz holds client i's `train_x_i`, `train_y_i`, `test_x_i`, `test_y_i` (x: n x 9 x 128
float32), written by pfllib_side_by_side.py from protofed's own clients, so the three train
on identical windows (pfl's Dataset does not reshuffle per epoch: each client's rows are put
in one seeded random order first). pfl simulates in one process (SimulatedBackend); its torch gets the
threads of OMP_NUM_THREADS, as PFLlib's does.

What is timed: the wall time from the end of one central iteration to the end of the next
(training, aggregation, the model update and the evaluation); the evaluation's own share is
the time spent in the model's `metrics` (scoring). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByDatapoints
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import get_user_sampler
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel
from torch import nn


class HARCNN(nn.Module):
    """Two (9-tap conv, ReLU, max-pool by 2) blocks and three dense layers, 6 classes."""

    def __init__(self, channels: int = 9, classes: int = 6) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(channels, 32, 9), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(32, 64, 9), nn.ReLU(), nn.MaxPool1d(2),
            nn.Flatten(),
            nn.Linear(64 * 26, 1024), nn.ReLU(),
            nn.Linear(1024, 512), nn.ReLU(),
            nn.Linear(512, classes),
        )  # fmt: skip
        self.scoring_s = 0.0
        self.correct = 0
        self.seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:  # noqa: A002
        self.eval() if eval else self.train()
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = True) -> dict:  # noqa: A002
        t0 = time.perf_counter()
        self.eval() if eval else self.train()
        logits = self(x)
        correct = int((logits.argmax(1) == y).sum())
        loss = float(F.cross_entropy(logits, y, reduction="sum"))
        self.scoring_s += time.perf_counter() - t0
        self.correct += correct
        self.seen += len(y)
        return {"loss": Weighted(loss, len(y)), "accuracy": Weighted(correct, len(y))}


class RoundClock(TrainingProcessCallback):
    def __init__(self, net: HARCNN) -> None:
        self.net = net
        self.last = time.perf_counter()
        self.rounds: list[dict[str, float]] = []

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        now = time.perf_counter()
        acc = self.net.correct / self.net.seen if self.net.seen else float("nan")
        self.rounds.append({"wall_s": now - self.last, "eval_s": self.net.scoring_s, "acc": acc})
        self.net.scoring_s, self.net.correct, self.net.seen = 0.0, 0, 0
        self.last = now
        return False, Metrics()


def federated(
    arrays: dict[str, np.ndarray], part: str, clients: int, seed: int
) -> FederatedDataset:
    """The clients' `part` arrays, each client's rows in one seeded random order (pfl's
    Dataset keeps its rows' order; protofed's are by subject and time, so unshuffled SGD
    would sweep one activity after the other)."""
    order = [np.random.default_rng([seed, i]).permutation(len(arrays[f"{part}_y_{i}"]))
             for i in range(clients)]  # fmt: skip
    data = {
        i: Dataset(
            raw_data=[
                torch.from_numpy(arrays[f"{part}_x_{i}"][order[i]]),
                torch.from_numpy(arrays[f"{part}_y_{i}"][order[i]]).long(),
            ],
            user_id=str(i),
            train_kwargs={"eval": False},
            eval_kwargs={"eval": True},
        )
        for i in range(clients)
    }
    sampler = get_user_sampler("minimize_reuse", list(range(clients)))
    return FederatedDataset(lambda i: data[i], sampler)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arrays", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with np.load(args.arrays) as npz:  # plain arrays: no pickle
        arrays = {k: npz[k] for k in npz.files}
    clients = int(arrays["clients"])
    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    net = HARCNN()
    model = PyTorchModel(
        model=net,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
    )
    backend = SimulatedBackend(
        training_data=federated(arrays, "train", clients, args.seed),
        val_data=federated(arrays, "test", clients, args.seed),
        postprocessors=[WeightByDatapoints()],
    )
    clock = RoundClock(net)
    setup_s = time.perf_counter() - t0
    clock.last = time.perf_counter()
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=args.rounds,
            evaluation_frequency=1,
            train_cohort_size=clients,
            val_cohort_size=clients,
        ),
        backend=backend,
        model=model,
        model_train_params=NNTrainHyperParams(
            local_learning_rate=0.005, local_num_epochs=1, local_batch_size=10
        ),
        model_eval_params=NNEvalHyperParams(local_batch_size=1024),
        callbacks=[clock],
    )
    print(
        json.dumps(
            {
                "setup_s": setup_s,
                "round_wall_s": [r["wall_s"] for r in clock.rounds],
                "eval_s": [r["eval_s"] for r in clock.rounds],
                "test_acc": [r["acc"] for r in clock.rounds],
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
