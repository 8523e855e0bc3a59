"""Re-evaluate a finished FedAli run with other ALP inference settings, without retraining.

The inference path of the ALP layer is a model setting, not a training one: the batch-
independent mode (`model.alp.inference=sample`) and the "w/o local prototypes at inference"
ablation (`model.alp.local_at_inference=false`) use the very same trained weights and
prototypes. This loads the run's last checkpoint into a model built with the given
overrides and scores it with the run's evaluation protocol (personalization, generalization,
global) on the same data.

It also scores any run (any method) at a kept checkpoint (`--checkpoint`): how runs cut short
by the machine's time are compared at the same round.

Usage: python benchmarks/fedali_reeval.py RUN_DIR [-s model.alp.inference=sample ...]
       [--checkpoint FILE]
Prints one JSON line: the overrides, the round, and the scores.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from sklearn.metrics import f1_score

from protofed.config import build_config
from protofed.runs import RunDir
from protofed.training.client import load_weights
from protofed.runtime.simulation import Simulation, prepare
from protofed.training.loop import predict


def _mean_std(values: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)), "std": float(np.std(values))}


def sampled_scores(sim: Simulation, k: int) -> dict:
    """The protocol's scores with generalization averaged over k seeded clients (cheaper).

    Personalization: every client's model on its own test split; generalization: client i's
    model on the union of all test splits, for k clients drawn with numpy's seed 0; global:
    the server's model on that union. Macro-F1 over the classes present in the labels, as
    protofed.evaluation. The same clients for every method, so methods compare on equal terms.
    """
    fed, model = sim.fed, sim.model
    client_model = sim.client_models(sim.progress.round)
    xs = torch.cat([c.test_x for c in fed.clients])
    ys = torch.cat([c.test_y for c in fed.clients]).numpy()
    chosen = sorted(np.random.default_rng(0).choice(len(fed.clients), k, replace=False).tolist())
    bs = sim.cfg.eval.batch_size
    pers_acc, pers_f1, gen_acc, gen_f1 = [], [], [], []
    t0 = time.perf_counter()
    for i, c in enumerate(fed.clients):
        load_weights(model, client_model(i))
        pred = predict(model, c.test_x, bs).numpy()
        y = c.test_y.numpy()
        pers_acc.append(float((pred == y).mean()))
        pers_f1.append(f1_score(y, pred, labels=np.unique(y), average="macro", zero_division=0))
        if i in chosen:
            pred = predict(model, xs, bs).numpy()
            gen_acc.append(float((pred == ys).mean()))
            gen_f1.append(f1_score(ys, pred, labels=np.unique(ys), average="macro", zero_division=0))
    out = {
        "personalization": {"acc": _mean_std(pers_acc), "f1": _mean_std(pers_f1)},
        "generalization": {"clients": chosen, "acc": _mean_std(gen_acc), "f1": _mean_std(gen_f1)},
        "global": None,
    }
    glob = sim.algorithm.global_model(sim.server)
    if glob is not None:
        load_weights(model, glob)
        pred = predict(model, xs, bs).numpy()
        out["global"] = {"acc": float((pred == ys).mean()),
                         "f1": float(f1_score(ys, pred, labels=np.unique(ys), average="macro",
                                              zero_division=0))}
    out["eval_s"] = time.perf_counter() - t0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("-s", "--set", action="append", default=[], help="section.key=value")
    parser.add_argument("--checkpoint", help="a checkpoint file of this run (default: its last)")
    parser.add_argument(
        "--gen-clients", type=int, default=0,
        help="0: the run's full protocol; K: personalization of every client, generalization "
        "of K clients drawn from seed 0 (the same for every method) on the union of test splits",
    )
    args = parser.parse_args()
    run = RunDir.open(args.run_dir)
    raw = run.config()
    for item in args.set:
        key, value = item.split("=", 1)
        node = raw
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = {"true": True, "false": False}.get(value, value)
    cfg = build_config(raw)
    sim = Simulation(prepare(cfg))
    if args.checkpoint:
        ckpt = torch.load(args.checkpoint, weights_only=True, map_location=cfg.train.device)
    else:
        ckpt = run.load_checkpoint(map_location=cfg.train.device)
    if ckpt is None:
        raise SystemExit(f"{args.run_dir}: no checkpoint")
    sim.restore(ckpt)
    if args.gen_clients:
        scores = sampled_scores(sim, args.gen_clients)
    else:
        scores = sim.evaluate(sim.progress.round)
        scores.pop("clients", None)
    print(json.dumps({"run": args.run_dir, "overrides": args.set, "round": sim.progress.round,
                      **scores}))


if __name__ == "__main__":
    main()
