"""Secure aggregation for `privacy.mode=central` on Flower: Flower's own SecAgg+, both sides.

With `privacy.secure_aggregation`, a round's training runs Flower's `SecAggPlusWorkflow`
(server) against Flower's `secaggplus_mod` (client) instead of collecting replies: each
client turns its clipped reply into one flat vector (`privacy.central.summand`: the update's
difference, its other records, a prototype table as dense means plus presence, adaptive
clipping's bit), the mod quantizes it and adds pairwise masks that cancel in the sum, and
the server unmasks only the sum. The server never holds an individual reply; it turns the
sum back into the privacy layer's sums (`privacy.central.sums_from`) and adds the Gaussian
noise there, as central mode says. What it still sees: which clients took part and
survived, the layout (record names and shapes, the same for every client), and the sum.

The four stages are Flower's own code; this module only feeds them: a legacy `Strategy`
whose `configure_fit` names the round's nodes and whose `aggregate_fit` keeps the unmasked
mean, the round's training messages put in place of the strategy's `FitIns` (so the node's
ClientApp trains exactly as without SecAgg+), and the Grid exchange that stops on Ctrl-C
and counts the bytes each node sends and receives.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_manager import ClientManager, SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState
from flwr.serverapp import Grid

MODULUS = 2**32
"""SecAgg+'s mask modulus (Flower's default and its maximum)."""
LAYOUT = "layout"
"""The key of a client's layout (JSON) among its FitRes metrics."""


def quantization_range(clients: int) -> int:
    """The quantization levels: Flower's 2**22, fewer where the round's sum of quantized
    values (each below the range, plus each client's weight factor) could wrap around the
    modulus."""
    room = MODULUS // (clients + 1)
    return int(min(2**22, 2 ** math.floor(math.log2(room))))


# the client side -----------------------------------------------------------------------------
def secagg_when_asked(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
    """Flower's `secaggplus_mod` for the messages of a SecAgg+ round, and only those: a
    training message without SecAgg+'s configs (a run without secure aggregation) goes
    straight to the ClientApp."""
    if RECORD_KEY_CONFIGS not in msg.content.config_records:
        return call_next(msg, ctxt)
    return secaggplus_mod(msg, ctxt, call_next)


def summand_content(layout: str, values: list[np.ndarray]) -> RecordDict:
    """A client's reply in a SecAgg+ round: its summand as the FitRes `secaggplus_mod`
    masks (the mod then clears the arrays, so only the masked vector leaves the node), the
    public example count 1 and the layout."""
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(values), 1, {LAYOUT: layout})
    return compat.fitres_to_recorddict(fitres, keep_input=True)


# the server side -----------------------------------------------------------------------------
def payload_bytes(content: RecordDict) -> int:
    """The bytes a message's records carry (arrays, config values, metrics)."""
    total = 0
    for record in content.values():
        if isinstance(record, ArrayRecord):
            total += sum(len(array.data) for array in record.values())
        elif isinstance(record, ConfigRecord | MetricRecord):
            for value in record.values():
                items = value if isinstance(value, list) else [value]
                for item in items:
                    total += len(item) if isinstance(item, bytes | str) else 8
    return total


@dataclass
class _Counting:
    """The Grid as SecAgg+'s stages use it (`send_and_receive`), through `exchange`, with
    the bytes each node was sent and sent back."""

    grid: Grid
    exchange: Callable[[Grid, list[Message], float | None], list[Message]]
    down: dict[int, int] = field(default_factory=dict)
    up: dict[int, int] = field(default_factory=dict)

    def send_and_receive(
        self, messages: list[Message], *, timeout: float | None = None
    ) -> list[Message]:
        for m in messages:
            node = m.metadata.dst_node_id
            self.down[node] = self.down.get(node, 0) + payload_bytes(m.content)
        replies = self.exchange(self.grid, messages, timeout)
        for r in replies:
            if not r.has_error():
                node = r.metadata.src_node_id
                self.up[node] = self.up.get(node, 0) + payload_bytes(r.content)
        return replies


