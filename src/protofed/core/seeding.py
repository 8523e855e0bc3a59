"""Every random number in a run comes from the config's seed through these streams.

Each stream is keyed by what it is for (and the round and client where it applies), so the
clients sampled in round r, or the batches client i draws in round r, never depend on what ran
before: every algorithm sees the same clients, and a resumed run draws what an uninterrupted
one would have.
"""

from __future__ import annotations

import numpy as np
import torch

# stream tags: fixed numbers so that adding a stream never shifts another
MODEL_INIT, SAMPLING, CLIENT_TRAIN = 10, 11, 12
DYNAMIC_DATA = 13  # data.dynamic: which clients lose which classes (runtime/dynamic.py)
SERVER = 14  # an algorithm's server-side randomness (e.g. clustering), keyed further by it
EVALUATION = 15  # eval.generalization_samples: the union's stratified sample (evaluation.py)
PRIVACY_CLIENT = 16  # privacy.mode=local: a client's noise, keyed by round and client
PRIVACY_SERVER = 17  # privacy.mode=central: the server's noise, keyed by round
AUDIT = 18  # privacy.audit: the canaries' directions and when they take part (privacy/audit.py)
NATURAL_CLIENTS = 19  # data.num_clients under a natural partition: which groups (data/partition.py)
UNSEEN_USERS = (
    31  # eval.unseen_clients: who is held out, and their fine-tuning (runtime/holdout.py)
)


def derive_seed(seed: int, *keys: int) -> int:
    return int(np.random.SeedSequence([seed, *keys]).generate_state(1, dtype=np.uint64)[0] >> 1)


def numpy_generator(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, *keys]))


def torch_generator(seed: int, *keys: int) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(seed, *keys))


def sample_clients(seed: int, server_round: int, num_clients: int, count: int) -> list[int]:
    """The sorted client ids taking part in `server_round` (1-based)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, SAMPLING, server_round]))
    if count >= num_clients:
        return list(range(num_clients))
    return sorted(int(i) for i in rng.choice(num_clients, size=count, replace=False))


def poisson_clients(seed: int, server_round: int, num_clients: int, rate: float) -> list[int]:
    """The sorted client ids taking part in `server_round` when each is drawn alone with
    probability `rate` (privacy.sampling=poisson): the round's size varies, possibly 0."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, SAMPLING, server_round]))
    return [int(i) for i in np.flatnonzero(rng.random(num_clients) < rate)]
