# %% [markdown]
# # Your own CSV with a user column
#
# A table of sensor features, one row per window, a column naming the person who recorded
# it: each person becomes a client (`data.partition=natural`). The rows here are real: the
# official WISDM v1.1 "transformed" accelerometer features (43 per 10 s window, 36 users),
# of which we keep a few users and write our own CSV, as you would export yours.
#
# Run it from the repository root: `python docs/tutorials/own_csv.py` after `protofed data
# fetch wisdm_features` (the data root then holds `har/wisdm_features.csv`; set
# `PROTOFED_DATA=DIR` for a folder where the data sets are already converted). Outputs go to
# `$PROTOFED_TUTORIAL_OUT/own_csv/` (default `runs/tutorials/own_csv/`);
# `PROTOFED_TUTORIAL_SMALL=1` runs 4 users and 5 rounds instead of 12 users and 30 rounds.

# %%
import os
from pathlib import Path

import pandas as pd

import protofed
from protofed.extend import DataConfig, data_root

SMALL = os.environ.get("PROTOFED_TUTORIAL_SMALL", "") not in ("", "0")
OUT = Path(os.environ.get("PROTOFED_TUTORIAL_OUT", "runs/tutorials")) / "own_csv"
DATA = data_root(DataConfig())  # $PROTOFED_DATA, else the user cache (`protofed data fetch`)
OUT.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## Write the CSV
#
# Every column other than the label and the group is a feature and must be numeric. WISDM's
# file marks missing peak values with `?`: we drop those columns, and the row id, which is
# not a feature. The label may be text (`Walking`, `Jogging`, ...).

# %%
raw = pd.read_csv(DATA / "har" / "wisdm_features.csv", na_values="?")
users = sorted(raw["user"].unique())[: 4 if SMALL else 12]
table = (
    raw[raw["user"].isin(users)]
    .drop(columns=["UNIQUE_ID"])
    .dropna(axis="columns")  # the *PEAK columns with missing cells
    .rename(columns={"class": "activity"})
)
csv = OUT / "my_wisdm.csv"
table.to_csv(csv, index=False)
print(f"{csv}: {len(table)} rows, {table['user'].nunique()} users, {table.shape[1] - 2} features")
print(table.groupby("user")["activity"].value_counts().unstack(fill_value=0))

# %% [markdown]
# ## Run on it
#
# `data.name=arrays` reads `.npz`, `.csv` or `.parquet`; `label_column` and `group_column`
# name the columns; `partition: natural` makes one client per user. Features are z-scored
# with the training rows' statistics (`data.standardize`, on by default for your own data).
# Each client's rows are split 70/10/20 into train/validation/test.

# %%
run = protofed.run(
    {
        "data": {
            "name": "arrays",
            "path": str(csv),
            "label_column": "activity",
            "group_column": "user",
            "partition": "natural",
        },
        "model": {"name": "mlp", "hidden": [64]},
        "algorithm": {"name": "fedavg"},
        "train": {"rounds": 5 if SMALL else 30, "lr": 0.1, "workers": 1},
        "eval": {"every": 1},
    },
    out=OUT / "run",
    overwrite=True,
)
print(run.client_names)  # one client per user, named by the user column's values
final = run.summary.final
print(f"personalization F1 {final.personalization.f1:.3f} (fraction, mean over clients)")

# %% [markdown]
# ## A client's data and predictions
#
# `Run.client_data(i, split)` rebuilds client `i`'s split exactly as the run did (seeded), as
# tensors; `Run.predict(i, x)` labels inputs with client `i`'s personalized model. Predicting
# the client's own test split reproduces its personalization accuracy for the last round.

# %%
lines = []
for i, name in enumerate(run.client_names):
    x, y = run.client_data(i, "test")
    predicted = run.predict(i, x)
    accuracy = (predicted == y).float().mean().item()
    lines.append(f"client {i} ({name}): {len(y)} test rows, accuracy {accuracy:.3f}")
print("\n".join(lines))

last = run.history[run.history["round"] == run.history["round"].max()]
recorded = dict(zip(last["client"], last["pers_acc"], strict=True))
x, y = run.client_data(0, "test")
assert abs((run.predict(0, x) == y).float().mean().item() - recorded[0]) < 1e-6
(OUT / "predictions.txt").write_text("\n".join(lines) + "\n")
print(f"client 0: predicting its test split gives the recorded accuracy, {recorded[0]:.3f}")
