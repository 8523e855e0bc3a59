"""The public, typed extension API: what an algorithm, model, data-set or logger author needs.

One import, stable names (docs/python-api.md lists them):

    from protofed.extend import MODEL, Algorithm, FitResult, Hyperparams, register_algorithm

- **Algorithms**: the `Algorithm` base class (FedAvg's defaults; override `fit` and what
  differs), its typed `Hyperparams`, the `Setting` it is built with, the `Client` its `fit` is
  handed, the records that cross the wire (`Records`, `Arrays`, `Metrics`, `Reply`, `MODEL`)
  and what its hooks return (`FitResult`, `AggregateResult`); `register_algorithm`.
- **Stacked training** (`train.stacked`), opt-in and outside the `Algorithm` interface: an
  algorithm whose round can run with all its clients at once registers that round with
  `register_stacked(cls)` over `(algorithm, clients, messages, states, train) ->
  list[FitResult]`, calling `train` (a `Trainer`) with one `StackedTask` per client for each
  training phase, a `Term` (of the client's weights, its own tensors and its `Batch`) for a
  loss beyond cross-entropy. Without one, its clients train one at a time.
- **Shared mechanics** an algorithm reuses instead of rewriting: aggregation (weighted
  means of records, `Averaged`), the body/head split (`HeadLocalAlgorithm`), FedProx's
  proximal term, prototype losses and the prototype helpers (class means, merges,
  K-means, the nearest-prototype head, the `"protos"` record).
- **Models**: `FedModel` (features + head) and `register_model` over a builder
  `(cfg: ModelConfig, input_shape, num_classes) -> FedModel`.
- **Data sets**: `Dataset` and `register_dataset` over a loader `(cfg: DataConfig) ->
  Dataset`; `data_root(cfg)` is where files live (`$PROTOFED_DATA`, else the user cache).
- **Loggers**: `Logger` and `register_logger` for `--log NAME` (docs/tracking.md).

Everything here is a re-export: the objects are protofed's own, so an `isinstance` check or
a registration behaves the same whichever path imported them. Nothing inside protofed
imports this module (it sits in the top layer, docs/architecture.md).
"""

from __future__ import annotations

from protofed import register_algorithm, register_dataset, register_model
from protofed.algorithms.base import Algorithm, Hyperparams, Setting, with_model
from protofed.algorithms.common.aggregation import (
    Averaged,
    examples,
    mean_metric,
    select,
    weighted_mean,
)
from protofed.algorithms.common.prototype_losses import (
    prototype_distance,
    prototype_regularized_loss,
)
from protofed.algorithms.common.regularizers import (
    ProximalStep,
    parameter_snapshot,
    proximal_loss,
    squared_distance,
)
from protofed.algorithms.common.split import (
    HEAD,
    HeadLocalAlgorithm,
    body_names,
    body_parameters,
    head_names,
    head_parameters,
    split_arrays,
)
from protofed.config import DataConfig, ModelConfig, TrainConfig
from protofed.core.types import (
    MODEL,
    AggregateResult,
    Arrays,
    FitResult,
    Metrics,
    Records,
    Reply,
)
from protofed.data import Dataset, data_root
from protofed.errors import ConfigError
from protofed.models import Builder, FedModel
from protofed.prototypes import (
    PROTOS,
    best_kmeans,
    class_means,
    embedding_means,
    kmeans,
    merge_means,
    nearest_prototype_head,
    pack_prototypes,
    shared_class_similarity,
    unpack_prototypes,
    with_prototype_head,
)
from protofed.runtime.stacking import register_stacked
from protofed.tracking import Logger, register_logger
from protofed.training.client import Client
from protofed.training.stacked import Batch, StackedTask, Term, Trainer

__all__ = [
    # algorithms: the base class, its hook types, its registration
    "Algorithm",
    "AggregateResult",
    "Arrays",
    "Client",
    "FitResult",
    "Hyperparams",
    "MODEL",
    "Metrics",
    "Records",
    "Reply",
    "Setting",
    "TrainConfig",
    "register_algorithm",
    "with_model",
    # stacked training, opt-in (runtime/stacking, training/stacked.py)
    "Batch",
    "StackedTask",
    "Term",
    "Trainer",
    "register_stacked",
    # aggregation (algorithms/common/aggregation.py)
    "Averaged",
    "examples",
    "mean_metric",
    "select",
    "weighted_mean",
    # body shared, head local (algorithms/common/split.py)
    "HEAD",
    "HeadLocalAlgorithm",
    "body_names",
    "body_parameters",
    "head_names",
    "head_parameters",
    "split_arrays",
    # the proximal term (algorithms/common/regularizers.py)
    "ProximalStep",
    "parameter_snapshot",
    "proximal_loss",
    "squared_distance",
    # prototypes (prototypes.py, algorithms/common/prototype_losses.py)
    "PROTOS",
    "best_kmeans",
    "class_means",
    "embedding_means",
    "kmeans",
    "merge_means",
    "nearest_prototype_head",
    "pack_prototypes",
    "prototype_distance",
    "prototype_regularized_loss",
    "shared_class_similarity",
    "unpack_prototypes",
    "with_prototype_head",
    # models
    "Builder",
    "FedModel",
    "ModelConfig",
    "register_model",
    # data sets
    "DataConfig",
    "Dataset",
    "data_root",
    "register_dataset",
    # loggers
    "Logger",
    "register_logger",
    # errors
    "ConfigError",
]
