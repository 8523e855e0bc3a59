"""protofed against PFLlib on PFLlib's own UCI-HAR work, run side by side in one sitting.

Why: the speed goal is protofed at least 3x PFLlib on PFLlib's work, as a ratio taken in one
sitting. A reference number measured at another time (README, speed section) says little on
a machine whose load changes by the minute, so this script runs both, one after the other, in
the same sitting, and repeats the sitting.

How (PFLlib as its README installs and runs it, pfl as its own; both in their own
environments with protofed's torch, protofed's commit before and after a change, one sitting):
  python -m venv /tmp/pfllib-venv && /tmp/pfllib-venv/bin/pip install torch==2.13.0
  /tmp/pfllib-venv/bin/pip install -c /tmp/torch.txt "numpy<2" scikit-learn scipy ujson h5py \
      pandas calmsize torchvision cvxpy      # env_cuda_latest.yaml's, CPU torch pinned
  python benchmarks/pfllib_side_by_side.py --pfllib /path/to/PFLlib \
      --pfllib-python /tmp/pfllib-venv/bin/python --pfllib-data pfllib \
      --pfl-python /tmp/pfl-venv/bin/python \
      --protofed before=/tmp/protofed-before/src --protofed after=src \
      --rounds 5 --repeats 3 --workers 2

  --pfllib is a checkout of github.com/TsingZ0/PFLlib (its `system/` and `dataset/` folders).
  PFLlib is not a dependency of protofed: nothing here imports it; it runs as
  `python -u main.py ...` in PATH/system, a child process, and its printed round times are read.
  --pfl-python (optional) adds pfl-research on the same work: benchmarks/pfl_har.py, run by
  that interpreter (install: see pfl_har.py).
  --protofed LABEL=SRC (repeatable; default: this checkout) runs protofed from SRC (a `src`
  folder put first on the child's PYTHONPATH), so two commits are measured in one sitting.

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
{'x': (n, 9, 1, 128), 'y': (n,)}. --pfllib-data pfllib (as its README runs it) writes the
files PFLlib's own dataset/generate_HAR.py writes: the same windows, subjects and per-subject
75/25 split (read from protofed's staged copy, `har/uci_har.npz`, which keeps PFLlib's split;
UCI's archive itself is not fetched), x in generate_HAR.py's time-major reshape (without the
transpose; the staging undid it), float32, y int32. --pfllib-data protofed (the default
before 2026-12) writes protofed's own clients instead (`build_federated` on the config above:
the same rows in the corrected [channel, time] layout, y int64). Either way client i = the
i-th subject, both sides train on the same rows, and PFLlib's HARCNN (a Conv2d with (1, 9)
kernels) does the same products as protofed's Conv1d. A sha256 of all arrays goes into
config.json; a folder written otherwise is refused unless --overwrite. Writing the dict
pickles it (numpy's format for an object array), because that is what PFLlib's reader
expects; PFLlib's own code unpickles it. Nothing in this script unpickles.

What is timed: PFLlib prints the wall time of each round (`time cost`: evaluation of the
received model on every client's test data plus a train-loss pass over every client's
training data, then the 30 clients' training and the aggregation). protofed's per round is the
wall time from the end of one round to the end of the next (training, aggregation, and an
evaluation on every client's test data; protofed computes no train loss, so PFLlib does a
little more evaluation work: about 1 forward pass over the training data per round). Set-up
(loading data, building 30 clients) is left out of both. A sitting's number is the median of
its rounds after the first (the first holds warm-ups: worker start, caches); the summary gives
the median over sittings and the ratio PFLlib / protofed within each sitting.

Threads: by default PFLlib and pfl run as their READMEs run them, with torch's default
intra-op threads (all cores) and no thread variables set; protofed gets train.threads=all
cores (with train.workers=2, two single-threaded training processes). --threads N sets
OMP_NUM_THREADS and MKL_NUM_THREADS=N for PFLlib and pfl (torch takes it as its thread
count) and train.threads=N for protofed.

PFLlib's imports: main.py imports every algorithm, which pulls in torchvision (only used for
ResNet/GoogleNet models), cvxpy (FedPAC), h5py (results file, written after the last round),
calmsize (memory report at the end) and scikit-learn (AUC, every evaluation). In its own
environment (--pfllib-python, as above) all of them import. Where one does not (running it
with protofed's interpreter, as before 2026-12), this script puts a stub module on the
child's path for torchvision and cvxpy (a module that raises if used; FedAvg with HARCNN
never uses them); h5py, calmsize and scikit-learn are needed for real (--pfllib-path DIR
adds a folder to its sys.path). PFLlib writes PATH/results/ and PATH/system/models/.

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


def pfllib_own_arrays(data_dir: str) -> list[dict[str, dict[str, np.ndarray]]]:
    """What PFLlib's dataset/generate_HAR.py writes, per subject: its 75/25 split (kept in the
    staged `har/uci_har.npz`), x as its time-major (n, 128, 9) arrays reshaped to
    (n, 9, 1, 128) without a transpose, float32 (np.loadtxt's dtype there), y int32."""
    with np.load(Path(data_dir) / "har" / "uci_har.npz") as npz:
        x, y, subject, split = npz["X"], npz["y"], npz["subject"], npz["split"]
    time_major = np.ascontiguousarray(x.transpose(0, 2, 1))  # what the staging transposed
    raw = time_major.reshape(len(x), 9, 1, 128).astype(np.float32)
    out = []
    for s in np.unique(subject):
        rows = subject == s
        out.append(
            {
                part: {
                    "x": raw[rows & (split == code)],
                    "y": y[rows & (split == code)].astype(np.int32),
                }
                for part, code in (("train", 0), ("test", 1))
            }
        )
    return out


def write_pfllib_har(
    pfllib: Path, data_dir: str, overwrite: bool = False, layout: str = "protofed"
) -> dict[str, Any]:
    """PATH/dataset/HAR from protofed's clients (`layout="protofed"`) or as PFLlib's own
    generate_HAR.py writes it (`"pfllib"`), unless this script's copy is there."""
    if layout == "pfllib":
        arrays, names = pfllib_own_arrays(data_dir), None
    else:
        clients = protofed_clients(data_dir)
        arrays, names = [pfllib_arrays(c) for c in clients], [c.name for c in clients]
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
            return {"folder": str(root), "written": False, "sha256": fingerprint, "layout": layout}
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
        "layout": layout,
        "protofed_config": CONFIG,
        "clients": names,
        "sha256": fingerprint,
    }
    config_path.write_text(json.dumps(config) + "\n")
    return {"folder": str(root), "written": True, "sha256": fingerprint, "layout": layout}


