"""Running experiments: preparation, the round loop, its transports and evaluation modes.

prepare.py   config -> data, model, algorithm (every config error before any file)
loop.py      RoundLoop: sample, send, aggregate, evaluate, record, checkpoint; Diverged
fingerprint.py  what a checkpoint must match to be resumed
in_process.py   InProcessTransport: clients trained here or in worker processes
parallel.py  WorkerPool: forked single-threaded workers
stacking/    train.stacked: a round's clients trained together, algorithms opt in there
timing.py    RoundClock: a round's time, split into training, guard and aggregation
nonfinite.py the non-finite guard: NaN or infinity in a reply or the server state
scoring.py   ServerSideEvaluation: scores on the server's copy of every client's data
holdout.py   eval.unseen_clients: which clients never train
unseen.py    UnseenScoring: the held-out clients scored, fine-tuned as each method does
kept_prototypes.py  eval.keep_prototypes_every: class prototypes kept for figures
dynamic.py   data.dynamic: classes withheld and given back on a schedule
engine.py    simulate / start / resume: the built-in engine and its run directory
"""

from protofed.runtime.engine import resume, simulate, start
from protofed.runtime.in_process import InProcessTransport, fit_client, run_fit
from protofed.runtime.loop import Diverged, Evaluation, RoundLoop, Transport
from protofed.runtime.prepare import Prepared, build_model_and_algorithm, prepare
from protofed.runtime.scoring import ServerSideEvaluation
from protofed.runtime.summary import Progress

__all__ = [
    "Diverged",
    "Evaluation",
    "InProcessTransport",
    "Prepared",
    "Progress",
    "RoundLoop",
    "ServerSideEvaluation",
    "Transport",
    "build_model_and_algorithm",
    "fit_client",
    "prepare",
    "resume",
    "run_fit",
    "simulate",
    "start",
]
