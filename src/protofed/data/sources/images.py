"""Images: scikit-learn digits, MNIST, USPS, MNIST-M and their union (`digits_domains`),
CIFAR-10/100, FEMNIST, and Office-Caltech10 (as SURF features of its images)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from protofed.config import DataConfig
from protofed.data.sources.reading import (
    as_labels,
    load_npz,
    require,
    require_first,
    resize,
    zscore,
)
from protofed.data.types import Dataset


def _image_dataset(name: str, X: np.ndarray, y: np.ndarray, **kw: Any) -> Dataset:
    num_classes = kw.pop("num_classes", None) or int(y.max()) + 1
    class_names = kw.pop("class_names", None) or [str(i) for i in range(num_classes)]
    return Dataset(
        name=name,
        X=X,
        y=as_labels(y),
        num_classes=num_classes,
        class_names=class_names,
        kind="image",
        **kw,
    )


def _to_chw(x: np.ndarray, *, channels_last: bool) -> np.ndarray:
    """Images -> float32 (N, C, H, W) in [0, 1]; uint8 is divided by 255, floats kept."""
    scale = 255.0 if x.dtype == np.uint8 else 1.0
    out = x.astype(np.float32)
    if scale != 1.0:
        out /= scale
    if out.ndim == 3:
        out = out[:, None]
    elif channels_last:
        out = out.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(out)


def _normalise_channels(X: np.ndarray) -> tuple[np.ndarray, dict[str, list[float]]]:
    """Per-channel mean/std standardisation over the data set (the usual CIFAR transform)."""
    mean = X.mean(axis=(0, 2, 3), dtype=np.float64)
    std = X.std(axis=(0, 2, 3), dtype=np.float64)
    std = np.where(std > 0, std, 1.0)
    X -= mean.astype(np.float32)[None, :, None, None]
    X /= std.astype(np.float32)[None, :, None, None]
    return X, {"channel_mean": mean.tolist(), "channel_std": std.tolist()}


def load_digits(cfg: DataConfig) -> Dataset:
    """scikit-learn's bundled 8x8 digits, scaled to [0, 1]."""
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    X = resize(np.ascontiguousarray(bunch.images[:, None] / 16.0, dtype=np.float32), cfg.image_size)
    return _image_dataset("digits", X, bunch.target, meta={"source": "scikit-learn load_digits"})


