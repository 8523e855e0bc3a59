"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data sets beside the repo (../shared/data); tests needing them skip without."""
    if not SHARED_DATA.is_dir():
        pytest.skip(
            "../shared/data not found: real-data tests need the shared data sets beside the repo"
        )
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """`train.threads` sets torch's process-wide thread count: give it back after each test."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
