"""The round loop: one loop for every engine, composed from a transport and an evaluation.

Per round: sample clients (a fixed stream per round), hand the server state to the
transport, which configures each client's message, obtains the replies (training here, in
worker processes, or over Flower) and yields them lazily; `aggregate` consumes them and
returns the new server state and its own metrics; every `eval.every` rounds the evaluation
mode scores the models; a record goes to `metrics.jsonl`; and, where the transport keeps the
client states in this process, a checkpoint is written as `train.checkpoint_every` says
(`checkpoint_due`: by default, by time). The loop owns sampling, byte counts,
timing, the history and the summary; the transport owns where clients run and their states.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from typing import Any, Protocol

from protofed.core.results import RoundInfo, RoundRecord, RoundScores, Summary, Traffic
from protofed.core.seeding import sample_clients
from protofed.core.types import Arrays, Checked, Delivery, Records, Reply, check_result
from protofed.privacy import Private
from protofed.privacy.entropy import private_sample
from protofed.runs import RunDir
from protofed.runtime.fingerprint import fingerprint, states_fault
from protofed.runtime.kept_prototypes import keep, keeps
from protofed.runtime.nonfinite import nonfinite
from protofed.runtime.prepare import Prepared, clients_per_round
from protofed.runtime.provenance import begin_session, end_session
from protofed.runtime.summary import Progress, build_summary, chance_warnings
from protofed.runtime.timing import RoundClock

log = logging.getLogger("protofed")


class Diverged(Exception):
    """A reply or the server state holds NaN or infinity: the run cannot go on."""


CHECKPOINT_SHARE = 0.02
"""`train.checkpoint_every=auto`: the most of a run's time its checkpoints may take."""


def checkpoint_due(
    every: int | str, server_round: int, rounds: int, since_s: float, last_write_s: float | None
) -> bool:
    """Whether to write the checkpoint after `server_round` (of `rounds`).

    `every` N: every N-th round. auto: once `since_s`, the time since the last checkpoint
    (or since the session began), is at least (1 - s) / s = 49 times what the last one
    took to write (`last_write_s`; None before the session's first, which is then written:
    it measures the cost), so writing takes at most s = 2 % of the run; a kill loses at
    most those 49 writes' worth of work plus the round in progress. The last round is
    always written (a resume of a complete run finds it).
    """
    if server_round == rounds:
        return True
    if every != "auto":
        return server_round % int(every) == 0
    if last_write_s is None:
        return True
    return since_s >= last_write_s * (1 - CHECKPOINT_SHARE) / CHECKPOINT_SHARE


OnRound = Callable[[int, RoundInfo, "RoundRecord | None"], None]
"""Called after every round with (round, what its training gave, its record if evaluated)."""


class Transport(Protocol):
    """How a round's messages reach the clients and their replies come back."""

    @property
    def name(self) -> str:
        """The engine's name in the summary."""
        ...

    @property
    def states(self) -> dict[int, Records] | None:
        """Client states kept here (checkpointed), or None."""
        ...

    @property
    def trained(self) -> dict[int, Arrays] | None:
        """Each client's model after its last training, kept here (eval.client_model=trained,
        checkpointed beside the states), or None (not kept, or kept on the clients)."""
        ...

    def fit(self, server: Records, server_round: int, clients: list[int]) -> Iterator[Delivery]:
        """Each client's reply with the bytes each way, lazily; rejected replies left out."""
        ...

    def client_models(self, server: Records, server_round: int) -> Callable[[int], Arrays]: ...

    def close(self) -> None: ...


class Evaluation(Protocol):
    """How a round is scored: on the server's data, or by the clients themselves."""

    def evaluate(self, server: Records, server_round: int) -> RoundScores: ...


