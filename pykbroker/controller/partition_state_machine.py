"""The active controller's partition state changes, written to ZooKeeper fenced by its epoch
(Kafka's ZkPartitionStateMachine).

Every write is a multi that starts with check(/controller_epoch, <version we wrote>), so a controller
that lost its election cannot change anything; partition states are also written conditional on
their version, and a conflicting write (a leader's ISR change) makes the controller re-read that state
and compute it again.  The leader elections it applies (new partitions, offline leaders and replicas,
unclean election when allowed, controlled shutdown, preferred and unclean elections asked for) are
:mod:`.election`'s rules; :class:`~pykbroker.controller.controller.ZkController` decides when.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError, RuntimeInconsistency
from kazoo.protocol.states import WatchedEvent

from pykbroker.config import BrokerConfig
from pykbroker.controller import election
from pykbroker.controller.context import ControllerContext, TopicPartition
from pykbroker.metadata import zk_layout as zl
from pykbroker.metadata.zk_layout import PartitionState

__all__ = ["MAX_MULTI_OPS", "MAX_WRITE_ROUNDS", "ControllerMoved", "MultiFailed", "NotActive",
           "PartitionStateMachine", "ZkOp"]

log = logging.getLogger("pykbroker.controller")

MAX_MULTI_OPS = 200  # ops per ZooKeeper multi (the epoch check included)
MAX_WRITE_ROUNDS = 20  # conflicting-write retries per batch
UNCLEAN_KEY = "unclean.leader.election.enable"


class ControllerMoved(Exception):
    """Our epoch check failed: another controller was elected since (we are a zombie)."""


class NotActive(Exception):
    """The session was suspended or lost while an event was being handled: stop quietly."""


class MultiFailed(Exception):
    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(f"op {index}: {error!r}")
        self.index = index
        self.error = error


@dataclass(frozen=True)
class ZkOp:
    kind: str  # create | set | delete | check
    path: str
    data: bytes = b""
    version: int = -1
    ephemeral: bool = False


def _bool(value: object) -> bool:
    return str(value).strip().lower() == "true"


class PartitionStateMachine:
    """The controller's ZooKeeper calls (event thread only) and the partition states it writes."""

    def __init__(self, zk: KazooClient, broker_id: int, config: BrokerConfig) -> None:
        self._zk = zk
        self.broker_id = broker_id
        self._config = config
        self._timeout = max(1.0, config["zookeeper.session.timeout.ms"] / 1000)
        self._active = False
        self._ctx = ControllerContext()

    # --- ZooKeeper helpers (event thread only) ------------------------------------------------

    def _wait(self, result: Any) -> Any:
        return result.get(timeout=self._timeout)

    def _get(self, path: str, watch: Callable[[WatchedEvent], None] | None = None) -> tuple[bytes, Any]:
        data, stat = self._wait(self._zk.get_async(path, watch=watch))
        return data, stat

    def _children(self, path: str, watch: Callable[[WatchedEvent], None] | None = None) -> list[str]:
        return list(self._wait(self._zk.get_children_async(path, watch=watch)))

    def _exists(self, path: str, watch: Callable[[WatchedEvent], None] | None = None) -> Any:
        return self._wait(self._zk.exists_async(path, watch=watch))

    def _get_many(self, paths: list[str]) -> dict[str, tuple[bytes, Any] | None]:
        """Pipelined reads; None for a missing znode."""
        pending = [(p, self._zk.get_async(p)) for p in paths]
        out: dict[str, tuple[bytes, Any] | None] = {}
        for path, res in pending:
            try:
                out[path] = self._wait(res)
            except NoNodeError:
                out[path] = None
        return out

    def _multi(self, ops: list[ZkOp]) -> list[Any]:
        """One fenced multi: check(/controller_epoch) and then ``ops``; results of ``ops``.

        Raises ControllerMoved when the epoch check fails, MultiFailed(index into ops) otherwise.
        """
        if not self._active or self._ctx.epoch_zk_version < 0:
            raise NotActive()
        t = self._zk.transaction()
        t.check(zl.CONTROLLER_EPOCH, self._ctx.epoch_zk_version)
        for op in ops:
            if op.kind == "create":
                t.create(op.path, op.data, ephemeral=op.ephemeral)
            elif op.kind == "set":
                t.set_data(op.path, op.data, version=op.version)
            elif op.kind == "delete":
                t.delete(op.path, version=op.version)
            else:
                t.check(op.path, op.version)
        results = self._wait(t.commit_async())
        for i, r in enumerate(results):
            if isinstance(r, Exception) and not isinstance(r, RolledBackError | RuntimeInconsistency):
                if i == 0:
                    raise ControllerMoved(f"/controller_epoch check failed: {r!r}")
                raise MultiFailed(i - 1, r)
        return list(results[1:])

    def _refresh_states(self, tps: Iterable[TopicPartition]) -> None:
        tps = [tp for tp in tps if tp[0] in self._ctx.topics]
        reads = self._get_many([zl.partition_state_path(t, p) for t, p in tps])
        for t, p in tps:
            got = reads[zl.partition_state_path(t, p)]
            if got is None:
                self._ctx.states.pop((t, p), None)
                continue
            try:
                self._ctx.states[(t, p)] = zl.decode_partition_state(got[0], int(got[1].version))
            except (ValueError, KeyError, TypeError) as e:
                log.error("%(topic)s-%(partition)d: unreadable state znode (%(error)r)",
                          {"topic": t, "partition": p, "error": e})

    # --- partition state writes ---------------------------------------------------------------

    def _next_state(self, state: PartitionState, leader: int, isr: list[int]) -> PartitionState:
        """Every leader or ISR change the controller makes bumps the leader epoch."""
        return replace(state, leader=leader, isr=list(isr), leader_epoch=state.leader_epoch + 1,
                       controller_epoch=self._ctx.epoch)

    def _write_states(self, compute: dict[TopicPartition, Callable[[PartitionState | None], PartitionState | None]],
                      reason: str) -> int:
        """Write the new state ``compute`` gives each partition (None: leave it), in fenced multis.

        A conflicting write (a leader's ISR change) makes us re-read that state and compute again.
        Returns how many states were written.
        """
        planned: dict[TopicPartition, PartitionState] = {}
        for tp, fn in compute.items():
            new = fn(self._ctx.states.get(tp))
            if new is not None:
                planned[tp] = new
        existing_parents: dict[str, set[int] | None] = {}  # topic -> partition znodes that exist
        written = 0
        items = collections.deque(planned.items())
        while items:
            batch: list[tuple[TopicPartition, PartitionState]] = []
            ops: list[ZkOp] = []
            owners: list[TopicPartition] = []
            while items and len(ops) < MAX_MULTI_OPS - 4:
                tp, new = items.popleft()
                group = self._state_ops(tp, new, existing_parents)
                batch.append((tp, new))
                ops.extend(group)
                owners.extend([tp] * len(group))
            written += self._commit_states(batch, ops, owners, compute, existing_parents, reason)
        return written

    def _state_ops(self, tp: TopicPartition, new: PartitionState,
                   existing_parents: dict[str, set[int] | None]) -> list[ZkOp]:
        topic, p = tp
        data = zl.encode_partition_state(new)
        current = self._ctx.states.get(tp)
        if current is not None:
            return [ZkOp("set", zl.partition_state_path(topic, p), data, current.zk_version)]
        if topic not in existing_parents:
            try:
                existing_parents[topic] = {int(c) for c in self._children(zl.partitions_path(topic)) if c.isdigit()}
            except NoNodeError:
                existing_parents[topic] = None
        ops = []
        parts = existing_parents[topic]
        if parts is None:
            ops.append(ZkOp("create", zl.partitions_path(topic)))
            parts = existing_parents[topic] = set()
        if p not in parts:
            ops.append(ZkOp("create", zl.partition_path(topic, p)))
            parts.add(p)
        ops.append(ZkOp("create", zl.partition_state_path(topic, p), data))
        return ops

    def _commit_states(self, batch: list[tuple[TopicPartition, PartitionState]], ops: list[ZkOp],
                       owners: list[TopicPartition],
                       compute: dict[TopicPartition, Callable[[PartitionState | None], PartitionState | None]],
                       existing_parents: dict[str, set[int] | None], reason: str) -> int:
        for _ in range(MAX_WRITE_ROUNDS):
            if not batch:
                return 0
            try:
                results = self._multi(ops)
            except MultiFailed as f:
                tp = owners[f.index]
                op = ops[f.index]
                log.debug("%(topic)s-%(partition)d: %(operation)s of %(path)s failed (%(error)r): re-reading and "
                          "computing again",
                          {"topic": tp[0], "partition": tp[1], "operation": op.kind, "path": op.path, "error": f.error})
                if isinstance(f.error, NodeExistsError) and not op.path.endswith("/state"):
                    existing_parents.pop(tp[0], None)  # a parent we thought missing exists: list again
                elif isinstance(f.error, BadVersionError | NodeExistsError):
                    self._refresh_states([tp])
                elif isinstance(f.error, NoNodeError):
                    self._ctx.states.pop(tp, None)
                    compute = {**compute, tp: lambda _s: None}  # the topic went away meanwhile
                else:
                    raise f.error from None
                for btp, _new in batch:  # parents listed as created by the rolled-back multi: list again
                    if self._ctx.states.get(btp) is None:
                        existing_parents.pop(btp[0], None)
                # Recompute the batch from the refreshed context and rebuild its ops.
                rebuilt: list[tuple[TopicPartition, PartitionState]] = []
                for btp, _old in batch:
                    new = compute[btp](self._ctx.states.get(btp))
                    if new is not None:
                        rebuilt.append((btp, new))
                batch, ops, owners = rebuilt, [], []
                for btp, new in batch:
                    group = self._state_ops(btp, new, existing_parents)
                    ops.extend(group)
                    owners.extend([btp] * len(group))
                continue
            versions: dict[TopicPartition, int] = {}
            for op, owner, r in zip(ops, owners, results, strict=True):
                if op.path.endswith("/state"):
                    versions[owner] = int(r.version) if op.kind == "set" else 0
            created = 0
            for tp, new in batch:
                old = self._ctx.states.get(tp)
                stored = replace(new, zk_version=versions[tp])
                self._ctx.states[tp] = stored
                self._log_change(tp, old, stored, reason)
                created += old is None
            if created:
                log.info("controller %(broker_id)d epoch %(controller_epoch)d: initialized %(created)d partition "
                         "states (%(reason)s)",
                         {"broker_id": self.broker_id, "controller_epoch": self._ctx.epoch, "created": created,
                          "reason": reason})
            return len(batch)
        log.warning("controller %(broker_id)d: gave up writing %(batch)d partition states (%(reason)s) after "
                    "%(max_write_rounds)d conflicting rounds",
                    {"broker_id": self.broker_id, "batch": len(batch), "reason": reason,
                     "max_write_rounds": MAX_WRITE_ROUNDS})
        return 0

    def _log_change(self, tp: TopicPartition, old: PartitionState | None, new: PartitionState, reason: str) -> None:
        if old is None:  # one summary line per batch at INFO
            log.debug("%(topic)s-%(partition)d: initial leader %(leader)d, leader epoch %(leader_epoch)d, isr "
                      "%(isr)s (%(reason)s)",
                      {"topic": tp[0], "partition": tp[1], "leader": new.leader, "leader_epoch": new.leader_epoch,
                       "isr": new.isr, "reason": reason})
        elif old.leader != new.leader:
            log.info("%(topic)s-%(partition)d: leader %(old_leader)d -> %(leader)d, leader epoch %(leader_epoch)d, "
                     "isr %(isr)s (%(reason)s)",
                     {"topic": tp[0], "partition": tp[1], "old_leader": old.leader, "leader": new.leader,
                      "leader_epoch": new.leader_epoch, "isr": new.isr, "reason": reason})
        else:
            log.info("%(topic)s-%(partition)d: leader %(leader)d, leader epoch %(leader_epoch)d, isr %(old_isr)s -> "
                     "%(isr)s (%(reason)s)",
                     {"topic": tp[0], "partition": tp[1], "leader": new.leader, "leader_epoch": new.leader_epoch,
                      "old_isr": old.isr, "isr": new.isr, "reason": reason})

    # --- reconciliation: new partitions, offline leaders, offline replicas --------------------

    def _unclean_allowed(self, topic: str, cache: dict[str, bool]) -> bool:
        """unclean.leader.election.enable: the topic's config, else the dynamic broker config, else ours."""
        if topic in cache:
            return cache[topic]
        value: object = None
        for path in (zl.topic_config_path(topic), f"/config/brokers/{self.broker_id}",
                     f"/config/brokers/{zl.DEFAULT_BROKER_ENTITY}"):
            try:
                value = zl.decode_entity_config(self._get(path)[0]).get(UNCLEAN_KEY)
            except (NoNodeError, ValueError, AttributeError):
                value = None
            if value is not None:
                break
        allowed = _bool(value) if value is not None else bool(self._config[UNCLEAN_KEY])
        cache[topic] = allowed
        return allowed

    def _reconcile(self, tps: Iterable[TopicPartition], reason: str, live: set[int] | None = None) -> int:
        """Initialize new partitions, elect leaders for partitions without a live one, drop replicas that are
        down (and replicas no longer assigned) from ISRs.

        Brokers in controlled shutdown count as live (their partitions are not offline) but are not
        elected and do not join a new leader's ISR, as in Kafka.
        """
        live_now = set(self._ctx.live_brokers) if live is None else live
        online_now = live_now - self._ctx.shutting_down
        unclean: dict[str, bool] = {}

        def compute(tp: TopicPartition) -> Callable[[PartitionState | None], PartitionState | None]:
            def fn(state: PartitionState | None) -> PartitionState | None:
                replicas = self._ctx.replicas(tp)
                if not replicas or tp[0] in self._ctx.deleting:
                    return None
                if state is None:
                    live = [b for b in replicas if b in online_now]
                    if not live:
                        log.warning("%(topic)s-%(partition)d: no assigned replica is alive (replicas %(replicas)s, "
                                    "live brokers %(online_now)s); it stays offline until one is",
                                    {"topic": tp[0], "partition": tp[1], "replicas": replicas,
                                     "online_now": sorted(online_now)})
                        return None
                    return PartitionState(live[0], 0, live, self._ctx.epoch)
                leader = state.leader if state.leader in replicas else election.NO_LEADER
                isr = [b for b in state.isr if b in replicas] or list(state.isr)
                result = election.on_replicas_offline(replicas, leader, isr, live_now, False, online_now)
                # Still leaderless (None: already so, e.g. an out-of-ISR replica just came back): unclean
                # election if the topic allows it.
                leaderless = (leader if result is None else result.leader) == election.NO_LEADER
                if leaderless and any(b in online_now for b in replicas) and self._unclean_allowed(tp[0], unclean):
                    result = election.on_replicas_offline(replicas, leader, isr, live_now, True, online_now)
                    if result is not None and result.leader != election.NO_LEADER:
                        log.warning("%(topic)s-%(partition)d: unclean leader election of %(leader)d (isr was %(isr)s)",
                                    {"topic": tp[0], "partition": tp[1], "leader": result.leader, "isr": state.isr})
                if result is None:
                    result = election.LeaderAndIsr(leader, isr)
                if result.leader == state.leader and result.isr == state.isr:
                    return None
                return self._next_state(state, result.leader, result.isr)
            return fn

        return self._write_states({tp: compute(tp) for tp in tps}, reason)

    # --- elections asked for: controlled shutdown, preferred and unclean ------------------------

    def _controlled_shutdown(self, broker: int, only: list[TopicPartition] | None = None) -> None:
        """Move ``broker``'s leaderships to other ISR members and take it out of the ISRs it follows."""
        tps = only if only is not None else self._ctx.partitions_on(broker)
        live = set(self._ctx.live_brokers)

        def compute(tp: TopicPartition) -> Callable[[PartitionState | None], PartitionState | None]:
            def fn(state: PartitionState | None) -> PartitionState | None:
                replicas = self._ctx.replicas(tp)
                if state is None or len(replicas) <= 1 or broker not in self._ctx.shutting_down:
                    return None
                if state.leader == broker:
                    e = election.elect_controlled_shutdown(replicas, state.isr, live, self._ctx.shutting_down)
                    return None if e is None else self._next_state(state, e.leader, e.isr)
                if broker in state.isr:
                    r = election.remove_from_isr(state.leader, state.isr, {broker})
                    return None if r.isr == state.isr else self._next_state(state, r.leader, r.isr)
                return None
            return fn

        self._write_states({tp: compute(tp) for tp in tps}, f"controlled shutdown of broker {broker}")

    def _run_election(self, election_type: int, tps: list[TopicPartition] | None, reason: str) -> int:
        """Preferred (0) or unclean (1) elections; None means every partition, as ElectLeaders."""
        known = set(self._ctx.partitions())
        targets = [tp for tp in (self._ctx.partitions() if tps is None else tps) if tp in known]
        online = self._ctx.online()

        def fn_for(tp: TopicPartition) -> Callable[[PartitionState | None], PartitionState | None]:
            def fn(state: PartitionState | None) -> PartitionState | None:
                if state is None:
                    return None
                replicas = self._ctx.replicas(tp)
                if election_type == 1:
                    if state.leader in self._ctx.live_brokers:
                        return None
                    e = election.elect_offline(replicas, state.isr, online, True)
                else:
                    if replicas[:1] == [state.leader]:
                        return None
                    e = election.elect_preferred(replicas, state.isr, online)
                return None if e is None else self._next_state(state, e.leader, e.isr)
            return fn

        return self._write_states({tp: fn_for(tp) for tp in targets}, reason)
