# %% [markdown]
# # Write your own algorithm: FedAvg with server momentum
#
# An algorithm answers four questions (docs/architecture.md, Adding an algorithm): what the
# server keeps (`init_server`), what it sends (`configure`), what a client does (`fit`) and
# how the server combines the replies (`aggregate`). Here: FedAvgM (Hsu et al., 2019), FedAvg
# whose server treats the clients' mean change as a gradient and steps with momentum.
#
# Run it from the repository root: `python docs/tutorials/own_algorithm.py` (scikit-learn's
# digits: no data files). Outputs go to `$PROTOFED_TUTORIAL_OUT/own_algorithm/` (default
# `runs/tutorials/own_algorithm/`); `PROTOFED_TUTORIAL_SMALL=1` runs 8 rounds instead of 30.

# %%
import os
from pathlib import Path

from pydantic import Field

import protofed
from protofed.extend import MODEL, AggregateResult, Algorithm, FitResult, Hyperparams

SMALL = os.environ.get("PROTOFED_TUTORIAL_SMALL", "") not in ("", "0")
OUT = Path(os.environ.get("PROTOFED_TUTORIAL_OUT", "runs/tutorials")) / "own_algorithm"

# %% [markdown]
# ## Typed hyperparameters
#
# A pydantic model: `algorithm.server_lr=...` in a config is checked against it (an unknown
# key or a value out of range is a one-line error naming it).

# %%


class ServerMomentumParams(Hyperparams):
    server_lr: float = Field(1.0, gt=0, description="Server step size (1 with beta 0: FedAvg).")
    beta: float = Field(0.9, ge=0, lt=1, description="Server momentum.")


# %% [markdown]
# ## The algorithm
#
# The server keeps the model and a velocity (one tensor per weight, the same names and
# shapes: the checkpoint contract), and sends only the model. A client trains as in FedAvg.
# The server averages the replies (`self.average`: the example-weighted mean, or the robust
# rule `aggregation.rule` names), then `velocity = beta * velocity + (old - mean)` and
# `model = old - server_lr * velocity`. An algorithm keeps no state in attributes: everything
# between rounds lives in the records, which is what lets a run resume.

# %%
VELOCITY = "velocity"


@protofed.register_algorithm
class ServerMomentum(Algorithm):
    """FedAvg with server momentum (FedAvgM)."""

    name = "server_momentum"
    summary = "FedAvg whose server steps along the clients' mean change with momentum."
    reference = "Hsu et al., Measuring the Effects of Non-Identical Data Distribution, 2019"
    Params = ServerMomentumParams

    def init_server(self):
        model = dict(self.setting.init_model)
        return {MODEL: model, VELOCITY: {k: v.new_zeros(v.shape) for k, v in model.items()}}

    def configure(self, server, client, server_round):
        return {MODEL: server[MODEL]}  # the velocity stays on the server

    def fit(self, client, message, state):
        client.load(message[MODEL])
        metrics = client.train_model()  # train first: `weights()` copies the model as it is
        return FitResult({MODEL: client.weights()}, metrics)

    def aggregate(self, server, replies, server_round):
        mean, _, metrics = self.average(replies, records=[MODEL], reference=server)
        old, new = server[MODEL], mean[MODEL]
        model, velocity = {}, {}
        for k, weight in old.items():
            if not weight.is_floating_point():  # counters (BatchNorm's): the mean's
                model[k], velocity[k] = new[k], server[VELOCITY][k]
                continue
            velocity[k] = self.params.beta * server[VELOCITY][k] + (weight - new[k])
            model[k] = weight - self.params.server_lr * velocity[k]
        return AggregateResult({MODEL: model, VELOCITY: velocity}, metrics)


# %% [markdown]
# ## Run it, and FedAvg on the same federation
#
# The registered name works wherever a config names an algorithm, in this process
# (`protofed.run`, `load_run`, the reports). New processes (the CLI, a sweep, Flower's nodes)
# see it once it is an entry point of an installed package (docs/architecture.md).

# %%
digits = {
    "data": {"name": "digits", "num_clients": 10, "partition": "dirichlet", "alpha": 0.5},
    "model": {"name": "mlp", "hidden": [64]},
    "train": {"rounds": 8 if SMALL else 30, "lr": 0.1, "workers": 1},
    "eval": {"every": 1},
}
algorithms = {
    "fedavg": {"name": "fedavg"},
    "server_momentum": {"name": "server_momentum", "server_lr": 1.0, "beta": 0.7},
}
lines = []
for folder, algorithm in algorithms.items():
    run = protofed.run(digits, out=OUT / folder, overwrite=True, algorithm=algorithm)
    final = run.summary.final
    assert final.global_ is not None  # both have a server model
    lines.append(
        f"{folder:16s} global F1 {final.global_.f1:.3f}, "
        f"personalization F1 {final.personalization.f1:.3f}"
    )
    curve = run.history.groupby("round")["global_f1"].first()
    lines.append("  global F1 by round: " + " ".join(f"{v:.2f}" for v in curve))
(OUT / "comparison.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
