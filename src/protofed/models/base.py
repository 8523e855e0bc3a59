"""What every protofed model is: an embedding network plus a classifier head.

Prototype methods need the embedding, FedPer/FedRep/FedBABU split body and head, FedALA
picks its top layers by name, and FedSub reads the first layers' activations. So every model
exposes `features` (input -> embedding), `head` (embedding -> logits), and its parameter
names grouped by part and ordered by layer, instead of leaving callers to count tensors.
"""

from __future__ import annotations

import torch
from torch import nn


class FedModel(nn.Module):
    """Base class: subclasses set `self.features` and `self.head` in `__init__`."""

    features: nn.Module
    head: nn.Module
    embedding_dim: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    @property
    def batch_dependent(self) -> bool:
        """Whether, in eval mode, a sample's output depends on the other samples of its batch
        (FedAli's ALP layers with `inference="batch"`): then a scorer may not reuse one pass's
        embeddings for inputs batched another way."""
        return any(getattr(m, "batch_dependent", False) for m in self.modules() if m is not self)

    def param_groups(self) -> dict[str, list[str]]:
        """Parameter names by part: {'features': [...], 'head': [...]}."""
        groups: dict[str, list[str]] = {"features": [], "head": []}
        for name, _ in self.named_parameters():
            groups[name.split(".", 1)[0]].append(name)
        return groups

    def layers(self) -> list[str]:
        """Names of the modules that own parameters directly, input to output.

        A "layer" is a module with its own parameters (a Linear, a Conv, a norm). FedALA's
        top-p layers and FedSub's first-L layers are counted in this list, never in tensors.
        """
        return [
            name
            for name, module in self.named_modules()
            if name and any(True for _ in module.parameters(recurse=False))
        ]

    def layer_params(self, layer: str) -> list[str]:
        """Parameter names owned by one layer from `layers()`."""
        module = self.get_submodule(layer)
        return [f"{layer}.{n}" for n, _ in module.named_parameters(recurse=False)]
