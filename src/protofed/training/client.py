"""What a client's side of an algorithm is handed: its data, a model to work in, its RNG."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from protofed.config import TrainConfig
from protofed.core.types import Arrays, Metrics
from protofed.data.federated import ClientData
from protofed.models.base import FedModel
from protofed.training.loop import LossFn, cross_entropy, train_epochs


def load_weights(model: FedModel, arrays: Arrays) -> None:
    """Copy named tensors into the model's parameters and buffers (names must exist)."""
    state = model.state_dict()
    with torch.no_grad():
        for name, value in arrays.items():
            target = state.get(name)
            if target is None:
                raise KeyError(f"model has no parameter or buffer named '{name}'")
            target.copy_(value)


def model_weights(model: FedModel) -> Arrays:
    """A detached copy of every parameter and buffer."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@dataclass
class Client:
    """One client in one round, as the algorithm's `fit` sees it.

    `model` is a workspace shared by all clients of a worker: `fit` loads the weights it needs
    into it, so nothing of another client survives in it. `generator` is seeded from
    (seed, round, client), so results do not depend on which clients ran before.
    """

    id: int
    data: ClientData
    model: FedModel
    train: TrainConfig
    server_round: int
    generator: torch.Generator

    @property
    def num_examples(self) -> int:
        return len(self.data.train_y)

    def load(self, arrays: Arrays) -> None:
        """Copy these weights (all or some of the model's) into the workspace model."""
        load_weights(self.model, arrays)

    def weights(self) -> Arrays:
        """A copy of the workspace model's weights as they are now: call it after training."""
        return model_weights(self.model)

    def train_model(
        self,
        *,
        epochs: int | None = None,
        loss_fn: LossFn = cross_entropy,
        parameters: Iterable[torch.Tensor] | None = None,
        lr: float | None = None,
        after_step: Callable[[], None] | None = None,
    ) -> Metrics:
        """Train the workspace model on this client's training split; its metrics.

        `epochs`/`lr` replace `train.local_epochs`/`train.lr`; `loss_fn(model, x, y)` replaces
        cross-entropy (proximal and contrastive terms); `parameters` limits what the optimizer
        moves (FedRep's head, then body); `after_step()` runs after each step.
        """
        return train_epochs(
            self.model,
            self.data.train_x,
            self.data.train_y,
            self.train,
            self.generator,
            epochs=epochs,
            loss_fn=loss_fn,
            parameters=parameters,
            lr=lr,
            after_step=after_step,
        )