def write_pfl_arrays(data_dir: str, path: Path) -> Path:
    """protofed's clients as plain arrays (no pickle) for benchmarks/pfl_har.py."""
    clients = protofed_clients(data_dir)
    arrays: dict[str, np.ndarray] = {"clients": np.array(len(clients))}
    for i, c in enumerate(clients):
        for part in ("train", "test"):
            arrays[f"{part}_x_{i}"] = getattr(c, f"{part}_x").numpy().astype(np.float32)
            arrays[f"{part}_y_{i}"] = getattr(c, f"{part}_y").numpy().astype(np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


# -- PFLlib --------------------------------------------------------------------------------
def child_env(threads: int | None, extra_path: list[str]) -> dict[str, str]:
    """The child's environment: thread variables only where --threads was given (None: as
    the READMEs run them, torch's default), `extra_path` first on PYTHONPATH."""
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(name, None)
    if threads is not None:
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
    pfllib: Path, rounds: int, threads: int | None, python: str, path: list[str], log: Path
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


# -- pfl-research --------------------------------------------------------------------------
def run_pfl(
    python: str, arrays: Path, rounds: int, threads: int | None, log: Path
) -> dict[str, Any]:
    cmd = [python, "-u", str(BENCH / "pfl_har.py"), "--arrays", str(arrays)]
    cmd += ["--rounds", str(rounds)]
    text, wall = run_logged(cmd, child_env(threads, []), log)
    res = json.loads(text.strip().splitlines()[-1])
    if len(res["round_wall_s"]) != rounds:
        raise SystemExit(f"pfl timed {len(res['round_wall_s'])} rounds, expected {rounds}")
    return {
        "side": "pfl",
        "round_wall_s": res["round_wall_s"],
        "eval_s": res["eval_s"],
        "test_acc": res["test_acc"],
        "setup_s": res["setup_s"],
        "threads": res["threads"],
        "torch": res["torch"],
        "process_wall_s": wall,
        "command": " ".join(cmd[1:]),
    }


# -- protofed ------------------------------------------------------------------------------
def protofed_overrides(workers: int, threads: int) -> list[str]:
    return [*CONFIGS[CONFIG], f"train.workers={workers}", f"train.threads={threads}"]


def run_protofed(
    workers: int, rounds: int, threads: int, data_dir: str, log: Path, src: str | None = None
) -> dict[str, Any]:
    """protofed in a fresh process too (no state carried), from `src` where given."""
    cmd = [sys.executable, __file__, "--child-protofed", str(workers)]
    cmd += ["--rounds", str(rounds), "--threads", str(threads), "--data-dir", data_dir]
    text, wall = run_logged(cmd, child_env(threads, [src] if src else []), log)
    res = json.loads(text.strip().splitlines()[-1])
    return {
        "side": f"protofed_workers{workers}",
        "src": src,
        "round_wall_s": res["round_wall_s"],
        "test_acc_after_round": res["accuracy_by_round"],
        "setup_s": res["setup_s"],
        "kernel_plans": res.get("kernel_plans"),
        "process_wall_s": wall,
        "overrides": [*COMMON, *protofed_overrides(workers, threads)],
    }


def child_protofed(workers: int, rounds: int, threads: int, data_dir: str) -> None:
    import torch

    import protofed

    torch.set_num_threads(threads)
    res = measure(CONFIG, protofed_overrides(workers, threads), rounds, data_dir)
    res["protofed_file"] = protofed.__file__
    try:  # the plans this machine's measurement chose (protofed from 2026-12 on)
        from protofed.training.fused import kernel_cache_path

        cache = kernel_cache_path()
        res["kernel_plans"] = json.loads(cache.read_text()) if cache and cache.is_file() else None
    except ImportError:
        res["kernel_plans"] = None
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
    for other in ("pfllib", "pfl"):
        if other not in sides:
            continue
        for s in sides:
            if not s.startswith("protofed"):
                continue
            ratios = [p / q for p, q in zip(per_side[other], per_side[s], strict=True)]
            out[f"ratio_{other}_over_{s}"] = {
                "median": statistics.median(ratios),
                "min": min(ratios),
                "sittings": ratios,
            }
    return out


def git_commit(path: Path) -> str | None:
    proc = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True)
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def protofed_sources(given: list[str]) -> list[tuple[str, str | None]]:
    """--protofed LABEL=SRC pairs; none given: this checkout, unlabelled."""
    out: list[tuple[str, str | None]] = []
    for item in given:
        label, sep, path = item.partition("=")
        if not sep or not label or not (Path(path) / "protofed").is_dir():
            raise SystemExit(f"--protofed {item}: LABEL=SRC, SRC a folder holding protofed/")
        out.append((label, str(Path(path).resolve())))
    return out or [("", None)]


