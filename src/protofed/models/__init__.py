"""Model registry: `build_model(cfg, input_shape, num_classes)` and `MODELS` for `protofed list`.

Every model is a `FedModel` (see `protofed.models.base`): `features` maps an input to its
embedding, `head` maps the embedding to logits. Input shapes follow `Dataset.input_shape`:
sensor windows (channels, time), images (channels, height, width), tabular rows (features,).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass

from protofed import plugins
from protofed.config import ModelConfig
from protofed.errors import ConfigError
from protofed.models.base import FedModel
from protofed.models.cnn import CNN, build_cnn, build_cnnbn, build_pflcnn
from protofed.models.cnn1d import CNN1D, build_cnn1d, build_cnn1dbn
from protofed.models.harcnn import HARCNN, build_harcnn
from protofed.models.mlp import MLP, build_mlp
from protofed.models.resnet import ResNet18, build_resnet18
from protofed.models.transformers import HART, ViTTiny, build_hart, build_vit_tiny

Builder = Callable[[ModelConfig, tuple[int, ...], int], FedModel]


@dataclass(frozen=True)
class ModelInfo:
    description: str
    build: Builder
    inputs: str  # the input kind it takes: "any", "image" or "sensor"


MODELS: dict[str, ModelInfo] = {
    "mlp": ModelInfo("MLP on the flattened input (model.hidden sizes, ReLU)", build_mlp, "any"),
    "cnn": ModelInfo(
        "FedAvg CNN (McMahan et al. 2017): 2 conv5x5 + FC 512, images", build_cnn, "image"
    ),
    "pflcnn": ModelInfo(
        "PFLlib's FedAvgCNN (FedALA's 4-layer CNN): cnn without padding, images",
        build_pflcnn,
        "image",
    ),
    "cnn1d": ModelInfo(
        "1-D CNN, 3 conv blocks + global average pool + FC 128, sensor windows",
        build_cnn1d,
        "sensor",
    ),
    "cnnbn": ModelInfo(
        "cnn with BatchNorm after each convolution (for FedBN), images", build_cnnbn, "image"
    ),
    "cnn1dbn": ModelInfo(
        "cnn1d with BatchNorm after each convolution (for FedBN), sensor windows",
        build_cnn1dbn,
        "sensor",
    ),
    "resnet18": ModelInfo(
        "ResNet-18 with a 3x3 stem for small images (BatchNorm)", build_resnet18, "image"
    ),
    "harcnn": ModelInfo(
        "PFLlib's HAR CNN: 2 conv9 + FC 1024 + FC 512, sensor windows", build_harcnn, "sensor"
    ),
    "hart": ModelInfo(
        "HART, FedAli's HAR transformer: 6 blocks, d=192, frames of 16 (model.alp.* adds ALP)",
        build_hart,
        "sensor",
    ),
    "vit_tiny": ModelInfo(
        "Tiny ViT: 6 blocks, d=192, 64 patches, images (model.alp.* adds ALP)",
        build_vit_tiny,
        "image",
    ),
}
ALP_MODELS = ("hart", "vit_tiny")  # the models that take model.alp.enabled=true


def register_model(
    name: str, description: str, inputs: str = "any"
) -> Callable[[Builder], Builder]:
    """Decorator for a builder `(cfg: ModelConfig, input_shape, num_classes) -> FedModel`:
    makes `model.name=<name>` build it. `inputs`: "any", "image" or "sensor"."""
    if inputs not in ("any", "image", "sensor"):
        raise ConfigError(f"register_model('{name}'): inputs must be any, image or sensor")

    return plugins.registrar("models", MODELS, name, lambda b: ModelInfo(description, b, inputs))


def load_plugins() -> dict[str, ModelInfo]:
    """Every model, installed plugins' included (their modules register with the decorator)."""
    plugins.load("models")
    return MODELS


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> FedModel:
    """Build `cfg.name` for samples of `input_shape` and `num_classes` classes."""
    if cfg.name not in MODELS:
        load_plugins()
    info = MODELS.get(cfg.name)
    if info is None:
        close = difflib.get_close_matches(cfg.name, list(MODELS), n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(f"unknown model.name '{cfg.name}' (known: {', '.join(MODELS)}){hint}")
    if num_classes < 1:
        raise ConfigError(
            f"model '{cfg.name}' needs at least 1 class; got num_classes={num_classes}"
        )
    if cfg.alp.enabled and cfg.name not in ALP_MODELS:
        raise ConfigError(
            f"model.alp.enabled=true needs a model with ALP layers ({', '.join(ALP_MODELS)}); "
            f"got model.name '{cfg.name}'"
        )
    return info.build(cfg, tuple(int(d) for d in input_shape), int(num_classes))


__all__ = [
    "register_model",
    "load_plugins",
    "CNN",
    "CNN1D",
    "HARCNN",
    "HART",
    "MLP",
    "MODELS",
    "FedModel",
    "ModelInfo",
    "ResNet18",
    "ViTTiny",
    "build_model",
]
