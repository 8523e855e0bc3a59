"""Messages over Flower's Grid: the transport the one round loop uses on Flower.

`FlowerTransport` fills the loop's one seam differently from the built-in engine: `fit`
sends each sampled client its message (`algorithm.configure`, per client) as a Flower
Message and validates the replies (`validation`), and `client_models` asks every client for
its personalized model, because client states live on the clients (`Context.state`), not
on the server. Sampling, seeding, aggregation, byte counts, the evaluation protocol and the
run directory are the loop's own code, so the same config and seed give the same numbers
(tests check it against golden files).

Differences from the built-in engine, all by design:
- no checkpoints: client states live on the nodes (`FlowerTransport.states` is None), so a
  killed run cannot be resumed;
- a rejected reply is left out of the round (logged); the round fails only when fewer than
  `flower.min_replies` replies remain; the bytes sent to a rejected client still count;
- the summary adds `flower` (rejected replies per round, start-up time).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from protofed.core.types import MODEL, Arrays, Delivery, Records, Reply, nbytes
from protofed.errors import RunStopped
from protofed.flower import wire
from protofed.flower.secagg import secure_sum
from protofed.flower.validation import Rejected, ReplyValidator
from protofed.privacy import summand_bound
from protofed.privacy.central import SECURE_SUM, secure_sum_record
from protofed.runtime import Prepared

log = logging.getLogger("protofed.flower")


STOP = threading.Event()
"""Set when the process is interrupted (`session.request_stop`): the ServerApp thread's waits
end within a poll."""


def exchange(grid: Grid, messages: list[Message], timeout_s: float | None) -> list[Message]:
    """`grid.send_and_receive` that also ends when `STOP` is set (Ctrl-C, SIGTERM), and sends
    nothing once it is.

    Flower runs the ServerApp in a thread of its own that waits for replies; after the main
    thread is interrupted no reply comes, and without this the process would wait forever.
    """
    if STOP.is_set():  # asked to stop: start no client work
        raise RunStopped("interrupted")
    ids = set(grid.push_messages(messages))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    replies: list[Message] = []
    while ids:
        if STOP.is_set():
            raise RunStopped("interrupted")
        if deadline is not None and time.monotonic() >= deadline:
            break
        got = list(grid.pull_messages(ids))
        replies += got
        ids.difference_update(m.metadata.reply_to_message_id for m in got)
        if ids:
            time.sleep(0.05)
    return replies


def discover(
    grid: Grid,
    config_json: str,
    expected: int,
    wait_s: float = 60.0,
    timeout_s: float | None = None,
) -> tuple[dict[int, int], dict[int, dict[str, Any]]]:
    """Which node holds which client: wait for `expected` nodes, then ask each ("query").

    Returns client id -> node id, and client id -> the node's answer (its partition header
    in deployment). A node that fails to answer (say, a partition of another experiment) is
    left out with a logged reason, and so are two nodes claiming one client
    (`unique_claims`).
    """
    deadline = time.monotonic() + wait_s
    nodes = list(grid.get_node_ids())
    while len(nodes) < expected and time.monotonic() < deadline:
        if STOP.is_set():
            raise RunStopped("interrupted")
        time.sleep(0.5)
        nodes = list(grid.get_node_ids())
    if len(nodes) < expected:
        raise RuntimeError(
            f"{len(nodes)} Flower node(s) connected within {wait_s:.0f} s, {expected} expected"
        )
    task = wire.task(wire.QUERY, 0, -1, config_json)
    messages = [
        Message(RecordDict({wire.TASK: task}), node, wire.QUERY, group_id="query") for node in nodes
    ]
    claims: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for reply in exchange(grid, messages, timeout_s):
        node = reply.metadata.src_node_id
        if reply.has_error():
            log.warning("node %s is left out: %s", node, reply.error.reason)
            continue
        info = json.loads(str(reply.content.config_records[wire.INFO]["json"]))
        claims.setdefault(int(info["client"]), []).append((node, info))
    return unique_claims(claims)


def unique_claims(
    claims: dict[int, list[tuple[int, dict[str, Any]]]],
) -> tuple[dict[int, int], dict[int, dict[str, Any]]]:
    """(client -> node, client -> header) of the clients exactly one node claims. Two nodes
    claiming one client cannot both be right and the server cannot tell which is: both are
    left out, with one line naming them (a duplicate or foreign node must not stop a run)."""
    node_of: dict[int, int] = {}
    infos: dict[int, dict[str, Any]] = {}
    for cid, holders in sorted(claims.items()):
        if len(holders) > 1:
            nodes = ", ".join(str(node) for node, _ in holders)
            log.warning("client %d is claimed by nodes %s: all left out", cid, nodes)
            continue
        node_of[cid], infos[cid] = holders[0]
    return node_of, infos


class RoundFailed(RunStopped):
    """Fewer valid replies than `flower.min_replies`: the round cannot be aggregated."""


def _strings(record: ConfigRecord, key: str) -> list[str]:
    """A list value of a node's answer, as strings; anything but a list is refused."""
    value = record[key]
    if not isinstance(value, list):
        raise RuntimeError(f"the node's '{key}' is not a list ({value!r})")
    return [str(v) for v in value]


