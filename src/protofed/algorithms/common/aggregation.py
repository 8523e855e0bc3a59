"""Weighted averages of named records: the one aggregation every method builds on."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from protofed.core.types import Arrays, Records, Reply


def weighted_mean(
    replies: Iterable[Reply],
    records: Iterable[str] | None = None,
    weight: Callable[[Reply], float] = lambda r: r.num_examples,
) -> tuple[Records, list[Reply]]:
    """Streaming weighted mean of the replies' records (all of them, or only `records`).

    Floating tensors are averaged in float64 and cast back; integer tensors (BatchNorm's
    `num_batches_tracked`) take the maximum. Replies are consumed once and returned with the
    averaged records dropped: callers still read the metrics and the records they asked not
    to average (prototypes, statistics) without keeping model copies alive.
    """
    wanted = None if records is None else set(records)
    sums: Records = {}
    total = 0.0
    seen: list[Reply] = []
    for reply in replies:
        w = float(weight(reply))
        total += w
        rest: Records = {}
        for record, arrays in reply.records.items():
            if wanted is not None and record not in wanted:
                rest[record] = arrays
                continue
            _accumulate(sums.setdefault(record, {}), arrays, w)
        seen.append(Reply(reply.client, rest, reply.metrics, reply.num_examples))
    if not seen:
        raise ValueError("weighted_mean needs at least one reply")
    if total <= 0:
        raise ValueError("weighted_mean: the weights sum to zero")
    return {name: _finish(acc, total) for name, acc in sums.items()}, seen


def _accumulate(sums: Arrays, arrays: Arrays, w: float) -> None:
    for name, tensor in arrays.items():
        if tensor.is_floating_point():
            acc = sums.get(name)
            if acc is None:  # our own float64 copy (never the reply's tensor), scaled
                sums[name] = tensor.detach().to(torch.float64, copy=True).mul_(w)
            else:  # cast first: a mixed-dtype add_ takes a scalar path, ~3x slower
                acc.add_(tensor.detach().to(torch.float64), alpha=w)
        else:
            prev = sums.get(name)
            sums[name] = tensor.clone() if prev is None else torch.maximum(prev, tensor)


def _finish(sums: Arrays, total: float) -> Arrays:
    return {
        name: acc.div_(total).to(torch.float32) if acc.is_floating_point() else acc
        for name, acc in sums.items()
    }


def mean_metric(replies: Iterable[Reply], key: str) -> float | None:
    """Example-weighted mean of one scalar metric, if any reply reports it."""
    num = den = 0.0
    for r in replies:
        if key in r.metrics:
            num += r.metrics[key] * r.num_examples
            den += r.num_examples
    return num / den if den else None


def select(arrays: Arrays, names: Iterable[str]) -> Arrays:
    """The sub-mapping for `names` (all must be present)."""
    return {n: arrays[n] for n in names}
