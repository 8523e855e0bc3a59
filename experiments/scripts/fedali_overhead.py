"""FedAli's overhead against FedAvg on the same backbone (FedAli's Table 3).

On one real client (default: UCI-HAR natural partition and HART, subject of client 0;
`--config configs/fedali_cifar10_dirichlet.yaml` for the ViT on CIFAR-10): the local training time
of one `fit` (the algorithm's own client step: `train.local_epochs` epochs of Adam, batch 64;
FedAli's includes the ALP layers' Sinkhorn plans and EMA updates), alternated between the two
methods `--repeats` times after one warm-up fit each (median and min reported, so load from other processes hits both
alike); the model's memory footprint (parameters, buffers, and the trainable part); the bytes
one client sends up and receives per round. The server step (K-means of the clients'
local prototypes) on real rounds is benchmarks/fedali_server_step.py.

Usage: python experiments/scripts/fedali_overhead.py [--data-dir ../shared/data] [--repeats 3] [--device cuda]
       [--config configs/fedali_cifar10_dirichlet.yaml]
Writes experiments/out/fedali_overhead.json (or --out; and prints it). Paper (HHAR, GPU): training time
1.09x, memory 2.38x, communication 1.84x.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from protofed.config import load_config
from protofed.core.seeding import torch_generator
from protofed.core.types import nbytes
from protofed.runtime import prepare
from protofed.training.client import Client

CONFIG = "configs/fedali_uci_har_natural.yaml"


def setup(name: str, data_dir: str, epochs: int, device: str, config: str = CONFIG):
    overrides = [
        f"data.dir={data_dir}",
        "train.threads=1",
        f"train.local_epochs={epochs}",
        f"train.device={device}",
    ]
    if name == "fedavg":
        overrides += ["algorithm.name=fedavg", "model.alp.enabled=false"]
    return prepare(load_config(config, overrides))


def timed_fit(prep, cid: int, server_round: int) -> tuple[float, dict, dict, dict]:
    algo, model = prep.algorithm, prep.model
    server = algo.init_server()
    message = algo.configure(server, cid, server_round)
    client = Client(
        cid,
        prep.fed.clients[cid],
        model,
        prep.cfg.train,
        server_round,
        torch_generator(0, server_round, cid),
    )
    sync = torch.cuda.synchronize if model_device(model).type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    result = algo.fit(client, message, {})
    sync()
    return time.perf_counter() - t0, message, result.reply, result.state


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1, help="local epochs timed per fit")
    parser.add_argument("--device", default="cpu", help="train.device: cpu or cuda")
    parser.add_argument("--config", default=CONFIG, help="a FedAli config (its backbone and data)")
    parser.add_argument("--out", default="experiments/out/fedali_overhead.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    preps = {
        name: setup(name, args.data_dir, args.epochs, args.device, args.config)
        for name in ("fedavg", "fedali")
    }
    for prep in preps.values():
        timed_fit(prep, 0, 2)  # warm-up (first-call allocations, oneDNN kernel selection)
    times: dict[str, list[float]] = {"fedavg": [], "fedali": []}
    info: dict[str, dict] = {}
    for _ in range(args.repeats):
        for name, prep in preps.items():
            seconds, message, reply, state = timed_fit(prep, 0, 2)
            times[name].append(seconds)
            model = prep.model
            info[name] = {
                "down_bytes": nbytes(message),
                "up_bytes": nbytes(reply),
                "model_bytes": nbytes({"model": model.state_dict()}),
                "trainable_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
            }
    steps = len(prep.fed.clients[0].train_y)
    machine = platform.processor() or platform.machine()
    if args.device.startswith("cuda"):
        machine = torch.cuda.get_device_name()
    result: dict = {
        "config": args.config,
        "machine": machine,
        "device": args.device,
        "threads": 1,
        "client_train_samples": steps,
        "local_epochs": args.epochs,
    }
    for name in times:
        result[name] = {
            **info[name],
            "fit_s_median": statistics.median(times[name]),
            "fit_s_min": min(times[name]),
            "fit_s_all": times[name],
        }
    ratio = lambda key: result["fedali"][key] / result["fedavg"][key]  # noqa: E731
    result["ratio"] = {
        "training_time_median": ratio("fit_s_median"),
        "training_time_min": ratio("fit_s_min"),
        "memory_model": ratio("model_bytes"),
        "communication_round": (result["fedali"]["up_bytes"] + result["fedali"]["down_bytes"])
        / (result["fedavg"]["up_bytes"] + result["fedavg"]["down_bytes"]),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
