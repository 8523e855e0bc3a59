"""What a client's reply is clipped to, and where the Gaussian noise goes.

A reply is split into groups, each clipped as one vector to its own bound:
- the **update**: every record the client was also sent (same name, same keys and shapes,
  e.g. `model`), as the difference between what it sends and what it was sent, clipped
  jointly to `privacy.clip_norm` (an integer tensor there, such as a BatchNorm step count,
  goes back as the value that was sent: it is not sent at all);
- each **other record** (a class-prototype table, FedAli's banks, ...) as one vector,
  clipped to `privacy.prototype_clip`. A prototype table (`pack_prototypes`) sends its
  class means; its counts become 1 (the server weighs a client's class by presence, never
  by a count that reveals the client's size) and its class indices go in the clear.
- a **binary record** (every tensor boolean: FedSub's subnetwork masks), d bits in all, is
  sent centred and scaled, bit b as (2b - 1) x `prototype_clip` / sqrt(d): a vector of norm
  exactly `prototype_clip` whatever the bits, so it joins the other records under the same
  bound and the same noise. The server turns what it receives (central: the noised mean;
  local: each noised reply) back into bits by its sign (`decode_binary`): post-processing,
  which keeps the guarantee. A reply names its binary records in its `privacy` record.

With G groups, group g clipped to C_g, the reply scaled group by group to C_g = 1 is a
vector of norm at most sqrt(G); Gaussian noise of std sigma x sqrt(G) x C_g on group g is
then the Gaussian mechanism with multiplier sigma on that vector, whatever G is. `central`
adds it once to the sum of the round's replies at the server (central.py), `local` to each
reply on the client.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from protofed.core.types import Arrays, Records
from protofed.errors import ConfigError
from protofed.privacy.entropy import NoiseSource

PRIVACY = "privacy"
"""The record of the privacy layer's own values: the clip norm down, the unclipped bit and
the names of the binary records up."""
BINARY = "binary."
"""A key of a reply's `privacy` record: `binary.<record>` says that record was binary."""


@dataclass(frozen=True)
class Groups:
    """How a reply splits: the records that are updates, and the records clipped alone."""

    update: tuple[str, ...]
    others: tuple[str, ...]

    @property
    def count(self) -> int:
        return (1 if self.update else 0) + len(self.others)


def is_update(name: str, arrays: Arrays, message: Records) -> bool:
    """Whether a reply record is an update of a record the client was sent (a prototype
    table never is: it is the client's own statistics, whatever the server sent under the
    same name, e.g. PFPL's personalized prototypes)."""
    sent = message.get(name)
    if not sent or is_prototypes(arrays) or any(key not in sent for key in arrays):
        return False
    return all(arrays[key].shape == sent[key].shape for key in arrays)


def is_prototypes(arrays: Arrays) -> bool:
    return "classes" in arrays and "means" in arrays


def is_binary(arrays: Arrays) -> bool:
    """A record of bits only (FedSub's masks): sent centred and scaled, not refused."""
    return bool(arrays) and all(value.dtype == torch.bool for value in arrays.values())


def encode_binary(arrays: Arrays, bound: float) -> Arrays:
    """Bits as a float vector of norm exactly `bound`: b -> (2b - 1) x bound / sqrt(d)."""
    bits = sum(value.numel() for value in arrays.values())
    step = bound / math.sqrt(max(bits, 1))
    return {k: (v.to(torch.float32) * 2 - 1) * step for k, v in arrays.items()}


def binary_names(records: Records) -> list[str]:
    """The records a reply sent as encoded bits (named in its `privacy` record)."""
    return [key[len(BINARY) :] for key in records.get(PRIVACY, {}) if key.startswith(BINARY)]


def decode_binary(records: Records, names: list[str]) -> Records:
    """The named records back as bits: a value above 0 (the centred midpoint) is set."""
    return {
        name: {k: v > 0 for k, v in arrays.items()} if name in names else arrays
        for name, arrays in records.items()
    }


def split(reply: Records, message: Records) -> Groups:
    names = [name for name in reply if name != PRIVACY]
    update = tuple(n for n in names if is_update(n, reply[n], message))
    return Groups(update, tuple(n for n in names if n not in update))


