"""How much a client's class prototypes reveal: linking a client across rounds by them.

PFPL (and FedProto before it) argue that sending only class prototypes protects a client.
This measures one thing the server can do with them: tell which client sent a prototype
table. FedProto trains on UCI-HAR's natural clients (configs/privacy_uci_har.yaml without
privacy), every round's tables kept (`eval.keep_prototypes_every`: each client's class means
of its model's features on its training split, what it sends). The attacker links every
table of the last round to the nearest table of an earlier round (the middle one, and the
one before the last; mean L2 over the classes both hold). Chance is 1 / clients. Then the
same tables go through protofed's local mechanism (docs/privacy.md: each table clipped to
`privacy.prototype_clip`, Gaussian noise calibrated for epsilon over the run's rounds) and the
attack is repeated over noise draws.

    PROTOFED_DATA=../shared/data python experiments/scripts/prototype_linkage.py --out runs/linkage

Central mode needs no measurement: every reply the algorithm sees is the one noised mean.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

import protofed
from protofed.config import PrivacyConfig, load_config
from protofed.privacy import plan
from protofed.privacy.mechanisms import clip_reply, noise_reply

EPSILONS = (1.0, 2.0, 4.0, 8.0)
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "privacy_uci_har.yaml"


def settings(args: argparse.Namespace) -> dict[str, object]:
    """FedProto without privacy, every round's tables kept."""
    return {
        "algorithm.name": "fedproto",
        "privacy.enabled": False,
        "seed": args.seed,
        "train.rounds": args.rounds,
        "eval.every": 1,
        "eval.keep_prototypes_every": 1,
    }


def tables(run: Path, server_round: int) -> dict[int, dict[int, np.ndarray]]:
    """client -> class -> prototype, as kept after `server_round`."""
    with np.load(run / "prototypes" / f"round_{server_round:04d}.npz", allow_pickle=False) as f:
        out: dict[int, dict[int, np.ndarray]] = {}
        for name in f.files:
            if name.startswith("client_") and not name.endswith("_classes"):
                rows, classes = f[name], f[name + "_classes"]
                out[int(name.split("_")[1])] = dict(zip(classes.tolist(), rows, strict=True))
    return out


def link(early: dict, late: dict) -> float:
    """The fraction of late tables whose nearest early table is their own client's."""
    hits = 0
    clients = sorted(late)
    for i in clients:

        def distance(j: int, i: int = i) -> float:
            shared = set(late[i]) & set(early[j])
            if not shared:
                return np.inf
            return float(np.mean([np.linalg.norm(late[i][c] - early[j][c]) for c in shared]))

        hits += min(sorted(early), key=distance) == i
    return hits / len(clients)


def privatize(table: dict[int, np.ndarray], sigma: float, bound: float, seed: int) -> dict:
    """protofed's local mechanism on one prototype table (one group: G = 1)."""
    classes = sorted(table)
    record = {
        "protos": {
            "classes": torch.tensor(classes),
            "means": torch.tensor(np.stack([table[c] for c in classes])),
        }
    }
    clipped, _ = clip_reply(record, {}, 1.0, bound)
    noised = noise_reply(clipped, {}, (0.0, sigma * bound), torch.Generator().manual_seed(seed))
    rows = noised["protos"]["means"].numpy()
    return dict(zip(classes, rows, strict=True))


def attack(early: dict, late: dict, bound: float, rounds: int, draws: int) -> dict:
    """Linkage without noise, clipped only, and through the local mechanism at each epsilon
    (sigma calibrated for `rounds` rounds; fresh noise for every table, draw and epsilon)."""
    out: dict[str, object] = {
        "no_noise": link(early, late),
        "clipped_no_noise": link(
            {i: privatize(t, 0.0, bound, 0) for i, t in early.items()},
            {i: privatize(t, 0.0, bound, 0) for i, t in late.items()},
        ),
    }
    for epsilon in EPSILONS:
        cfg = PrivacyConfig(
            enabled=True, mode="local", target_epsilon=epsilon, prototype_clip=bound
        )
        sigma = plan(cfg, len(late), 10, rounds).sigma
        scores = []
        for draw in range(draws):
            base = 1_000_000 * int(epsilon) + 2_000 * draw
            noisy_early = {i: privatize(t, sigma, bound, base + i) for i, t in early.items()}
            noisy_late = {i: privatize(t, sigma, bound, base + 1_000 + i) for i, t in late.items()}
            scores.append(link(noisy_early, noisy_late))
        out[f"local_eps{epsilon:g}"] = {"sigma": sigma, "mean": float(np.mean(scores))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    run_dir = args.out / f"fedproto_s{args.seed}"
    if not (run_dir / "summary.json").exists():
        protofed.run(CONFIG, run_dir, overwrite=True, **settings(args))
    bound = load_config(CONFIG).privacy.prototype_clip
    late = tables(run_dir, args.rounds)
    results: dict[str, object] = {"clients": len(late), "chance": 1 / len(late)}
    for early_round in (args.rounds // 2, args.rounds - 1):
        early = tables(run_dir, early_round)
        key = f"round {early_round} -> {args.rounds}"
        results[key] = attack(early, late, bound, args.rounds, args.draws)
    print(json.dumps(results, indent=2))
    (args.out / f"linkage_s{args.seed}.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