def side_name(label: str, workers: int) -> str:
    return f"protofed_{label}_workers{workers}" if label else f"protofed_workers{workers}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pfllib", type=Path, help="a PFLlib checkout (has system/main.py)")
    ap.add_argument("--data-dir", default=DEFAULT_DATA, help="protofed's data root")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3, help="sittings (PFLlib, protofed, ...)")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="PFLlib's and pfl's OMP/MKL threads and protofed's train.threads; default: "
        "unset for PFLlib and pfl (torch's default, as their READMEs run), all cores for protofed",
    )
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="protofed's")
    ap.add_argument("--protofed", action="append", default=[], metavar="LABEL=SRC")
    ap.add_argument("--pfllib-python", default=sys.executable)
    ap.add_argument("--pfllib-path", nargs="*", default=[], help="extra sys.path for PFLlib")
    ap.add_argument("--pfllib-commit", default=None, help="label, when PATH is not a git tree")
    ap.add_argument(
        "--pfllib-data",
        choices=["protofed", "pfllib"],
        default="protofed",
        help="PFLlib's HAR files: protofed's clients, or as its generate_HAR.py writes them",
    )
    ap.add_argument("--pfl-python", default=None, help="pfl-research's interpreter (optional)")
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
    data = write_pfllib_har(pfllib, args.data_dir, args.overwrite, args.pfllib_data)
    print(f"PFLlib's HAR arrays: {data}", flush=True)
    import torch

    cores = os.cpu_count() or 1
    protofed_threads = args.threads or cores
    sources = protofed_sources(args.protofed)
    out = Path(args.out)
    logs = out.with_suffix(".logs")
    pfl_arrays = (
        write_pfl_arrays(args.data_dir, logs / "pfl_arrays.npz") if args.pfl_python else None
    )
    sides = ["pfllib", *(["pfl"] if pfl_arrays else [])]
    sides += [side_name(label, w) for label, _ in sources for w in args.workers]
    sittings: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="pfllib-stubs-") as stubs:
        path, stubbed = pfllib_path(args.pfllib_python, args.pfllib_path, Path(stubs))
        for k in range(args.repeats):
            loads = {"start": os.getloadavg()[0]}
            log = logs / f"sitting{k + 1}_pfllib.log"
            runs = {
                "pfllib": run_pfllib(
                    pfllib, args.rounds, args.threads, args.pfllib_python, path, log
                )
            }
            loads["after_pfllib"] = os.getloadavg()[0]
            if pfl_arrays is not None:
                log = logs / f"sitting{k + 1}_pfl.log"
                runs["pfl"] = run_pfl(args.pfl_python, pfl_arrays, args.rounds, args.threads, log)
                loads["after_pfl"] = os.getloadavg()[0]
            # protofed's commits in turn, their order reversed every other sitting
            for label, src in sources if k % 2 == 0 else sources[::-1]:
                for w in args.workers:
                    side = side_name(label, w)
                    log = logs / f"sitting{k + 1}_{side}.log"
                    runs[side] = run_protofed(
                        w, args.rounds, protofed_threads, args.data_dir, log, src
                    )
                    loads[f"after_{side}"] = os.getloadavg()[0]
            sittings.append({"loadavg_1min": loads, "runs": runs})
            line = ", ".join(f"{s} {steady(runs[s]['round_wall_s']):.2f} s" for s in sides)
            print(f"sitting {k + 1}/{args.repeats}: {line} a round; load {loads}", flush=True)
    result = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": cores,
            "threads": args.threads,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "pfllib": {
            "path": str(pfllib),
            "commit": args.pfllib_commit or git_commit(pfllib),
            "python": args.pfllib_python,
            "stubbed_imports": stubbed,
            "extra_path": args.pfllib_path,
        },
        "pfl": {"python": args.pfl_python} if args.pfl_python else None,
        "protofed": {label or "this checkout": src for label, src in sources},
        "data": data,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "summary": summarize(sittings, sides),
        "sittings": sittings,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
