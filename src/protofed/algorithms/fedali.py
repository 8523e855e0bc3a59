"""FedAli: ALP layers with local and global prototypes; server K-means of the local ones.

Paper: Ek et al., FedAli: Personalized Federated Learning Alignment with Prototype Layers for
Generalized Mobile Services, 2024 (official code getalp/FedAli).
See docs/algorithms/fedali.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import torch
from pydantic import Field

from protofed.algorithms.base import Algorithm, Hyperparams, Setting
from protofed.core.types import MODEL, AggregateResult, Arrays, FitResult, Records, Reply
from protofed.errors import ConfigError
from protofed.nn.alp import BETA, GAMMA, GLOBAL, LOCAL
from protofed.prototypes import kmeans
from protofed.training.client import Client

# records besides "model" (the weights without the ALP layers' banks and scalars)
GLOBAL_BANKS = "global"  # server state and message: every ALP layer's global prototypes
LOCAL_BANKS = "local"  # reply and client state: the client's local prototypes; with
# local_banks=reset also the server's (and round 1's message): the model's initial local banks
SCALARS = "scalars"  # message: the round's beta and gamma, one scalar buffer per layer


class FedAliParams(Hyperparams):
    beta: float = Field(0.2, ge=0, le=1, description="Alignment coefficient beta (paper: 0.2).")
    first_round_beta: float = Field(
        0.0, ge=0, le=1, description="beta in round 1 (official code: 0; the paper's text: 0.2)."
    )
    gamma: float = Field(0.999, ge=0, le=1, description="EMA rate of the local prototypes.")
    kmeans_iters: int = Field(
        300, ge=1, description="Server K-means iterations per ALP layer (scikit-learn's default)."
    )
    local_banks: Literal["keep", "reset"] = Field(
        "keep",
        description="A client's local prototypes at the start of a round: its own from its "
        "last round ('keep', the paper's text) or the global ones it receives ('reset': the "
        "official trainer, usePersonalPrototype = False).",
    )
    kmeans_backend: Literal["torch", "sklearn"] = Field(
        "torch",
        description="Server K-means: 'torch' (float32 Lloyd with exact pruned assignments, on "
        "the server's device) or 'sklearn' (float64); the same stopping rule (tol 1e-4).",
    )


def _names(model: Arrays, buffer: str) -> list[str]:
    return [k for k in model if k.endswith(f".{buffer}")]


class FedAli(Algorithm):
    name = "fedali"
    summary = "ALP layers: OT-matched local/global prototypes; server K-means of local prototypes."
    reference = (
        "Ek et al., FedAli: Personalized Federated Learning Alignment with Prototype Layers "
        "for Generalized Mobile Services, 2024 (github.com/getalp/FedAli)"
    )
    Params = FedAliParams
    params: FedAliParams

    def __init__(self, params: Hyperparams, setting: Setting) -> None:
        super().__init__(params, setting)
        init = setting.init_model
        self.local_names = _names(init, LOCAL)
        if not self.local_names:
            raise ConfigError(
                "fedali needs a model with ALP layers: set model.alp.enabled=true with model.name hart or vit_tiny"
            )
        self.global_names = [n[: -len(LOCAL)] + GLOBAL for n in self.local_names]
        self.scalar_names = _names(init, BETA) + _names(init, GAMMA)
        alp = set(self.local_names) | set(self.global_names) | set(self.scalar_names)
        self.weight_names = [k for k in init if k not in alp]

    # what each side holds -------------------------------------------------------------
    def initial_local(self) -> Arrays:
        """A client's local prototypes before its first round: the model's seeded bank."""
        return {n: self.setting.init_model[n].clone() for n in self.local_names}

    def init_server(self) -> Records:
        """The initial weights and global banks; with `local_banks=reset` also the initial
        local banks, which round 1 starts from (the official server model holds both banks,
        and writes the K-means centroids into both after every round)."""
        init = self.setting.init_model
        server = {
            MODEL: {n: init[n] for n in self.weight_names},
            GLOBAL_BANKS: {n: init[n] for n in self.global_names},
        }
        if self.params.local_banks == "reset":
            server[LOCAL_BANKS] = {n: init[n] for n in self.local_names}
        return server

    def start_banks(self, message: Records, state: Records) -> Arrays:
        """The local banks a client starts the round with: with `keep`, its own (the seeded
        initial bank before its first round); with `reset`, the server's local banks in the
        message (round 1: the initial ones), else the global banks it received."""
        if self.params.local_banks == "keep":
            return state[LOCAL_BANKS] if state else self.initial_local()
        if LOCAL_BANKS in message:
            return message[LOCAL_BANKS]
        return self._as_local(message[GLOBAL_BANKS])

    def _as_local(self, glob: Arrays) -> Arrays:
        """Global banks under the local banks' names."""
        return {loc: glob[g] for loc, g in zip(self.local_names, self.global_names, strict=True)}

    def scalars(self, server_round: int) -> Arrays:
        beta = self.params.first_round_beta if server_round <= 1 else self.params.beta
        values = {BETA: beta, GAMMA: self.params.gamma}
        return {n: torch.tensor(values[n.rsplit(".", 1)[1]]) for n in self.scalar_names}

    def configure(self, server: Records, client: int, server_round: int) -> Records:
        """The server's state and the round's scalars; with `local_banks=reset` the server's
        local banks go down in round 1 only (later they equal the global ones)."""
        message = {**server, SCALARS: self.scalars(server_round)}
        if server_round > 1:
            message.pop(LOCAL_BANKS, None)
        return message

    # client -----------------------------------------------------------------------------
    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        for record in message.values():
            client.load(record)
        client.load(self.start_banks(message, state))
        metrics = client.train_model()
        trained = client.weights()
        local = {n: trained[n] for n in self.local_names}
        reply = {MODEL: {n: trained[n] for n in self.weight_names}, LOCAL_BANKS: local}
        return FitResult(reply, metrics, {LOCAL_BANKS: {n: t.clone() for n, t in local.items()}})

    # server -----------------------------------------------------------------------------
    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        mean, seen, metrics = self.average(replies, records=[MODEL], reference=server)
        n = torch.tensor([r.num_examples for r in seen], dtype=torch.float64)
        old = server[GLOBAL_BANKS]
        new: Arrays = {}
        device = torch.device("cpu")  # the torch backend runs on the run's GPU, if it has one
        if self.params.kmeans_backend == "torch" and torch.cuda.is_available():
            device = torch.device(self.setting.train.device)
        for local, glob in zip(self.local_names, self.global_names, strict=True):
            # (clients, G, d), stacked on the host
            stacked = torch.stack([r.records[LOCAL_BANKS][local] for r in seen]).cpu()
            clients, g = stacked.shape[:2]
            start = (stacked.double() * (n / n.sum()).view(-1, 1, 1)).sum(0)
            centroids, _ = kmeans(
                stacked.reshape(-1, stacked.shape[-1]).to(device),
                g,
                init=start.to(device, stacked.dtype),
                max_iter=self.params.kmeans_iters,
                backend=self.params.kmeans_backend,
                guess=torch.arange(g).repeat(clients),  # a prototype starts in its slot's cluster
            )
            new[glob] = centroids.to(old[glob].device, old[glob].dtype)
        server_state = {MODEL: mean[MODEL], GLOBAL_BANKS: new}
        if self.params.local_banks == "reset":  # the centroids in both banks, as the official
            server_state[LOCAL_BANKS] = self._as_local(new)
        return AggregateResult(server_state, metrics)

    # evaluation -------------------------------------------------------------------------
    def client_model(self, message: Records, state: Records) -> Arrays:
        own = self.start_banks(message, state)
        return {**message[MODEL], **message[GLOBAL_BANKS], **message[SCALARS], **own}

    def trained_model(self, message: Records, result: FitResult) -> Arrays:
        """The trained weights with the local banks training left (also with `reset`, where
        the next round's start would be the global ones)."""
        return {**super().trained_model(message, result), **result.state[LOCAL_BANKS]}

    def global_model(self, server: Records) -> Arrays | None:
        glob = server[GLOBAL_BANKS]
        return {**server[MODEL], **glob, **self.scalars(2), **self._as_local(glob)}
