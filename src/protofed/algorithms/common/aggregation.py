"""Averages of named records: the weighted mean every method builds on, and robust rules.

`weighted_mean` streams: it holds one running sum, never the replies. The robust rules
(coordinate-wise median and trimmed mean, Krum) and the update-norm checks need every reply
of the round at once; `average` picks between them from the experiment's `aggregation`
section (docs/aggregation.md).
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable, Iterable, Iterator
from functools import reduce
from typing import NamedTuple

import torch

from protofed.config import AggregationConfig
from protofed.core.types import Arrays, Metrics, Records, Reply

DROPPED = "dropped_replies"
"""Server metric: replies the update-norm checks left out of the round."""
KRUM_FALLBACK = "krum_fallback"
"""Server metric: 1 when a round had too few replies for Krum and took the median instead."""


def examples(reply: Reply) -> float:
    """The usual aggregation weight: the reply's training-set size."""
    return reply.num_examples


def weighted_mean(
    replies: Iterable[Reply],
    records: Iterable[str] | None = None,
    weight: Callable[[Reply], float] = examples,
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


_CHUNK = 1 << 16
"""Elements a CPU reply is cast to float64 at a time: a 512 KiB buffer, which stays in cache."""


def _add_scaled(acc: torch.Tensor, tensor: torch.Tensor, w: float) -> None:
    """`acc += w * tensor` in float64, `tensor` cast first (a mixed-dtype add_ takes a
    scalar path, ~3x slower). On the CPU the cast goes a cache-sized chunk at a time, so
    the reply's float64 copy is never written out whole and read back: about 1.4 against
    2-3 ms for harcnn's 1664 x 1024 weight, one thread (docs/speed.md). Each element gets
    the same operations either way, so the sums are identical."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu" or tensor.numel() <= _CHUNK or not acc.is_contiguous():
        acc.add_(tensor.to(torch.float64), alpha=w)
        return
    buffer = torch.empty(_CHUNK, dtype=torch.float64)
    flat_acc, flat = acc.view(-1), tensor.reshape(-1)
    for start in range(0, flat.numel(), _CHUNK):
        piece = flat[start : start + _CHUNK]
        flat_acc[start : start + _CHUNK].add_(buffer[: len(piece)].copy_(piece), alpha=w)


def _accumulate(sums: Arrays, arrays: Arrays, w: float) -> None:
    for name, tensor in arrays.items():
        if tensor.is_floating_point():
            acc = sums.get(name)
            if acc is None:  # our own float64 copy (never the reply's tensor), scaled
                sums[name] = tensor.detach().to(torch.float64, copy=True).mul_(w)
            else:
                _add_scaled(acc, tensor, w)
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


# robust rules ---------------------------------------------------------------------------


class Averaged(NamedTuple):
    """What `average` returns: the averaged records, the replies as `weighted_mean` returns
    them (those the norm checks dropped left out), and the server metrics it adds."""

    records: Records
    replies: list[Reply]
    metrics: Metrics


def average(
    replies: Iterable[Reply],
    config: AggregationConfig,
    records: Iterable[str] | None = None,
    weight: Callable[[Reply], float] = examples,
    reference: Records | None = None,
) -> Averaged:
    """The records averaged by `config`: today's streaming `weighted_mean` for the default.

    Anything else reads the whole round: the norm checks (against `reference`, the server's
    weights the clients started from) drop replies first, then the rule combines the rest.
    The robust rules ignore `weight`: a client's own count cannot buy it influence. Metrics:
    `dropped_replies` whenever the rule is not the default, `krum_fallback` under Krum.
    """
    checks = config.max_update_norm is not None or config.max_norm_ratio is not None
    if config.rule == "mean" and not checks:
        mean, seen = weighted_mean(replies, records, weight)
        return Averaged(mean, seen, {})
    wanted = None if records is None else list(records)
    every = list(replies)
    kept = every
    if checks and every:  # no replies: the rule below says so
        if reference is None:
            raise ValueError("the update-norm checks need the server's weights (reference)")
        norms = update_norms(every, reference, wanted)
        keep = within_norm_limits(norms, config.max_update_norm, config.max_norm_ratio)
        kept = [r for r, k in zip(every, keep, strict=True) if k]
        if not kept:
            raise ValueError(
                f"all {len(every)} replies exceed aggregation.max_update_norm="
                f"{config.max_update_norm} (smallest update norm {min(norms):.4g}): raise it"
            )
    metrics: Metrics = {DROPPED: float(len(every) - len(kept))}
    if config.rule == "mean":
        mean, seen = weighted_mean(kept, wanted, weight)
    elif config.rule == "median":
        mean, seen = coordinate_median(kept, wanted)
    elif config.rule == "trimmed_mean":
        mean, seen = trimmed_mean(kept, wanted, config.trim)
    else:
        fallback = len(kept) < krum_minimum(config.byzantine)
        metrics[KRUM_FALLBACK] = float(fallback)
        if fallback:
            warnings.warn(
                "aggregation.rule=krum needs 2 * byzantine + 3 replies: rounds with fewer take "
                "the coordinate-wise median (server metric krum_fallback)",
                stacklevel=2,
            )
            mean, seen = coordinate_median(kept, wanted)
        else:
            mean, seen = krum(kept, wanted, config.byzantine)
    return Averaged(mean, seen, metrics)


def update_norms(
    replies: list[Reply], reference: Records, records: Iterable[str] | None = None
) -> list[float]:
    """Each reply's L2 distance to `reference` over the floating tensors both hold (of
    `records` only, if given); a reply sharing none with it is an error, not a zero."""
    wanted = None if records is None else set(records)
    norms = []
    for reply in replies:
        squares, compared = 0.0, 0
        for record, arrays in reply.records.items():
            if (wanted is not None and record not in wanted) or record not in reference:
                continue
            ref = reference[record]
            for name, tensor in arrays.items():
                if name in ref and tensor.is_floating_point():
                    diff = tensor.detach().double() - ref[name].detach().to(tensor.device).double()
                    squares += float(diff.square().sum())
                    compared += 1
        if not compared:
            raise ValueError(f"client {reply.client}'s reply shares no weights with the server's")
        norms.append(math.sqrt(squares))
    return norms


def within_norm_limits(
    norms: list[float], max_norm: float | None, max_ratio: float | None
) -> list[bool]:
    """Which updates pass both bounds; the ratio is to the median of all `norms`. A NaN norm
    (a non-finite reply) counts as infinite, so any bound drops it."""
    norms = [math.inf if math.isnan(n) else n for n in norms]
    limit = math.inf if max_norm is None else max_norm
    if max_ratio is not None:
        limit = min(limit, max_ratio * statistics.median(norms))
    return [n <= limit for n in norms]


def coordinate_median(
    replies: Iterable[Reply], records: Iterable[str] | None = None
) -> tuple[Records, list[Reply]]:
    """Coordinate-wise median (the mean of the two middle values for an even count)."""
    parts, seen = _split(replies, records)
    n = len(parts)
    return _combine(parts, lambda s: _sorted_mean(s, (n - 1) // 2, n // 2 + 1)), seen


def trimmed_mean(
    replies: Iterable[Reply], records: Iterable[str] | None = None, trim: float = 0.1
) -> tuple[Records, list[Reply]]:
    """Coordinate-wise trimmed mean (Yin et al., ICML 2018), unweighted: per coordinate the
    ceil(trim * n) largest and smallest values are cut (fewer if that would leave none).

    Rounding up, unlike scipy's trim_mean, means trim=0.1 still cuts one value of nine.
    """
    parts, seen = _split(replies, records)
    n = len(parts)
    cut = min(math.ceil(round(trim * n, 9)), (n - 1) // 2)
    return _combine(parts, lambda s: _sorted_mean(s, cut, n - cut)), seen


def krum_minimum(byzantine: int) -> int:
    """The fewest replies Krum is defined for with `byzantine` bad ones: 2f + 3."""
    return 2 * byzantine + 3


def krum(
    replies: Iterable[Reply], records: Iterable[str] | None = None, byzantine: int = 1
) -> tuple[Records, list[Reply]]:
    """Krum (Blanchard et al., NeurIPS 2017): the one reply whose summed squared distance to
    its n - f - 2 nearest others is least; tolerates f bad replies of n >= 2f + 3."""
    parts, seen = _split(replies, records)
    n = len(parts)
    if n < krum_minimum(byzantine):
        raise ValueError(
            f"krum with byzantine={byzantine} needs {krum_minimum(byzantine)} replies, got {n}"
        )
    squared = torch.zeros(n, n, dtype=torch.float64)
    for tensors in _floating(parts):
        flat = torch.stack(tensors).reshape(n, -1).double()
        squared += (
            torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist").square().cpu()
        )
    nearest = squared.sort(dim=1).values[:, 1 : n - byzantine - 1]  # column 0: itself
    scores = nearest.sum(dim=1).nan_to_num(nan=math.inf)
    best = int(scores.argmin())
    return _combine(parts, lambda s: s[best].clone()), seen  # no view of the stack


def _split(
    replies: Iterable[Reply], records: Iterable[str] | None
) -> tuple[list[Records], list[Reply]]:
    """Each reply's records to combine, and the replies without them (as `weighted_mean`)."""
    wanted = None if records is None else set(records)
    parts: list[Records] = []
    seen: list[Reply] = []
    for reply in replies:
        part: Records = {}
        rest: Records = {}
        for record, arrays in reply.records.items():
            (part if wanted is None or record in wanted else rest)[record] = arrays
        parts.append(part)
        seen.append(Reply(reply.client, rest, reply.metrics, reply.num_examples))
    if not parts:
        raise ValueError("aggregation needs at least one reply")
    return parts, seen


