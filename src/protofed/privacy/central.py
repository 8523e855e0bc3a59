"""`central` mode: the round's clipped replies summed, noised once, released as one mean.

Central mode needs nothing of a reply but its contribution to a sum, group by group
(mechanisms.py says how a reply splits): the clipped update's difference from what the
client was sent, each other record's clipped values, a prototype table as its dense class
means plus a presence vector, and adaptive clipping's centred bit. `Sums` holds those
sums; `release` adds the Gaussian noise to them and divides by the round's expected size.
The sums come either from the individual replies (`central_sums`, the server holding
each reply) or from secure aggregation (`summand` on each client, one flat vector that
Flower's SecAgg+ adds up under masks, and `sums_from` on the server, which then never
holds an individual reply). Both give the same `Sums`, so the release, the epsilon and
everything the algorithm computes after it are one code path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from protofed.core.types import Arrays, Records, Reply
from protofed.privacy.entropy import NoiseSource
from protofed.privacy.mechanisms import (
    PRIVACY,
    Groups,
    binary_names,
    deltas,
    flat,
    is_prototypes,
    noise,
    split,
)
from protofed.prototypes import pack_prototypes, unpack_prototypes

UNCLIPPED = "unclipped"
"""Adaptive clipping's centred bit, in a reply's `privacy` record."""
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
DTYPES["float64"] = torch.float64
"""The dtypes a summand's layout may name (it comes from a client: nothing else is looked up)."""


@dataclass
class Sums:
    """The round's clipped replies added up, group by group, in the order the noise is drawn.

    `updates[name]`: the summed differences of an update record (its floating keys);
    `keys[name]`: every key the reply's update record had, floating or not (the others go
    back as they were sent); `others[name]`: a non-update record's summed floating values;
    `prototypes[name]`: (summed dense class means (C, D), holders per class (C,), whether
    the replies carried counts); `unclipped`: the sum of adaptive clipping's bits."""

    groups: Groups
    count: int
    updates: dict[str, Arrays] = field(default_factory=dict)
    keys: dict[str, list[str]] = field(default_factory=dict)
    others: dict[str, Arrays] = field(default_factory=dict)
    prototypes: dict[str, tuple[torch.Tensor, torch.Tensor, bool]] = field(default_factory=dict)
    unclipped: float = 0.0
    binary: list[str] = field(default_factory=list)  # records sent as encoded bits


def check_groups(replies: list[Reply], sent: list[Records]) -> Groups:
    """The groups every reply of the round shares (one release needs one shape)."""
    groups = split(replies[0].records, sent[0])
    for reply, message in zip(replies, sent, strict=True):
        if split(reply.records, message) != groups:
            raise ValueError(
                f"privacy: client {reply.client}'s reply has other records than client "
                f"{replies[0].client}'s ({split(reply.records, message)} vs {groups})"
            )
    return groups


def central_sums(replies: list[Reply], sent: list[Records], num_classes: int) -> Sums:
    """The sums of the round's clipped replies, from the replies themselves."""
    groups = check_groups(replies, sent)
    sums = Sums(groups, len(replies))
    for name in groups.update:
        total: Arrays = {}
        for reply, message in zip(replies, sent, strict=True):
            for key, delta in deltas(reply.records[name], message[name]).items():
                total[key] = total[key] + delta if key in total else delta.clone()
        sums.updates[name] = total
        sums.keys[name] = list(replies[0].records[name])
    for name in groups.others:
        if is_prototypes(replies[0].records[name]):
            tables = [unpack_prototypes(r.records[name], num_classes) for r in replies]
            dim = max(m.shape[1] for m, _ in tables)
            table = torch.zeros(num_classes, dim, dtype=tables[0][0].dtype)
            holders = torch.zeros(num_classes, dtype=table.dtype)
            for means, counts in tables:
                if means.shape[1] == dim:
                    table += means
                    holders += (counts > 0).to(table.dtype)
            counted = all("counts" in r.records[name] for r in replies)
            sums.prototypes[name] = (table, holders, counted)
            continue
        sums.others[name] = {
            k: torch.stack([r.records[name][k] for r in replies]).sum(0)
            for k in replies[0].records[name]
        }
    sums.unclipped = sum(float(r.records.get(PRIVACY, {}).get(UNCLIPPED, 0.0)) for r in replies)
    return sums