def _norm(tensors: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors))


def _scale(norm: float, bound: float) -> float:
    return min(1.0, bound / norm) if norm > 0 else 1.0


def deltas(reply: Arrays, sent: Arrays) -> Arrays:
    """The floating part of an update record, as differences from what was sent."""
    return {k: v - sent[k].to(v.device) for k, v in reply.items() if v.is_floating_point()}


def _values(name: str, arrays: Arrays) -> Arrays:
    """The floating values of a non-update record that the mechanism clips and noises."""
    if is_prototypes(arrays):
        return {"means": arrays["means"]}
    for key, value in arrays.items():
        if not value.is_floating_point():
            raise ConfigError(
                f"privacy: reply record '{name}' holds the integer tensor '{key}', which no "
                "Gaussian mechanism can noise; this algorithm cannot run with privacy.enabled "
                "(docs/privacy.md)"
            )
    return arrays


def clip_reply(
    reply: Records, message: Records, clip_norm: float, prototype_clip: float
) -> tuple[Records, float]:
    """The reply with every group clipped to its bound (a binary record encoded first and
    named in the `privacy` record), and the update's norm before."""
    groups = split(reply, message)
    update = {n: deltas(reply[n], message[n]) for n in groups.update}
    norm = _norm([t for d in update.values() for t in d.values()])
    out = _clipped_update(reply, message, update, _scale(norm, clip_norm), clip_norm)
    for name in groups.others:
        arrays = reply[name]
        if is_binary(arrays):
            arrays = encode_binary(arrays, prototype_clip)
            out.setdefault(PRIVACY, {})[BINARY + name] = torch.tensor(1.0)
        values = _values(name, arrays)
        scale = _scale(_norm(list(values.values())), prototype_clip)
        clipped = {**arrays, **{k: v * scale for k, v in values.items()}}
        if is_prototypes(arrays) and "counts" in arrays:
            clipped["counts"] = torch.ones_like(arrays["counts"])
        out[name] = clipped
    return out, norm


def _clipped_update(
    reply: Records, message: Records, update: Records, factor: float, bound: float
) -> Records:
    """The update records, sent + factor x difference, with the difference the server will
    compute (in the weights' own precision) within `bound`: where rounding next to large
    weights lands above it, the factor shrinks until it does not (at worst to 0, the
    weights that were sent)."""
    for _ in range(8):
        out = {
            name: {
                k: message[name][k] + update[name][k] * factor
                if k in update[name]
                else message[name][k].clone()
                for k in reply[name]
            }
            for name in update
        }
        realized = _norm([t for n in update for t in deltas(out[n], message[n]).values()])
        if realized <= bound or factor == 0.0:
            return out
        factor = factor * bound / realized * (1 - 1e-6) if factor > 1e-30 else 0.0
    return {
        name: {k: t.clone() for k, t in message[name].items() if k in reply[name]}
        for name in update
    }


def noise(like: torch.Tensor, std: float, source: NoiseSource) -> torch.Tensor:
    """Gaussian noise of `std` shaped as `like`, drawn on the CPU from `source`."""
    drawn = source.normal(like.shape) * std
    return drawn.to(dtype=like.dtype, device=like.device)


def noise_reply(
    reply: Records,
    message: Records,
    stds: tuple[float, float],
    source: NoiseSource,
) -> Records:
    """`local` mode: a clipped reply with its own noise; `stds` = (update std, other std)."""
    groups = split(reply, message)
    out = dict(reply)
    for name in groups.update:
        out[name] = {
            k: v + noise(v, stds[0], source) if v.is_floating_point() else v
            for k, v in reply[name].items()
        }
    for name in groups.others:
        values = _values(name, reply[name])
        out[name] = {
            **reply[name],
            **{k: v + noise(v, stds[1], source) for k, v in values.items()},
        }
    return out


def flat(arrays: Arrays) -> torch.Tensor:
    """A record's values as one float64 vector, in the record's key order."""
    return torch.cat([v.double().flatten() for v in arrays.values()])
