"""The non-finite guard: whether a reply or a server state holds NaN or infinity.

Proportionate by construction: NaN and infinity propagate through a sum, so a clean record
costs one reduction per array and a host sync; only a record whose total is not finite is
scanned element by element, to name its first bad array. Where clients train in this
process or in its own workers, each reply is checked where it was made, right after
training (`checked`), while its tensors are still in that core's cache; the round loop then
reads the verdict instead of reading the tensors again. Replies from elsewhere (Flower's
nodes) are checked by the loop.
"""

from __future__ import annotations

import math
import time

import torch

from protofed.core.types import Arrays, Checked, Records


def finite_total(arrays: Arrays) -> bool:
    """Whether the sum of every floating array is finite: one reduction per array (in float32
    at least, so that half-precision arrays do not overflow) and one host sync in all."""
    sums = [
        t.sum(dtype=torch.promote_types(t.dtype, torch.float32))
        for t in arrays.values()
        if t.is_floating_point() and t.numel()
    ]
    if not sums:
        return True
    device = sums[0].device
    return math.isfinite(float(torch.stack([s.to(device) for s in sums]).sum()))


def nonfinite(records: Records) -> str | None:
    """The name of the first floating array holding NaN or infinity, or None.

    A record whose total is finite is clean; a total can also overflow from finite values,
    and then the element scan finds nothing and the record passes, as it should.
    """
    for record, arrays in records.items():
        if finite_total(arrays):
            continue
        for name, tensor in arrays.items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                return f"{record}/{name}"
    return None


def checked(records: Records) -> Checked:
    """`nonfinite(records)` with the seconds it took here (`Checked.wall_s` until the
    transport scales it to the processes that check in parallel)."""
    start = time.perf_counter()
    bad = nonfinite(records)
    return Checked(bad, time.perf_counter() - start)
