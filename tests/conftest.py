"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


DIGITS_SMALL = [
    "data.name=digits",
    "data.num_clients=6",
    "model.hidden=[32]",
    "train.rounds=3",
    "train.lr=0.1",
    "train.momentum=0.9",
    "train.local_epochs=2",
    "data.standardize=true",
    "train.threads=1",
    "train.workers=1",
]
"""Six digits clients, an MLP of 2,410 weights, 3 rounds: a federation that learns in seconds
(the privacy tests run it with and without the privacy layer)."""


def uci_har_slice(path: Path, subjects: list[int], every: int) -> Path:
    """Real UCI-HAR windows of a few subjects (natural clients), every `every`-th, total acc +
    body gyro: a federation small enough for a test. Written to `path` (.npz); returned."""
    import numpy as np

    raw = np.load(SHARED_DATA / "har" / "uci_har.npz", allow_pickle=False)
    channels = [str(c) for c in raw["channels"]]
    pick = [channels.index(f"{k}_{a}") for k in ("total_acc", "body_gyro") for a in "xyz"]
    keep = np.isin(raw["subject"], subjects) & (np.arange(len(raw["y"])) % every == 0)
    np.savez(path, X=raw["X"][keep][:, pick], y=raw["y"][keep], group=raw["subject"][keep])
    return path


def har_slice_config(path: Path, *settings: str):
    """The config of a 2-round run on a `uci_har_slice` file (one client per subject, seed 1,
    one thread), then `settings` (`key=value`, applied in order)."""
    from protofed.config import load_config

    return load_config(
        None,
        [
            "data.name=arrays",
            f"data.path={path}",
            "data.partition=natural",
            "seed=1",
            "train.rounds=2",
            "train.threads=1",
            *settings,
        ],
    )


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data sets beside the repo (../shared/data); tests needing them skip without."""
    if not SHARED_DATA.is_dir():
        pytest.skip(
            "../shared/data not found: real-data tests need the shared data sets beside the repo"
        )
    return SHARED_DATA


@pytest.fixture(scope="session")
def digits_clients():
    """Two real clients from scikit-learn's digits: `make(size)` gives disjoint slices of
    `size` samples each, split 70/10/20 into train/val/test."""
    import torch
    from sklearn.datasets import load_digits

    from protofed.data.federated import ClientData

    X, y = load_digits(return_X_y=True)
    x = torch.tensor(X / 16.0, dtype=torch.float32)
    t = torch.tensor(y, dtype=torch.long)

    def make(size: int) -> list[ClientData]:
        out = []
        for i in range(2):
            xs, ys = x[i * size : (i + 1) * size], t[i * size : (i + 1) * size]
            a, b = int(0.7 * len(xs)), int(0.8 * len(xs))
            out.append(ClientData(f"c{i}", None, xs[:a], ys[:a], xs[a:b], ys[a:b], xs[b:], ys[b:]))
        return out

    return make


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """`train.threads` sets torch's process-wide thread count: give it back after each test."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def kernel_cache(tmp_path_factory) -> None:
    """The kernels measured by the suite's runs (training/fused.py's cached choice) go to a
    file of this session, never to the user's cache folder; subprocesses inherit it."""
    import os

    if "PROTOFED_KERNEL_CACHE" not in os.environ:
        os.environ["PROTOFED_KERNEL_CACHE"] = str(tmp_path_factory.mktemp("kernels") / "k.json")