class FlowerTransport:
    """Messages over Flower's Grid; the client states stay on the clients (`Context.state`).

    `fit` sends each sampled client its message (`algorithm.configure`, per client) and
    validates the replies (`validation`); `client_models` asks every client for its
    personalized model. A rejected reply is left out of the round (logged); the round fails
    only when fewer than `flower.min_replies` replies remain.
    """

    states: dict[int, Records] | None = None  # on the clients: no checkpoint here
    # eval.client_model=trained: kept on the clients too (Context.state)
    trained: dict[int, Arrays] | None = None

    def __init__(self, prepared: Prepared, config_json: str, name: str) -> None:
        self.prepared = prepared
        self.algorithm = prepared.algorithm
        self.cfg = prepared.cfg
        self.config_json = config_json
        self.name = name
        self.grid: Grid | None = None
        self.node_of: dict[int, int] = {}  # client id -> Flower node id
        self.validator = ReplyValidator.for_model(prepared.model.state_dict())
        self.rejected: list[dict[str, Any]] = []  # {"round", "client", "reason"}
        # what the server knows of each client's training set (its data in simulation, the
        # partition headers in deployment): a reply may not claim more examples
        self.train_sizes: dict[int, int] = {
            i: len(c.train_y) for i, c in enumerate(prepared.fed.clients)
        }
        self.startup_s = 0.0  # Flower's start-up and the node discovery, before round 1

    def attach(self, grid: Grid, node_of: dict[int, int]) -> None:
        self.grid, self.node_of = grid, node_of

    # talking to nodes ----------------------------------------------------------------------
    def send(self, kind: str, contents: dict[int, RecordDict], group: str) -> dict[int, Message]:
        """Send one message per client; the replies that came back, by client."""
        assert self.grid is not None, "not attached to a Flower Grid"
        messages = [
            Message(content, self.node_of[cid], kind, group_id=group)
            for cid, content in contents.items()
        ]
        client_of = {node: cid for cid, node in self.node_of.items()}
        replies = exchange(self.grid, messages, self.cfg.flower.timeout_s)
        return {client_of[r.metadata.src_node_id]: r for r in replies}

    def content(
        self,
        kind: str,
        server_round: int,
        cid: int,
        message: Records,
        mode: str = "",
        extra: dict[str, Any] | None = None,
        cache: dict[int, Any] | None = None,
    ) -> RecordDict:
        """One client's message. `cache` keeps serialized records by record object: clients
        sent the same record (FedAvg's global model) share one ArrayRecord."""
        content = RecordDict(
            {wire.TASK: wire.task(kind, server_round, cid, self.config_json, mode)}
        )
        for name, arrays in message.items():
            if cache is None:
                content[name] = wire.to_records({name: arrays})[name]
            else:
                if id(arrays) not in cache:  # holding `arrays` keeps its id unique
                    cache[id(arrays)] = (arrays, wire.to_records({name: arrays})[name])
                content[name] = cache[id(arrays)][1]
        for name, record in (extra or {}).items():
            content[name] = record
        return content

    # the transport ---------------------------------------------------------------------------
    def fit(self, server: Records, server_round: int, clients: list[int]) -> Iterator[Delivery]:
        if self.cfg.privacy.enabled and self.cfg.privacy.secure_aggregation:
            yield from self.secure_fit(server, server_round, clients)
            return
        messages = {cid: self.algorithm.configure(server, cid, server_round) for cid in clients}
        cache: dict[int, Any] = {}
        contents = {
            cid: self.content(wire.TRAIN, server_round, cid, m, cache=cache)
            for cid, m in messages.items()
        }
        answers = self.send(wire.TRAIN, contents, str(server_round))
        del contents, cache
        replies: list[Reply] = []
        rejected: list[Rejected] = []
        for cid in clients:
            answer = answers.get(cid)
            try:
                if answer is None:
                    raise ValueError("no reply (timed out or the node is gone)")
                if answer.has_error():
                    raise ValueError(f"the client failed: {answer.error.reason}")
                records = wire.from_records(answer.content, self.cfg.train.device)
                metrics = wire.from_metrics(answer.content.metric_records[wire.METRICS])
                examples = metrics.pop(wire.NUM_EXAMPLES)
                known = self.train_sizes.get(cid)
                if known is not None and examples > known:
                    raise ValueError(
                        f"num_examples {examples:g} exceeds the {known} training samples "
                        "the server knows the client has"
                    )
            except (ValueError, KeyError) as err:
                rejected.append(Rejected(cid, str(err).strip("'\"")))
                continue
            replies.append(Reply(cid, records, metrics, examples))
        kept, invalid = self.validator.check_round(replies, messages)
        rejected = sorted([*rejected, *invalid], key=lambda r: r.client)
        for r in rejected:
            log.warning(
                "round %d: reply of client %d rejected: %s", server_round, r.client, r.reason
            )
            self.rejected.append({"round": server_round, "client": r.client, "reason": r.reason})
        if len(kept) < self.cfg.flower.min_replies:
            raise RoundFailed(
                f"round {server_round}: {len(kept)} valid repl(ies) of {len(clients)}, "
                f"flower.min_replies={self.cfg.flower.min_replies}"
            )
        sent = {cid: nbytes(m) for cid, m in messages.items()}
        # a rejected client was sent its message all the same: its bytes count with the first
        # kept reply's (the loop counts bytes down per reply it sees)
        unanswered = sum(sent[r.client] for r in rejected)
        for i, reply in enumerate(kept):
            down = sent[reply.client] + (unanswered if i == 0 else 0)
            yield Delivery(reply, down, nbytes(reply.records))

    def secure_fit(
        self, server: Records, server_round: int, clients: list[int]
    ) -> Iterator[Delivery]:
        """The round under `privacy.secure_aggregation` (secagg.py): the clients train as
        ever, but only the SecAgg+ sum of their clipped replies reaches the server, handed
        to the privacy layer as each survivor's reply (`privacy.central.SECURE_SUM`)."""
        if len(clients) < 2:  # a sum of one reply is that reply: nothing is released
            log.warning(
                "round %d: secure aggregation needs 2 or more clients, %d sampled: the round "
                "releases nothing",
                server_round,
                len(clients),
            )
            return
        assert self.grid is not None, "not attached to a Flower Grid"
        messages = {cid: self.algorithm.configure(server, cid, server_round) for cid in clients}
        cache: dict[int, Any] = {}
        contents = {
            self.node_of[cid]: self.content(
                wire.TRAIN, server_round, cid, m, mode=wire.SECAGG, cache=cache
            )
            for cid, m in messages.items()
        }
        result = secure_sum(
            self.grid,
            exchange,
            contents,
            server_round,
            summand_bound(server, self.cfg.privacy),
            self.cfg.privacy.secagg_threshold,
            self.cfg.flower.timeout_s,
        )
        del contents, cache
        client_of = {node: cid for cid, node in self.node_of.items()}
        survivors = sorted(client_of[n] for n in result.survivors) if result else []
        for cid in sorted(set(clients) - set(survivors)):
            reason = "secure aggregation halted" if result is None else "dropped out of SecAgg+"
            log.warning("round %d: client %d left out: %s", server_round, cid, reason)
            self.rejected.append({"round": server_round, "client": cid, "reason": reason})
        if result is None or len(survivors) < self.cfg.flower.min_replies:
            raise RoundFailed(
                f"round {server_round}: {len(survivors)} client(s) of {len(clients)} in the "
                f"secure sum, flower.min_replies={self.cfg.flower.min_replies}"
            )
        record = secure_sum_record(result.layout, result.total, len(survivors))
        lost = sum(result.down.get(self.node_of[c], 0) for c in set(clients) - set(survivors))
        for i, cid in enumerate(survivors):
            node = self.node_of[cid]
            down = result.down.get(node, 0) + (lost if i == 0 else 0)
            reply = Reply(cid, {SECURE_SUM: record}, {}, 1.0)
            yield Delivery(reply, down, result.up.get(node, 0))

    def client_models(self, server: Records, server_round: int) -> Callable[[int], Arrays]:
        """Every client's personalized model, fetched from the clients in one exchange."""
        clients = sorted(self.node_of)
        messages = {i: self.algorithm.configure(server, i, server_round + 1) for i in clients}
        cache: dict[int, Any] = {}
        contents = {
            i: self.content(wire.EVALUATE, server_round, i, m, mode="weights", cache=cache)
            for i, m in messages.items()
        }
        answers = self.send(wire.EVALUATE, contents, f"eval-{server_round}")
        models: dict[int, Arrays] = {}
        for i in clients:
            answer = answers.get(i)
            if answer is None or answer.has_error():
                why = "no reply" if answer is None else answer.error.reason
                raise RuntimeError(
                    f"round {server_round}: client {i} did not return its model ({why})"
                )
            sent = messages[i]
            info = answer.content.config_records[wire.INFO]
            kept = {
                k: src.split("/", 1)
                for k, src in zip(
                    _strings(info, "from_message"), _strings(info, "sources"), strict=True
                )
            }
            changed = wire.from_record(
                answer.content.array_records[wire.SCORES], self.cfg.train.device
            )
            model = {**{k: sent[rec][name] for k, (rec, name) in kept.items()}, **changed}
            reason = self.validator.check_one({MODEL: model}, {}, {})
            expected = {k.split("/", 1)[1] for k in self.validator.model}
            if reason is None and model.keys() != expected:
                reason = f"its model lacks {sorted(expected - model.keys())[:3]}"
            if reason is not None:
                raise RuntimeError(f"round {server_round}: client {i}'s model is invalid: {reason}")
            models[i] = model
        return models.__getitem__

    def close(self) -> None:
        """Nothing to release: the Flower session (or the deployment) owns the nodes."""

    def summary(self) -> dict[str, Any]:
        per_round: dict[int, int] = {}
        for r in self.rejected:
            per_round[r["round"]] = per_round.get(r["round"], 0) + 1
        return {
            "flower": {
                "rejected": len(self.rejected),
                "rejected_per_round": per_round,
                "rejections": self.rejected[:100],
                "startup_s": self.startup_s,
            }
        }
