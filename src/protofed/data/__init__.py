"""Data: loaders (one per source), partitioners, and per-client splits."""

from protofed.data.federated import ClientData, FederatedData, build_federated, stratified_split
from protofed.data.partition import PARTITIONERS, partition
from protofed.data.sources import (
    DATASETS,
    DatasetInfo,
    data_root,
    load_dataset,
    load_plugins,
    register_dataset,
)
from protofed.data.types import Dataset

__all__ = [
    "DATASETS",
    "PARTITIONERS",
    "ClientData",
    "Dataset",
    "DatasetInfo",
    "FederatedData",
    "build_federated",
    "data_root",
    "load_dataset",
    "load_plugins",
    "partition",
    "register_dataset",
    "stratified_split",
]
