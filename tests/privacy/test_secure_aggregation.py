"""`privacy.secure_aggregation`: Flower's SecAgg+ sums the clipped replies, the server adds
the noise to the sum and never holds one reply.

The protocol runs for real here: Flower's `SecAggPlusWorkflow` on the server side, Flower's
`secaggplus_mod` in the real ClientApp on each node, the nodes reading their partition files
as deployed SuperNodes do. Only the network is in-process (`Loopback`, a Grid that hands each
message to the node's ClientApp): Flower's own processes are tested in tests/flower/.
"""

from __future__ import annotations

import copy
import time
import uuid

import numpy as np
import pytest
import torch
from flwr.app import Context, Error, Message, RecordDict
from flwr.common import bytes_to_ndarray
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from flwr.supercore.task_identity import TaskIdentity

from conftest import DIGITS_SMALL
from protofed.config import load_config
from protofed.core.types import Reply
from protofed.errors import ConfigError
from protofed.flower import clientapp, wire
from protofed.flower.deployment import deploy
from protofed.flower.partitions import export_partitions
from protofed.flower.secagg import quantization_range
from protofed.flower.transport import FlowerTransport
from protofed.privacy.central import (
    UNCLIPPED,
    central_sums,
    release,
    summand,
    sums_from,
)
from protofed.privacy.entropy import SeededNoise
from protofed.privacy.mechanisms import PRIVACY, encode_binary
from protofed.prototypes import pack_prototypes
from protofed.runtime import prepare, simulate
from protofed.runtime.engine import start

SECURE = [
    *DIGITS_SMALL,
    "data.num_clients=4",
    "train.rounds=2",
    "privacy.enabled=true",
    "privacy.noise_multiplier=0.3",
    "privacy.clip_norm=2",
    "privacy.secure_aggregation=true",
    "privacy.clear_evaluation=true",  # a deployment's evaluation counts (refused otherwise)
]


class Loopback:
    """A Grid whose network is a function call: each message goes to its node's ClientApp
    (Flower's `ClientApp.__call__`, mods included) with that node's own `Context`, which
    keeps the node's state between messages as a SuperNode does. It records every reply the
    server receives."""

    def __init__(self, node_configs: list[dict]) -> None:
        self.contexts = {
            i + 1: Context(
                run_id=1, node_id=i + 1, node_config=c, state=RecordDict(), run_config={}
            )
            for i, c in enumerate(node_configs)
        }
        self.replies: dict[str, Message] = {}
        self.received: list[Message] = []

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages: list[Message]) -> list[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            msg.metadata.__dict__["_src_node_id"] = 0
            msg.metadata.__dict__["_created_at"] = time.time()
            node = msg.metadata.dst_node_id
            try:  # the node gets its own copy, as off a network
                reply = copy.deepcopy(clientapp.app(copy.deepcopy(msg), self.contexts[node]))
            except Exception as err:  # a failing ClientApp answers with an error, as Flower's
                reply = Message(Error(code=0, reason=str(err)), reply_to=msg)
            self.replies[msg.metadata.message_id] = reply
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, ids: set[str]) -> list[Message]:
        out = [self.replies.pop(i) for i in list(ids) if i in self.replies]
        self.received += out
        return out

    def send_and_receive(self, messages: list[Message], *, timeout: float | None = None):
        return self.pull_messages(set(self.push_messages(messages)))


