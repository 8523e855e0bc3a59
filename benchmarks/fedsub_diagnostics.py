"""Diagnostics of one FedSub aggregation on WISDM (seed 0), for docs/results/fedsub.md.

Three rounds, then the replies of round 4 through the server functions: clusters per class,
how much of the model the class subnetworks cover, and how far each fusion strategy moves the
weights. Usage (repository root, data in ../shared/data): python benchmarks/fedsub_diagnostics.py
"""

import torch

from protofed.algorithms.fedsub import MASK, cluster_classes, fuse, predict_missing
from protofed.config import load_config
from protofed.runtime.parallel import fit_client
from protofed.runtime.simulation import Simulation, prepare

cfg = load_config("configs/fedsub_wisdm.yaml", ["data.dir=../shared/data", "train.threads=1", "train.rounds=5", "eval.every=100"])
sim = Simulation(prepare(cfg))
for r in range(1, 4):
    sim.run_round(r)
algo = sim.algorithm
reps = [fit_client(sim.p, None, sim.server, c, 4, sim.state_of(c))[0] for c in range(36)]
counts = torch.stack([r["count"] for r in reps])
means = torch.stack([r["proto"] for r in reps])
filled, pred = predict_missing(means, counts, 5)
labels = cluster_classes(filled, (counts > 0) | pred, 8, 0)
print("clients lacking classes:", int((counts == 0).sum()), "predicted:", int(pred.sum()))
print("clusters per class:", [int(labels[:, y].max()) + 1 for y in range(6)])
print("cluster sizes class 0:", torch.bincount(labels[labels[:, 0] >= 0, 0]).tolist())
masks = torch.stack([torch.cat([r[MASK + n].reshape(6, -1) for n in algo.shared], 1) for r in reps])
print("share of parameters in a class subnetwork (mean over clients, classes present):",
      float(masks[counts > 0].float().mean()))
for layer in algo.shared:
    m = torch.stack([r[MASK + layer].reshape(6, -1) for r in reps])[counts > 0].float().mean()
    print("  ", layer, round(float(m), 3))
weights = torch.stack([torch.cat([r[n].reshape(-1) for n in algo.shared]) for r in reps])
acc = torch.stack([r["acc"] for r in reps])
for s in ("overlap", "cluster_avg", "leadership"):
    out = fuse(weights, masks, counts, acc, labels, s, 0.5)
    changed = (out != weights).float().mean()
    rel = ((out - weights).norm(dim=1) / weights.norm(dim=1)).mean()
    print(s, "share of parameters changed:", round(float(changed), 3), "relative change:", round(float(rel), 3))
