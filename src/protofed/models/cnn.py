"""`cnn`: the FedAvg CNN of McMahan et al. (2017) for small images of any channel count."""

from __future__ import annotations

from torch import nn

from protofed.config import ModelConfig
from protofed.errors import ConfigError
from protofed.models.base import FedModel
from protofed.nn import Linear


def require_image(model: str, input_shape: tuple[int, ...], min_side: int) -> tuple[int, int, int]:
    """Check that samples are images (channels, height, width) with sides >= `min_side`."""
    shape = tuple(input_shape)
    if len(shape) != 3 or min(shape) < 1 or min(shape[1:]) < min_side:
        raise ConfigError(
            f"model '{model}' needs images shaped (channels, height, width) with height and "
            f"width >= {min_side}; got input shape {shape}"
        )
    return shape  # narrowed by the length check above


class CNN(FedModel):
    """conv5x5(32)+ReLU+pool2, conv5x5(64)+ReLU+pool2, flatten, Linear(->512)+ReLU; Linear head.

    Both convolutions use padding 2 ("same"), so each pool halves the side: 28x28 flattens to
    64*7*7, 32x32 to 64*8*8, and 8x8 digits to 64*2*2. Non-square images are fine.
    """

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_classes: int,
        embedding_dim: int = 512,
        padding: int = 2,
        batch_norm: bool = False,
    ):
        super().__init__()
        channels, height, width = input_shape

        def side(n: int) -> int:  # conv5x5 (with `padding`), pool 2, twice
            return ((n + 2 * padding - 4) // 2 + 2 * padding - 4) // 2

        flat = 64 * side(height) * side(width)

        def norm(width: int) -> list[nn.Module]:  # cnnbn: BatchNorm after each convolution
            return [nn.BatchNorm2d(width)] if batch_norm else []

        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=5, padding=padding),
            *norm(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=5, padding=padding),
            *norm(64),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            Linear(flat, embedding_dim),
            nn.ReLU(),
        )
        self.head = Linear(embedding_dim, num_classes)
        self.embedding_dim = embedding_dim


def build_cnn(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> CNN:
    shape = require_image("cnn", input_shape, min_side=4)
    return CNN(shape, num_classes, cfg.embedding_dim or 512)


def build_pflcnn(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> CNN:
    """PFLlib's FedAvgCNN, the FedALA paper's 4-layer CNN: `cnn` without padding (28x28 -> 1024
    features, 32x32 -> 1600), about 2.5x cheaper than `cnn`."""
    shape = require_image("pflcnn", input_shape, min_side=16)
    return CNN(shape, num_classes, cfg.embedding_dim or 512, padding=0)


def build_cnnbn(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> CNN:
    """`cnn` with BatchNorm after each convolution (FedBN's digit CNN normalises the same way;
    not after the FC layer, where a last batch of one sample would fail in training)."""
    shape = require_image("cnnbn", input_shape, min_side=4)
    return CNN(shape, num_classes, cfg.embedding_dim or 512, batch_norm=True)
