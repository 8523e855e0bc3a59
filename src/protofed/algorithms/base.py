"""The algorithm interface: four small questions, answered with named records of arrays.

An algorithm answers:
1. What does the server keep?  `init_server` builds the server state.
2. What does the server send to client i this round?  `configure` (it may differ per client).
3. What does client i do with it, and what does it send back?  `fit`, given the message and
   the client's own state from earlier rounds; it returns a `FitResult` (reply, metrics, the
   state the client keeps).
4. How does the server combine the replies?  `aggregate`, returning an `AggregateResult`
   (the new server state and the server's own metrics).
Plus the models it is evaluated with: `client_model` (the client's personalized weights,
built on the client side from the message and its state), `trained_model` (the model the
client holds right after its local training, for `eval.client_model=trained`) and
`global_model` (None if there is none).

The base class holds the defaults, so a method overrides only what differs from FedAvg: the
server keeps and sends `{"model": weights}`, and `aggregate` is the example-weighted mean of
every record the replies carry (or the robust rule the config's `aggregation` names: methods
average weights through `Algorithm.average`). The engine, not the algorithm, owns per-client
state, client sampling, randomness, `num_examples`, byte counting and timing; an algorithm
holds no mutable attributes between calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from protofed.algorithms.common.aggregation import Averaged, average, examples
from protofed.config import AggregationConfig
from protofed.core.types import (
    MODEL,
    AggregateResult,
    Arrays,
    FitResult,
    Metrics,
    Records,
    Reply,
)
from protofed.training.client import Client

if TYPE_CHECKING:
    import torch

    from protofed.config import TrainConfig

    Prototypes = tuple[torch.Tensor, torch.Tensor]  # (means (C, D), counts (C,))

# what an algorithm module needs, in one import: the core types and this module's classes
__all__ = ["Algorithm", "Hyperparams", "Setting"]
__all__ += ["MODEL", "AggregateResult", "Arrays", "Client", "FitResult", "Metrics", "Records"]
__all__ += ["Reply", "with_model"]


def with_model(message: Records, arrays: Arrays) -> Records:
    """`message` with `arrays` in place of the same names of its model record."""
    return {**message, MODEL: {**message.get(MODEL, {}), **arrays}}


class Hyperparams(BaseModel):
    """Base of every algorithm's typed hyperparameters: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


@dataclass(frozen=True)
class Setting:
    """What an algorithm may know about the experiment when it is built."""

    num_clients: int
    num_classes: int
    train: TrainConfig
    init_model: Arrays  # the seeded initial weights, names as in the model's state_dict
    seed: int = 0  # the config's seed: server-side randomness (clustering) derives from it
    # how `Algorithm.average` combines model weights (default: the example-weighted mean)
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)


class Algorithm(ABC):
    """Base class: set the class attributes, implement `fit`, override what differs."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line for `protofed list`
    reference: ClassVar[str] = ""
    Params: ClassVar[type[Hyperparams]] = Hyperparams
    has_global_model: ClassVar[bool] = True
    pools_data: ClassVar[bool] = False  # True: the runtime trains one client on all data

    def __init__(self, params: Hyperparams, setting: Setting) -> None:
        self.params = params
        self.setting = setting

    # 1. server state ------------------------------------------------------------------
    def init_server(self) -> Records:
        """The server's state before round 1 (by default: the initial model)."""
        return {MODEL: dict(self.setting.init_model)}

    # 2. what goes down ------------------------------------------------------------------
    def configure(self, server: Records, client: int, server_round: int) -> Records:
        """The message for `client` this round (by default: the server's state)."""
        return server

    # 3. what the client does ------------------------------------------------------------
    @abstractmethod
    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        """Train on the client's data: the reply, its metrics and the state the client keeps."""

    # 4. what the server does with the replies -------------------------------------------
    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        """The new server state (by default: the `average` of every record).

        `replies` may be a lazy stream: iterate it once.
        """
        mean, _, metrics = self.average(replies, reference=server)
        return AggregateResult(mean, metrics)

    def average(
        self,
        replies: Iterable[Reply],
        records: Iterable[str] | None = None,
        weight: Callable[[Reply], float] = examples,
        reference: Records | None = None,
    ) -> Averaged:
        """Model weights averaged by the experiment's `aggregation` rule: the streaming
        example-weighted mean by default, else a robust rule (common/aggregation.py).

        Use it for weights, not for prototypes or statistics. `reference` is the server's
        state the clients started from, which the update-norm checks measure against; the
        returned metrics (`dropped_replies`, ...) belong in the `AggregateResult`.
        """
        return average(replies, self.setting.aggregation, records, weight, reference)

    # evaluation -------------------------------------------------------------------------
    def client_model(self, message: Records, state: Records) -> Arrays:
        """The client's personalized model weights (by default: the model it was sent)."""
        return message[MODEL]

    def trained_model(self, message: Records, result: FitResult) -> Arrays:
        """The model the client holds right after its local training (`eval.client_model=
        trained`; FedAli's official code evaluates there), given the message `fit` got and
        what it returned.

        By default `client_model` with the reply's "model" record in place of the message's,
        over the state `fit` kept: the trained weights wherever the reply carries them
        (FedAvg), the kept ones wherever the state does (Local, Ditto). Override where the
        message holds something training replaced (FedPAC's combined head).
        """
        if MODEL in result.reply:
            message = with_model(message, result.reply[MODEL])
        return self.client_model(message, result.state)

    def global_model(self, server: Records) -> Arrays | None:
        """The server's model weights, or None for methods without one."""
        return server[MODEL] if self.has_global_model else None

    def prototypes(self, server: Records) -> dict[str, Prototypes] | None:
        """The class prototypes the server holds, for figures (`eval.keep_prototypes_every`).

        Named (means (C, D), counts (C,), 0 = absent class) pairs: "global" for the server's
        set, "client_<i>" where the server keeps each client's own (PFPL). None (the default)
        for methods without class prototypes; a prototype method returns {} before it has
        any. The runtime adds each client's local prototypes where none is given here.
        """
        return None

    # plumbing ---------------------------------------------------------------------------
    @classmethod
    def describe_params(cls) -> dict[str, Any]:
        return {k: f.default for k, f in cls.Params.model_fields.items()}