class RoundLoop:
    """Runs an experiment's rounds; everything it needs comes through its constructor."""

    def __init__(
        self,
        prepared: Prepared,
        transport: Transport,
        evaluation: Evaluation,
        run_dir: RunDir | None = None,
        population: list[int] | None = None,
        summary_extra: Callable[[], dict[str, object]] | None = None,
    ) -> None:
        """`population`: the client ids that can be sampled (default: every client of the
        data but the unseen ones, `Prepared.training`); the sampling stream draws positions
        in it. `summary_extra`: the transport's own summary entries (Flower's rejected
        replies)."""
        self.prepared = prepared
        self.cfg = prepared.cfg
        self.algorithm = prepared.algorithm
        self.transport = transport
        self.evaluation = evaluation
        self.run_dir = run_dir
        self.population = population if population is not None else prepared.training
        self.summary_extra = summary_extra
        self.server: Records = self.algorithm.init_server()
        self._starting_names = {record: list(arrays) for record, arrays in self.server.items()}
        self.progress = Progress()
        self.history: list[RoundRecord] = []
        self._fingerprint: dict[str, Any] | None = None
        # when the last checkpoint of this session was written, and what writing it took
        self._last_checkpoint: tuple[float, float | None] = (time.perf_counter(), None)
        self.checkpointed_round: int | None = None  # the last this session wrote, if any

    # state ------------------------------------------------------------------------------
    @property
    def num_clients(self) -> int:
        return len(self.population)

    @property
    def checkpoints(self) -> bool:
        """A run can resume only where its client states live in this process."""
        return self.transport.states is not None

    def client_state(self, client: int) -> Records:
        states = self.transport.states
        return {} if states is None else states.get(client, {})

    def per_round(self) -> int:
        return clients_per_round(self.cfg.train, self.num_clients)

    def checkpoint(self) -> dict[str, Any]:
        assert self.transport.states is not None, "the transport keeps no client states"
        assert self.run_dir is not None, "a checkpoint belongs to a run directory"
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.prepared)
            if self.run_dir.partition_sha256 is not None:  # what a resume verifies it by
                self._fingerprint["partition"] = self.run_dir.partition_sha256
        trained = self.transport.trained or {}
        state = {
            "progress": asdict(self.progress),
            "server": self.server,
            "clients": {str(i): s for i, s in self.transport.states.items()},
            # tensors shared with the states (Local's model) are saved once by torch.save
            "trained": {str(i): m for i, m in trained.items()},
            "fingerprint": self._fingerprint,
            "metrics": self.run_dir.metrics_position(),
        }
        # what a resume will check, checked now: a plugin that breaks the contract fails in
        # its first round, not at a resume hours later
        if fault := states_fault(state, self._starting_names, self.algorithm.setting.init_model):
            raise TypeError(
                f"{self.algorithm.name}: its state breaks the checkpoint contract "
                f"(docs/architecture.md, Adding an algorithm): {fault}"
            )
        return state

    def restore(self, ckpt: dict[str, Any]) -> None:
        assert self.transport.states is not None, "the transport keeps no client states"
        prog = ckpt["progress"]
        self.progress = Progress(**{k: prog[k] for k in asdict(Progress()) if k in prog})
        self.server = ckpt["server"]
        self.transport.states.clear()
        self.transport.states.update({int(i): s for i, s in ckpt["clients"].items()})
        if self.transport.trained is not None:
            self.transport.trained.clear()
            self.transport.trained.update({int(i): m for i, m in ckpt.get("trained", {}).items()})

    # one round --------------------------------------------------------------------------
    def sample(self, server_round: int) -> list[int]:
        """The round's clients: m of N, or each with probability m / N where the privacy
        accountant counts on Poisson sampling (`privacy.sampling=poisson`). A private run
        draws them from the operating system's entropy (privacy/entropy.py): a sample that
        the config replays would void the accountant's credit for sampling."""
        seed, population = self.cfg.seed, self.num_clients
        privacy = self.cfg.privacy
        if privacy.enabled:
            secure, poisson = privacy.noise == "secure", privacy.sampling == "poisson"
            count = self.per_round()
            picked = private_sample(secure, poisson, seed, server_round, population, count)
        else:
            picked = sample_clients(seed, server_round, population, self.per_round())
        return [self.population[i] for i in picked]

    def accepts(self, reply: Reply, server_round: int, check: Checked | None = None) -> bool:
        """The guard: whether `reply`'s records and metrics are finite (the records' verdict
        is `check`'s where the transport checked them where they were made). A reply that
        is not stops the run (`Diverged`), or is left out and counted
        (`train.on_nonfinite=drop`)."""
        bad = nonfinite(reply.records) if check is None else check.bad
        if bad is None and not all(map(math.isfinite, reply.metrics.values())):
            bad = "its metrics"
        if bad is None:
            return True
        what = f"round {server_round}: client {reply.client}'s reply has NaN or inf in {bad}"
        if self.cfg.train.on_nonfinite != "drop":
            raise Diverged(f"{what} (train.on_nonfinite=drop leaves such replies out)")
        log.warning("%s: left out of the round", what)
        self.progress.dropped_nonfinite += 1
        if self.transport.trained is not None:  # nor scored with that model
            self.transport.trained.pop(reply.client, None)
        return False

    def run_round(self, server_round: int) -> RoundInfo:
        """One round. Its time in this process, split: waiting for and receiving the replies
        (`train_s`; with workers they train meanwhile, also while this process aggregates),
        the guard's checks (`guard_s`: of the replies, where they were made, at their share
        of the wall clock, and of the new server state here) and the rest, the algorithm's
        `aggregate` (`aggregate_s`); the replies are a lazy stream that `aggregate` consumes."""
        clients = self.sample(server_round)
        clock = RoundClock()
        losses: list[tuple[float, float]] = []

        def replies() -> Iterator[Reply]:
            accepted = 0
            clock.wait()
            for reply, down, up, check in self.transport.fit(self.server, server_round, clients):
                clock.received(check)
                self.progress.down_bytes += down
                self.progress.up_bytes += up
                self.progress.client_updates += 1
                finite = self.accepts(reply, server_round, check)
                clock.checked()
                if not finite:
                    continue
                accepted += 1
                if "loss" in reply.metrics:
                    losses.append((reply.metrics["loss"], reply.num_examples))
                yield reply
                clock.wait()
            if accepted == 0 and clients:
                raise Diverged(f"round {server_round}: every reply had NaN or inf values")

        stream = replies()
        result = self.algorithm.aggregate(self.server, stream, server_round)
        check_result(result, "aggregate", type(self.algorithm).__name__)
        for _ in stream:  # every sampled client trains, even if aggregate stopped reading
            pass
        clock.aggregated()
        bad = nonfinite(result.server)
        if bad is not None:
            raise Diverged(
                f"round {server_round}: the aggregated server state has NaN or inf in {bad}"
            )
        self.server = result.server
        clock.stop()
        self.progress.train_s += clock.train_s
        self.progress.guard_s += clock.guard_s
        self.progress.aggregate_s += clock.aggregate_s
        self.progress.server_round = server_round
        weight = sum(w for _, w in losses)
        return RoundInfo(
            clients=clients,
            train_loss=sum(v * w for v, w in losses) / weight if weight else None,
            train_s=clock.train_s,
            guard_s=clock.guard_s,
            aggregate_s=clock.aggregate_s,
            server=dict(result.metrics),
        )

    def evaluate(self, server_round: int) -> RoundScores:
        t0 = time.perf_counter()
        scores = self.evaluation.evaluate(self.server, server_round)
        dt = time.perf_counter() - t0
        self.progress.eval_s += dt
        return replace(scores, eval_s=dt)

    def record(self, server_round: int, info: RoundInfo, scores: RoundScores) -> RoundRecord:
        """The round's line of metrics.jsonl (the same in memory and on disk)."""
        traffic = Traffic(up_bytes=self.progress.up_bytes, down_bytes=self.progress.down_bytes)
        return RoundRecord.of(info, scores, server_round, traffic)

    # the loop ---------------------------------------------------------------------------
    def run(self, on_round: OnRound | None = None) -> Summary:
        """Every remaining round, then the summary (written to the run directory, if any).

        A run that diverges (NaN or infinity in a reply or the server state) stops at once;
        its summary has `status: diverged` and the reason. provenance.json records the
        session (its start, and its end and outcome however it ends).
        """
        began, summary = False, None
        try:
            if self.run_dir is not None:
                data, device = self.prepared.data_files, self.cfg.train.device
                begin_session(self.run_dir, data, device, self.transport.name)
                began = True
            summary = self._rounds(on_round)
            return summary
        finally:
            self.transport.close()
            if self.run_dir is not None:
                try:
                    if began:
                        end_session(self.run_dir, summary)
                finally:
                    self.run_dir.unlock()

    def _rounds(self, on_round: OnRound | None) -> Summary:
        cfg = self.cfg
        t_start = time.perf_counter()
        self._last_checkpoint = (t_start, None)
        p = self.progress
        total_before = p.train_s + p.guard_s + p.aggregate_s + p.eval_s + p.checkpoint_s
        for r in range(self.progress.server_round + 1, cfg.train.rounds + 1):
            try:
                info = self.run_round(r)
            except Diverged as exc:
                return self.finish(total_before + time.perf_counter() - t_start, str(exc))
            record = None
            if r % cfg.eval.every == 0 or r == cfg.train.rounds:
                record = self.record(r, info, self.evaluate(r))
                self.history.append(record)
                if self.run_dir is not None:
                    self.run_dir.append_metrics(record.to_json())
                    if keeps(cfg, r):  # for figures; reads the state, changes nothing
                        here = self.checkpoints  # client models built here, not fetched
                        models = self.transport.client_models(self.server, r) if here else None
                        keep(self.prepared, self.run_dir.path, self.server, r, models)
            self.maybe_checkpoint(r)
            if on_round is not None:
                on_round(r, info, record)
        return self.finish(total_before + time.perf_counter() - t_start)

    def maybe_checkpoint(self, server_round: int) -> None:
        """Write the checkpoint after `server_round` where `train.checkpoint_every` says so
        (`checkpoint_due`); its time goes to `Progress.checkpoint_s`."""
        if self.run_dir is None or not self.checkpoints:
            return
        now = time.perf_counter()
        train = self.cfg.train
        since = now - self._last_checkpoint[0]
        if not checkpoint_due(
            train.checkpoint_every, server_round, train.rounds, since, self._last_checkpoint[1]
        ):
            return
        self.run_dir.save_checkpoint(self.checkpoint())
        done = time.perf_counter()
        self.progress.checkpoint_s += done - now
        self._last_checkpoint = (done, done - now)
        self.checkpointed_round = server_round

    def finish(self, total_s: float, diverged: str | None = None) -> Summary:
        """The summary, written to the run directory (if any)."""
        summary = build_summary(
            self.cfg,
            self.history,
            self.progress,
            algorithm=self.algorithm.name,
            engine=self.transport.name,
            num_clients=self.num_clients,
            total_s=total_s,
            warnings=chance_warnings(self.history, self.prepared.fed, self.cfg.privacy.enabled),
            diverged=diverged,
            extra=self.summary_extra() if self.summary_extra is not None else None,
            privacy=(
                self.algorithm.guarantee(self.server, self.progress.server_round)
                if isinstance(self.algorithm, Private)
                else None
            ),
        )
        if self.run_dir is not None:
            self.run_dir.write_summary(summary.to_json())
        return summary
