"""Every field a client sends in a private run, on every engine, is noised (or clipped for
the trusted server's noise in central mode), a public constant, or refused.

The built-in engine's client replies are `Reply` objects; both Flower engines run the one
ClientApp (simulation: `partition-id`, a deployment: a partition file), whose three handlers
(query, train, evaluate) are called here as Flower calls them, and what they return is
enumerated field by field.
"""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from flwr.app import Context, Message, Metadata, RecordDict

from protofed.config import load_config
from protofed.errors import ConfigError
from protofed.flower import clientapp, wire
from protofed.flower.partitions import export_partitions
from protofed.privacy.mechanisms import PRIVACY, deltas
from protofed.privacy.private import PUBLIC_EXAMPLES
from protofed.runtime import prepare, simulate

BASE = [
    "data.name=digits",
    "data.num_clients=4",
    "model.hidden=[16]",
    "train.rounds=1",
    "train.threads=1",
    "train.workers=1",
    "privacy.enabled=true",
    "privacy.noise_multiplier=1",
]
# what a header may carry under privacy: who the node is and the federation's public facts
PUBLIC_HEADER = {"client", "fingerprint", "entry", "counts", "federation"}


def _norm(arrays: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(v.double().pow(2).sum()) for v in arrays.values()))


@pytest.mark.parametrize("mode", ["central", "local"])
def test_the_builtin_engine_sends_nothing_unaccounted(mode) -> None:
    cfg = load_config(None, [*BASE, f"privacy.mode={mode}"])
    loop = simulate(prepare(cfg))
    clip = cfg.privacy.clip_norm
    for reply, *_ in loop.transport.fit(loop.server, 1, loop.sample(1)):
        assert reply.metrics == {}  # no loss, no count
        assert reply.num_examples == PUBLIC_EXAMPLES
        sent = loop.algorithm.configure(loop.server, reply.client, 1)
        assert set(reply.records) <= {"model", PRIVACY}
        update = deltas(reply.records["model"], sent["model"])
        if mode == "central":  # clipped, for the server's noise on the sum
            assert _norm(update) <= clip * (1 + 1e-5)
        else:  # noised on the client: far beyond the bound
            assert _norm(update) > 10 * clip
        assert set(reply.records.get(PRIVACY, {})) == set()  # no adaptive bit asked for


def _message(kind: str, cfg, mode: str = "", content: RecordDict | None = None) -> Message:
    records = content if content is not None else RecordDict()
    records[wire.TASK] = wire.task(kind, 1, 0, wire.config_json(cfg), mode)
    metadata = Metadata(  # as a SuperLink would address it to this node
        run_id=1,
        message_id=f"{kind}-1",
        src_node_id=0,
        dst_node_id=1,
        reply_to_message_id="",
        group_id="1",
        created_at=time.time(),
        ttl=600.0,
        message_type=kind,
    )
    return Message(metadata=metadata, content=records)


def _context(node_config: dict) -> Context:
    return Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(), run_config={})


@pytest.fixture(params=["simulation", "deployment"])
def node(request, tmp_path, monkeypatch):
    """(config, node config) of a private node on either Flower engine."""
    cfg = load_config(None, [*BASE, "privacy.mode=local", "privacy.clear_evaluation=false"])
    clientapp._CACHE.clear()
    if request.param == "simulation":
        monkeypatch.setattr(clientapp, "in_simulation", lambda: True)
        return cfg, {clientapp.PARTITION_ID_KEY: 0}
    files = export_partitions(cfg, tmp_path / "parts")
    return cfg, {clientapp.PARTITION_KEY: str(files[0])}


def test_a_private_nodes_discovery_header_holds_no_statistics(node) -> None:
    cfg, node_config = node
    reply = clientapp.query(_message(wire.QUERY, cfg), _context(node_config))
    info = json.loads(str(reply.content.config_records[wire.INFO]["json"]))
    assert set(info) <= PUBLIC_HEADER
    assert info["counts"] is None  # no per-class counts
    assert set(info["entry"]) == {"name", "group"}  # no sizes
    assert "clients" not in info["federation"] and "counts" not in info["federation"]


@pytest.mark.integration
def test_a_private_nodes_fit_reply_is_noised_and_counts_a_constant(node) -> None:
    cfg, node_config = node
    algorithm = prepare(cfg).algorithm
    server = algorithm.init_server()
    sent = algorithm.configure(server, 0, 1)
    content = RecordDict(wire.to_records(sent))
    reply = clientapp.train(_message(wire.TRAIN, cfg, content=content), _context(node_config))
    metrics = wire.from_metrics(reply.content.metric_records[wire.METRICS])
    assert metrics == {wire.NUM_EXAMPLES: PUBLIC_EXAMPLES}  # a public constant, no loss
    records = wire.from_records(reply.content)
    assert set(records) <= {"model", PRIVACY}
    assert _norm(deltas(records["model"], sent["model"])) > 10 * cfg.privacy.clip_norm  # noised
    assert set(reply.content.config_records) == set()


@pytest.mark.integration
def test_a_private_node_refuses_to_send_its_evaluation_counts(node) -> None:
    cfg, node_config = node
    algorithm = prepare(cfg).algorithm
    content = RecordDict(wire.to_records(algorithm.configure(algorithm.init_server(), 0, 1)))
    with pytest.raises(ConfigError, match="privacy.clear_evaluation"):
        clientapp.evaluate(
            _message(wire.EVALUATE, cfg, "scores", content=content), _context(node_config)
        )


def test_a_private_deployment_is_refused_unless_the_evaluation_is_accepted() -> None:
    from protofed.flower.deployment import deploy

    cfg = load_config(None, BASE)
    with pytest.raises(ConfigError, match="privacy.clear_evaluation"):
        deploy(cfg, None, 1, 0.0)  # type: ignore[arg-type]  # refused before any network
    seeded = load_config(None, [*BASE, "privacy.clear_evaluation=true", "privacy.noise=seeded"])
    with pytest.raises(ConfigError, match="privacy.noise"):
        deploy(seeded, None, 1, 0.0)  # type: ignore[arg-type]


@pytest.mark.integration
def test_personal_weights_leave_a_private_node_only_in_a_simulation(node) -> None:
    """Evaluation mode 'weights' sends a client's personal model to the server: in a
    simulation that is the evaluator's own process tree (it holds every client's data); a
    deployed node refuses it, whoever asks."""
    cfg, node_config = node
    algorithm = prepare(cfg).algorithm
    content = RecordDict(wire.to_records(algorithm.configure(algorithm.init_server(), 0, 1)))
    message = _message(wire.EVALUATE, cfg, "weights", content=content)
    if clientapp.PARTITION_KEY in node_config:
        with pytest.raises(ConfigError, match="does not send its personal model"):
            clientapp.evaluate(message, _context(node_config))
    else:
        reply = clientapp.evaluate(message, _context(node_config))
        assert wire.SCORES in reply.content.array_records
