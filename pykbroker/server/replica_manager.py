"""Partitions hosted by this broker: their logs, leadership and high watermarks.

This is the leadership seam.  Today every partition is led by this broker and
the ISR is just us, so the high watermark follows the log end offset.  When
replication lands, followers will advance the high watermark through
:meth:`Partition.maybe_advance_high_watermark` and leadership changes will
arrive from the metadata store; the produce and fetch handlers already ask
:meth:`ReplicaManager.partition` for a leader and respect its answer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import anyio

from pykbroker.storage.log import Log
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.log_manager import LogManager

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
        self.fetch_waiters = FetchWaiters()

    def partition(self, topic: str, index: int) -> Partition | None:
        return self._partitions.get((topic, index))

    def partitions(self) -> dict[TopicPartition, Partition]:
        return self._partitions

    def make_leader(
        self, topic: str, index: int, config: LogConfig, *, leader_epoch: int, replicas: list[int], isr: list[int]
    ) -> Partition:
        """Become (or stay) leader of a partition, opening or creating its log."""
        p = self._partitions.get((topic, index))
        if p is None:
            lg = self.log_manager.get_or_create_log(topic, index, config)
            p = Partition(topic, index, lg, self.broker_id, leader_epoch, list(replicas), list(isr))
            p.high_watermark = lg.log_end_offset
            self._partitions[(topic, index)] = p
        else:
            p.leader_epoch = leader_epoch
            p.replicas = list(replicas)
            p.isr = list(isr)
            p.log.update_config(config)
        return p

    def update_config(self, topic: str, config: LogConfig) -> None:
        for (t, _i), p in self._partitions.items():
            if t == topic:
                p.log.update_config(config)

    def remove_topic(self, topic: str) -> None:
        for tp in [tp for tp in self._partitions if tp[0] == topic]:
            self._partitions.pop(tp)
            self.log_manager.delete_log(*tp)
            self.fetch_waiters.notify(tp)
        log.info("deleted topic=%s", topic)

    def on_appended(self, partition: Partition) -> None:
        if partition.maybe_advance_high_watermark():
            self.fetch_waiters.notify(partition.tp)
