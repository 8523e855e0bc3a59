"""`resnet18`: ResNet-18 for small images (CIFAR-style stem), written out here.

3x3 stem convolution with no max-pool, four stages of two BasicBlocks (64/128/256/512
channels, stride 2 from the second stage on), global average pooling: a 512-d embedding.
Uses BatchNorm2d; 28x28 and 1-channel inputs work as well as 32x32 RGB.
"""

from __future__ import annotations

import torch
from torch import nn

from protofed.config import ModelConfig
from protofed.errors import ConfigError
from protofed.models.base import FedModel
from protofed.models.cnn import require_image
from protofed.nn import Linear


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet18(FedModel):
    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        stages: list[nn.Module] = []
        in_planes = 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(
                nn.Sequential(BasicBlock(in_planes, planes, stride), BasicBlock(planes, planes))
            )
            in_planes = planes
        self.features = nn.Sequential(
            nn.Conv2d(channels, 64, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            *stages,
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = Linear(512, num_classes)
        self.embedding_dim = 512


def build_resnet18(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> ResNet18:
    if cfg.embedding_dim is not None and cfg.embedding_dim != 512:
        raise ConfigError(
            f"model.embedding_dim={cfg.embedding_dim}: resnet18's embedding is fixed at 512"
        )
    channels, _, _ = require_image("resnet18", input_shape, min_side=4)
    return ResNet18(channels, num_classes)