@pytest.fixture
def nodes(tmp_path, monkeypatch):
    """(config, node configs): four deployed nodes, one partition file each; this process
    is the ServerApp's run (Flower's messages are stamped with its run id)."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    cfg = load_config(None, SECURE)
    clientapp._CACHE.clear()
    files = export_partitions(cfg, tmp_path / "parts")
    return cfg, [{clientapp.PARTITION_KEY: str(f)} for f in files]


def _reply(seed: int, with_bit: bool) -> tuple[dict, dict]:
    """A clipped reply of every kind of record (update, prototypes, other, bits), and its
    message."""
    g = torch.Generator().manual_seed(seed)
    sent = {"model": {"w": torch.randn(3, 4, generator=g), "n": torch.tensor(5)}}
    reply = {
        "model": {
            "w": sent["model"]["w"] + 0.1 * torch.randn(3, 4, generator=g),
            "n": torch.tensor(5),
        },
        "protos": pack_prototypes(
            torch.randn(5, 2, generator=g), torch.tensor([1.0, 0, 3, 0, 1]) * (seed % 2 + 1)
        ),
        "banks": {"b": torch.randn(4, generator=g)},
        "masks": encode_binary({"m": torch.rand(6, generator=g) > 0.5}, 1.0),
        PRIVACY: {"binary.masks": torch.tensor(1.0)},
    }
    reply["protos"]["counts"] = torch.ones_like(reply["protos"]["counts"])
    if with_bit:
        reply[PRIVACY][UNCLIPPED] = torch.tensor(0.5 if seed % 2 else -0.5)
    return reply, sent


@pytest.mark.parametrize("with_bit", [False, True])
def test_the_sum_of_summands_is_the_sum_of_the_replies(with_bit) -> None:
    pairs = [_reply(seed, with_bit) for seed in range(4)]
    layouts, values = zip(*(summand(r, s, 5) for r, s in pairs), strict=True)
    assert len(set(layouts)) == 1  # one layout for the whole round
    total = sum(np.concatenate(v) for v in values)
    secure = sums_from(layouts[0], total, 4, 5)
    replies = [Reply(i, r, {}, 1.0) for i, (r, _) in enumerate(pairs)]
    direct = central_sums(replies, [s for _, s in pairs], 5)
    assert secure.groups == direct.groups and secure.binary == ["masks"]
    assert secure.unclipped == pytest.approx(direct.unclipped) and secure.keys == direct.keys
    for name in direct.updates:
        for k, v in direct.updates[name].items():
            torch.testing.assert_close(secure.updates[name][k], v)
    torch.testing.assert_close(secure.prototypes["protos"][0], direct.prototypes["protos"][0])
    assert torch.equal(secure.prototypes["protos"][1], direct.prototypes["protos"][1])  # holders
    for name in direct.others:
        for k, v in direct.others[name].items():
            torch.testing.assert_close(secure.others[name][k], v)
    # the same noise on the same sums releases the same means
    a = release(secure, (0.3, 0.2), 4.0, SeededNoise(torch.Generator().manual_seed(1)))
    b = release(direct, (0.3, 0.2), 4.0, SeededNoise(torch.Generator().manual_seed(1)))
    torch.testing.assert_close(a[0]["model"]["w"], b[0]["model"]["w"])
    torch.testing.assert_close(a[1]["protos"]["means"], b[1]["protos"]["means"])


def test_a_layout_names_only_the_dtypes_it_may() -> None:
    reply, sent = _reply(0, False)
    layout, values = summand(reply, sent, 5)
    with pytest.raises(KeyError):
        sums_from(layout.replace('"float32"', '"load"'), np.concatenate(values), 1, 5)


def test_the_quantization_never_wraps_the_modulus() -> None:
    for clients in (2, 10, 1000, 5000):
        assert (clients + 1) * quantization_range(clients) < 2**32
    assert quantization_range(10) == 2**22  # Flower's default where it fits


@pytest.mark.parametrize(
    "extra, match",
    [
        (["privacy.mode=local"], "privacy.mode=central"),
        (["privacy.audit=10"], "privacy.audit"),
    ],
)
def test_secure_aggregation_is_refused_where_it_cannot_hold(extra, match) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, [*SECURE, *extra])


def test_the_builtin_engine_refuses_secure_aggregation(tmp_path) -> None:
    cfg = load_config(None, SECURE)
    with pytest.raises(ConfigError, match="secure_aggregation runs on Flower only"):
        start(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before any file
    with pytest.raises(ConfigError, match="secure_aggregation runs on Flower only"):
        simulate(prepare(cfg))


def _summands(cfg, node_configs, transport: FlowerTransport, server, clients) -> dict:
    """What each client's summand is (its ClientApp called directly, without the mod)."""
    out = {}
    for cid in clients:
        sent = transport.algorithm.configure(server, cid, 1)
        content = transport.content(wire.TRAIN, 1, cid, sent, mode=wire.SECAGG)
        msg = Message(content, dst_node_id=cid + 1, message_type=wire.TRAIN, group_id="1")
        msg.metadata.__dict__["_message_id"] = f"direct-{cid}"
        node = cid + 1
        context = Context(1, node, node_configs[cid], RecordDict(), {})
        reply = clientapp.train(msg, context)
        arrays = reply.content.array_records["fitres.parameters"]
        out[cid] = np.concatenate(
            [bytes_to_ndarray(a.data).reshape(-1) for a in arrays.values()]
        ).astype(np.float64)
    return out


