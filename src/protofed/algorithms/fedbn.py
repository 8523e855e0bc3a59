"""FedBN: FedAvg whose BatchNorm layers stay with each client (docs/algorithms/fedbn.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from protofed.algorithms.base import Algorithm, Hyperparams, Setting
from protofed.core.types import MODEL, Arrays, FitResult, Records
from protofed.errors import ConfigError
from protofed.training.client import Client

BATCHNORM = "batchnorm"  # client state: the client's BatchNorm layers
STATISTICS = "running_mean"  # the buffer that marks a BatchNorm layer
LOCAL_SUFFIXES = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def batchnorm_names(names: Iterable[str] | Mapping[str, object]) -> list[str]:
    """The names (parameters and buffers) that belong to BatchNorm layers, in `names`' order."""
    names = list(names)
    layers = {n[: -len(STATISTICS) - 1] for n in names if n.endswith("." + STATISTICS)}
    return [
        n
        for n in names
        if "." in n and n.rsplit(".", 1)[0] in layers and n.rsplit(".", 1)[1] in LOCAL_SUFFIXES
    ]


def split_batchnorm(arrays: Arrays, local: Iterable[str]) -> tuple[Arrays, Arrays]:
    """(shared, local) parts of `arrays`; the tensors are shared, not copied."""
    local = set(local)
    shared = {k: v for k, v in arrays.items() if k not in local}
    return shared, {k: v for k, v in arrays.items() if k in local}


class FedBN(Algorithm):
    name = "fedbn"
    summary = "FedAvg with local BatchNorm: BN weights and statistics never leave the client."
    reference = "Li et al., FedBN: Federated Learning on Non-IID Features via Local Batch Normalization, ICLR 2021"
    has_global_model = False

    class Params(Hyperparams):
        """No hyperparameters: the local layers are the model's BatchNorm layers."""

    def __init__(self, params: Hyperparams, setting: Setting) -> None:
        super().__init__(params, setting)
        self.local_names = batchnorm_names(setting.init_model)
        if not self.local_names:
            raise ConfigError(
                "algorithm 'fedbn' needs a model with BatchNorm layers (e.g. model.name=resnet18, "
                "cnnbn or cnn1dbn); without them it is FedAvg"
            )

    def local_layers(self, state: Records) -> Arrays:
        """The client's BatchNorm layers: from its state, or the initial ones."""
        if BATCHNORM in state:
            return state[BATCHNORM]
        return split_batchnorm(self.setting.init_model, self.local_names)[1]

    def init_server(self) -> Records:
        return {MODEL: split_batchnorm(dict(self.setting.init_model), self.local_names)[0]}

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(message[MODEL])
        client.load(self.local_layers(state))
        metrics = client.train_model()
        shared, local = split_batchnorm(client.weights(), self.local_names)
        return FitResult({MODEL: shared}, metrics, {BATCHNORM: local})

    def client_model(self, message: Records, state: Records) -> Arrays:
        return {**message[MODEL], **self.local_layers(state)}
