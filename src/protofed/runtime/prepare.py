"""Everything an experiment needs before its first round, built and checked from the config.

Config errors surface here, before any file is written: a bad key, a missing data file or a
model that cannot take the input shape stops the run with one line and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from protofed.algorithms import Algorithm, Setting, build_algorithm
from protofed.algorithms.common.aggregation import krum_minimum
from protofed.config import ExperimentConfig, TrainConfig
from protofed.core.seeding import MODEL_INIT, derive_seed
from protofed.core.types import MODEL, clone, nbytes
from protofed.data import data_root, load_plugins
from protofed.data.federated import ClientData, FederatedData, build_federated
from protofed.data.sources import recording_reads
from protofed.errors import ConfigError
from protofed.models import build_model
from protofed.models.base import FedModel
from protofed.privacy import private
from protofed.runtime.dynamic import DynamicClasses, client_data
from protofed.runtime.holdout import held_out, training_clients
from protofed.training.pretrain import load_init


def resolve_device(name: str) -> torch.device:
    """`train.device` as a torch device, checked against what this machine has."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"invalid value for 'train.device': {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} but no CUDA device is available here")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"train.device={name}: only cpu and cuda are supported")
    return device


@dataclass
class Prepared:
    """Everything validated and built before any file is written."""

    cfg: ExperimentConfig
    fed: FederatedData
    model: FedModel
    algorithm: Algorithm
    dynamic: DynamicClasses | None = None  # data.dynamic: the per-round views of client data
    pooled: ClientData | None = None  # every client's training data as one (`pools_data`)
    data_files: tuple[Path, ...] = ()  # the files the loader read (hashed in provenance.json)
    unseen: tuple[int, ...] = ()  # eval.unseen_clients: the held-out clients (never trained)

    @property
    def training(self) -> list[int]:
        """The clients that train: all but the unseen ones."""
        return training_clients(len(self.fed.clients), self.unseen)

    def client_data(self, client: int, server_round: int) -> ClientData:
        """The data `client` trains on in `server_round`."""
        return client_data(self.fed, self.dynamic, client, server_round)


def prepare(cfg: ExperimentConfig) -> Prepared:
    """Load data, build the model and the algorithm: every config error surfaces here.

    `Prepared.cfg` is `cfg` with the data root it read pinned as an absolute `data.dir`, so a
    run directory's config.yaml names the files the run saw.
    """
    cfg = with_data_root(cfg)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    device = resolve_device(cfg.train.device)
    with recording_reads() as files:
        fed = build_federated(cfg.data, cfg.seed)
    if device.type != "cpu":
        fed.clients = [c.to(device) for c in fed.clients]
    unseen = held_out(cfg, len(fed.clients))
    model, algorithm = build_model_and_algorithm(
        cfg, fed.input_shape, fed.num_classes, len(fed.clients), device
    )
    check_trained_memory(cfg, model, len(fed.clients))
    if not algorithm.pools_data:
        check_krum(cfg, len(fed.clients))
    dynamic = DynamicClasses.build(cfg.data.dynamic, fed, cfg.seed)
    if dynamic is not None:
        if algorithm.pools_data:
            raise ConfigError(
                f"data.dynamic is not supported by '{cfg.algorithm.name}' (pooled data)"
            )
        fed.meta["dynamic"] = dynamic.describe()
    training = training_clients(len(fed.clients), unseen)
    pooled = pooled_data(fed, training) if algorithm.pools_data else None
    if dynamic is None:  # with data.dynamic a client's training set changes by round
        trainers = [fed.clients[i] for i in training]
        check_batch_of_one(cfg, model, [pooled] if pooled is not None else trainers)
    return Prepared(cfg, fed, model, algorithm, dynamic, pooled, tuple(files), unseen)


def clients_per_round(train: TrainConfig, population: int) -> int:
    """How many of `population` clients a round samples (`train.clients_per_round`, else
    `train.client_fraction` of them, rounded up, at least one)."""
    if train.clients_per_round is not None:
        return min(train.clients_per_round, population)
    return max(1, math.ceil(train.client_fraction * population - 1e-9))


def check_krum(cfg: ExperimentConfig, num_clients: int) -> None:
    """Krum is defined for 2f + 3 replies: refuse a run whose full rounds have fewer (a
    round that loses replies to dropouts still falls back to the median, as announced)."""
    agg = cfg.aggregation
    per_round = clients_per_round(cfg.train, num_clients)
    if agg.rule == "krum" and per_round < krum_minimum(agg.byzantine):
        raise ConfigError(
            f"aggregation.byzantine={agg.byzantine} needs {krum_minimum(agg.byzantine)} replies "
            f"a round for krum, but a round samples {per_round} clients (lower it, or sample more)"
        )


def check_trained_memory(cfg: ExperimentConfig, model: FedModel, num_clients: int) -> None:
    """`eval.client_model=trained` keeps one model per client that has trained: refuse a run
    whose clients x model bytes exceed `eval.trained_memory_mb` before it starts, rather
    than let it run out of memory rounds later."""
    if cfg.eval.client_model != "trained":
        return
    size = nbytes({MODEL: model.state_dict()})
    need_mb = num_clients * size / 2**20
    if need_mb > cfg.eval.trained_memory_mb:
        raise ConfigError(
            f"eval.client_model=trained keeps one model per client: {num_clients} x "
            f"{size / 2**20:.3g} MB = {need_mb:.4g} MB exceeds eval.trained_memory_mb="
            f"{cfg.eval.trained_memory_mb:g} (raise it, or use eval.client_model=received)"
        )


