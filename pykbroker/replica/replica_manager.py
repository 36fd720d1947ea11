"""Partitions hosted by this broker: their logs, roles (leader or follower) and high watermarks.

With embedded metadata every partition is led here and the ISR is just us, so the high
watermark follows the log end offset.  In a cluster (after :meth:`ReplicaManager.set_cluster`)
the metadata store's changes make this broker leader or follower of each partition: a
leader learns its followers' progress from their fetches, moves the HW to the smallest LEO
over the ISR, adds followers that caught up to the ISR and drops those that lagged longer than
replica.lag.time.max.ms (conditional ZooKeeper writes through the ISR writer); a follower
fetches from its leader (pykbroker/replication/fetcher.py).  Client fetches wait for HW
movement, follower fetches for appends, acks=all produces for the HW.

A partition whose log dir failed is offline (Kafka's HostedPartition.Offline): it stays
known here so that produce, fetch and ListOffsets answer KAFKA_STORAGE_ERROR for it, and
Metadata shows it leaderless with this broker as an offline replica.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import anyio
import anyio.abc
from kio.schema.errors import ErrorCode

from pykbroker.logsetup import fields
from pykbroker.metadata.store import StaleState
from pykbroker.replication.fetcher import FetchSettings, ReplicaFetcherManager
from pykbroker.replication.rules import (
    FollowerState,
    can_join_isr,
    leader_high_watermark,
    out_of_sync_replicas,
)
from pykbroker.storage.log import KafkaStorageError, Log
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.log_manager import LogManager, LogMove

if TYPE_CHECKING:
    from pykbroker.config import BrokerConfig

log = logging.getLogger("pykbroker.replica")

TopicPartition = tuple[str, int]
# (topic, partition, leader_epoch, new ISR, state znode version) -> the new version; raises StaleState.
IsrWriter = Callable[[str, int, int, list[int], int], Awaitable[int]]


def lag_clock_ms() -> int:
    """The clock of followers' fetch and caught-up times (replica.lag.time.max.ms): monotonic, so a step of the
    wall clock neither drops every follower from the ISR nor keeps a dead one in it for the length of the step."""
    return time.monotonic_ns() // 1_000_000


@dataclass(eq=False)
class Partition:
    topic: str
    index: int
    log: Log
    leader_id: int
    leader_epoch: int = 0
    replicas: list[int] = field(default_factory=list)
    isr: list[int] = field(default_factory=list)
    high_watermark: int = 0
    # This broker's id (is_leader compares against it); the state znode version an ISR change
    # is conditional on; and, while leading, what each remote replica told us by fetching.
    local_id: int = -1
    zk_version: int = -1
    followers: dict[int, FollowerState] = field(default_factory=dict)
    isr_change_pending: bool = False
    leader_epoch_start_offset: int = 0  # our LEO when we became leader in this epoch

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.index)

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.local_id

    @property
    def offline(self) -> bool:
        """Its log dir failed: every request for it answers KAFKA_STORAGE_ERROR."""
        return self.log.offline

    @property
    def last_stable_offset(self) -> int:
        # The first offset of the oldest open transaction pins it, else the high watermark.
        first_unstable = self.log.first_unstable_offset()
        if first_unstable is None:
            return self.high_watermark
        return min(self.high_watermark, first_unstable)

    def maybe_advance_high_watermark(self) -> bool:
        """HW = the smallest LEO over the ISR; with the ISR being only this broker, the LEO.

        With followers in the ISR the HW only moves forward.
        """
        if len(self.isr) <= 1:
            new_hw = self.log.log_end_offset
            if new_hw != self.high_watermark:
                self.high_watermark = new_hw
                return True
            return False
        new_hw = leader_high_watermark(self.log.log_end_offset, self.isr, self.local_id, self.followers)
        if new_hw > self.high_watermark:
            self.high_watermark = new_hw
            return True
        return False

    def update_follower_fetch(self, replica_id: int, fetch_offset: int, log_start_offset: int, now_ms: int) -> None:
        """A follower fetched from ``fetch_offset``: it has everything below it."""
        st = self.followers.get(replica_id)
        if st is None:
            st = self.followers[replica_id] = FollowerState()
        st.on_fetch(fetch_offset, log_start_offset, self.log.log_end_offset, now_ms)

    def maybe_expand_isr(self, replica_id: int) -> list[int] | None:
        """The ISR with ``replica_id`` added if it just caught up (called on its fetch), else None.

        Only the fetching follower is considered: the last state of a dead one must not bring it back.
        """
        st = self.followers.get(replica_id)
        if (st is None or replica_id in self.isr or replica_id not in self.replicas
                or not can_join_isr(st, self.high_watermark, self.leader_epoch_start_offset)):
            return None
        return [*self.isr, replica_id]

    def maybe_shrink_isr(self, now_ms: int, lag_max_ms: int) -> list[int] | None:
        """The ISR without followers that lagged longer than ``lag_max_ms``, or None when all keep up."""
        out = out_of_sync_replicas(self.isr, self.local_id, self.followers, now_ms, lag_max_ms)
        if not out:
            return None
        return [r for r in self.isr if r not in out]

    def reset_followers(self, now_ms: int) -> None:
        """On becoming leader: followers in the ISR count as caught up now, the others never."""
        self.followers = {rid: FollowerState(last_caught_up_ms=now_ms if rid in self.isr else 0)
                          for rid in self.replicas if rid != self.local_id}


class Wakeable(Protocol):
    """What a waiter registers: ``anyio.Event`` (share fetches) or a long poll's own ``_Wake``."""

    def set(self) -> None: ...