def release(
    sums: Sums,
    stds: tuple[float, float],
    denominator: float,
    source: NoiseSource,
    observed: dict[str, torch.Tensor] | None = None,
) -> tuple[dict[str, Arrays], Records]:
    """The noised means: (update name -> mean difference, other record name -> its mean).

    The noise is Gaussian of std `stds[0]` on every update, `stds[1]` on every other record,
    added once to the sums; `denominator` is the round's expected size, never its actual
    one. `observed`, where given, receives each group's noised sum as one float64 vector
    (what the audit observes)."""
    means: dict[str, Arrays] = {}
    for name in sums.groups.update:
        released = {k: v + noise(v, stds[0], source) for k, v in sums.updates[name].items()}
        if observed is not None:
            observed[name] = flat(released)
        means[name] = {k: v / denominator for k, v in released.items()}
    others: Records = {}
    for name in sums.groups.others:
        if name in sums.prototypes:
            table, holders, counted = sums.prototypes[name]
            noised_sum = table + noise(table, stds[1], source)
            if observed is not None:
                observed[name] = noised_sum.double().flatten()
            noised = noised_sum / holders.clamp(min=1).unsqueeze(1)
            packed = pack_prototypes(noised, holders)
            if counted:
                packed["counts"] = torch.ones_like(packed["counts"])
            else:
                packed.pop("counts")
            others[name] = packed
            continue
        released = {k: v + noise(v, stds[1], source) for k, v in sums.others[name].items()}
        if observed is not None:
            observed[name] = flat(released)
        others[name] = {k: v / denominator for k, v in released.items()}
    return means, others


def released_replies(
    sums: Sums,
    means: dict[str, Arrays],
    others: Records,
    clients: list[int],
    sent: list[Records],
) -> list[Reply]:
    """Every client's reply replaced by the release: an update is the client's own message
    plus the mean difference, so whatever the algorithm's `aggregate` computes is
    post-processing of the one noised release. Every reply then weighs the same."""
    out = []
    for client, message in zip(clients, sent, strict=True):
        records = {
            name: {
                k: message[name][k] + means[name][k] if k in means[name] else message[name][k]
                for k in sums.keys[name]
            }
            for name in sums.groups.update
        }
        out.append(Reply(client, {**records, **others}, {}, 1.0))
    return out


def central_mean(
    replies: list[Reply],
    sent: list[Records],
    stds: tuple[float, float],
    denominator: float,
    num_classes: int,
    source: NoiseSource,
    observed: dict[str, torch.Tensor] | None = None,
) -> list[Reply]:
    """Every reply replaced by the noised mean of the round's clipped replies."""
    sums = central_sums(replies, sent, num_classes)
    means, others = release(sums, stds, denominator, source, observed)
    return released_replies(sums, means, others, [r.client for r in replies], sent)


