"""The engines a run can run on, by name, defined once for `protofed.run`, `protofed.resume`
and `protofed run --engine`: how each starts a run, how it drives the round loop, and whether
it can resume.

Flower is an optional extra: its modules are imported only when its engine is used, after
`require_flower` has turned a missing install into a one-line error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from protofed.errors import ConfigError

if TYPE_CHECKING:
    from protofed.config import ExperimentConfig
    from protofed.runtime.loop import OnRound, RoundLoop

BUILTIN = "builtin"


def _installed() -> None:
    """The built-in engine needs nothing beyond protofed's own dependencies."""


@dataclass(frozen=True)
class Engine:
    """One engine: `start(cfg, out, overwrite)` validates everything and creates the run
    directory, `drive(loop, on_round)` runs the loop to its end (the summary is then in the
    run directory), `resume(path, data_dir)` re-opens a run from its checkpoint (None where
    the client states live outside this process: `cannot_resume` says why), `require()`
    fails in one line where its optional extra is missing."""

    name: str
    start: Callable[[ExperimentConfig, str | Path, bool], RoundLoop]
    drive: Callable[[RoundLoop, OnRound | None], None]
    resume: Callable[[str | Path, str | Path | None], RoundLoop] | None = None
    require: Callable[[], None] = _installed
    cannot_resume: str = ""

    @property
    def resumable(self) -> bool:
        return self.resume is not None

    def reopen(self, path: str | Path, data_dir: str | Path | None = None) -> RoundLoop:
        """The run at `path` re-opened from its checkpoint (`resume`), or a ConfigError."""
        if self.resume is None:
            raise ConfigError(f"{self.cannot_resume}: {path} cannot resume")
        return self.resume(path, data_dir)


def _builtin_start(cfg: ExperimentConfig, out: str | Path, overwrite: bool) -> RoundLoop:
    from protofed.runtime import start

    return start(cfg, out, overwrite=overwrite)


def _builtin_drive(loop: RoundLoop, on_round: OnRound | None) -> None:
    loop.run(on_round)


def _builtin_resume(path: str | Path, data_dir: str | Path | None) -> RoundLoop:
    from protofed.runtime import resume

    return resume(path, data_dir)


def _require_flower() -> None:
    from protofed.flower import require_flower

    require_flower()


def _flower_start(cfg: ExperimentConfig, out: str | Path, overwrite: bool) -> RoundLoop:
    _require_flower()
    from protofed.flower.simulation import start

    return start(cfg, out, overwrite=overwrite)


def _flower_drive(loop: RoundLoop, on_round: OnRound | None) -> None:
    """The loop inside its own Flower simulation session."""
    _require_flower()
    from protofed.flower.simulation import run_simulation_loop

    run_simulation_loop(loop, on_round)


ENGINES: dict[str, Engine] = {
    engine.name: engine
    for engine in (
        Engine(BUILTIN, _builtin_start, _builtin_drive, resume=_builtin_resume),
        Engine(
            "flower",
            _flower_start,
            _flower_drive,
            require=_require_flower,
            cannot_resume="Flower runs keep client states on the nodes",
        ),
    )
}
"""Every engine by name: the built-in one, and Flower's simulation engine (docs/flower.md)."""


def engine_named(name: str, what: str = "engine") -> Engine:
    """The engine called `name`; else one ConfigError naming the known ones (`what`: how the
    caller's user named the choice, e.g. `--engine`)."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ConfigError(f"unknown {what} '{name}' ({' or '.join(ENGINES)})") from None
