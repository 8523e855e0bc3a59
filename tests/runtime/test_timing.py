"""RoundClock: a round's seconds split into train_s, guard_s and aggregate_s."""

from __future__ import annotations

import itertools

import pytest

from protofed.core.types import Checked
from protofed.runtime import timing
from protofed.runtime.timing import RoundClock


def test_the_split_adds_up_to_the_round(monkeypatch):
    """Start 0; a reply awaited from 1, received at 4 (checked where it was made in 0.5 of
    that), checked here by 5; aggregate reads on; the next awaited from 7, received at 9,
    checked by 9.25; aggregated at 12, the server state checked by 12.5."""
    ticks = iter([0.0, 1.0, 4.0, 5.0, 7.0, 9.0, 9.25, 12.0, 12.5])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(ticks))
    clock = RoundClock()
    clock.wait()
    clock.received(Checked(None, 0.5))
    clock.checked()
    clock.wait()
    clock.received(None)
    clock.checked()
    clock.aggregated()
    clock.stop()
    assert clock.train_s == pytest.approx(3.0 - 0.5 + 2.0)
    assert clock.guard_s == pytest.approx(0.5 + 1.0 + 0.25 + 0.5)
    assert clock.aggregate_s == pytest.approx(12.5 - clock.train_s - clock.guard_s)


def test_a_reply_left_out_waits_for_the_next_from_its_check(monkeypatch):
    ticks = itertools.count()  # 0, 1, 2, ...: one second a reading
    monkeypatch.setattr(timing.time, "perf_counter", lambda: float(next(ticks)))
    clock = RoundClock()  # 0
    clock.wait()  # 1
    clock.received(None)  # 2
    clock.checked()  # 3: dropped, the next awaited from here
    clock.received(None)  # 4
    clock.checked()  # 5
    clock.aggregated()  # 6
    clock.stop()  # 7
    assert (clock.train_s, clock.guard_s, clock.aggregate_s) == (2.0, 3.0, 2.0)
