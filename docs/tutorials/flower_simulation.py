# %% [markdown]
# # The same run on Flower's simulation engine
#
# protofed's algorithms run on [Flower](https://flower.ai) with no code of their own: the
# round loop, sampling, aggregation and evaluation are protofed's; Flower's simulation engine
# (Ray, one virtual SuperNode per client) carries the messages (docs/flower.md). Same config,
# same seed: the same numbers. This tutorial checks that.
#
# Run it from the repository root: `python docs/tutorials/flower_simulation.py` (digits: no
# data files; the `flower` extra, `flwr[simulation]`). Outputs go to
# `$PROTOFED_TUTORIAL_OUT/flower_simulation/` (default `runs/tutorials/flower_simulation/`);
# `PROTOFED_TUTORIAL_SMALL=1` runs 4 clients and 3 rounds instead of 10 and 10.

# %%
import os

# before Flower is imported: no telemetry, no update check, and no `uv sync` of the app's
# dependencies (which would pull a CUDA build of torch)
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

import math  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import protofed  # noqa: E402

SMALL = os.environ.get("PROTOFED_TUTORIAL_SMALL", "") not in ("", "0")
OUT = Path(os.environ.get("PROTOFED_TUTORIAL_OUT", "runs/tutorials")) / "flower_simulation"

# %% [markdown]
# ## One config, two engines
#
# Ditto: each client keeps a personal model beside the global one, so the comparison covers
# client state kept between rounds as well as the server's model. `flower.client_cpus` is
# what Ray reserves per virtual client.

# %%
clients, rounds = (4, 3) if SMALL else (10, 10)
config = {
    "data": {"name": "digits", "num_clients": clients, "partition": "dirichlet", "alpha": 0.5},
    "model": {"name": "mlp", "hidden": [64]},
    "algorithm": {"name": "ditto", "lam": 0.5},
    "train": {"rounds": rounds, "lr": 0.1, "workers": 1},
    "eval": {"every": 1},
    "flower": {"client_cpus": 1},
}
runs = {
    engine: protofed.run(config, out=OUT / engine, overwrite=True, engine=engine)
    for engine in ("builtin", "flower")
}
for engine, run in runs.items():
    print(
        engine, run.summary.engine, f"personalization F1 {run.summary.final.personalization.f1:.4f}"
    )

# %% [markdown]
# ## The same numbers
#
# Every client's scores at every evaluated round, from each run's history (a DataFrame), and
# the summaries' final scores: equal within 1e-4 (float sums may be ordered differently).

# %%
builtin, flower = (runs[e].history.sort_values(["round", "client"]) for e in ("builtin", "flower"))
columns = ["pers_acc", "pers_f1", "gen_acc", "gen_f1", "global_acc", "global_f1"]
difference = np.abs(builtin[columns].to_numpy(float) - flower[columns].to_numpy(float)).max()
print(f"largest difference over {len(builtin)} client-rounds: {difference:.2e}")
assert len(builtin) == len(flower) == clients * rounds and difference < 1e-4

finals = {e: r.summary.final for e, r in runs.items()}
for score in ("personalization", "generalization"):
    a, b = (getattr(finals[e], score).f1 for e in ("builtin", "flower"))
    assert math.isclose(a, b, abs_tol=1e-4), (score, a, b)
comparison = (
    f"engines: builtin, flower\nclient-rounds: {len(builtin)}\nmax difference: {difference:.3e}\n"
)
(OUT / "comparison.txt").write_text(comparison)
print("the final scores agree too; wrote comparison.txt")