class _Wake:
    """A long poll's wake-up: sets its future once (a notify, or the timer for False)."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[bool]) -> None:
        self.future = future

    def set(self, notified: bool = True) -> None:
        if not self.future.done():
            self.future.set_result(notified)


class FetchWaiters:
    """Long-poll fetches waiting for data on a set of partitions.

    A waiter registers a wake-up under each partition it reads; an append sets
    the wake-ups of that partition's waiters.  No polling loop.
    """

    def __init__(self) -> None:
        self._by_partition: dict[TopicPartition, set[Wakeable]] = {}
        # How many requests wait now (Kafka's purgatory size, for the metrics).
        self.waiting = 0

    def register(self, tps: Iterable[TopicPartition], event: Wakeable) -> None:
        for tp in tps:
            self._by_partition.setdefault(tp, set()).add(event)

    def unregister(self, tps: Iterable[TopicPartition], event: Wakeable) -> None:
        for tp in tps:
            waiters = self._by_partition.get(tp)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._by_partition[tp]

    async def wait(self, tps: list[TopicPartition], timeout_s: float) -> bool:
        """Until one of ``tps`` is notified or ``timeout_s`` passes; whether it was notified."""
        return await self.arm(tps).wait(timeout_s)

    def arm(self, tps: list[TopicPartition]) -> ArmedWait:
        """Register for ``tps`` now and await the wait later: a notify in between is not missed (a fetch
        parked after its read, while its connection's next request appends).  An armed wait that is never
        awaited leaves only its registration behind, which the partitions' next notify clears."""
        return ArmedWait(self, tps)

    def notify(self, tp: TopicPartition) -> None:
        waiters = self._by_partition.pop(tp, None)
        if waiters:
            for ev in waiters:
                ev.set()

    def notify_all(self) -> None:
        for waiters in self._by_partition.values():
            for ev in waiters:
                ev.set()
        self._by_partition.clear()


class ArmedWait:
    """One long poll's registration with :class:`FetchWaiters`; ``wait`` is awaited at most once.

    A future and one timer on the event loop, not an ``anyio.Event`` inside ``move_on_after``: a consumer
    at the tail long-polls once per batch produced, and the cancel scope's bookkeeping was a noticeable part
    of each poll.  Cancellation (a closing connection) still ends the wait."""

    __slots__ = ("_tps", "_waiters", "_wake")

    def __init__(self, waiters: FetchWaiters, tps: list[TopicPartition]) -> None:
        self._waiters = waiters
        self._tps = tps
        self._wake = _Wake(asyncio.get_running_loop().create_future())
        waiters.register(tps, self._wake)

    async def wait(self, timeout_s: float) -> bool:
        """Until a notify (True, perhaps one that came before this call) or ``timeout_s`` passes (False)."""
        wake = self._wake
        loop = asyncio.get_running_loop()
        timer = loop.call_at(loop.time() + timeout_s, wake.set, False)
        self._waiters.waiting += 1
        try:
            return await wake.future
        finally:
            timer.cancel()
            self._waiters.waiting -= 1
            self._waiters.unregister(self._tps, wake)


class ReplicaManager:
    def __init__(self, broker_id: int, log_manager: LogManager) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self._partitions: dict[TopicPartition, Partition] = {}
        # Partitions we lead whose log could not be opened because their log dir is offline.
        self._offline: set[TopicPartition] = set()
        # Client fetches wait for the HW to move; follower fetches for appends; acks=all
        # produces for the HW (or an ISR change).
        self.fetch_waiters = FetchWaiters()
        self.replica_fetch_waiters = FetchWaiters()
        self.produce_waiters = FetchWaiters()
        # Bytes appended as a follower, per topic (ReplicationBytesInPerSec, for the metrics).
        self.replication_bytes_in: dict[str, int] = {}
        # ISR changes this broker made as a leader (Kafka's IsrShrinksPerSec / IsrExpandsPerSec meters).
        self.isr_shrinks = 0
        self.isr_expands = 0
        # AlterReplicaLogDirs: moves run in this task group (see run_log_dir_moves).
        self._move_group: anyio.abc.TaskGroup | None = None
        self._moves: dict[TopicPartition, LogMove] = {}
        self._next_target: dict[TopicPartition, Path] = {}  # a move asked for while another is cancelled
        # Cluster mode (set_cluster / run_replication); None with embedded metadata.
        self.endpoint_of: Callable[[int], tuple[str, int] | None] | None = None
        self._isr_writer: IsrWriter | None = None
        self._replication_group: anyio.abc.TaskGroup | None = None
        self.fetchers: ReplicaFetcherManager | None = None
        # Controlled shutdown: no more follower fetching, so that no leader re-adds us to an ISR the
        # controller just took us out of (Kafka's controller stops the fetchers with StopReplica).
        self.fetching_stopped = False
        self.lag_time_max_ms = 30000

    def set_cluster(self, endpoint_of: Callable[[int], tuple[str, int] | None], isr_writer: IsrWriter) -> None:
        """Cluster mode: how to reach a broker's inter-broker endpoint and how to write an ISR change."""
        self.endpoint_of = endpoint_of
        self._isr_writer = isr_writer
        self.log_manager.high_watermarks = self.high_watermarks

    @property
    def replicating(self) -> bool:
        """Cluster mode: fetches with a replica id are followers' (with embedded metadata, consumers')."""
        return self.endpoint_of is not None

    def high_watermarks(self) -> dict[TopicPartition, int]:
        """Every hosted partition's HW, for the replication-offset-checkpoint file."""
        return {tp: p.high_watermark for tp, p in list(self._partitions.items()) if not p.log.offline}

    async def run_replication(self, config: BrokerConfig) -> None:
        """Runs for the broker's lifetime in cluster mode: follower fetchers, ISR shrink checks, HW checkpoints."""
        if self.endpoint_of is None:
            raise RuntimeError("set_cluster must be called before run_replication")
        self.lag_time_max_ms = int(config["replica.lag.time.max.ms"])
        settings = FetchSettings.from_config(config, self.broker_id)
        if self.fetchers is None:
            self.fetchers = ReplicaFetcherManager(self, settings)
        else:
            self.fetchers.settings = settings
        async with anyio.create_task_group() as tg:
            self._replication_group = tg
            try:
                tg.start_soon(self.fetchers.run)
                tg.start_soon(self._run_isr_shrink, max(self.lag_time_max_ms / 2000, 0.05))
                tg.start_soon(self._run_hw_checkpoint,
                              int(config["replica.high.watermark.checkpoint.interval.ms"]) / 1000)
                await anyio.sleep_forever()
            finally:
                self._replication_group = None

    async def _run_isr_shrink(self, interval_s: float) -> None:
        while True:
            await anyio.sleep(interval_s)
            self.check_isr_shrink(lag_clock_ms())

    async def _run_hw_checkpoint(self, interval_s: float) -> None:
        while True:
            await anyio.sleep(interval_s)
            await anyio.to_thread.run_sync(self.log_manager.checkpoint_high_watermarks)

    def check_isr_shrink(self, now: int) -> None:
        """Drop followers that lagged longer than replica.lag.time.max.ms from the ISRs we lead."""
        for p in list(self._partitions.values()):
            if p.is_leader and len(p.isr) > 1 and not p.isr_change_pending and not p.log.offline:
                new_isr = p.maybe_shrink_isr(now, self.lag_time_max_ms)
                if new_isr is not None:
                    log.info("Shrinking ISR of %(topic)s-%(partition)d from %(isr)s to %(new_isr)s",
                             {"topic": p.topic, "partition": p.index, "isr": p.isr, "new_isr": new_isr})
                    self._submit_isr(p, new_isr)

    def _submit_isr(self, p: Partition, new_isr: list[int]) -> None:
        group = self._replication_group
        if group is None or self._isr_writer is None or p.isr_change_pending:
            return
        p.isr_change_pending = True
        group.start_soon(self._write_isr, p, new_isr, p.leader_epoch, p.zk_version)

    async def _write_isr(self, p: Partition, new_isr: list[int], epoch: int, version: int) -> None:
        """Conditional ISR write (on the state znode version we hold), then apply it if still leading."""
        assert self._isr_writer is not None
        try:
            new_version = await self._isr_writer(p.topic, p.index, epoch, new_isr, version)
        except StaleState:
            log.info("ISR change of %(topic)s-%(partition)d to %(new_isr)s lost a race; waiting for the new state",
                     {"topic": p.topic, "partition": p.index, "new_isr": new_isr})
            return
        except Exception as exc:  # ZooKeeper unavailable: the next check retries
            log.warning("ISR change of %(topic)s-%(partition)d to %(new_isr)s failed: %(error)s",
                        {"topic": p.topic, "partition": p.index, "new_isr": new_isr, "error": exc})
            return
        finally:
            p.isr_change_pending = False
        if self._partitions.get(p.tp) is p and p.is_leader and p.leader_epoch == epoch and p.zk_version <= new_version:
            if len(new_isr) < len(p.isr):
                self.isr_shrinks += 1
            elif len(new_isr) > len(p.isr):
                self.isr_expands += 1
            p.isr = list(new_isr)
            p.zk_version = new_version
            self._hw_maybe_moved(p)
            self.produce_waiters.notify(p.tp)

    def partition(self, topic: str, index: int) -> Partition | None:
        return self._partitions.get((topic, index))

    def is_offline(self, topic: str, index: int) -> bool:
        """Whether this broker's replica of the partition is in an offline log dir."""
        p = self._partitions.get((topic, index))
        if p is not None:
            return p.log.offline
        return (topic, index) in self._offline

    def on_log_dir_offline(self, tps: Iterable[TopicPartition]) -> None:
        """The log dir of ``tps`` failed: wake their long-poll fetches to answer the error."""
        tps = list(tps)
        for tp in tps:
            if tp not in self._partitions:
                self._offline.add(tp)
            self._wake(tp)
        if tps:
            log.error("%(offline)d partition(s) offline: %(partitions)s",
                      {"offline": len(tps),
                       "partitions": ", ".join(f"{t}-{i}" for t, i in sorted(tps)[:20])
                       + (" ..." if len(tps) > 20 else "")})

    def partitions(self) -> dict[TopicPartition, Partition]:
        return self._partitions

    def _wake(self, tp: TopicPartition) -> None:
        self.fetch_waiters.notify(tp)
        self.replica_fetch_waiters.notify(tp)
        self.produce_waiters.notify(tp)

    def _open(self, topic: str, index: int, config: LogConfig) -> Log | None:
        try:
            lg = self.log_manager.get_or_create_log(topic, index, config)
        except KafkaStorageError as exc:
            log.error("partition %(topic)s-%(partition)d is offline: %(error)s",
                      {"topic": topic, "partition": index, "error": exc})
            self._offline.add((topic, index))
            return None
        self._offline.discard((topic, index))
        return lg

    def _initial_high_watermark(self, p: Partition) -> int:
        """The checkpointed HW capped at the LEO (the log start offset without one)."""
        lg = p.log
        hw = self.log_manager.checkpointed_high_watermark(p.topic, p.index)
        return min(max(hw if hw is not None else 0, lg.log_start_offset), lg.log_end_offset)

    def make_leader(
        self, topic: str, index: int, config: LogConfig, *, leader_epoch: int, replicas: list[int], isr: list[int],
        zk_version: int = -1,
    ) -> Partition | None:
        """Become (or stay) leader of a partition, opening or creating its log.

        Returns None if its log dir is offline (the partition is then offline, see
        :meth:`is_offline`).  A former follower stops fetching and keeps its HW: with
        followers in the ISR it only advances as they fetch.
        """
        p = self._partitions.get((topic, index))
        if p is None:
            lg = self._open(topic, index, config)
            if lg is None:
                return None
            try:
                lg.become_leader(leader_epoch)
            except KafkaStorageError as exc:
                log.error("partition %(topic)s-%(partition)d is offline: %(error)s",
                          {"topic": topic, "partition": index, "error": exc})
                self._offline.add((topic, index))
                return None
            p = Partition(topic, index, lg, self.broker_id, leader_epoch, list(replicas), list(isr),
                          local_id=self.broker_id, zk_version=zk_version)
            if len(p.isr) <= 1:
                p.high_watermark = lg.log_end_offset
            else:
                p.high_watermark = self._initial_high_watermark(p)
            p.leader_epoch_start_offset = lg.log_end_offset
            p.reset_followers(lag_clock_ms())
            self._partitions[(topic, index)] = p
            return p
        was_leader = p.is_leader
        if not was_leader and self.fetchers is not None:
            self.fetchers.remove(p.tp)
        if (leader_epoch != p.leader_epoch or not was_leader) and not p.log.offline:
            try:
                p.log.become_leader(leader_epoch)
            except KafkaStorageError as exc:
                log.error("partition %(topic)s-%(partition)d is offline: %(error)s",
                          {"topic": topic, "partition": index, "error": exc})
        if was_leader and leader_epoch == p.leader_epoch and 0 <= zk_version < p.zk_version:
            # An older state than the one our own ISR write produced: nothing new.
            p.log.update_config(config)
            return p
        new_role = not was_leader or leader_epoch != p.leader_epoch
        p.leader_id = self.broker_id
        p.leader_epoch = leader_epoch
        p.replicas = list(replicas)
        p.isr = list(isr)
        p.zk_version = zk_version
        p.log.update_config(config)
        if new_role:
            p.leader_epoch_start_offset = p.log.log_end_offset
            p.reset_followers(lag_clock_ms())
            if not was_leader:
                log.info("Became leader of %(topic)s-%(partition)d in epoch %(leader_epoch)d at LEO "
                         "%(log_end_offset)d, HW %(high_watermark)d",
                         {"topic": topic, "partition": index, "leader_epoch": leader_epoch,
                          "log_end_offset": p.log.log_end_offset, "high_watermark": p.high_watermark})
        self._hw_maybe_moved(p)
        self._wake(p.tp)
        return p

    def make_follower(
        self, topic: str, index: int, config: LogConfig, *, leader_id: int, leader_epoch: int, replicas: list[int],
        isr: list[int], zk_version: int = -1,
    ) -> Partition | None:
        """Follow ``leader_id``: open or create the log and fetch from the leader.

        A new leader or epoch restarts fetching from our LEO; the leader's diverging-epoch
        answer tells us where to truncate.  Returns None if the log dir is offline.
        """
        tp = (topic, index)
        p = self._partitions.get(tp)
        if p is None:
            lg = self._open(topic, index, config)
            if lg is None:
                return None
            p = Partition(topic, index, lg, leader_id, leader_epoch, list(replicas), list(isr),
                          local_id=self.broker_id, zk_version=zk_version)
            p.high_watermark = self._initial_high_watermark(p)
            self._partitions[tp] = p
            changed = True
        else:
            changed = p.leader_id != leader_id or p.leader_epoch != leader_epoch
            if p.is_leader:
                log.info("Became follower of %(topic)s-%(partition)d (leader %(leader_id)d, epoch %(leader_epoch)d)",
                         {"topic": topic, "partition": index, "leader_id": leader_id, "leader_epoch": leader_epoch})
            p.leader_id = leader_id
            p.leader_epoch = leader_epoch
            p.replicas = list(replicas)
            p.isr = list(isr)
            p.zk_version = zk_version
            p.followers = {}
            if not p.log.offline:
                p.log.update_config(config)
                p.log.leader_epoch = None  # a follower stamps nothing: batches keep the leader's epochs
            p.high_watermark = min(p.high_watermark, p.log.log_end_offset)
        # Requests waiting on us as leader now answer NOT_LEADER_OR_FOLLOWER.
        self._wake(tp)
        if self.fetchers is None:

            self.fetchers = ReplicaFetcherManager(self, None)
        if leader_id < 0 or p.log.offline or self.fetching_stopped:
            self.fetchers.remove(tp)  # no live leader yet: the next metadata change names one
        elif changed or not self.fetchers.has(tp):
            self.fetchers.add(p)
        return p

    def stop_replica(self, topic: str, index: int, *, delete: bool) -> None:
        """No longer a replica (reassigned away, topic deleted): stop fetching, forget it, delete the log if asked."""
        tp = (topic, index)
        if self.fetchers is not None:
            self.fetchers.remove(tp)
        self._partitions.pop(tp, None)
        self._wake(tp)
        if delete:
            self._offline.discard(tp)
            self.log_manager.delete_log(topic, index)

    def update_config(self, topic: str, config: LogConfig) -> None:
        for (t, _i), p in self._partitions.items():
            if t == topic and not p.log.offline:
                p.log.update_config(config)

    def remove_topic(self, topic: str) -> None:
        for tp in [tp for tp in self._partitions if tp[0] == topic]:
            if self.fetchers is not None:
                self.fetchers.remove(tp)
            self._partitions.pop(tp)
            self.log_manager.delete_log(*tp)
            self._wake(tp)
        for tp in [tp for tp in self._offline if tp[0] == topic]:
            self._offline.discard(tp)
            self.log_manager.delete_log(*tp)
        log.info("deleted topic", extra=fields(topic=topic))

    def on_appended(self, partition: Partition) -> None:
        if partition.maybe_advance_high_watermark():
            self.fetch_waiters.notify(partition.tp)
            self.produce_waiters.notify(partition.tp)
        self.replica_fetch_waiters.notify(partition.tp)

    def stop_fetching(self) -> None:
        """Controlled shutdown: stop following every partition, now and after later role changes."""
        self.fetching_stopped = True
        if self.fetchers is not None:
            for tp in list(self.fetchers.partitions()):
                self.fetchers.remove(tp)

    def wake_all_waiters(self) -> None:
        """Shutdown: every waiting fetch and acks=all produce re-checks now (and sees shutting_down)."""
        self.fetch_waiters.notify_all()
        self.replica_fetch_waiters.notify_all()
        self.produce_waiters.notify_all()

    async def wait_for_high_watermark(self, p: Partition, offset: int, timeout_s: float) -> bool:
        """Until the HW reaches ``offset`` (acks=all for coordinator writes); False on timeout or lost leadership."""
        deadline = anyio.current_time() + timeout_s
        for _ in range(1_000_000):  # each round is woken by an HW or role change, or times out
            if self._partitions.get(p.tp) is not p or not p.is_leader:
                return False
            if p.high_watermark >= offset:
                return True
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                return False
            await self.produce_waiters.wait([p.tp], remaining)
        return False

    def _hw_maybe_moved(self, p: Partition) -> None:
        if p.maybe_advance_high_watermark():
            self.fetch_waiters.notify(p.tp)
            self.produce_waiters.notify(p.tp)

    def on_follower_fetch(self, p: Partition, replica_id: int, fetch_offset: int, log_start_offset: int) -> None:
        """Leader side of a follower fetch: record its progress, maybe add it to the ISR, advance the HW."""
        if replica_id not in p.replicas:
            return
        p.update_follower_fetch(replica_id, fetch_offset, log_start_offset, lag_clock_ms())
        if not p.isr_change_pending:
            new_isr = p.maybe_expand_isr(replica_id)
            if new_isr is not None:
                log.info("Expanding ISR of %(topic)s-%(partition)d from %(isr)s to %(new_isr)s",
                         {"topic": p.topic, "partition": p.index, "isr": p.isr, "new_isr": new_isr})
                self._submit_isr(p, new_isr)
        self._hw_maybe_moved(p)

    def on_follower_appended(self, p: Partition, leader_high_watermark: int) -> None:
        """Follower side: after appending the leader's batches, HW = min(leader HW, own LEO)."""
        new_hw = min(leader_high_watermark, p.log.log_end_offset)
        if new_hw > p.high_watermark:
            p.high_watermark = new_hw
            self.fetch_waiters.notify(p.tp)

    # -- AlterReplicaLogDirs ---------------------------------------------------------------------

    # A copy round moves at most this much, so cancellation (shutdown) waits for little.
    MOVE_ROUND_BYTES = 32 << 20
    # The final round runs with the log paused: enter it once a round copied no more than this.
    MOVE_FINAL_BYTES = 4 << 20
    MOVE_MAX_ROUNDS = 200

    async def run_log_dir_moves(self) -> None:
        """Runs for the broker's lifetime: the task group the partition moves run in."""
        async with anyio.create_task_group() as tg:
            self._move_group = tg
            try:
                await anyio.sleep_forever()
            finally:
                self._move_group = None

    def alter_log_dir(self, topic: str, index: int, target: Path) -> ErrorCode:
        """Start moving a partition's log to ``target`` (one of log.dirs); Kafka's per-partition answer.

        The answer comes at once, the move runs in the background (DescribeLogDirs shows it as
        a future replica).  Asking for the dir it is in cancels a move in progress.
        """
        tp = (topic, index)
        lm = self.log_manager
        if lm.failure_channel.is_offline(target):
            return ErrorCode.kafka_storage_error
        p = self._partitions.get(tp)
        if p is None:
            # Kafka: an offline partition is a storage error; one we do not host, REPLICA_NOT_AVAILABLE.
            return ErrorCode.kafka_storage_error if tp in self._offline else ErrorCode.replica_not_available
        if p.offline:
            return ErrorCode.kafka_storage_error
        current = lm.log_dir_of(topic, index)
        moving = self._moves.get(tp)
        if moving is not None and not moving.cancelled and moving.target_dir != target:
            moving.cancelled = True  # its task deletes the future log, then starts the queued one
        if target == current:
            self._next_target.pop(tp, None)
            return ErrorCode.none
        if moving is not None and not moving.cancelled:
            return ErrorCode.none  # already on its way there
        if lm.failure_channel.offline_dirs():
            # As Kafka: no future log while a dir is offline, lest the partition exist twice.
            return ErrorCode.kafka_storage_error
        if moving is not None:
            self._next_target[tp] = target
            return ErrorCode.none
        return self._start_move(p, target)

    def _start_move(self, p: Partition, target: Path) -> ErrorCode:
        group = self._move_group
        if group is None:
            return ErrorCode.kafka_storage_error  # not serving (shutting down)
        try:
            mv = self.log_manager.start_move(p.topic, p.index, target)
        except KafkaStorageError:
            return ErrorCode.kafka_storage_error
        self._moves[p.tp] = mv
        group.start_soon(self._run_move, p, mv)
        return ErrorCode.none

    async def _run_move(self, p: Partition, mv: LogMove) -> None:
        lm = self.log_manager
        done = False
        try:
            for _ in range(self.MOVE_MAX_ROUNDS):
                if mv.cancelled or p.log is not mv.source:
                    break
                copied = await anyio.to_thread.run_sync(functools.partial(
                    mv.copy_round, volatile=mv.source.active_indexes(), budget=self.MOVE_ROUND_BYTES))
                if copied <= self.MOVE_FINAL_BYTES:
                    break
            if not mv.cancelled and p.log is mv.source and self._partitions.get(p.tp) is p:
                # Synchronous on the event loop: no request sees the partition mid-swap.
                p.log = lm.complete_move(mv, p.log.config)
                done = True
                self.fetch_waiters.notify(p.tp)
        except (OSError, KafkaStorageError, RuntimeError) as exc:
            log.error("moving %(topic)s-%(partition)d to %(target_dir)s failed: %(error)s",
                      {"topic": p.topic, "partition": p.index, "target_dir": mv.target_dir, "error": exc})
        finally:
            if self._moves.get(p.tp) is mv:
                del self._moves[p.tp]
            if not done:
                lm.abandon_move(mv)
        if done:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(lm.delete_retired)
                await anyio.to_thread.run_sync(lm.checkpoint)  # the log start offset, in its new dir
        nxt = self._next_target.pop(p.tp, None)
        if nxt is not None and self._partitions.get(p.tp) is p and nxt != lm.log_dir_of(p.topic, p.index):
            self._start_move(p, nxt)