def check_batch_of_one(cfg: ExperimentConfig, model: FedModel, clients: list[ClientData]) -> None:
    """A model whose BatchNorm sees one value per channel (resnet18 on images of 8 pixels a
    side or less) cannot train on a batch of one sample: refuse a run where a client's last
    batch would hold one, rather than fail in the middle of a round."""
    batch = cfg.train.batch_size
    lone = [c for c in clients if batch == 1 or len(c.train_y) % batch == 1]
    if not lone:
        return
    probe = copy.deepcopy(model).train()
    try:
        probe(lone[0].train_x[:1])
    except ValueError as exc:
        if "more than 1 value per channel" not in str(exc):
            raise
        raise ConfigError(
            f"client {lone[0].name} has {len(lone[0].train_y)} training samples, so its last "
            f"batch of train.batch_size={batch} holds one, on which {cfg.model.name}'s "
            f"BatchNorm cannot train at input shape {tuple(lone[0].train_x.shape[1:])}: set "
            "another train.batch_size (or a larger data.image_size)"
        ) from None


def with_data_root(cfg: ExperimentConfig, data_dir: str | Path | None = None) -> ExperimentConfig:
    """`cfg` with `data.dir` set: `data_dir` if given, else the root the loader would read
    (data.dir, PROTOFED_DATA, the cache dir) for data sets read from a data root."""
    info = load_plugins().get(cfg.data.name)
    if data_dir is None and (cfg.data.dir is not None or info is None or not info.needs_root):
        return cfg
    pinned = cfg.model_copy(deep=True)
    pinned.data.dir = str(data_dir if data_dir is not None else data_root(cfg.data))
    return pinned


def build_model_and_algorithm(
    cfg: ExperimentConfig,
    input_shape: tuple[int, ...],
    num_classes: int,
    num_clients: int,
    device: torch.device,
) -> tuple[FedModel, Algorithm]:
    """The seeded initial model and the algorithm built on it.

    Deterministic in the config: the server and every client (a Flower SuperNode that holds
    only its own data) build the same initial weights and the same `Setting`.
    """
    with torch.random.fork_rng(devices=[]):
        check_model_size(cfg, input_shape, num_classes)
        torch.manual_seed(derive_seed(cfg.seed, MODEL_INIT))
        try:
            model = build_model(cfg.model, input_shape, num_classes)
        except RuntimeError as exc:  # torch.OutOfMemoryError is one too
            if "alloc" not in str(exc) and "out of memory" not in str(exc):
                raise
            raise ConfigError(
                f"model.*: the model '{cfg.model.name}' does not fit in memory ("
                f"{str(exc).strip().splitlines()[0][:120]}); make it smaller (model.hidden, ...)"
            ) from None
    if cfg.model.init is not None:  # `protofed pretrain`'s encoder and prototypes
        load_init(model, cfg.model.init)
    model.to(device)
    setting = Setting(
        num_clients=num_clients,
        num_classes=num_classes,
        train=cfg.train,
        init_model=clone(model.state_dict()),
        seed=cfg.seed,
        aggregation=cfg.aggregation,
    )
    algorithm = build_algorithm(cfg.algorithm.name, cfg.algorithm.hyperparameters(), setting)
    if cfg.privacy.enabled:  # the same wrapper on the server and on every client
        if cfg.eval.client_model == "trained":
            raise ConfigError(
                "privacy.enabled: eval.client_model=trained would score each client with the "
                "clipped (and noised) reply it sent, not the model it holds; use received"
            )
        per_round = clients_per_round(cfg.train, num_clients)
        algorithm = private(algorithm, cfg.privacy, per_round, cfg.train.rounds)
    return model, algorithm


def check_model_size(cfg: ExperimentConfig, input_shape: tuple[int, ...], classes: int) -> None:
    """Refuse a model whose parameters alone exceed this machine's memory, built on the
    meta device (no memory, no random numbers drawn) before the real one. A model that
    cannot be built there is left to the real build."""
    try:
        with torch.device("meta"):
            shapes = build_model(cfg.model, input_shape, classes).parameters()
            need = sum(p.numel() * p.element_size() for p in shapes)
    except ConfigError:
        raise
    except Exception:  # noqa: BLE001 - a plugin model that the meta device cannot build
        return
    free = _available_memory()
    if free is not None and COPIES * need > free:
        raise ConfigError(
            f"model.*: the model '{cfg.model.name}' has {need / 2**30:.1f} GiB of parameters; "
            f"a run holds {COPIES} copies, more than the {free / 2**30:.1f} GiB of memory "
            "available; make it smaller (model.hidden, ...)"
        )


COPIES = 4
"""The fewest copies of the model's parameters a run holds: the server's, a client's, its
gradients and the aggregate."""


def _available_memory() -> int | None:
    """MemAvailable (Linux), else the physical memory, else None."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX
        return None


def pooled_data(fed: FederatedData, ids: list[int] | None = None) -> ClientData:
    """All clients' training data as one client (the `centralized` reference); `ids`: only
    these clients' (the unseen ones left out)."""
    cat = torch.cat
    cs = fed.clients if ids is None else [fed.clients[i] for i in ids]
    return ClientData(
        name="pooled",
        group=None,
        train_x=cat([c.train_x for c in cs]),
        train_y=cat([c.train_y for c in cs]),
        val_x=cat([c.val_x for c in cs]),
        val_y=cat([c.val_y for c in cs]),
        test_x=cat([c.test_x for c in cs]),
        test_y=cat([c.test_y for c in cs]),
    )
