"""How much FedAli's alignment changes a trained model: beta as trained against beta = 0.

Loads a FedAli run's checkpoint (the server's weights and one client's local prototypes),
scores `--images` of that client's test data in inference mode twice, with every ALP layer's
beta at the trained value and at 0, and reports the share of unchanged predictions, the
largest logit change, and per ALP layer the mean norms of its input tokens and of the GLU of
its local prototypes (beta * GLU is mixed with (1 - beta) * tokens before normalising).
Why: the beta = 0 control matches FedAli on every data set in docs/results/fedali.md.

Usage: python benchmarks/fedali_alignment_effect.py runs/fedali_cifar10_cpu/fedali [--client 0]
       [--images 256] [--data-dir ../shared/data]
"""

from __future__ import annotations

import argparse
import json

import torch

from protofed.config import build_config
from protofed.nn.alp import alp_layers
from protofed.runs import RunDir
from protofed.training.client import load_weights
from protofed.runtime.simulation import Simulation, prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a FedAli run directory with a checkpoint")
    parser.add_argument("--client", type=int, default=0)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--data-dir", default="../shared/data")
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = RunDir.open(args.run)
    raw = run.config()
    raw.setdefault("data", {})["dir"] = args.data_dir
    sim = Simulation(prepare(build_config(raw)))
    checkpoint = run.load_checkpoint()
    if checkpoint is None:
        raise SystemExit(f"{args.run}: no checkpoint")
    sim.restore(checkpoint)
    # the client's model as the evaluation sees it: the algorithm's own client_model rule
    model = sim.model
    load_weights(model, sim.client_models(sim.progress.round)(args.client))
    model.eval()
    x = torch.as_tensor(sim.fed.clients[args.client].test_x[: args.images])
    layers = alp_layers(model)
    token_norms: dict[str, float] = {}
    hooks = [
        layer.register_forward_pre_hook(
            lambda _m, inp, name=name: token_norms.__setitem__(name, float(inp[0].norm(dim=-1).mean()))
        )
        for name, layer in layers.items()
    ]
    trained_beta = {name: float(layer.beta) for name, layer in layers.items()}
    with torch.no_grad():
        aligned = model(x)
        for hook in hooks:
            hook.remove()
        for layer in layers.values():
            layer.beta.fill_(0.0)
        plain = model(x)
        glu_norms = {name: float(layer.glu(layer.local_prototypes).norm(dim=-1).mean())
                     for name, layer in layers.items() if layer.glu is not None}
    result = {
        "run": str(args.run), "round": sim.progress.round, "client": args.client, "images": len(x),
        "same_prediction": float((aligned.argmax(1) == plain.argmax(1)).float().mean()),
        "max_logit_change": float((aligned - plain).abs().max()),
        "max_logit": float(plain.abs().max()),
        "layers": {name: {"beta": trained_beta[name], "token_norm": token_norms[name],
                          "glu_of_prototypes_norm": glu_norms.get(name)} for name in layers},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
