"""What the active controller knows about the cluster (Kafka's ControllerContext), with no I/O.

Filled from ZooKeeper when a broker becomes controller and kept current by its events; thrown
away when it resigns. Only the controller's event thread touches it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from pykbroker.metadata.zk_layout import PartitionState

TopicPartition = tuple[str, int]


@dataclass
class TopicInfo:
    """A topic's assignment znode: every replica (during a reassignment: target and original)."""

    topic_id: uuid.UUID
    replicas: dict[int, list[int]]
    adding: dict[int, list[int]] = field(default_factory=dict)
    removing: dict[int, list[int]] = field(default_factory=dict)
    zk_version: int = -1

    def target(self, partition: int) -> list[int]:
        """The replicas a partition ends up with once its reassignment (if any) completes."""
        removing = self.removing.get(partition, [])
        return [b for b in self.replicas.get(partition, []) if b not in removing]

    def is_reassigning(self, partition: int) -> bool:
        return bool(self.adding.get(partition) or self.removing.get(partition))


@dataclass
class ControllerContext:
    epoch: int = 0
    epoch_zk_version: int = -1
    live_brokers: dict[int, str | None] = field(default_factory=dict)  # id -> rack
    broker_czxid: dict[int, int] = field(default_factory=dict)  # tells a bounced broker from a steady one
    shutting_down: set[int] = field(default_factory=set)
    topics: dict[str, TopicInfo] = field(default_factory=dict)
    states: dict[TopicPartition, PartitionState] = field(default_factory=dict)
    deleting: set[str] = field(default_factory=set)

    # --- brokers ------------------------------------------------------------------------------

    def online(self) -> set[int]:
        """Live brokers that may lead or join an ISR: not in controlled shutdown."""
        return set(self.live_brokers) - self.shutting_down

    def is_online(self, broker: int) -> bool:
        return broker in self.live_brokers and broker not in self.shutting_down

    # --- topics and partitions ----------------------------------------------------------------

    def replicas(self, tp: TopicPartition) -> list[int]:
        info = self.topics.get(tp[0])
        return list(info.replicas.get(tp[1], [])) if info is not None else []

    def partitions(self, include_deleting: bool = False) -> list[TopicPartition]:
        return [(t, p) for t, info in sorted(self.topics.items())
                if include_deleting or t not in self.deleting for p in sorted(info.replicas)]

    def partitions_of(self, topic: str) -> list[TopicPartition]:
        info = self.topics.get(topic)
        return [(topic, p) for p in sorted(info.replicas)] if info is not None else []

    def partitions_on(self, broker: int) -> list[TopicPartition]:
        """Partitions (not being deleted) with a replica on ``broker``."""
        return [tp for tp in self.partitions() if broker in self.replicas(tp)]

    def partitions_led_by(self, broker: int) -> list[TopicPartition]:
        return [tp for tp in self.partitions() if (s := self.states.get(tp)) is not None and s.leader == broker]

    def new_partitions(self) -> list[TopicPartition]:
        """Partitions in an assignment that have no state yet (Kafka's NewPartition)."""
        return [tp for tp in self.partitions() if tp not in self.states]

    def offline_partitions(self) -> list[TopicPartition]:
        """Partitions with a state but no online leader."""
        online = self.online()
        return [tp for tp in self.partitions() if (s := self.states.get(tp)) is not None and s.leader not in online]

    def reassigning(self) -> list[TopicPartition]:
        return [(t, p) for t, info in sorted(self.topics.items()) if t not in self.deleting
                for p in sorted(info.replicas) if info.is_reassigning(p)]

    def reassignment_complete(self, tp: TopicPartition) -> bool:
        """Every target replica is in the ISR (Kafka's isReassignmentComplete)."""
        state = self.states.get(tp)
        info = self.topics.get(tp[0])
        if state is None or info is None:
            return False
        return set(info.target(tp[1])) <= set(state.isr)

    def preferred_imbalance(self, broker: int) -> tuple[float, list[TopicPartition]]:
        """Share of the partitions whose preferred replica is ``broker`` that it does not lead, and those partitions.

        Only partitions with a state count (a partition without a leader counts as not led by it), as in Kafka.
        """
        preferred = [tp for tp in self.partitions() if self.replicas(tp)[:1] == [broker]]
        if not preferred:
            return 0.0, []
        others = [tp for tp in preferred if (s := self.states.get(tp)) is not None and s.leader != broker]
        return len(others) / len(preferred), others

    def remove_topic(self, topic: str) -> None:
        info = self.topics.pop(topic, None)
        if info is not None:
            for p in info.replicas:
                self.states.pop((topic, p), None)
        self.deleting.discard(topic)
