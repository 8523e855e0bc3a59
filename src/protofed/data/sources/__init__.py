"""Loaders: one function per data set name, all returning a `Dataset`; and their registry.

Every loader reads its files once per call and caches nothing, so tests and runs never see
each other's data. Files are found under a data root (`data.dir`, else `$PROTOFED_DATA`, else
the user cache dir) with the same layout as the project's shared data folder; a missing file
is a `ConfigError` that names the full expected path and where the data set can be obtained.

Conventions every loader follows, so partitioners and models never special-case a source:
`X` float32 with samples on the first axis; `y` int64 in 0..C-1; `groups` int64 in 0..G-1 with
`group_names[g]` naming group g (subject, user, writer, domain) where the source has them.

One module per family: `har`, `wesad`, `images`, `arrays` (the user's own files) and
`synthetic`, on the helpers of `files`. This module holds the table of data sets
(`DATASETS`), the decorator that adds one (`register_dataset`), and `load_dataset`.
"""

from __future__ import annotations

import difflib
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from protofed import plugins
from protofed.config import DataConfig
from protofed.core.files import first_line
from protofed.data.sources import arrays, fedali_har, har, images, synthetic, wesad
from protofed.data.sources.reading import data_root, recording_reads, require_finite
from protofed.data.types import Dataset
from protofed.errors import ConfigError

__all__ = [
    "DATASETS",
    "DatasetInfo",
    "data_root",
    "load_dataset",
    "load_plugins",
    "recording_reads",
    "register_dataset",
]


@dataclass(frozen=True)
class DatasetInfo:
    """A registered data set: what it is (for `protofed list`), how to load it, where to get it."""

    description: str
    loader: Callable[[DataConfig], Dataset]
    source: str = ""
    needs_root: bool = True


_UCI = "UCI Machine Learning Repository"
DATASETS: dict[str, DatasetInfo] = {
    "digits": DatasetInfo(
        "scikit-learn 8x8 digits, 1797 images, 10 classes (bundled, no download)",
        images.load_digits,
        "scikit-learn (bundled)",
        needs_root=False,
    ),
    "uci_har": DatasetInfo(
        "UCI-HAR smartphone windows (6 or 9 channels x 128), 6 activities, 30 subjects",
        har.load_uci_har,
        f"{_UCI}: Human Activity Recognition Using Smartphones",
    ),
    "wisdm": DatasetInfo(
        "WISDM v1.1 phone accelerometer windows (3 x 128), 6 activities, 36 users",
        har.load_wisdm,
        "WISDM Lab (Fordham) Activity Prediction v1.1, windowed as in AdaTime",
    ),
    "hhar": DatasetInfo(
        "HHAR Samsung-phone accelerometer windows (3 x 128), 6 activities, 9 users",
        har.load_hhar,
        f"{_UCI}: Heterogeneity Activity Recognition (AdaTime HHAR_SA)",
    ),
    "har_combined": DatasetInfo(
        "users of several HAR sets (data.members; default hhar + wisdm: 45 users, 7 activities)",
        har.load_har_combined,
        "the member sets (see those entries), harmonized",
    ),
    "realworld": DatasetInfo(
        "RealWorld HAR 2016 accelerometer windows (3 x 128, 50 Hz), 8 activities, 105 clients",
        fedali_har.load_realworld,
        "Univ. Mannheim: RealWorld (HAR) 2016, one client per subject x body position",
    ),
    "hhar_paper": DatasetInfo(
        "HHAR accelerometer windows of every phone (3 x 128, 50 Hz), 6 activities, 36 clients",
        fedali_har.load_hhar_paper,
        f"{_UCI}: Heterogeneity Activity Recognition, one client per user x phone model",
    ),
    "fedali_combined": DatasetInfo(
        "FedAli's Combined: hhar_paper + realworld clients (141), 9 activities",
        fedali_har.load_fedali_combined,
        "hhar_paper and realworld (see those entries), harmonized",
    ),
    "wisdm_features": DatasetInfo(
        "WISDM v1.1 transformed features (43 per 10 s window), 6 activities, 36 users",
        har.load_wisdm_features,
        "WISDM Lab (Fordham): WISDM_ar_v1.1_transformed.csv",
    ),
    "wesad": DatasetInfo(
        "WESAD wrist/chest window features, 3 affect states, 15 subjects",
        wesad.load_wesad,
        f"{_UCI}: WESAD (Wearable Stress and Affect Detection), window features",
    ),
    "mnist": DatasetInfo(
        "MNIST 28x28 digits, train+test (70000)",
        images.load_mnist,
        "MNIST (yann.lecun.com / torchvision)",
    ),
    "usps": DatasetInfo(
        "USPS 16x16 digits, train+test (9298)",
        images.load_usps,
        "USPS (Hull 1994; the Kaggle usps.h5)",
    ),
    "mnist_m": DatasetInfo(
        "MNIST-M 32x32 colour digits: train+test once fetched, else the test split",
        images.load_mnist_m,
        "MNIST-M (Ganin & Lempitsky 2015), test split",
    ),
    "digits_domains": DatasetInfo(
        "MNIST + USPS + MNIST-M at 3x32x32, <=7000 per domain, groups = domain",
        images.load_digits_domains,
        "MNIST, USPS and MNIST-M (see those entries)",
    ),
    "cifar10": DatasetInfo(
        "CIFAR-10 3x32x32, 10 classes: all 60000 once fetched, else a 20k subset",
        images.load_cifar10,
        "CIFAR-10 (Krizhevsky 2009)",
    ),
    "cifar100": DatasetInfo(
        "CIFAR-100 3x32x32, 100 classes: all 60000 once fetched, else a 10k subset",
        images.load_cifar100,
        "CIFAR-100 (Krizhevsky 2009)",
    ),
    "femnist": DatasetInfo(
        "FEMNIST (LEAF niid 5% sample) 28x28, 62 classes, groups = writer",
        images.load_femnist,
        "LEAF benchmark: FEMNIST (niid, 5% sample)",
    ),
    "office_caltech": DatasetInfo(
        "Office-Caltech10 SURF 800-d features, 10 classes, 4 domains",
        images.load_office_caltech,
        "Office-Caltech10 SURF features (Gong et al. 2012 GFK release)",
    ),
    "arrays": DatasetInfo(
        "your own data: data.path = .npz (X, y, group) or .csv/.parquet table",
        arrays.load_arrays,
        "your own file (data.path)",
        needs_root=False,
    ),
    "synthetic": DatasetInfo(
        "seeded Gaussian blobs, 20000 x 32, 10 classes (tests, benchmarks)",
        synthetic.load_synthetic,
        "generated",
        needs_root=False,
    ),
}


