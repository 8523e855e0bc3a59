"""Where the privacy layer's randomness comes from: noise and client sampling nobody can replay.

A guarantee holds only if the noise is unknown to whoever sees the release. Noise drawn from
the run's seed is not: the seed is in `config.yaml`, so anyone holding the config regenerates
the noise, subtracts it and recovers the clipped sum (or, in local mode, every client's
clipped reply), and sees which clients were sampled, which voids the amplification the
accountant credits. So by default (`privacy.noise=secure`) both come from the operating
system's cryptographically secure generator (`os.urandom`, `secrets`), drawn fresh and
never recorded:
- Gaussian noise by the Box-Muller transform of 53-bit uniforms read from `os.urandom`
  (Opacus's secure mode draws from a CSPRNG the same way: torchcsprng);
- the round's clients by `secrets.SystemRandom`.
`privacy.noise=seeded` keeps the old streams (keyed by the seed, the round and the client) for
research that needs a private simulation to repeat exactly; every output then says that the
epsilon is not a guarantee, and a Flower deployment refuses it.
"""

from __future__ import annotations

import math
import os
import secrets
from typing import Protocol

import numpy as np
import torch

from protofed.core.caveats import NOT_A_GUARANTEE
from protofed.core.seeding import (
    PRIVACY_CLIENT,
    PRIVACY_SERVER,
    poisson_clients,
    sample_clients,
    torch_generator,
)

__all__ = ["NOT_A_GUARANTEE", "NoiseSource", "SecureNoise", "SeededNoise", "private_sample"]


class NoiseSource(Protocol):
    """Standard normal draws for the Gaussian mechanism."""

    def normal(self, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
        """float64 standard normal values of `shape`, on the CPU."""
        ...


class SecureNoise:
    """Standard normals from the operating system's entropy (module docstring)."""

    def normal(self, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
        count = math.prod(shape)
        pairs = (count + 1) // 2
        words = np.frombuffer(os.urandom(16 * pairs), dtype=np.uint64) >> np.uint64(11)
        # 53 random bits each, as uniforms in (0, 1]: log(u) is finite
        uniform = torch.from_numpy((words.astype(np.float64) + 1.0) * 2.0**-53)
        radius = torch.sqrt(-2.0 * torch.log(uniform[:pairs]))
        angle = (2.0 * math.pi) * uniform[pairs:]
        drawn = torch.cat((radius * torch.cos(angle), radius * torch.sin(angle)))
        return drawn[:count].reshape(shape)


class SeededNoise:
    """Standard normals from a torch generator keyed by the run's seed (replayable)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def normal(self, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, generator=self.generator, dtype=torch.float64)


def server_noise(secure: bool, seed: int, server_round: int) -> NoiseSource:
    """The server's noise for a round (central mode, the adaptive count, the canaries)."""
    if secure:
        return SecureNoise()
    return SeededNoise(torch_generator(seed, PRIVACY_SERVER, server_round))


def client_noise(secure: bool, seed: int, server_round: int, client: int) -> NoiseSource:
    """A client's own noise for a round (local mode)."""
    if secure:
        return SecureNoise()
    return SeededNoise(torch_generator(seed, PRIVACY_CLIENT, server_round, client + 1))


def private_sample(
    secure: bool, poisson: bool, seed: int, server_round: int, population: int, count: int
) -> list[int]:
    """The sorted indices of a private round's clients: `count` of `population` without
    replacement, or each alone with probability count / population (`poisson`), from the
    secure generator, or from the seed's sampling stream where the noise is seeded."""
    if not secure:
        if poisson:
            return poisson_clients(seed, server_round, population, count / population)
        return sample_clients(seed, server_round, population, count)
    draw = secrets.SystemRandom()
    if poisson:
        rate = count / population
        return [i for i in range(population) if draw.random() < rate]
    if count >= population:
        return list(range(population))
    return sorted(draw.sample(range(population), count))
