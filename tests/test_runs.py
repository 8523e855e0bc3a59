"""The run directory across versions: a run written by an earlier protofed opens, reads and
resumes with this one (runs.py, runtime.engine.resume, core.results)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import protofed
from protofed.core.results import RoundRecord, Summary

OLD_RUN = Path(__file__).parent / "data" / "run_before_typed_records"
"""FedPer on digits (4 clients, 4 rounds), stopped by Ctrl-C after round 2, written by the
code before round data were typed (commit db0125b): config, partition, two metrics.jsonl
lines and a checkpoint, as that version left them."""


def _config() -> dict:
    import yaml

    return yaml.safe_load((OLD_RUN / "config.yaml").read_text())


def test_every_line_of_an_earlier_metrics_file_reads_back_as_written():
    for line in (OLD_RUN / "metrics.jsonl").read_text().splitlines():
        raw = json.loads(line)
        assert RoundRecord.from_json(raw).to_json() == raw


@pytest.mark.integration
def test_a_run_stopped_by_an_earlier_version_resumes_to_the_uninterrupted_numbers(tmp_path):
    old = tmp_path / "old"
    shutil.copytree(OLD_RUN, old)
    resumed = protofed.resume(old)
    assert [r.round for r in map(RoundRecord.from_json, resumed.dir.history())] == [1, 2, 3, 4]
    whole = protofed.run(_config(), tmp_path / "whole")
    got, want = resumed.summary, whole.summary
    assert got.status == "complete" and got.rounds == 4
    assert got.final == want.final and got.selected == want.selected
    written = json.loads((old / "summary.json").read_text())
    assert Summary.from_json(written) == got


@pytest.mark.integration
@pytest.mark.parametrize("which", ["final", "selected"])
def test_a_summary_reads_back_key_for_key(tmp_path, which):
    run = protofed.run(_config(), tmp_path / "run")
    written = json.loads((run.path / "summary.json").read_text())
    assert Summary.from_json(written).to_json() == written
    assert getattr(run.summary, which).personalization.f1 == written[which]["personalization"]["f1"]
