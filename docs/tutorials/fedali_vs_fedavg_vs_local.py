# %% [markdown]
# # FedAli vs FedAvg vs Local on UCI-HAR
#
# Three runs on UCI-HAR's natural clients (one client per subject), a table and a figure.
# Run it from the repository root: `python docs/tutorials/fedali_vs_fedavg_vs_local.py`
# after `protofed data fetch uci_har` (the data root then holds `har/uci_har.npz`; set
# `PROTOFED_DATA=DIR` for a folder where the data sets are already converted). Outputs go to
# `$PROTOFED_TUTORIAL_OUT/fedali_vs_fedavg_vs_local/` (default `runs/tutorials/...`).
#
# `PROTOFED_TUTORIAL_SMALL=1` is the test's setting: 3 subjects, 2 rounds, tiny prototype
# banks, under a minute. Without it the script runs the settings of
# `configs/sweeps/tutorial_fedali_comparison.yaml` (about 10 minutes on 2 CPU cores). The same
# full size from the command line, as a sweep and its report:
#
# ```
# protofed sweep configs/sweeps/tutorial_fedali_comparison.yaml --out runs/tutorial_fedali
# protofed report runs/tutorial_fedali --plot --label 'fedali*=FedAli' \
#     --label 'fedavg*=FedAvg' --label 'local*=Local' --out runs/tutorial_fedali/report
# ```
#
# ## The protocol's three scores
#
# Every evaluated round scores each client three ways (docs/protocol.md):
#
# - **personalization**: the client's own model on the client's own test split: how well
#   the federation serves the people who trained it;
# - **generalization**: the client's own model on the union of all clients' test splits:
#   what the personalized model still knows about everyone else;
# - **global**: the server's model on that union (methods with a server model; Local has none).
#
# Local training maximises personalization and has poor generalization; FedAvg trains one
# model for everyone; FedAli's prototype layers aim at both.

# %%
import os
from pathlib import Path

import numpy as np

import protofed
from protofed.analysis import (
    collect,
    group_runs,
    pers_vs_gen,
    summarize,
    to_csv,
    to_markdown,
    write_figures,
)
from protofed.extend import DataConfig, data_root

SMALL = os.environ.get("PROTOFED_TUTORIAL_SMALL", "") not in ("", "0")
OUT = Path(os.environ.get("PROTOFED_TUTORIAL_OUT", "runs/tutorials")) / "fedali_vs_fedavg_vs_local"
DATA = data_root(DataConfig())  # $PROTOFED_DATA, else the user cache (`protofed data fetch`)
# the repository's root: two folders above the script, or above the notebook's folder (Jupyter
# runs a notebook in the folder it is in, and defines no __file__)
ROOT = Path(__file__).resolve().parents[2] if "__file__" in globals() else Path.cwd().parents[1]
CONFIG = ROOT / "configs" / "fedali_uci_har_natural.yaml"

# %% [markdown]
# ## The settings
#
# The FedAli config (HART with an ALP layer in each block, Adam 1e-4, FedAli's evaluation
# rule) with a CPU budget. The paper runs 600 rounds of 5 local epochs: these numbers are a
# first look, not its table. FedAvg and Local run the same HART without ALP layers.

# %%
if SMALL:
    # UCI-HAR's loader reads all 30 subjects; the test keeps 3 of them (every 4th window),
    # written as an `arrays` file with a group column: still natural clients, one per subject
    raw = np.load(DATA / "har" / "uci_har.npz", allow_pickle=False)
    channels = [str(c) for c in raw["channels"]]
    pick = [channels.index(f"{k}_{a}") for k in ("total_acc", "body_gyro") for a in "xyz"]
    keep = np.isin(raw["subject"], [1, 3, 5]) & (np.arange(len(raw["y"])) % 4 == 0)
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez(
        OUT / "uci_har_3_subjects.npz",
        X=raw["X"][keep][:, pick],
        y=raw["y"][keep],
        group=raw["subject"][keep],
    )
    data = {"name": "arrays", "path": str(OUT / "uci_har_3_subjects.npz"), "partition": "natural"}
    train = {"rounds": 2, "local_epochs": 1, "workers": 1}
    settings = {"eval.every": 2, "model.alp.prototypes": [16]}
else:
    data = {"name": "uci_har", "partition": "natural", "dir": str(DATA)}
    # configs/sweeps/tutorial_fedali_comparison.yaml's settings
    train = {"rounds": 4, "local_epochs": 1, "clients_per_round": 8}
    settings = {"eval.every": 4, "eval.generalization_samples": 500}

METHODS = {  # folder -> (algorithm, ALP layers)
    "fedali": ("fedali", True),
    "fedavg": ("fedavg", False),
    "local": ("local", False),
}

# %% [markdown]
# ## Three runs
#
# `protofed.run` writes a run directory for each (the same as `protofed run` does) and
# returns a `Run`; its `summary` holds typed scores as fractions in [0, 1].

# %%
for folder, (algorithm, alp) in METHODS.items():
    run = protofed.run(
        CONFIG,
        out=OUT / "runs" / folder,
        overwrite=True,
        data=data,
        train=train,
        algorithm={"name": algorithm},
        **{"model.alp.enabled": alp, **settings},
    )
    final = run.summary.final
    print(
        f"{folder:7s} personalization F1 {final.personalization.f1:.3f}, "
        f"generalization F1 {final.generalization.f1:.3f}"
    )

# %% [markdown]
# ## The table
#
# `protofed.analysis` reads the run directories back: one row per group of runs (here one run
# each: no seeds to average), scores in percent. The same as `protofed report
# OUT/runs --out OUT/report`.

# %%
groups = group_runs(collect([OUT / "runs"], "selected"))
rows = summarize(groups)
(OUT / "report.md").write_text(to_markdown(rows))
(OUT / "report.csv").write_text(to_csv(rows))
print(to_markdown(rows))

# %% [markdown]
# ## The figure
#
# Personalization against generalization, one point per run, with readable names (the
# `--label` mapping of `protofed report --plot`: a folder pattern -> a legend text).
# Good personalized FL sits up and to the right.

# %%
# %matplotlib inline
labels = {"fedali": "FedAli (HART + ALP)", "fedavg": "FedAvg (HART)", "local": "Local (HART)"}
figure = pers_vs_gen(groups, "UCI-HAR natural clients", labels=labels)
assert figure is not None  # every run scored generalization
written = write_figures({"pers_gen": figure}, OUT / "figure", "selected")
print("wrote", *written)
# a notebook draws the figure here (jupytext turns the cell's first line into the magic
# `%matplotlib inline`); in a script, the line does nothing
figure  # noqa: B018
