"""The server's check of every reply before it reaches `aggregate`.

A reply that fails is left out of the round with a logged reason; it never crashes the
server or poisons the aggregate. No algorithm declares its replies, so what a reply may
contain is inferred, the same way for every algorithm:

1. it decodes: plain numeric arrays only (no pickle, no object arrays: `wire.from_record`),
   scalar finite metrics, `num_examples` (if sent) >= 0;
2. every floating-point value is finite (no NaN, no infinity);
3. an array of the record `model` named like a model weight has that weight's exact shape
   and dtype (the model is the template: FedAvg's, Ditto's and FedRep's replies are weights);
4. an array of another record named like an array of the same record in the message it
   answers has the message's dtype and trailing shape (prototype methods send one row per
   class present, so the leading dimension may differ between clients and from the message);
5. the replies of a round agree on their records and names and, for arrays that are not
   model weights,
   on dtype and trailing shape: the expected layout is the one a strict majority of the
   replies that passed 1-4 share; without a strict majority (say two replies that
   disagree), the layout accepted in the previous round decides, and failing that the first
   reply in client order. A reply with another layout is rejected as missing or unexpected
   arrays, or a wrong shape or dtype.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import torch

from protofed.core.types import MODEL, Arrays, Metrics, Records, Reply

log = logging.getLogger("protofed.flower")

Layout = tuple[tuple[str, str, tuple[int, ...]], ...]  # (record/name, dtype, shape) sorted


def flat(records: Records) -> Arrays:
    """Records as one mapping of "record/name" to tensors (how replies are compared)."""
    return {f"{rec}/{name}": t for rec, arrays in records.items() for name, t in arrays.items()}


@dataclass
class Rejected:
    client: int
    reason: str


def _describe(shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> str:
    return f"{tuple(shape)} {str(dtype).replace('torch.', '')}"


@dataclass
class ReplyValidator:
    """Checks one round's replies; keeps the last accepted layout to break ties."""

    model: dict[str, tuple[torch.Size, torch.dtype]]  # name -> (shape, dtype) of each weight
    last_layout: Layout | None = field(default=None)

    @classmethod
    def for_model(cls, weights: Arrays) -> ReplyValidator:
        return cls({f"{MODEL}/{k}": (v.shape, v.dtype) for k, v in weights.items()})

    # one reply on its own (rules 1-4) ------------------------------------------------------
    def check_one(
        self, records: Records, metrics: Metrics, message: Records, num_examples: float = 0.0
    ) -> str | None:
        """The reason a reply is malformed, or None."""
        if num_examples < 0:
            return f"num_examples is negative ({num_examples})"
        arrays, message_arrays = flat(records), flat(message)
        for name, value in arrays.items():
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                bad = int((~torch.isfinite(value)).sum())
                return f"array '{name}' has {bad} non-finite value(s)"
            if name in self.model:
                shape, dtype = self.model[name]
                if value.shape != shape or value.dtype != dtype:
                    return (
                        f"array '{name}' is {_describe(value.shape, value.dtype)}, "
                        f"the model's weight is {_describe(shape, dtype)}"
                    )
            elif name in message_arrays:
                sent = message_arrays[name]
                if (
                    value.dtype != sent.dtype
                    or value.shape[1:] != sent.shape[1:]
                    or (value.dim() != sent.dim())
                ):
                    return (
                        f"array '{name}' is {_describe(value.shape, value.dtype)}, the "
                        f"message's is {_describe(sent.shape, sent.dtype)}"
                    )
        return None

    @staticmethod
    def layout(arrays: Arrays) -> Layout:
        return tuple(sorted((k, str(v.dtype), (v.dim(), *v.shape[1:])) for k, v in arrays.items()))

    # a round (rule 5) ----------------------------------------------------------------------
    def check_round(
        self, replies: list[Reply], messages: dict[int, Records]
    ) -> tuple[list[Reply], list[Rejected]]:
        """The replies to keep (in the given order) and the rejected ones with reasons."""
        rejected: list[Rejected] = []
        passed: list[Reply] = []
        for reply in replies:
            reason = self.check_one(
                reply.records, reply.metrics, messages.get(reply.client, {}), reply.num_examples
            )
            if reason is None:
                passed.append(reply)
            else:
                rejected.append(Rejected(reply.client, reason))
        if not passed:
            return [], rejected
        layouts = [self.layout(flat(r.records)) for r in passed]
        counts = Counter(layouts)
        top, top_count = counts.most_common(1)[0]
        if 2 * top_count > len(layouts):
            expected = top
        elif self.last_layout is not None and self.last_layout in counts:
            expected = self.last_layout
        else:
            expected = layouts[0]
        kept = []
        for reply, lay in zip(passed, layouts, strict=True):
            if lay == expected:
                kept.append(reply)
            else:
                rejected.append(Rejected(reply.client, _difference(lay, expected)))
        self.last_layout = expected
        return kept, rejected


def _difference(got: Layout, expected: Layout) -> str:
    g = {name: rest for name, *rest in got}
    e = {name: rest for name, *rest in expected}
    missing = sorted(set(e) - set(g))
    extra = sorted(set(g) - set(e))
    if missing:
        return f"missing array(s) {missing[:5]} that the other replies carry"
    if extra:
        return f"unexpected array(s) {extra[:5]} that the other replies lack"
    differ = sorted(k for k in g if g[k] != e[k])
    return f"array(s) {differ[:5]} differ in dtype or shape from the other replies"