class _SumOnly(Strategy):
    """The legacy strategy SecAgg+'s workflow asks: it trains the round's nodes and keeps
    the unmasked mean of their vectors (and which nodes it came from)."""

    def __init__(self, proxies: list[ClientProxy]) -> None:
        self.proxies = proxies
        self.mean: list[np.ndarray] | None = None
        self.survivors: list[int] = []
        self.layouts: set[str] = set()

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return None

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        return [(p, FitIns(Parameters([], ""), {})) for p in self.proxies]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        if results:
            self.mean = parameters_to_ndarrays(results[0][1].parameters)
        self.survivors = [cast(GridClientProxy, proxy).node_id for proxy, _ in results]
        self.layouts = {str(res.metrics.get(LAYOUT, "")) for _, res in results}
        return None, {}

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return []

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        return None, {}

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        return None


@dataclass
class SecureSum:
    """What one SecAgg+ round leaves the server: the sum of the survivors' vectors, their
    shared layout, the surviving nodes, and the bytes each node was sent and sent back."""

    total: np.ndarray
    layout: str
    survivors: list[int]
    down: dict[int, int]
    up: dict[int, int]


def secure_sum(
    grid: Grid,
    exchange: Callable[[Grid, list[Message], float | None], list[Message]],
    contents: dict[int, RecordDict],
    server_round: int,
    bound: float,
    threshold: float,
    timeout_s: float | None,
) -> SecureSum | None:
    """One round of SecAgg+ over `contents` (node id -> its training message); None when
    the protocol halted (too few nodes left to unmask: nothing is released)."""
    counting = _Counting(grid, exchange)
    proxies: list[ClientProxy] = [GridClientProxy(node, grid, 0) for node in contents]
    strategy = _SumOnly(proxies)
    state = RecordDict(
        {
            MAIN_CONFIGS_RECORD: ConfigRecord({WorkflowKey.CURRENT_ROUND: server_round}),
            MAIN_PARAMS_RECORD: ArrayRecord(),
        }
    )
    manager = SimpleClientManager()  # the round's nodes (Flower logs "sampled n out of n")
    for proxy in proxies:
        manager.register(proxy)
    context = LegacyContext(Context(0, 0, {}, state, {}), strategy=strategy, client_manager=manager)
    workflow = SecAggPlusWorkflow(
        num_shares=1.0,  # every other client of the round holds a share (SecAgg's graph)
        reconstruction_threshold=threshold,
        max_weight=1.0,  # each client weighs 1 (the public example count): the mean
        clipping_range=bound,
        quantization_range=quantization_range(len(contents)),
        modulus_range=MODULUS,
        timeout=timeout_s,
    )
    secagg_state = WorkflowState()
    on_grid = cast(Grid, counting)
    if not workflow.setup_stage(on_grid, context, secagg_state):
        return None
    # the stages would send each node the strategy's FitIns: the round's real messages instead
    secagg_state.nid_to_fitins = {node: contents[node] for node in secagg_state.nid_to_fitins}
    stages = (
        workflow.share_keys_stage,
        workflow.collect_masked_vectors_stage,
        workflow.unmask_stage,
    )
    for stage in stages:
        if not stage(on_grid, context, secagg_state):
            return None
    if strategy.mean is None or not strategy.survivors:
        return None
    if len(strategy.layouts) != 1:
        raise ValueError(
            f"round {server_round}: the clients' summands have {len(strategy.layouts)} "
            "different layouts; one sum needs one"
        )
    mean = np.concatenate([np.asarray(a, dtype=np.float64).reshape(-1) for a in strategy.mean])
    total = mean * len(strategy.survivors)
    if not np.isfinite(total).all():
        raise ValueError(f"round {server_round}: the secure sum is not finite")
    return SecureSum(total, strategy.layouts.pop(), strategy.survivors, counting.down, counting.up)