def _train_test(
    cfg: DataConfig, name: str, relpath: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw train+test arrays concatenated, with split 0 train / 1 test."""
    d = load_npz(require(cfg, name, relpath), "x_train", "y_train", "x_test", "y_test")
    x = np.concatenate([d["x_train"], d["x_test"]])
    y = np.concatenate([d["y_train"], d["y_test"]])
    split = np.repeat([0, 1], [len(d["y_train"]), len(d["y_test"])]).astype(np.int64)
    return x, y, split


def _raw_mnist_m(cfg: DataConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The fetched train+test file when present, else the test split alone (split None)."""
    path = require_first(cfg, "mnist_m", "digits/mnist_m.npz", "digits/mnist_m_test.npz")
    if path.name == "mnist_m.npz":
        return _train_test(cfg, "mnist_m", "digits/mnist_m.npz")
    d = load_npz(path, "x_test", "y_test")
    return d["x_test"], d["y_test"], None


def load_mnist(cfg: DataConfig) -> Dataset:
    """MNIST train+test, the published split kept."""
    x, y, split = _train_test(cfg, "mnist", "digits/mnist.npz")
    X = resize(_to_chw(x, channels_last=False), cfg.image_size)
    return _image_dataset("mnist", X, y, predefined_split=split)


def load_usps(cfg: DataConfig) -> Dataset:
    """USPS train+test, the published split kept."""
    x, y, split = _train_test(cfg, "usps", "digits/usps.npz")
    X = resize(_to_chw(x, channels_last=False), cfg.image_size)
    return _image_dataset("usps", X, y, predefined_split=split)


def load_mnist_m(cfg: DataConfig) -> Dataset:
    """MNIST-M train+test once fetched, else its test split alone."""
    x, y, split = _raw_mnist_m(cfg)
    X = resize(_to_chw(x, channels_last=True), cfg.image_size)
    note = "MNIST-M test split only" if split is None else "MNIST-M train + test"
    return _image_dataset("mnist_m", X, y, predefined_split=split, meta={"note": note})


DIGITS_DOMAINS_SIZE = 32
DIGITS_DOMAINS_PER_DOMAIN = 7000
_DOMAIN_NAMES = ["mnist", "usps", "mnist_m"]


def load_digits_domains(cfg: DataConfig) -> Dataset:
    """Three digit domains on one grid (3 x 32 x 32), at most 7000 samples each.

    The cap keeps MNIST from outweighing the others tenfold and bounds memory; the subsample is
    drawn with np.random.default_rng(0), so it is the same in every run regardless of data.seed.
    """
    size = cfg.image_size or DIGITS_DOMAINS_SIZE
    raw = [
        _train_test(cfg, "mnist", "digits/mnist.npz")[:2],
        _train_test(cfg, "usps", "digits/usps.npz")[:2],
        _raw_mnist_m(cfg)[:2],
    ]
    rng = np.random.default_rng(0)
    xs, ys, gs, sizes = [], [], [], {}
    for dom, (x, y) in enumerate(raw):
        keep = np.sort(rng.permutation(len(y))[:DIGITS_DOMAINS_PER_DOMAIN])
        img = resize(_to_chw(x[keep], channels_last=x.ndim == 4), size)
        if img.shape[1] == 1:
            img = np.repeat(img, 3, axis=1)
        xs.append(img)
        ys.append(y[keep])
        gs.append(np.full(len(keep), dom, dtype=np.int64))
        sizes[_DOMAIN_NAMES[dom]] = len(keep)
    return _image_dataset(
        "digits_domains",
        np.concatenate(xs),
        np.concatenate(ys),
        groups=np.concatenate(gs),
        group_names=list(_DOMAIN_NAMES),
        meta={
            "domain_sizes": sizes,
            "note": f"at most {DIGITS_DOMAINS_PER_DOMAIN} samples per domain, drawn with "
            "np.random.default_rng(0) from train+test; greyscale repeated to 3 channels; "
            f"bilinear resize to {size}x{size}",
        },
    )


def _cifar(cfg: DataConfig, name: str, full: str, subset: str) -> Dataset:
    """The fetched 60000-image file when present, else the stratified subset."""
    path = require_first(cfg, name, full, subset)
    if path.name == Path(full).name:
        x, y, split = _train_test(cfg, name, full)
        note = "all 60000 images (published train/test kept as the predefined split)"
    else:
        d = load_npz(path, "x", "y")
        x, y, split = d["x"], d["y"], None
        note = "stratified subset"
    X = resize(_to_chw(x, channels_last=True), cfg.image_size)
    X, stats = _normalise_channels(X)
    return _image_dataset(
        name,
        X,
        y,
        predefined_split=split,
        meta={**stats, "file": str(path), "note": f"{note}; per-channel standardised"},
    )


def load_cifar10(cfg: DataConfig) -> Dataset:
    """CIFAR-10: all 60000 images once fetched, else the 20k stratified subset."""
    return _cifar(cfg, "cifar10", "images/cifar10.npz", "images/cifar10_20k.npz")


def load_cifar100(cfg: DataConfig) -> Dataset:
    """CIFAR-100: all 60000 images once fetched, else the 10k stratified subset."""
    return _cifar(cfg, "cifar100", "images/cifar100.npz", "images/cifar100_10k.npz")


def load_femnist(cfg: DataConfig) -> Dataset:
    """FEMNIST (LEAF niid 5% sample), grouped by writer, inverted to a 0 background."""
    path = require_first(cfg, "femnist", "images/femnist.npz", "images/femnist_partial.npz")
    d = load_npz(path, "x", "y", "writer")
    # LEAF stores ink dark on a 255 background; invert so background is 0 like MNIST.
    X = resize(1.0 - _to_chw(d["x"], channels_last=False), cfg.image_size)
    writers = d["writer"].astype(np.int64)
    if "writer_names" in d:
        names = [str(n) for n in d["writer_names"]]
    else:
        names = [f"writer_{i}" for i in range(int(writers.max()) + 1)]
    split = d["split"].astype(np.int64) if "split" in d else None
    return _image_dataset(
        "femnist",
        X,
        d["y"],
        num_classes=62,
        groups=writers,
        group_names=names,
        predefined_split=split,
        meta={"file": str(path), "note": "LEAF niid 5% sample; inverted to 0 background"},
    )


def load_office_caltech(cfg: DataConfig) -> Dataset:
    """Office-Caltech10 SURF word counts as row histograms, column z-scored; groups = domain."""
    path = require(cfg, "office_caltech", "features/office_caltech10_surf.npz")
    d = load_npz(path, "X", "y", "domain")
    counts = d["X"].astype(np.float32)
    # Images differ in size, so raw SURF word counts differ in scale: L1 turns each row into a
    # word histogram, then columns are z-scored so no single frequent word dominates.
    totals = counts.sum(axis=1, keepdims=True)
    hist = counts / np.where(totals > 0, totals, 1.0)
    X, _, _ = zscore(hist)
    domains = [str(n) for n in d["domain_names"]] if "domain_names" in d else None
    groups = d["domain"].astype(np.int64)
    class_names = [str(c) for c in d["class_names"]] if "class_names" in d else None
    y = as_labels(d["y"])
    return Dataset(
        name="office_caltech",
        X=X,
        y=y,
        num_classes=len(class_names) if class_names else int(y.max()) + 1,
        class_names=class_names or [str(i) for i in range(int(y.max()) + 1)],
        groups=groups,
        group_names=domains or [f"domain_{i}" for i in range(int(groups.max()) + 1)],
        kind="tabular",
        meta={"file": str(path), "preprocessing": "row L1 normalisation, then column z-score"},
    )
