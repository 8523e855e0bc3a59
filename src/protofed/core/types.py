"""The types every layer shares: what crosses between server and clients, and what comes back.

A message, a reply, a client's state and the server's state are all `Records`: named
records, each a flat mapping of names to tensors (`Arrays`). A record has one meaning
(`"model"`: weights named as in the model's `state_dict`; `"protos"`: a prototype table;
...), so no method parses key prefixes, and a message maps one to one onto Flower's
`RecordDict` of `ArrayRecord`s (`protofed.flower.wire`). Scalars that describe a reply
travel as `Metrics`.

This module depends on nothing else of protofed: algorithms and engines both build on it,
never on each other's internals (the layers are checked by import-linter, see
docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

Arrays = dict[str, torch.Tensor]
"""One record: names to tensors (a model's weights, a prototype table, a few scalars)."""

Records = dict[str, Arrays]
"""A message, a reply or a state: record names to records (e.g. `{"model": ..., "protos": ...}`)."""

Metrics = dict[str, float]
"""Scalar metrics: a reply's (loss, steps) or the server's own after aggregating."""

MODEL = "model"
"""The record that holds model weights, in messages, replies and states alike."""


@dataclass
class Reply:
    """One client's answer in a round, as the server's `aggregate` receives it.

    `num_examples` is stamped by the engine (the client's training-set size), never by the
    algorithm: it is the usual aggregation weight.
    """

    client: int
    records: Records
    metrics: Metrics = field(default_factory=dict)
    num_examples: float = 1.0


class Checked(NamedTuple):
    """The non-finite check of a reply's records, run where the reply was made (in this
    process or in one of its own workers): the first array holding NaN or infinity (None:
    clean) and the check's share of the round's wall clock, in seconds (its time over the
    processes that check in parallel)."""

    bad: str | None
    wall_s: float


class Delivery(NamedTuple):
    """A reply as a transport hands it to the round loop, with the bytes that crossed the
    wire for it: the message down to the client and the reply up (0 and 0 where nothing
    crossed one, as for the pooled reference client), and its non-finite check where the
    transport ran it (None: the loop checks the reply itself)."""

    reply: Reply
    down_bytes: int
    up_bytes: int
    checked: Checked | None = None


@dataclass
class FitResult:
    """What a client's `fit` returns: the reply it sends, its metrics, the state it keeps."""

    reply: Records
    metrics: Metrics = field(default_factory=dict)
    state: Records = field(default_factory=dict)


@dataclass
class AggregateResult:
    """What the server's `aggregate` returns: its new state and its own named metrics.

    The metrics reach `metrics.jsonl` (key `server`) and the reports.
    """

    server: Records
    metrics: Metrics = field(default_factory=dict)


def records_fault(records: object, what: str) -> str | None:
    """What makes `records` not `Records` (named dicts of tensors), or None."""
    if not isinstance(records, dict):
        return f"{what} must be a dict of records, not {type(records).__name__}"
    for name, arrays in records.items():
        if not isinstance(arrays, dict):
            return f"{what} record '{name}' must be a dict of tensors, not {type(arrays).__name__}"
        for key, value in arrays.items():
            if not isinstance(value, torch.Tensor):
                return f"{what} '{name}.{key}' must be a torch.Tensor, not {type(value).__name__}"
    return None


def _metrics_fault(metrics: object) -> str | None:
    if not isinstance(metrics, dict):
        return f"metrics must be a dict, not {type(metrics).__name__}"
    for key, value in metrics.items():
        if not isinstance(value, int | float):  # what JSON writes (bool is an int)
            return f"metric '{key}' must be a Python float, not {type(value).__name__}"
    return None


def check_result(result: object, hook: str, algorithm: str) -> None:
    """A TypeError naming the hook when an algorithm's `fit` or `aggregate` returns the
    wrong shape of thing, before it fails obscurely deep in an engine (cheap: no tensor is
    read)."""
    expected = FitResult if hook == "fit" else AggregateResult
    fault: str | None
    if not isinstance(result, expected):
        article = "an" if expected is AggregateResult else "a"
        fault = f"must return {article} {expected.__name__}, not {type(result).__name__}"
    elif isinstance(result, FitResult):
        fault = (
            records_fault(result.reply, "reply")
            or _metrics_fault(result.metrics)
            or records_fault(result.state, "state")
        )
    else:
        fault = records_fault(result.server, "server") or _metrics_fault(result.metrics)
    if fault is not None:
        raise TypeError(f"{algorithm}.{hook}: {fault}")


def nbytes(records: Records) -> int:
    """Bytes on the wire for a message or reply: the tensors' payload."""
    return sum(t.numel() * t.element_size() for arrays in records.values() for t in arrays.values())


def clone(arrays: Arrays) -> Arrays:
    """A detached copy of every tensor."""
    return {k: v.detach().clone() for k, v in arrays.items()}
