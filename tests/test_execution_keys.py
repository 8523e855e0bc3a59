"""The execution group (`config.EXECUTION_KEYS`) is one list: the resume check, the report's
grouping, the sweep's identity of a run and the docs all read it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from protofed.config import EXECUTION_KEYS, build_config, flatten
from protofed.errors import ConfigError
from protofed.report import IGNORED_KEYS
from protofed.sweep import config_digest, load_spec

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_execution_key_is_a_config_key() -> None:
    keys = set(flatten(build_config({}).to_dict()))
    assert set(EXECUTION_KEYS) <= keys
    assert "eval.batch_size" not in EXECUTION_KEYS  # FedAli's ALP predicts by batch


def test_the_docs_list_the_execution_keys() -> None:
    page = (DOCS / "running-fast.md").read_text()
    section = page[page.index("## Execution keys") :]
    listed = re.findall(r"^- `([a-z_.]+)`$", section, flags=re.M)
    assert listed == list(EXECUTION_KEYS)


def test_the_report_and_the_sweep_ignore_exactly_the_execution_keys() -> None:
    assert set(IGNORED_KEYS) == {"seed", *EXECUTION_KEYS}
    base = build_config({})
    for key in EXECUTION_KEYS:
        other = base.model_copy(deep=True)
        section, name = key.split(".", 1)
        value = {"data.dir": "/elsewhere", "train.device": "cuda", "train.workers": 7}.get(key)
        if value is None:
            continue
        setattr(getattr(other, section), name, value)
        assert config_digest(other) == config_digest(base), key
    seeded = base.model_copy(deep=True)
    seeded.train.lr = 0.5
    assert config_digest(seeded) != config_digest(base)


def test_a_sweep_refuses_an_execution_key_as_a_grid_axis(tmp_path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("base: {}\ngrid:\n  train.workers: [1, 2]\n")
    with pytest.raises(ConfigError, match="execution key"):
        load_spec(spec).expand()
