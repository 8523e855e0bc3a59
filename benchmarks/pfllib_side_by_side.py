"""protofed against PFLlib on PFLlib's own UCI-HAR work, run side by side in one sitting.

Why: the speed goal is protofed at least 3x PFLlib on PFLlib's work, as a ratio taken in one
sitting. A reference number measured at another time (README, speed section) says little on
a machine whose load changes by the minute, so this script runs both, one after the other, in
the same sitting, and repeats the sitting.

How:
  python benchmarks/pfllib_side_by_side.py --pfllib /path/to/PFLlib [--rounds 20] [--repeats 3]

  --pfllib is a checkout of github.com/TsingZ0/PFLlib (its `system/` and `dataset/` folders).
  PFLlib is not a dependency of protofed: nothing here imports it; it runs as
  `python -u main.py ...` in PATH/system, a child process, and its printed round times are read.

The work (both sides): FedAvg, HARCNN (2,253,958 parameters), all 9 channels x 128 samples,
6 classes, SGD lr 0.005 without momentum, batch 10, 1 local epoch, all 30 clients (= subjects)
every round, evaluation every round, on the CPU. PFLlib's command line:
  main.py -data HAR -m HARCNN -algo FedAvg -ncl 6 -nc 30 -jr 1 -gr R-1 -ls 1 -lbs 10
          -lr 0.005 -eg 1 -dev cpu -go protofed_side_by_side
(`-gr R-1` because PFLlib runs rounds 0..R-1, R in all; `-ncl 6`, since its default is 10).
protofed's side is the config `b_harcnn_9ch_b10_pfllib` of benchmarks/speed_fedavg_uci_har.py,
imported from there (its `measure`), once with train.workers=1 (the serial engine) and once
with train.workers=2.

The data: PFLlib reads PATH/dataset/HAR/{train,test}/<client>.npz, each a pickled dict
{'x': (n, 9, 1, 128), 'y': (n,)}. This script writes them (unless its own copy is already
there) from exactly what protofed trains on: protofed's loader and partition
(`protofed.data.federated.build_federated` on the config above: natural partition by subject,
`data.predefined_split=true`, `data.split=[0.75,0,0.25]`) give client i = the i-th subject in
ascending order, which is also PFLlib's client order (np.unique of the subject ids), and its
train / test rows are the per-subject 75/25 split stored in `har/uci_har.npz` (no validation
part, so no seed enters). Each client's train_x becomes PFLlib's train 'x' reshaped to
(n, 9, 1, 128) (PFLlib's HARCNN is a Conv2d with (1, 9) kernels: the same convolution as
protofed's Conv1d), train_y its 'y' (int64); the same for test. Both sides thus train on the
same windows, in the corrected [channel, time] layout (PFLlib's own generate_HAR.py reshapes
time-major arrays without a transpose; its split is also a fresh random one). A sha256 of all
arrays goes into config.json; a folder written otherwise is refused unless --overwrite.
Writing the dict pickles it (numpy's format for an object array), because that is what
PFLlib's reader expects; PFLlib's own code unpickles it. Nothing in this script unpickles.

What is timed: PFLlib prints the wall time of each round (`time cost`: evaluation of the
received model on every client's test data plus a train-loss pass over every client's
training data, then the 30 clients' training and the aggregation). protofed's per round is the
wall time from the end of one round to the end of the next (training, aggregation, and an
evaluation on every client's test data; protofed computes no train loss, so PFLlib does a
little more evaluation work: about 1 forward pass over the training data per round). Set-up
(loading data, building 30 clients) is left out of both. A sitting's number is the median of
its rounds after the first (the first holds warm-ups: worker start, caches); the summary gives
the median over sittings and the ratio PFLlib / protofed within each sitting.

Threads: both sides get the same count, --threads (default: all cores). PFLlib is one process;
OMP_NUM_THREADS and MKL_NUM_THREADS are set for it, which torch takes as its intra-op thread
count. protofed gets train.threads=N in its main process; with train.workers=2 its two
training processes are single-threaded each (two cores busy, as PFLlib's two threads).

PFLlib's imports: main.py imports every algorithm, which pulls in torchvision (only used for
ResNet/GoogleNet models), cvxpy (FedPAC), h5py (results file, written after the last round),
calmsize (memory report at the end) and scikit-learn (AUC, every evaluation). Needed for real:
h5py, calmsize, scikit-learn. torchvision must match the installed torch exactly and cvxpy
brings several solvers; where either does not import, this script puts a stub module on the
child's path for it (a module that raises if used; FedAvg with HARCNN never uses them).
Install the rest beside protofed's environment without touching it, e.g.
  pip install --no-deps --target /tmp/pfllib-deps h5py calmsize
and pass --pfllib-path /tmp/pfllib-deps. PFLlib writes PATH/results/ and PATH/system/models/.

Load: measure on a quiet machine. Where other jobs keep the cores busy, a process with two
intra-op threads waits on whichever of its threads is descheduled, and a round takes several
times longer (PFLlib, protofed with train.workers=1 alike), so ratios taken under load are
indicative only; the JSON keeps the load average before, after and between sittings.

Writes benchmarks/out/pfllib_side_by_side.json (and prints a summary); each child's output
goes to benchmarks/out/pfllib_side_by_side.logs/ (tail -f them to follow a run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from speed_fedavg_uci_har import COMMON, CONFIGS, measure  # noqa: E402

CONFIG = "b_harcnn_9ch_b10_pfllib"
DEFAULT_DATA = str(BENCH.parents[1] / "shared" / "data")
WRITER = "protofed benchmarks/pfllib_side_by_side.py"
ROUND_TIME = re.compile(r"-+ time cost -+ ([0-9.eE+-]+)")
TEST_ACC = re.compile(r"Averaged Test Accuracy: ([0-9.]+)")
# modules PFLlib's main.py imports that FedAvg + HARCNN never use
STUBBABLE = ("torchvision", "cvxpy")
REQUIRED = ("numpy", "torch", "sklearn", "h5py", "calmsize")
STUB = '''"""Stub written by protofed's benchmarks/pfllib_side_by_side.py: {name} did not import in
this environment, and PFLlib's FedAvg with HARCNN only imports it."""


