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
LOCAL_BANKS = "local"  # reply and client state: the client's local prototypes
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
        init = self.setting.init_model
        return {
            MODEL: {n: init[n] for n in self.weight_names},
            GLOBAL_BANKS: {n: init[n] for n in self.global_names},
        }

    def scalars(self, server_round: int) -> Arrays:
        beta = self.params.first_round_beta if server_round <= 1 else self.params.beta
        values = {BETA: beta, GAMMA: self.params.gamma}
        return {n: torch.tensor(values[n.rsplit(".", 1)[1]]) for n in self.scalar_names}

    def configure(self, server: Records, client: int, server_round: int) -> Records:
        return {**server, SCALARS: self.scalars(server_round)}

    # client -----------------------------------------------------------------------------
    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        for record in message.values():
            client.load(record)
        client.load(state[LOCAL_BANKS] if state else self.initial_local())
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
        return AggregateResult({MODEL: mean[MODEL], GLOBAL_BANKS: new}, metrics)

    # evaluation -------------------------------------------------------------------------
    def client_model(self, message: Records, state: Records) -> Arrays:
        own = state[LOCAL_BANKS] if state else self.initial_local()
        return {**message[MODEL], **message[GLOBAL_BANKS], **message[SCALARS], **own}

    def global_model(self, server: Records) -> Arrays | None:
        glob = server[GLOBAL_BANKS]
        banks = {loc: glob[g] for loc, g in zip(self.local_names, self.global_names, strict=True)}
        return {**server[MODEL], **glob, **self.scalars(2), **banks}
