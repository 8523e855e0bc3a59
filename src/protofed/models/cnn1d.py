"""`cnn1d`: a small 1-D CNN for sensor windows shaped (channels, time)."""

from __future__ import annotations

from torch import nn

from protofed.config import ModelConfig
from protofed.errors import ConfigError
from protofed.models.base import FedModel
from protofed.nn import Linear


def require_sequence(model: str, input_shape: tuple[int, ...], min_length: int) -> tuple[int, int]:
    """Check that samples are sensor windows (channels, time) with time >= `min_length`."""
    shape = tuple(input_shape)
    if len(shape) != 2 or shape[0] < 1 or shape[1] < min_length:
        raise ConfigError(
            f"model '{model}' needs sensor windows shaped (channels, time) with time >= "
            f"{min_length}; got input shape {shape}"
        )
    return shape  # narrowed by the length check above


class CNN1D(FedModel):
    """3 x [Conv1d(64, k=5, pad=2) + ReLU + MaxPool1d(2)], global average pool, Linear+ReLU.

    No BatchNorm on purpose: averaging BN statistics across clients silently changes FedAvg.
    `batch_norm=True` (`cnn1dbn`, for FedBN) adds BatchNorm after each convolution.
    Global average pooling over time makes the model independent of the window length.
    """

    def __init__(
        self, channels: int, num_classes: int, embedding_dim: int = 128, batch_norm: bool = False
    ):
        super().__init__()
        blocks: list[nn.Module] = []
        width = channels
        for _ in range(3):
            blocks.append(nn.Conv1d(width, 64, kernel_size=5, padding=2))
            if batch_norm:  # cnn1dbn
                blocks.append(nn.BatchNorm1d(64))
            blocks += [nn.ReLU(), nn.MaxPool1d(2)]
            width = 64
        self.features = nn.Sequential(
            *blocks, nn.AdaptiveAvgPool1d(1), nn.Flatten(), Linear(64, embedding_dim), nn.ReLU()
        )
        self.head = Linear(embedding_dim, num_classes)
        self.embedding_dim = embedding_dim


def build_cnn1d(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> CNN1D:
    channels, _ = require_sequence("cnn1d", input_shape, min_length=8)
    return CNN1D(channels, num_classes, cfg.embedding_dim or 128)


def build_cnn1dbn(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> CNN1D:
    """`cnn1d` with BatchNorm after each convolution (not after the FC layer, where a last
    batch of one sample would fail in training): a model for FedBN on sensor data."""
    channels, _ = require_sequence("cnn1dbn", input_shape, min_length=8)
    return CNN1D(channels, num_classes, cfg.embedding_dim or 128, batch_norm=True)
