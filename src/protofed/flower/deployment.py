"""The Flower engine deployed: the round loop of the ServerApp (`serverapp.py`).

`deploy` builds it: the server holds no data, learns the federation from the SuperNodes'
partition headers, samples among the clients present and has each client evaluate itself
(`ClientSideEvaluation`); the replies travel through the same `FlowerTransport` as in a
simulation.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from flwr.serverapp import Grid

from protofed.config import ExperimentConfig
from protofed.core.results import ClientScores, GlobalScores, RoundScores, finite
from protofed.core.types import Arrays, Records
from protofed.data.federated import SPLITS, ClientData, FederatedData
from protofed.errors import ConfigError
from protofed.evaluation import scores_from_counts, summarize
from protofed.flower import wire
from protofed.flower.settings import check_settings
from protofed.flower.transport import FlowerTransport, discover
from protofed.runtime import Prepared, RoundLoop, build_model_and_algorithm
from protofed.runtime.prepare import resolve_device

log = logging.getLogger("protofed.flower")

COUNT_KEYS = ("pers.test", "pers.val", "global.test")
"""What a client sends back from its evaluation: per-class counts (true positives, support,
predicted) of its personalized model on its test and validation splits, and of the global
model on its test split."""


def _empty(shape: tuple[int, ...], name: str, group: int | None) -> ClientData:
    x, y = torch.empty((0, *shape)), torch.empty(0, dtype=torch.long)
    return ClientData(name, group, *(t for _ in SPLITS for t in (x, y)))


class ClientSideEvaluation:
    """A deployment's evaluation: each client scores itself, the server adds per-class counts.

    Personalization and validation on each client's own splits, the global model on each
    client's test split; generalization needs every client's data in one place and is not
    reported.
    """

    def __init__(self, prepared: Prepared, transport: FlowerTransport, present: list[int]) -> None:
        self.prepared = prepared
        self.transport = transport
        self.present = present

    def evaluate(self, server: Records, server_round: int) -> RoundScores:
        global_model = self.prepared.algorithm.global_model(server)
        counts = self.client_counts(server, server_round, global_model)
        result = self.personal_scores(counts)
        if global_model is not None:
            result = replace(result, global_=self.global_score(counts["global.test"]))
        return result

    def missing_counts(self) -> np.ndarray:
        """The counts of a client that sent none: -1 everywhere."""
        return np.full((3, self.prepared.fed.num_classes), -1, dtype=np.int64)

    def client_counts(
        self, server: Records, server_round: int, global_model: Arrays | None
    ) -> dict[str, list[np.ndarray]]:
        """Each present client's counts, by `COUNT_KEYS`, in client order; a client that failed
        or sent malformed counts has rows of -1 (missing)."""
        algorithm = self.prepared.algorithm
        extra = {} if global_model is None else {wire.GLOBAL: wire.to_record(global_model)}
        cache: dict[int, Any] = {}
        contents = {
            cid: self.transport.content(
                wire.EVALUATE,
                server_round,
                cid,
                algorithm.configure(server, cid, server_round + 1),
                mode="scores",
                extra=extra,
                cache=cache,
            )
            for cid in self.present
        }
        answers = self.transport.send(wire.EVALUATE, contents, f"eval-{server_round}")
        c = self.prepared.fed.num_classes
        missing = self.missing_counts()
        counts: dict[str, list[np.ndarray]] = {key: [] for key in COUNT_KEYS}
        for cid in self.present:
            answer = answers.get(cid)
            got: Arrays = {}
            if answer is not None and not answer.has_error():
                try:
                    got = wire.from_record(answer.content.array_records[wire.SCORES])
                except (ValueError, KeyError) as err:
                    log.warning("round %d: client %d's scores rejected: %s", server_round, cid, err)
            elif answer is not None:
                log.warning(
                    "round %d: client %d failed to evaluate: %s",
                    server_round,
                    cid,
                    answer.error.reason,
                )
            for key in counts:
                value = got.get(key)
                ok = value is not None and tuple(value.shape) == (3, c) and bool((value >= 0).all())
                counts[key].append(value.numpy() if value is not None and ok else missing)
        return counts

    def personal_scores(self, counts: dict[str, list[np.ndarray]]) -> RoundScores:
        """The result without the global score: personalization and validation, per client
        and summarized (no generalization: no client holds the others' data)."""
        scores = {}
        rule = self.prepared.cfg.eval.f1_labels
        for key in ("pers.test", "pers.val"):
            stack = np.stack(counts[key]).astype(float)
            stack[stack < 0] = np.nan  # a client without scores counts as missing
            acc, f1 = scores_from_counts(stack[:, 0], stack[:, 1], stack[:, 2], rule)
            scores[key] = (acc, f1)
        (pers_acc, pers_f1), (val_acc, val_f1) = scores["pers.test"], scores["pers.val"]
        return RoundScores(
            personalization=summarize(pers_acc, pers_f1),
            generalization=None,
            val=summarize(val_acc, val_f1),
            global_=None,
            clients=ClientScores(
                pers_acc=[finite(v) for v in pers_acc.tolist()],
                pers_f1=[finite(v) for v in pers_f1.tolist()],
                gen_acc=[],
                gen_f1=[],
                val_acc=[finite(v) for v in val_acc.tolist()],
                val_f1=[finite(v) for v in val_f1.tolist()],
                client_ids=list(self.present),
            ),
        )

    def global_score(self, counts: list[np.ndarray]) -> GlobalScores | None:
        """The global model on the test splits of the clients that sent counts, pooled; None
        when none did."""
        rows = np.stack([g for g in counts if (g >= 0).all()] or [self.missing_counts()])
        if not (rows >= 0).all():
            return None
        rule = self.prepared.cfg.eval.f1_labels
        total = rows.sum(0)
        acc, f1 = scores_from_counts(total[None, 0], total[None, 1], total[None, 2], rule)
        _, per_client = scores_from_counts(rows[:, 0], rows[:, 1], rows[:, 2], rule)
        return GlobalScores(
            acc=finite(float(acc[0])),
            f1=finite(float(f1[0])),
            f1_std=finite(float(np.nanstd(per_client))),
        )


def deploy(
    cfg: ExperimentConfig, grid: Grid, nodes: int, wait_s: float
) -> tuple[RoundLoop, dict[str, Any]]:
    """The server of a deployed federation: no data, the clients present, client-side scores.

    Asks the nodes who they are, then builds the server side from their partition headers.
    Returns the round loop and the partition summary for the run directory.
    """
    if cfg.data.dynamic.enabled:
        raise ConfigError("data.dynamic needs every client's data in one process: simulation only")
    if cfg.eval.unseen_clients or cfg.eval.finetune_epochs:
        raise ConfigError(
            "eval.unseen_clients is not supported in a deployment (the server holds no data to "
            "score held-out clients on): simulation and the built-in engine only"
        )
    if cfg.privacy.enabled and not cfg.privacy.clear_evaluation:
        raise ConfigError(
            "privacy.clear_evaluation: a deployment's evaluation sends each client's per-class "
            "test and validation counts in the clear, outside epsilon; set "
            "privacy.clear_evaluation=true to accept that (epsilon then says so)"
        )
    if cfg.privacy.enabled and cfg.privacy.noise == "seeded":
        raise ConfigError(
            "privacy.noise: seeded noise can be regenerated by anyone who holds the config; a "
            "deployment draws it from each machine's secure entropy (set privacy.noise=secure)"
        )
    node_of, infos = discover(grid, wire.config_json(cfg), nodes, wait_s, cfg.flower.timeout_s)
    headers = {cid: info for cid, info in infos.items() if "federation" in info}
    if not headers:
        raise RuntimeError("no node holds a partition file (node-config partition=...)")
    fp = wire.data_fingerprint(cfg)
    ours = [info["federation"] for info in headers.values() if info["fingerprint"] == fp]
    if not ours:
        raise ConfigError(
            "no node holds a partition of this experiment (every one comes from another "
            "data config or seed)"
        )
    fed_header = ours[0]
    for cid, info in sorted(headers.items()):
        if info["fingerprint"] != fp or info["federation"] != fed_header:
            log.warning("client %d is left out: its partition comes from another experiment", cid)
            del headers[cid], node_of[cid]
    if len(headers) < cfg.flower.min_replies:
        raise ConfigError(
            f"flower.min_replies: {len(headers)} node(s) hold a partition of this experiment "
            f"after leaving out duplicate and foreign ones, {cfg.flower.min_replies} needed"
        )
    present = sorted(headers)
    device = resolve_device(cfg.train.device)
    shape = tuple(fed_header["input_shape"])
    fed = FederatedData(
        dataset=fed_header["dataset"],
        num_classes=fed_header["num_classes"],
        class_names=fed_header["class_names"],
        input_shape=shape,
        kind=fed_header["kind"],
        clients=[
            _empty(shape, headers[c]["entry"]["name"], headers[c]["entry"]["group"])
            for c in present
        ],
        counts=np.array(  # a private node sends none (clientapp.private_entry)
            [headers[c]["counts"] or [0] * fed_header["num_classes"] for c in present],
            dtype=np.int64,
        ),
        meta=fed_header["meta"],
    )
    model, algorithm = build_model_and_algorithm(
        cfg, shape, fed.num_classes, int(fed_header["num_clients"]), device
    )
    summary = {
        **fed_header,
        "clients": [headers[c]["entry"] for c in present],
        "counts": fed.counts.tolist(),
        "deployed_clients": present,
    }
    prepared = Prepared(cfg, fed, model, algorithm)
    transport = FlowerTransport(prepared, wire.config_json(cfg), "flower-deployment")
    transport.train_sizes = {  # a private node reports no size (and a constant count)
        c: int(headers[c]["entry"]["train"]) for c in present if "train" in headers[c]["entry"]
    }
    transport.attach(grid, {c: node_of[c] for c in present})
    loop = RoundLoop(
        prepared,
        transport,
        ClientSideEvaluation(prepared, transport, present),
        population=present,
        summary_extra=transport.summary,
    )
    check_settings(prepared, loop.per_round(), simulated=False)
    return loop, summary