# secure aggregation: a reply as one vector, and the sums back from the vectors' sum ---------
def summand(reply: Records, message: Records, num_classes: int) -> tuple[str, list[np.ndarray]]:
    """A client's clipped reply as what secure aggregation adds up: (its layout, as JSON
    the server checks is the same for every client, and its values, float64 arrays).

    Each coordinate stays within the group's bound (a clipped vector's entries do), a
    presence flag is 0 or 1, adaptive clipping's bit +-1/2: SecAgg+ quantizes within a
    range that covers them (flower/secagg.py)."""
    groups = split(reply, message)
    layout: dict[str, Any] = {"update": [], "others": []}
    values: list[np.ndarray] = []
    for name in groups.update:
        difference = deltas(reply[name], message[name])
        keys = [
            [k, str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in difference.items()
        ]
        layout["update"].append([name, list(reply[name]), keys])
        values += [v.detach().cpu().double().numpy().reshape(-1) for v in difference.values()]
    for name in groups.others:
        arrays = reply[name]
        if is_prototypes(arrays):
            means, counts = unpack_prototypes(arrays, num_classes)
            dtype = str(means.dtype).removeprefix("torch.")
            layout["others"].append(
                ["prototypes", name, int(means.shape[1]), dtype, "counts" in arrays]
            )
            values += [
                means.detach().cpu().double().numpy().reshape(-1),
                (counts > 0).double().cpu().numpy(),
            ]
            continue
        keys = [[k, str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in arrays.items()]
        layout["others"].append(["values", name, keys])
        values += [v.detach().cpu().double().numpy().reshape(-1) for v in arrays.values()]
    layout["binary"] = binary_names(reply)
    layout["unclipped"] = UNCLIPPED in reply.get(PRIVACY, {})
    if layout["unclipped"]:
        values.append(np.array([float(reply[PRIVACY][UNCLIPPED])]))
    return json.dumps(layout, sort_keys=True), values


def sums_from(layout_json: str, total: np.ndarray, count: int, num_classes: int) -> Sums:
    """The `Sums` of `count` replies from the sum of their summands (one flat vector)."""
    layout = json.loads(layout_json)
    update = tuple(name for name, _, _ in layout["update"])
    sums = Sums(Groups(update, tuple(entry[1] for entry in layout["others"])), count)
    vector = np.asarray(total, dtype=np.float64).reshape(-1)
    start = 0

    def take(size: int) -> torch.Tensor:
        nonlocal start
        if start + size > vector.size:
            raise ValueError(f"the secure sum has {vector.size} values, its layout needs more")
        part = torch.from_numpy(vector[start : start + size].copy())
        start += size
        return part

    for name, all_keys, keys in layout["update"]:
        sums.keys[name] = list(all_keys)
        sums.updates[name] = {
            k: take(int(np.prod(shape))).reshape(shape).to(DTYPES[dtype])
            for k, dtype, shape in keys
        }
    for kind, name, *rest in layout["others"]:
        if kind == "prototypes":
            dim, dtype, counted = rest
            table = take(num_classes * dim).reshape(num_classes, dim).to(DTYPES[dtype])
            holders = take(num_classes).round().to(table.dtype)
            sums.prototypes[name] = (table, holders, bool(counted))
            continue
        sums.others[name] = {
            k: take(int(np.prod(shape))).reshape(shape).to(DTYPES[dtype])
            for k, dtype, shape in rest[0]
        }
    sums.binary = [str(name) for name in layout["binary"]]
    if layout["unclipped"]:
        sums.unclipped = float(take(1)[0])
    if start != vector.size:
        raise ValueError(f"the secure sum has {vector.size} values, its layout {start}")
    return sums


SECURE_SUM = "protofed.secure_sum"
"""The record a secure aggregation hands the privacy layer in place of the replies: the
sum of the round's summands, their layout and how many were summed."""


def secure_sum_record(layout_json: str, total: np.ndarray, count: int) -> Arrays:
    """What the Flower transport hands the privacy layer for each surviving client."""
    return {
        "total": torch.from_numpy(np.asarray(total, dtype=np.float64).reshape(-1).copy()),
        "layout": torch.tensor(list(layout_json.encode()), dtype=torch.uint8),
        "count": torch.tensor(count),
    }


def secure_sums(replies: list[Reply], num_classes: int) -> Sums:
    """The `Sums` a secure aggregation delivered (each surviving client's reply carries the
    same `SECURE_SUM` record, and nothing else)."""
    record = replies[0].records[SECURE_SUM]
    count = int(record["count"])
    if count != len(replies) or any(r.records.get(SECURE_SUM) is not record for r in replies):
        raise ValueError(f"a secure sum of {count} replies arrived as {len(replies)} replies")
    layout = bytes(record["layout"].tolist()).decode()
    return sums_from(layout, record["total"].numpy(), count, num_classes)