@pytest.mark.integration
def test_secagg_gives_the_server_the_sum_and_no_single_reply(nodes) -> None:
    cfg, node_configs = nodes
    grid = Loopback(node_configs)
    loop, _ = deploy(cfg, grid, nodes=len(node_configs), wait_s=5)  # type: ignore[arg-type]
    transport = loop.transport
    assert isinstance(transport, FlowerTransport)
    clients = [0, 1, 2, 3]
    deliveries = list(transport.fit(loop.server, 1, clients))
    assert [d.reply.client for d in deliveries] == clients
    record = deliveries[0].reply.records["protofed.secure_sum"]
    assert all(d.reply.records["protofed.secure_sum"] is record for d in deliveries)
    assert all(d.up_bytes > 0 and d.down_bytes > 0 for d in deliveries)
    direct = _summands(cfg, node_configs, transport, loop.server, clients)
    expected = sum(direct.values())
    bound = max(cfg.privacy.clip_norm, cfg.privacy.prototype_clip, 1.0)
    step = 2 * bound / quantization_range(len(clients))
    np.testing.assert_allclose(record["total"].numpy(), expected, atol=len(clients) * step)
    # what reached the server from each node: no arrays, and a masked vector that says
    # nothing of that node's summand (uniform masks modulo 2**32)
    masked = [
        m
        for m in grid.received
        if RECORD_KEY_CONFIGS in m.content.config_records
        and Key.MASKED_PARAMETERS in m.content.config_records[RECORD_KEY_CONFIGS]
    ]
    assert len(masked) == len(clients)
    for m in masked:
        assert all(len(r) == 0 for r in m.content.array_records.values())
        parts = m.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]
        vector = np.concatenate([bytes_to_ndarray(b).reshape(-1) for b in parts])[1:]  # weight
        own = direct[m.metadata.src_node_id - 1]
        seen = vector.astype(np.float64) * 2 * bound / quantization_range(4) - bound
        assert abs(np.corrcoef(seen, own)[0, 1]) < 0.2
        assert np.abs(seen - own).max() > 100 * bound


@pytest.mark.integration
def test_a_deployed_secure_run_trains_and_accounts(nodes) -> None:
    cfg, node_configs = nodes
    cfg.eval.every = 2  # evaluated once, at the end
    loop, _ = deploy(cfg, Loopback(node_configs), nodes=len(node_configs), wait_s=5)  # type: ignore[arg-type]
    summary = loop.run().to_json()
    assert summary["status"] == "complete" and summary["flower"]["rejected"] == 0
    assert summary["privacy"]["epsilon"] > 0
    # ten classes: chance is 0.1 (0.48 measured after these 2 rounds at sigma 0.3)
    assert summary["final"]["personalization"]["acc"] > 0.3
