"""Partitions hosted by this broker: their logs, leadership and high watermarks.

This is the leadership seam.  Today every partition is led by this broker and
the ISR is just us, so the high watermark follows the log end offset.  When
replication lands, followers will advance the high watermark through
:meth:`Partition.maybe_advance_high_watermark` and leadership changes will
arrive from the metadata store; the produce and fetch handlers already ask
:meth:`ReplicaManager.partition` for a leader and respect its answer.

A partition whose log dir failed is offline (Kafka's HostedPartition.Offline): it stays
known here so that produce, fetch and ListOffsets answer KAFKA_STORAGE_ERROR for it, and
Metadata shows it leaderless with this broker as an offline replica.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc
from kio.schema.errors import ErrorCode

from pykbroker.storage.log import KafkaStorageError, Log
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.log_manager import LogManager, LogMove

log = logging.getLogger("pykbroker.replica")

TopicPartition = tuple[str, int]


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

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.index)

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
        """With the ISR being only this broker, every appended offset is fully replicated."""
        new_hw = self.log.log_end_offset
        if new_hw != self.high_watermark:
            self.high_watermark = new_hw
            return True
        return False


class FetchWaiters:
    """Long-poll fetches waiting for data on a set of partitions.

    A waiter registers an event under each partition it reads; an append sets
    the events of that partition's waiters.  No timers, no polling loop.
    """

    def __init__(self) -> None:
        self._by_partition: dict[TopicPartition, set[anyio.Event]] = {}

    def register(self, tps: Iterable[TopicPartition], event: anyio.Event) -> None:
        for tp in tps:
            self._by_partition.setdefault(tp, set()).add(event)

    def unregister(self, tps: Iterable[TopicPartition], event: anyio.Event) -> None:
        for tp in tps:
            waiters = self._by_partition.get(tp)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._by_partition[tp]

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


class ReplicaManager:
    def __init__(self, broker_id: int, log_manager: LogManager) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self._partitions: dict[TopicPartition, Partition] = {}
        # Partitions we lead whose log could not be opened because their log dir is offline.
        self._offline: set[TopicPartition] = set()
        self.fetch_waiters = FetchWaiters()
        # AlterReplicaLogDirs: moves run in this task group (see run_log_dir_moves).
        self._move_group: anyio.abc.TaskGroup | None = None
        self._moves: dict[TopicPartition, LogMove] = {}
        self._next_target: dict[TopicPartition, Path] = {}  # a move asked for while another is cancelled

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
            self.fetch_waiters.notify(tp)
        if tps:
            log.error("%d partition(s) offline: %s", len(tps),
                      ", ".join(f"{t}-{i}" for t, i in sorted(tps)[:20]) + (" ..." if len(tps) > 20 else ""))

    def partitions(self) -> dict[TopicPartition, Partition]:
        return self._partitions

    def make_leader(
        self, topic: str, index: int, config: LogConfig, *, leader_epoch: int, replicas: list[int], isr: list[int]
    ) -> Partition | None:
        """Become (or stay) leader of a partition, opening or creating its log.

        Returns None if its log dir is offline (the partition is then offline, see
        :meth:`is_offline`).
        """
        p = self._partitions.get((topic, index))
        if p is None:
            try:
                lg = self.log_manager.get_or_create_log(topic, index, config)
            except KafkaStorageError as exc:
                log.error("partition %s-%d is offline: %s", topic, index, exc)
                self._offline.add((topic, index))
                return None
            try:
                lg.become_leader(leader_epoch)
            except KafkaStorageError as exc:
                log.error("partition %s-%d is offline: %s", topic, index, exc)
                self._offline.add((topic, index))
                return None
            self._offline.discard((topic, index))
            p = Partition(topic, index, lg, self.broker_id, leader_epoch, list(replicas), list(isr))
            p.high_watermark = lg.log_end_offset
            self._partitions[(topic, index)] = p
        else:
            if leader_epoch != p.leader_epoch and not p.log.offline:
                try:
                    p.log.become_leader(leader_epoch)
                except KafkaStorageError as exc:
                    log.error("partition %s-%d is offline: %s", topic, index, exc)
            p.leader_epoch = leader_epoch
            p.replicas = list(replicas)
            p.isr = list(isr)
            p.log.update_config(config)
        return p

    def update_config(self, topic: str, config: LogConfig) -> None:
        for (t, _i), p in self._partitions.items():
            if t == topic and not p.log.offline:
                p.log.update_config(config)

    def remove_topic(self, topic: str) -> None:
        for tp in [tp for tp in self._partitions if tp[0] == topic]:
            self._partitions.pop(tp)
            self.log_manager.delete_log(*tp)
            self.fetch_waiters.notify(tp)
        for tp in [tp for tp in self._offline if tp[0] == topic]:
            self._offline.discard(tp)
            self.log_manager.delete_log(*tp)
        log.info("deleted topic=%s", topic)

    def on_appended(self, partition: Partition) -> None:
        if partition.maybe_advance_high_watermark():
            self.fetch_waiters.notify(partition.tp)

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
            log.error("moving %s-%d to %s failed: %s", p.topic, p.index, mv.target_dir, exc)
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
