"""Reusable layers shared by the models (and, later, the ALP layer and Sinkhorn)."""

from protofed.nn.linear import Linear

__all__ = ["Linear"]
