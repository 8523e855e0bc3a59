"""Live tracking: what follows a run while it runs, from the round loop's `on_round` calls.

The loop calls `on_round(round, info, record)` after every round (`runtime.loop.OnRound`):
`info` holds the round's train loss, server metrics and times, `record` the line it appended
to metrics.jsonl (None for a round that was not evaluated). `Tracking` consumes them:

- TensorBoard scalars in RUN/tensorboard/ (`--log tensorboard`, `protofed.run(log=...)`);
- one plain line per evaluated round for a log file (`round 10/100  loss 0.4123  pers F1
  81.23%  ...  ETA 4m48s`), where stderr is not a terminal and no progress bar is drawn;
- the progress bar's status (the latest train loss and personalization F1).

It only reads what the loop hands it, so what it shows is what metrics.jsonl holds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from protofed.core.results import RoundInfo, RoundRecord
from protofed.errors import ConfigError

LOGS = ("tensorboard",)
"""The `--log` destinations."""
TENSORBOARD = "tensorboard"
"""The run directory's folder of TensorBoard event files."""
SCORES = {
    "personalization": "personalization",
    "generalization": "generalization",
    "global": "global",
    "val": "validation",
}
"""metrics.jsonl's score sections -> their TensorBoard tag prefix."""


def log_kinds(values: str | Sequence[str] | None) -> tuple[str, ...]:
    """`--log` values (repeated, or comma-separated) checked before any file is written: an
    unknown one, or tensorboard without its package, is a one-line error."""
    if values is None:
        return ()
    items = [values] if isinstance(values, str) else list(values)
    kinds: list[str] = []
    for item in items:
        for kind in (k.strip() for k in str(item).split(",")):
            if kind and kind not in LOGS:
                raise ConfigError(f"unknown --log '{kind}' (valid: {', '.join(LOGS)})")
            if kind and kind not in kinds:
                kinds.append(kind)
    if "tensorboard" in kinds:
        require_tensorboard()
    return tuple(kinds)


def require_tensorboard() -> None:
    """A one-line error naming the extra to install when TensorBoard cannot be imported."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(
            "--log tensorboard needs the tensorboard package: "
            f"pip install 'protofed[tensorboard]' ({reason})"
        ) from None


def _number(value: Any) -> float | None:
    """A finite number, or None (a missing score, a NaN written as null, a flag)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def scalars(
    info: RoundInfo, record: RoundRecord | None, round_s: float | None = None
) -> dict[str, float]:
    """The round's scalars by TensorBoard tag.

    Every round: `train/loss`, `server/<metric>`, `time/train_s`, `time/aggregate_s` and
    `time/round_s` (wall clock since the previous round). An evaluated round adds every score
    of its metrics.jsonl line (`personalization/f1`, `generalization/acc`, `global/f1`,
    `validation/f1_std`, ...), `comm/up_bytes` and `comm/down_bytes` (totals so far) and
    `time/eval_s`. Missing or non-finite values are left out.
    """
    values: dict[str, Any] = {
        "train/loss": info.train_loss,
        "time/train_s": info.train_s,
        "time/aggregate_s": info.aggregate_s,
        "time/round_s": round_s,
    }
    values.update({f"server/{k}": v for k, v in info.server.items()})
    if record is not None:
        line = record.to_json()  # the tags are metrics.jsonl's keys
        for section, prefix in SCORES.items():
            values.update({f"{prefix}/{k}": v for k, v in (line.get(section) or {}).items()})
        values.update({f"comm/{k}": v for k, v in line["comm"].items()})
        values["time/eval_s"] = record.time.eval_s
    return {tag: number for tag, v in values.items() if (number := _number(v)) is not None}


def duration(seconds: float) -> str:
    """12s, 4m48s, 1h02m: an ETA as a log line shows it."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _pct(value: Any) -> str:
    number = _number(value)
    return "-" if number is None else f"{100 * number:.2f}%"


class RoundClock:
    """Wall-clock seconds per round and the time left, from the rounds this process ran."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.rounds = 0

    def tick(self) -> float:
        """A round ended: the seconds it took (since the previous tick, or the start)."""
        now = time.perf_counter()
        took, self.last = now - self.last, now
        self.rounds += 1
        return took

    @property
    def per_round(self) -> float:
        return (self.last - self.start) / max(self.rounds, 1)

    def eta_s(self, server_round: int, total: int) -> float:
        return (total - server_round) * self.per_round


def plain_line(server_round: int, total: int, record: RoundRecord, clock: RoundClock) -> str:
    """One evaluated round as one line of text, for `tail -f` on a log file."""
    parts = [f"round {server_round}/{total}"]
    loss = _number(record.train_loss)
    parts.append(f"loss {'-' if loss is None else f'{loss:.4f}'}")
    parts.append(f"pers F1 {_pct(record.personalization.f1)}")
    for part, label in ((record.generalization, "gen"), (record.global_, "global")):
        if part is not None:
            parts.append(f"{label} F1 {_pct(part.f1)}")
    per = clock.per_round
    parts.append(f"{per:.1f} s/round" if per >= 1 else f"{per:.2f} s/round")
    parts.append(f"ETA {duration(clock.eta_s(server_round, total))}")
    return "  ".join(parts)


class TensorBoardLog:
    """TensorBoard event files in `folder`, one step per round, flushed after every round.

    A run that starts at round 1 (new, or restarted from scratch) removes older event files
    of its folder; a resumed run appends a new file with `purge_step` = its first round, so
    TensorBoard drops what an interrupted session logged after the checkpoint it resumed
    from and shows each round once, as metrics.jsonl does.
    """

    def __init__(self, folder: Path, first_round: int) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        if first_round <= 1 and folder.is_dir():
            for stale in folder.glob("events.out.tfevents.*"):
                stale.unlink()
        self.writer = SummaryWriter(
            log_dir=str(folder), purge_step=first_round if first_round > 1 else None
        )

    def add(self, server_round: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, server_round)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Tracking:
    """Everything that consumes a round's record as the run goes; call it as `on_round`.

    `run_dir`: the run directory; `total`: the run's rounds; `done`: the rounds already run
    (a resume); `log`: `log_kinds(...)`; `lines`: where plain lines go (None: nowhere).
    """

    def __init__(
        self,
        run_dir: str | Path,
        total: int,
        done: int = 0,
        log: Sequence[str] = (),
        lines: TextIO | None = None,
    ) -> None:
        self.total = total
        self.lines = lines
        self.clock = RoundClock()
        self.loss: float | None = None
        self.pers_f1: float | None = None
        self.tensorboard = (
            TensorBoardLog(Path(run_dir) / TENSORBOARD, done + 1) if "tensorboard" in log else None
        )

    def __call__(self, server_round: int, info: RoundInfo, record: RoundRecord | None) -> None:
        round_s = self.clock.tick()
        self.loss = _number(info.train_loss)
        if record is not None:
            self.pers_f1 = _number(record.personalization.f1)
        if self.tensorboard is not None:
            self.tensorboard.add(server_round, scalars(info, record, round_s))
        if self.lines is not None and record is not None:
            try:
                print(plain_line(server_round, self.total, record, self.clock), file=self.lines)
                self.lines.flush()
            except (OSError, ValueError):  # the pipe's reader went away: the run goes on
                self.lines = None

    @property
    def status(self) -> str:
        """The latest train loss and personalization F1, for a progress bar."""
        loss = "-" if self.loss is None else f"{self.loss:.4f}"
        return f"loss {loss}  pers F1 {_pct(self.pers_f1)}"

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