def __getattr__(attr):
    raise ImportError("{name} is a stub here (protofed's pfllib_side_by_side.py)")
'''


# -- the data ------------------------------------------------------------------------------
def protofed_clients(data_dir: str) -> list[Any]:
    """protofed's clients for the config: what both sides train and test on."""
    from protofed.config import load_config
    from protofed.data.federated import build_federated

    cfg = load_config(None, [*COMMON, *CONFIGS[CONFIG], f"data.dir={data_dir}"])
    return build_federated(cfg.data, cfg.seed).clients


def pfllib_arrays(client: Any) -> dict[str, dict[str, np.ndarray]]:
    """One client's train and test arrays in PFLlib's shapes: x (n, C, 1, T), y int64."""
    out = {}
    for part in ("train", "test"):
        x = getattr(client, f"{part}_x").numpy()
        out[part] = {
            "x": np.ascontiguousarray(x.reshape(x.shape[0], x.shape[1], 1, x.shape[2])),
            "y": getattr(client, f"{part}_y").numpy().astype(np.int64),
        }
    return out


def write_pfllib_har(pfllib: Path, data_dir: str, overwrite: bool = False) -> dict[str, Any]:
    """PATH/dataset/HAR from protofed's clients, unless this script's copy is there."""
    clients = protofed_clients(data_dir)
    arrays = [pfllib_arrays(c) for c in clients]
    digest = hashlib.sha256()
    for a in arrays:
        for part in ("train", "test"):
            for k in ("x", "y"):
                digest.update(a[part][k].tobytes())
    fingerprint = digest.hexdigest()
    root = pfllib / "dataset" / "HAR"
    config_path = root / "config.json"
    if config_path.is_file():
        old = json.loads(config_path.read_text())
        if old.get("written_by") == WRITER and old.get("sha256") == fingerprint:
            return {"folder": str(root), "written": False, "sha256": fingerprint}
        if not overwrite:
            raise SystemExit(
                f"{root} holds other HAR arrays (not this script's, or other data); "
                "pass --overwrite to replace them"
            )
    for part in ("train", "test"):
        (root / part).mkdir(parents=True, exist_ok=True)
        for i, a in enumerate(arrays):
            with open(root / part / f"{i}.npz", "wb") as f:
                # PFLlib's format: a dict, stored (pickled) as a 0-d object array
                np.savez_compressed(f, data=np.array(a[part], dtype=object))
    labels = [
        [
            [int(c), int((a["train"]["y"] == c).sum() + (a["test"]["y"] == c).sum())]
            for c in range(6)
        ]
        for a in arrays
    ]
    config = {
        "num_clients": len(arrays),
        "num_classes": 6,
        "Size of samples for labels in clients": labels,
        "written_by": WRITER,
        "protofed_config": CONFIG,
        "clients": [c.name for c in clients],
        "sha256": fingerprint,
    }
    config_path.write_text(json.dumps(config) + "\n")
    return {"folder": str(root), "written": True, "sha256": fingerprint}


# -- PFLlib --------------------------------------------------------------------------------
def child_env(threads: int, extra_path: list[str]) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    paths = [*extra_path, env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def pfllib_path(python: str, extra: list[str], stub_dir: Path) -> tuple[list[str], list[str]]:
    """The child's extra sys.path: `extra`, then stubs for what does not import there."""
    env = child_env(1, extra)
    stubbed = []
    for name in STUBBABLE:
        ok = subprocess.run([python, "-c", f"import {name}"], env=env, capture_output=True)
        if ok.returncode != 0:
            (stub_dir / name).mkdir(parents=True, exist_ok=True)
            (stub_dir / name / "__init__.py").write_text(STUB.format(name=name))
            stubbed.append(name)
    path = [*extra, str(stub_dir)] if stubbed else list(extra)
    missing = [
        name
        for name in REQUIRED
        if subprocess.run(
            [python, "-c", f"import {name}"], env=child_env(1, path), capture_output=True
        ).returncode
        != 0
    ]
    if missing:
        raise SystemExit(
            f"PFLlib needs {', '.join(missing)}: e.g. `pip install --no-deps --target DIR "
            f"{' '.join('scikit-learn' if m == 'sklearn' else m for m in missing)}` "
            "and --pfllib-path DIR"
        )
    return path, stubbed


def run_logged(
    cmd: list[str], env: dict[str, str], log: Path, cwd: Path | None = None
) -> tuple[str, float]:
    """Run `cmd`, its output going to `log` (watch it with tail -f); output and wall seconds."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        code = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t0
    text = log.read_text()
    if code != 0:
        sys.stderr.write(text[-4000:])
        raise SystemExit(f"{' '.join(cmd[:3])} ... exited with {code}; its output: {log}")
    return text, wall


def run_pfllib(
    pfllib: Path, rounds: int, threads: int, python: str, path: list[str], log: Path
) -> dict[str, Any]:
    cmd = [
        python, "-u", "main.py",
        "-data", "HAR", "-m", "HARCNN", "-algo", "FedAvg", "-ncl", "6",
        "-nc", "30", "-jr", "1", "-gr", str(rounds - 1), "-ls", "1",
        "-lbs", "10", "-lr", "0.005", "-eg", "1", "-dev", "cpu",
        "-go", "protofed_side_by_side",
    ]  # fmt: skip
    text, wall = run_logged(cmd, child_env(threads, path), log, cwd=pfllib / "system")
    times = [float(t) for t in ROUND_TIME.findall(text)]
    accs = [float(a) for a in TEST_ACC.findall(text)]
    if len(times) != rounds:
        raise SystemExit(f"PFLlib printed {len(times)} round times, expected {rounds}")
    return {
        "side": "pfllib",
        "round_wall_s": times,
        # PFLlib evaluates at the start of a round: entry r is after r rounds of training
        "test_acc_before_round": accs,
        "process_wall_s": wall,
        "command": " ".join(cmd[1:]),
    }


# -- protofed ------------------------------------------------------------------------------
def protofed_overrides(workers: int, threads: int) -> list[str]:
    return [*CONFIGS[CONFIG], f"train.workers={workers}", f"train.threads={threads}"]


def run_protofed(
    workers: int, rounds: int, threads: int, data_dir: str, log: Path
) -> dict[str, Any]:
    """protofed in a fresh process too (same environment as PFLlib's, no state carried)."""
    cmd = [sys.executable, __file__, "--child-protofed", str(workers)]
    cmd += ["--rounds", str(rounds), "--threads", str(threads), "--data-dir", data_dir]
    text, wall = run_logged(cmd, child_env(threads, []), log)
    res = json.loads(text.strip().splitlines()[-1])
    return {
        "side": f"protofed_workers{workers}",
        "round_wall_s": res["round_wall_s"],
        "test_acc_after_round": res["accuracy_by_round"],
        "setup_s": res["setup_s"],
        "process_wall_s": wall,
        "overrides": [*COMMON, *protofed_overrides(workers, threads)],
    }


def child_protofed(workers: int, rounds: int, threads: int, data_dir: str) -> None:
    import torch

    torch.set_num_threads(threads)
    res = measure(CONFIG, protofed_overrides(workers, threads), rounds, data_dir)
    print(json.dumps(res))


# -- the sittings --------------------------------------------------------------------------
def steady(times: list[float]) -> float:
    """Median seconds a round, leaving out the first where there are more."""
    return statistics.median(times[1:] if len(times) > 1 else times)


def summarize(sittings: list[dict[str, Any]], sides: list[str]) -> dict[str, Any]:
    per_side = {s: [steady(sit["runs"][s]["round_wall_s"]) for sit in sittings] for s in sides}
    out: dict[str, Any] = {
        "seconds_per_round": {
            s: {"median": statistics.median(v), "sittings": v} for s, v in per_side.items()
        }
    }
    for s in sides:
        if s == "pfllib":
            continue
        ratios = [p / q for p, q in zip(per_side["pfllib"], per_side[s], strict=True)]
        out[f"ratio_pfllib_over_{s}"] = {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "sittings": ratios,
        }
    return out


def git_commit(path: Path) -> str | None:
    proc = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True)
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pfllib", type=Path, help="a PFLlib checkout (has system/main.py)")
    ap.add_argument("--data-dir", default=DEFAULT_DATA, help="protofed's data root")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3, help="sittings (PFLlib, protofed, ...)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="protofed's")
    ap.add_argument("--pfllib-python", default=sys.executable)
    ap.add_argument("--pfllib-path", nargs="*", default=[], help="extra sys.path for PFLlib")
    ap.add_argument("--pfllib-commit", default=None, help="label, when PATH is not a git tree")
    ap.add_argument("--overwrite", action="store_true", help="replace PATH/dataset/HAR")
    ap.add_argument("--out", default=str(BENCH / "out" / "pfllib_side_by_side.json"))
    ap.add_argument("--child-protofed", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_protofed is not None:
        child_protofed(args.child_protofed, args.rounds, args.threads, args.data_dir)
        return
    if args.pfllib is None or not (args.pfllib / "system" / "main.py").is_file():
        ap.error("--pfllib must be a PFLlib checkout (PATH/system/main.py)")
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (the first round is left out)")
    pfllib = args.pfllib.resolve()
    data = write_pfllib_har(pfllib, args.data_dir, args.overwrite)
    print(f"PFLlib's HAR arrays: {data}", flush=True)
    import torch

    sides = ["pfllib", *(f"protofed_workers{w}" for w in args.workers)]
    sittings: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="pfllib-stubs-") as stubs:
        path, stubbed = pfllib_path(args.pfllib_python, args.pfllib_path, Path(stubs))
        logs = Path(args.out).with_suffix(".logs")
        for k in range(args.repeats):
            log = logs / f"sitting{k + 1}_pfllib.log"
            runs = {
                "pfllib": run_pfllib(
                    pfllib, args.rounds, args.threads, args.pfllib_python, path, log
                )
            }
            for w in args.workers:
                side = f"protofed_workers{w}"
                log = logs / f"sitting{k + 1}_{side}.log"
                runs[side] = run_protofed(w, args.rounds, args.threads, args.data_dir, log)
            sittings.append({"loadavg_1min_after": os.getloadavg()[0], "runs": runs})
            line = ", ".join(f"{s} {steady(runs[s]['round_wall_s']):.2f} s" for s in sides)
            print(f"sitting {k + 1}/{args.repeats}: {line} a round", flush=True)
    result = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "threads_each_side": args.threads,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "pfllib": {
            "path": str(pfllib),
            "commit": args.pfllib_commit or git_commit(pfllib),
            "stubbed_imports": stubbed,
            "extra_path": args.pfllib_path,
        },
        "data": data,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "summary": summarize(sittings, sides),
        "sittings": sittings,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
