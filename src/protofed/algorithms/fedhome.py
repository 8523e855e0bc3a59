"""FedHome: FedAvg, then per-client head fine-tuning on SMOTE-balanced embeddings (docs/algorithms/fedhome.md)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from pydantic import Field

from protofed.algorithms.base import Algorithm, Hyperparams, Setting
from protofed.algorithms.common.split import split_arrays
from protofed.core.types import MODEL, AggregateResult, Arrays, FitResult, Records, Reply
from protofed.errors import ConfigError
from protofed.prototypes import embed
from protofed.training.client import Client
from protofed.training.loop import train_epochs

if TYPE_CHECKING:
    pass

HEAD = "head"  # a client's state in the fine-tuning phase: its fine-tuned head


def smote_balance(
    x: torch.Tensor, y: torch.Tensor, k: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) followed by SMOTE samples that bring every class to the largest class's count.

    Each synthetic point is x_a + u * (x_b - x_a) with x_a a random sample of the class, x_b one
    of its k nearest neighbours within the class and u ~ U(0, 1); all draws use `generator`.
    """
    x = x.reshape(len(x), -1)
    counts = torch.bincount(y.long())
    target = int(counts.max()) if len(counts) else 0
    new_x, new_y = [x], [y]
    for c in range(len(counts)):
        n = int(counts[c])
        if n < 2 or n >= target:
            continue
        members = x[y == c]
        kk = min(k, n - 1)
        dist = torch.cdist(members, members)
        dist.fill_diagonal_(float("inf"))
        neighbours = dist.topk(kk, largest=False).indices.cpu()  # (n, kk)
        need = target - n
        base = torch.randint(n, (need,), generator=generator)
        pick = torch.randint(kk, (need,), generator=generator)
        other = neighbours[base, pick]
        u = torch.rand(need, 1, generator=generator, dtype=x.dtype).to(x.device)
        a, b = members[base.to(x.device)], members[other.to(x.device)]
        new_x.append(a + u * (b - a))
        new_y.append(torch.full((need,), c, dtype=y.dtype, device=y.device))
    return torch.cat(new_x), torch.cat(new_y)


class FedHome(Algorithm):
    name = "fedhome"
    summary = "FedAvg, then each client fine-tunes its head on SMOTE-balanced embeddings."
    reference = (
        "Wu et al., FedHome: Cloud-Edge Based Personalized Federated Learning for In-Home "
        "Health Monitoring, IEEE TMC 2022"
    )

    class Params(Hyperparams):
        finetune_rounds: int = Field(
            50,
            ge=0,
            description="The last rounds are fine-tuning rounds (FedSub/ProtoHAR: 50); must be below train.rounds.",
        )
        k_neighbors: int = Field(5, ge=1, description="SMOTE's k nearest neighbours (SMOTE: 5).")
        finetune_epochs: int | None = Field(
            None, ge=1, description="Head epochs per fine-tuning round; None: train.local_epochs."
        )
        head_lr: float | None = Field(
            None, gt=0, description="Learning rate of the head fine-tuning; None: train.lr."
        )

    params: Params

    def __init__(self, params: Hyperparams, setting: Setting) -> None:
        super().__init__(params, setting)
        rounds = setting.train.rounds
        if self.params.finetune_rounds >= rounds:
            raise ConfigError(
                f"algorithm.finetune_rounds={self.params.finetune_rounds} must be below "
                f"train.rounds={rounds} (FedHome needs FedAvg rounds before fine-tuning)"
            )

    def finetuning(self, server_round: int) -> bool:
        """Whether `server_round` belongs to the personalization phase."""
        return server_round > self.setting.train.rounds - self.params.finetune_rounds

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(message[MODEL])
        if not self.finetuning(client.server_round):
            metrics = client.train_model()
            return FitResult({MODEL: client.weights()}, metrics)
        client.load(self.head(message, state))
        model = client.model
        z = embed(model, client.data.train_x)
        zb, yb = smote_balance(z, client.data.train_y, self.params.k_neighbors, client.generator)
        metrics = train_epochs(
            model.head,
            zb,
            yb,
            client.train,
            client.generator,
            epochs=self.params.finetune_epochs,
            lr=self.params.head_lr,
        )
        metrics["balanced_examples"] = float(len(yb))
        _, head = split_arrays(client.weights())
        return FitResult({}, metrics, {HEAD: head})

    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        if self.finetuning(server_round):
            for _ in replies:  # nothing is sent up: the global model stays as it is
                pass
            return AggregateResult(server)
        return super().aggregate(server, replies, server_round)

    def head(self, message: Records, state: Records) -> Arrays:
        return state[HEAD] if state else split_arrays(message[MODEL])[1]

    def client_model(self, message: Records, state: Records) -> Arrays:
        return {**message[MODEL], **state.get(HEAD, {})}
