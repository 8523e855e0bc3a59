"""`mlp`: a plain multilayer perceptron over the flattened input."""

from __future__ import annotations

import math

from torch import nn

from protofed.config import ModelConfig
from protofed.errors import ConfigError
from protofed.models.base import FedModel
from protofed.nn import Linear


class MLP(FedModel):
    """Flatten, then `hidden` Linear+ReLU layers (the embedding), then a Linear head.

    `features` is an `nn.Sequential` of separate Flatten/Linear/ReLU modules, so per-layer
    activations can be read by name (`features.1`, `features.3`, ...). With `hidden=[]` the
    model is multinomial logistic regression and the embedding is the flattened input.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: list[int]):
        super().__init__()
        width = math.prod(input_shape)
        layers: list[nn.Module] = [nn.Flatten()]
        for size in hidden:
            layers += [Linear(width, size), nn.ReLU()]
            width = size
        self.features = nn.Sequential(*layers)
        self.head = Linear(width, num_classes)
        self.embedding_dim = width


def build_mlp(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> MLP:
    if not input_shape or min(input_shape) < 1:
        raise ConfigError(f"model 'mlp' needs a non-empty input shape; got {tuple(input_shape)}")
    if any(h < 1 for h in cfg.hidden):
        raise ConfigError(f"model.hidden sizes must be >= 1 (got {cfg.hidden})")
    if cfg.embedding_dim is not None and cfg.hidden and cfg.embedding_dim != cfg.hidden[-1]:
        raise ConfigError(
            f"model.embedding_dim={cfg.embedding_dim} conflicts with model.hidden={cfg.hidden}: "
            "the mlp embedding is its last hidden layer; set model.hidden instead"
        )
    if cfg.embedding_dim is not None and not cfg.hidden:
        raise ConfigError(
            "model.embedding_dim is not configurable for an mlp with no hidden layers"
        )
    return MLP(input_shape, num_classes, list(cfg.hidden))