def register_dataset(
    name: str, description: str, source: str = "", needs_root: bool = False
) -> Callable[[Callable[[DataConfig], Dataset]], Callable[[DataConfig], Dataset]]:
    """Decorator for a loader `(cfg: DataConfig) -> Dataset`: makes `data.name=<name>` load it.

    `needs_root`: it reads files under the data root (`data.dir`); `source`: where to get them.
    """

    return plugins.registrar(
        "datasets", DATASETS, name, lambda load: DatasetInfo(description, load, source, needs_root)
    )


def load_plugins() -> dict[str, DatasetInfo]:
    """Every data set, installed plugins' included (their modules register with the decorator)."""
    plugins.load("datasets")
    return DATASETS


def load_dataset(cfg: DataConfig) -> Dataset:
    """Load the data set named by data.name; an unknown name suggests the closest valid one."""
    if cfg.name not in DATASETS:
        load_plugins()
    info = DATASETS.get(cfg.name)
    if info is None:
        close = difflib.get_close_matches(cfg.name, list(DATASETS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(
            f"data.name: unknown data set '{cfg.name}'{hint} (valid: {', '.join(DATASETS)})"
        )
    try:
        ds = info.loader(cfg)
    except ConfigError:
        raise
    except (OSError, EOFError, ValueError, IndexError, zipfile.BadZipFile, zlib.error) as exc:
        # a damaged file under the data root (truncated, bit-flipped, renamed, edited)
        where = f"{exc.filename}: " if isinstance(exc, OSError) and exc.filename else ""
        raise ConfigError(
            f"data.name={cfg.name}: {where}cannot read its files ({first_line(exc)}); "
            f"fetch them again with protofed data fetch {cfg.name} --force"
        ) from None
    require_finite(ds.X, f"data.name={cfg.name}: the features after the cast to {ds.X.dtype}")
    if ds.num_classes < 2:
        culprit = cfg.path if cfg.name == "arrays" else f"data.name={cfg.name}"
        raise ConfigError(f"{culprit}: {ds.num_classes} class(es) in the labels; 2 at least")
    return ds