def _tensors(parts: list[Records]) -> Iterator[tuple[str, str, list[torch.Tensor]]]:
    """(record, name, every reply's tensor) for each tensor of the first reply."""
    for record, arrays in parts[0].items():
        for name in arrays:
            try:
                yield record, name, [p[record][name].detach() for p in parts]
            except KeyError:
                raise ValueError(f"the replies differ: not all carry {record}/{name}") from None


def _floating(parts: list[Records]) -> Iterator[list[torch.Tensor]]:
    return (ts for _, _, ts in _tensors(parts) if ts[0].is_floating_point())


def _combine(parts: list[Records], rule: Callable[[torch.Tensor], torch.Tensor]) -> Records:
    """`rule` over the stacked floating tensors (cast to float32, as `weighted_mean`); the
    maximum of the others (BatchNorm's `num_batches_tracked`), as `weighted_mean`."""
    out: Records = {}
    for record, name, tensors in _tensors(parts):
        if tensors[0].is_floating_point():
            value = rule(torch.stack(tensors)).to(torch.float32)
        else:
            value = reduce(torch.maximum, tensors).clone()
        out.setdefault(record, {})[name] = value
    return out


def _sorted_mean(stacked: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Per coordinate, the float64 mean of the sorted values lo .. hi - 1 (across replies)."""
    return stacked.sort(dim=0).values[lo:hi].double().mean(dim=0)
