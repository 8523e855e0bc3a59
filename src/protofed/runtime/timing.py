"""A round's wall clock in the loop's process, split by phase (`RoundLoop.run_round`)."""

from __future__ import annotations

import time

from protofed.core.types import Checked


class RoundClock:
    """Splits one round's time, from its start to `stop`, into three phases:

    - `train_s`: waiting for and receiving the replies (`wait` to `received`; with workers
      the clients train meanwhile, also while this process checks and aggregates), less the
      time their checks took where they were made;
    - `guard_s`: the non-finite checks, of the replies (where they were made, at their share
      of the wall clock, and here: `received` to `checked`) and of the new server state
      (`aggregated` to `stop`);
    - `aggregate_s`: the rest, the algorithm's `aggregate` consuming the replies.
    """

    def __init__(self) -> None:
        self.train_s = 0.0
        self.guard_s = 0.0
        self.aggregate_s = 0.0
        self.start = self.mark = self.done = time.perf_counter()

    def wait(self) -> None:
        """A reply is awaited from now."""
        self.mark = time.perf_counter()

    def received(self, check: Checked | None) -> None:
        """A reply came, `check` its non-finite check where it was made (within the wait)."""
        now = time.perf_counter()
        self.train_s += now - self.mark
        if check is not None:
            self.train_s -= check.wall_s
            self.guard_s += check.wall_s
        self.mark = now

    def checked(self) -> None:
        """The reply is checked here; the next one is awaited from now."""
        now = time.perf_counter()
        self.guard_s += now - self.mark
        self.mark = now

    def aggregated(self) -> None:
        """Every reply is aggregated; the new server state's check begins."""
        self.done = time.perf_counter()

    def stop(self) -> None:
        """The round is over: the check of the server state counts as guard, the rest as
        aggregation."""
        end = time.perf_counter()
        self.guard_s += end - self.done
        self.aggregate_s = end - self.start - self.train_s - self.guard_s
