"""Which model is a FedALA client's personalized one? Three answers, on the same trained runs.

From a finished run's checkpoint (its last round R), without training anything:
- hat (protofed's default, `personalized=hat`): theta_hat from the current global model, the
  client's local model and the W of its latest round;
- official: theta_hat after one more W epoch on the current global model, i.e. exactly what
  the client's round R+1 would start from (same seeded stream): what the official code
  evaluates (its server runs ALA for every client, then evaluates, then trains);
- trained (`personalized=trained`): the model the client trained last.
Personalization accuracy and macro-F1 (mean over clients) for each, per run.

Usage: python benchmarks/fedala_eval_modes.py RUN_DIR... [--out benchmarks/out/fedala_eval_modes.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from protofed.algorithms.common.ala import AdaptiveLocalAggregation
from protofed.config import build_config
from protofed.runs import RunDir
from protofed.training.client import Client
from protofed.core.seeding import CLIENT_TRAIN, derive_seed, torch_generator
from protofed.runtime.simulation import Simulation, prepare


def modes(run_dir: str) -> dict:
    run = RunDir.open(run_dir)  # read only: the run directory is left as it is
    cfg = build_config(run.config())
    sim = Simulation(prepare(cfg))
    sim.restore(run.load_checkpoint(map_location=cfg.train.device))
    alg = sim.algorithm
    if not isinstance(alg, AdaptiveLocalAggregation) or alg.ala_local != "reply":
        raise SystemExit(f"{run_dir}: not a FedALA / X+ALA run with a 'reply' local model")
    r = sim.progress.round
    base = super(AdaptiveLocalAggregation, alg)  # the algorithm without ALA
    n = len(sim.fed.clients)
    message = [alg.configure(sim.server, i, r + 1) for i in range(n)]

    def score(models: list) -> dict:
        s = sim.evaluator.evaluate(lambda i: models[i], alg.global_model(sim.server))
        return {k: s["personalization"][k] for k in ("acc", "acc_std", "f1", "f1_std")}

    out = {"run": str(run_dir), "algorithm": alg.name, "round": r}
    out["hat"] = score([alg.client_model(message[i], sim.state_of(i)) for i in range(n)])
    official = []
    for i in range(n):  # round R+1's ALA, as fit would run it (same streams)
        torch.manual_seed(derive_seed(cfg.seed, CLIENT_TRAIN, r + 1, i + 1, 1))
        client = Client(id=i, data=sim.fed.clients[i], model=sim.model, train=cfg.train,
                        round=r + 1, generator=torch_generator(cfg.seed, CLIENT_TRAIN, r + 1, i + 1))
        start, inner, _, _ = alg.initialise(client, message[i], sim.state_of(i))
        official.append(base.client_model(start, inner))
    out["official"] = score(official)
    settings = alg.ala
    try:
        alg.ala = settings.model_copy(update={"personalized": "trained"})
        out["trained"] = score([alg.client_model(message[i], sim.state_of(i)) for i in range(n)])
    finally:
        alg.ala = settings
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "fedala_eval_modes.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = [modes(d) for d in args.runs]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    for r in results:
        print(f"{r['run']}: " + ", ".join(
            f"{m} {100 * r[m]['acc']:.2f}" for m in ("hat", "official", "trained")))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
