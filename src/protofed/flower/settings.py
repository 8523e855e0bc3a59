"""The Flower settings (`flower.*`) checked against the experiment, before any file exists."""

from __future__ import annotations

import os
import socket

from protofed.errors import ConfigError
from protofed.runtime import Prepared


def check_settings(prepared: Prepared, per_round: int, simulated: bool) -> None:
    """The Flower settings against the experiment, before any file exists."""
    cfg = prepared.cfg
    if prepared.algorithm.pools_data:
        raise ConfigError(
            f"'{prepared.algorithm.name}' pools all data in one client: run it on the built-in engine"
        )
    if simulated and cfg.train.device != "cpu" and cfg.flower.client_gpus == 0:
        raise ConfigError(
            f"train.device={cfg.train.device} on Flower: set flower.client_gpus (GPUs per ClientApp, e.g. 0.5)"
        )
    if cfg.flower.min_replies > per_round:
        raise ConfigError(
            f"flower.min_replies={cfg.flower.min_replies} exceeds the {per_round} clients sampled per round"
        )
    if simulated and cfg.flower.ray_address is not None:
        check_ray_address(cfg.flower.ray_address)


RAY_PROBE_S = 5.0
"""How long `check_ray_address` waits for a cluster's head to accept a connection."""


def check_ray_address(address: str) -> None:
    """`flower.ray_address` checked before any file exists: Ray itself waits on an address
    nothing answers at, or fails once the run directory was made; and its own `auto`, with
    no `ray start` cluster to find, attaches to any Ray instance running here, another
    run's included. As in Ray, `auto` means RAY_ADDRESS when set; a HOST:PORT is used as
    it is."""
    target, where = address, f"flower.ray_address={address}"
    if address == "auto":
        if os.environ.get("RAY_ADDRESS"):
            target = os.environ["RAY_ADDRESS"]
            where += f" (RAY_ADDRESS={target})"
        else:
            from ray._private.utils import read_ray_address  # the last `ray start` here

            target = read_ray_address() or ""
            if not target:
                raise ConfigError(
                    f"{where}: no `ray start` cluster on this machine and RAY_ADDRESS unset "
                    "(Ray would attach to any instance it finds): start one, or name it as "
                    "HOST:PORT"
                )
    host, colon, port = target.removeprefix("ray://").rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:6379
    if not (colon and host and port.isdecimal()):
        raise ConfigError(f"{where}: '{target}' is not HOST:PORT, 'auto' or ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=RAY_PROBE_S).close()
    except OSError as exc:
        raise ConfigError(
            f"{where}: nothing answers at {target} ({exc.strerror or type(exc).__name__}); "
            "start the cluster (`ray start --head`), or leave the key unset for a Ray of "
            "the run's own"
        ) from None
