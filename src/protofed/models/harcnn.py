"""`harcnn`: the HAR CNN of PFLlib (HARCNN in system/flcore/trainmodel/models.py).

Kept layer for layer so results compare with PFLlib's: on UCI-HAR (9 channels x 128 samples,
6 classes) the flatten size is 64*26 = 1664 and the model has 2,253,958 parameters.
"""

from __future__ import annotations

from torch import nn

from protofed.config import ModelConfig
from protofed.models.base import FedModel
from protofed.models.cnn1d import require_sequence
from protofed.nn import Linear


def harcnn_flat_length(length: int) -> int:
    """Time steps left after conv9, pool2, conv9, pool2 (no padding)."""
    return ((length - 8) // 2 - 8) // 2


class HARCNN(FedModel):
    """Conv1d(C,32,9)+ReLU+pool2, Conv1d(32,64,9)+ReLU+pool2, flatten, 1024, 512; Linear head."""

    def __init__(self, channels: int, length: int, num_classes: int, embedding_dim: int = 512):
        super().__init__()
        flat = 64 * harcnn_flat_length(length)
        self.features = nn.Sequential(
            nn.Conv1d(channels, 32, kernel_size=9),
            nn.ReLU(),
            nn.MaxPool1d(2),
            nn.Conv1d(32, 64, kernel_size=9),
            nn.ReLU(),
            nn.MaxPool1d(2),
            nn.Flatten(),
            Linear(flat, 1024),
            nn.ReLU(),
            Linear(1024, embedding_dim),
            nn.ReLU(),
        )
        self.head = Linear(embedding_dim, num_classes)
        self.embedding_dim = embedding_dim


def build_harcnn(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> HARCNN:
    # conv9 + pool2 + conv9 + pool2 must leave at least one time step: length >= 28.
    channels, length = require_sequence("harcnn", input_shape, min_length=28)
    return HARCNN(channels, length, num_classes, cfg.embedding_dim or 512)
