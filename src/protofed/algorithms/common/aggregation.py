"""Weighted averages of named tensors: the one aggregation every method builds on."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from protofed.algorithms.base import Arrays, Reply


def weighted_mean(
    replies: Iterable[Reply],
    keys: Iterable[str] | None = None,
    weight: Callable[[Reply], float] = lambda r: r.num_examples,
) -> tuple[Arrays, list[Reply]]:
    """Streaming weighted mean of the replies' arrays (all keys, or only `keys`).

    Floating tensors are averaged in float64 and cast back; integer tensors (BatchNorm's
    `num_batches_tracked`) take the maximum. Replies are consumed once; they are returned with
    their arrays dropped, so callers can still read metrics without keeping model copies alive.
    """
    wanted = None if keys is None else set(keys)
    sums: Arrays = {}
    total = 0.0
    seen: list[Reply] = []
    for reply in replies:
        w = float(weight(reply))
        total += w
        for name, tensor in reply.arrays.items():
            if wanted is not None and name not in wanted:
                continue
            if tensor.is_floating_point():
                acc = sums.get(name)
                if acc is None:  # our own float64 copy (never the reply's tensor), scaled
                    sums[name] = tensor.detach().to(torch.float64, copy=True).mul_(w)
                else:  # cast first: a mixed-dtype add_ takes a scalar path, ~3x slower
                    acc.add_(tensor.detach().to(torch.float64), alpha=w)
            else:
                prev = sums.get(name)
                sums[name] = tensor.clone() if prev is None else torch.maximum(prev, tensor)
        seen.append(Reply(reply.client, {}, reply.metrics))
    if not seen:
        raise ValueError("weighted_mean needs at least one reply")
    if total <= 0:
        raise ValueError("weighted_mean: the weights sum to zero")
    template = {}
    for name, acc in sums.items():
        template[name] = acc.div_(total).to(torch.float32) if acc.is_floating_point() else acc
    return template, seen


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


def prefixed(arrays: Arrays, prefix: str) -> Arrays:
    return {f"{prefix}{k}": v for k, v in arrays.items()}


def unprefixed(arrays: Arrays, prefix: str) -> Arrays:
    return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}


def split_off(
    replies: Iterable[Reply], names: Iterable[str], sink: list[Arrays]
) -> Iterable[Reply]:
    """The replies without the arrays in `names`, which go to `sink` (one mapping per reply).

    For methods that send a model plus small extras (prototypes, statistics): the model part
    still streams into `weighted_mean` while the extras are kept for the server's own step.
    """
    names = tuple(names)
    for reply in replies:
        arrays = dict(reply.arrays)
        sink.append({n: arrays.pop(n) for n in names})
        yield Reply(reply.client, arrays, reply.metrics)
