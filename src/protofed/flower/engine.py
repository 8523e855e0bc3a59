"""A compatibility module: the names other modules imported from the Flower engine before
it was split by job. New code imports from where each name lives:

- `simulation`: `start`, `simulation_loop`, `run_simulation_loop`, `run_simulations`;
- `session`: `FLOWER_ENV` (Ray, signals and the clean-up of a simulation session);
- `transport`: `FlowerTransport`, `RoundFailed` (messages over Flower's Grid);
- `deployment`: `deploy`, `ClientSideEvaluation` (the deployed ServerApp's loop).
"""

from __future__ import annotations

from protofed.flower.deployment import ClientSideEvaluation, deploy
from protofed.flower.session import FLOWER_ENV
from protofed.flower.simulation import (
    run_simulation_loop,
    run_simulations,
    simulation_loop,
    start,
)
from protofed.flower.transport import FlowerTransport, RoundFailed

__all__ = [
    "FLOWER_ENV",
    "ClientSideEvaluation",
    "FlowerTransport",
    "RoundFailed",
    "deploy",
    "run_simulation_loop",
    "run_simulations",
    "simulation_loop",
    "start",
]
