"""The algorithm interface: four small questions, answered with flat mappings of arrays.

An algorithm answers:
1. What does the server keep?  `init_server` builds the server state.
2. What does the server send to client i this round?  `configure` (it may differ per client).
3. What does client i do with it, and what does it send back?  `fit`, given the message and
   the client's own state from earlier rounds; it returns the reply and the new client state.
4. How does the server combine the replies?  `aggregate`.
Plus the models it is evaluated with: `client_model` (the client's personalized model, built
on the client side from the message and its state) and `global_model` (None if there is none).

Messages, replies and states are `Arrays`: flat dicts of names to tensors (plus scalar
metrics on replies). That is all that ever crosses between server and client, so the same
code runs in the built-in simulation and over Flower. The runtime, not the algorithm, owns
per-client state, client sampling, randomness, byte counting and timing; an algorithm holds
no mutable attributes between calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from protofed.config import TrainConfig
    from protofed.training.client import Client

Arrays = dict[str, torch.Tensor]
Metrics = dict[str, float]


class Hyperparams(BaseModel):
    """Base of every algorithm's typed hyperparameters: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass
class Reply:
    """One client's answer to the server: its arrays plus scalar metrics.

    `metrics["num_examples"]` is the client's training-set size, the usual aggregation weight.
    """

    client: int
    arrays: Arrays
    metrics: Metrics

    @property
    def num_examples(self) -> float:
        return float(self.metrics.get("num_examples", 1.0))


@dataclass(frozen=True)
class Setting:
    """What an algorithm may know about the experiment when it is built."""

    num_clients: int
    num_classes: int
    train: TrainConfig
    init_model: Arrays  # the seeded initial weights, names as in the model's state_dict
    seed: int = 0  # the config's seed: server-side randomness (clustering) derives from it


class Algorithm:
    """Base class. Subclasses set the class attributes and override the four questions."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line for `protofed list`
    reference: ClassVar[str] = ""
    Params: ClassVar[type[Hyperparams]] = Hyperparams
    has_global_model: ClassVar[bool] = True
    pools_data: ClassVar[bool] = False  # True: the runtime trains one client on all data
    # Which model is a client's "local" one, for the ALA plug-in (`algorithm.ala.*`, see
    # algorithms/common/ala.py): "reply" (what the client trained and sent back last time),
    # "state" (the client state `fit` returns), or None (ALA does not apply).
    ala_local: ClassVar[Literal["reply", "state"] | None] = None

    def __init__(self, params: Hyperparams, setting: Setting) -> None:
        self.params = params
        self.setting = setting

    # 1. server state ------------------------------------------------------------------
    def init_server(self) -> Arrays:
        """The server's state before round 1 (by default: the initial model)."""
        return dict(self.setting.init_model)

    # 2. what goes down ------------------------------------------------------------------
    def configure(self, server: Arrays, client: int, round: int) -> Arrays:
        """The message for `client` this round (by default: the global model)."""
        return server

    # 3. what the client does ------------------------------------------------------------
    def fit(self, client: Client, message: Arrays, state: Arrays) -> tuple[Arrays, Metrics, Arrays]:
        """Train on the client's data; return (reply arrays, metrics, new client state)."""
        raise NotImplementedError

    # 4. what the server does with the replies -------------------------------------------
    def aggregate(self, server: Arrays, replies: Iterable[Reply], round: int) -> Arrays:
        """The new server state. `replies` may be a lazy stream: iterate it once."""
        raise NotImplementedError

    # evaluation -------------------------------------------------------------------------
    def client_model(self, message: Arrays, state: Arrays) -> Arrays:
        """The client's personalized model weights (by default: what the server sent)."""
        return message

    def global_model(self, server: Arrays) -> Arrays | None:
        """The server's model weights, or None for methods without one."""
        return server if self.has_global_model else None

    # plumbing ---------------------------------------------------------------------------
    @classmethod
    def describe_params(cls) -> dict[str, Any]:
        return {k: f.default for k, f in cls.Params.model_fields.items()}
