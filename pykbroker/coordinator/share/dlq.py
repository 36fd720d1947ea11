"""Dead-letter topics for share groups (a pykbroker extension, docs/queues.md).

A record a consumer REJECTs, or whose delivery count reaches the limit, is appended to the dead-letter
topic before it is archived: its key, value and headers, plus headers naming where it came from and why.
The group config ``pykbroker.share.dlq.topic`` wins over the source topic's ``pykbroker.dlq.topic``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pykbroker.coordinator.internal_topic import now_ms
from pykbroker.coordinator.share.partition import Archived, ArchiveReason
from pykbroker.metadata.store import INTERNAL_TOPICS
from pykbroker.protocol.records import Record, build_batch, decode_records, iter_batches, validate_for_append
from pykbroker.replica.replica_manager import Partition, ReplicaManager
from pykbroker.replica.topics import TopicError, TopicManager, TopicSpec

log = logging.getLogger("pykbroker.share")

HEADER_PREFIX = "pykbroker.dlq."


def dead_letter_reasons(archived: Sequence[Archived]) -> list[Archived]:
    """The archived records that go to a dead-letter topic (gaps are not records)."""
    return [a for a in archived if a.reason in (ArchiveReason.REJECTED, ArchiveReason.DELIVERY_COUNT_EXCEEDED)]


def read_records_at(p: Partition, offsets: Sequence[int]) -> dict[int, Record]:
    """The records at these offsets of the partition's log (missing ones are left out)."""
    wanted = sorted(set(offsets))
    out: dict[int, Record] = {}
    i = 0
    while i < len(wanted):
        off = wanted[i]
        if off < p.log.log_start_offset or off >= p.log.log_end_offset:
            i += 1
            continue
        res = p.log.read(off, 1 << 20, min_one_message=True)
        data = res.records
        if not data:
            break
        for h in iter_batches(data):
            if h.is_control or h.last_offset < off:
                continue
            for r in decode_records(memoryview(data)[h.position:h.position + h.size]):
                if r.offset in wanted:
                    out[r.offset] = r
        nxt = res.next_offset
        while i < len(wanted) and wanted[i] < nxt:
            i += 1
        if nxt <= off:
            i += 1
    return out


def dead_letter_record(r: Record, *, topic: str, partition: int, group: str, delivery_count: int,
                       reason: ArchiveReason) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
    headers = list(r.headers)
    headers += [
        (HEADER_PREFIX + "source.topic", topic.encode()),
        (HEADER_PREFIX + "source.partition", str(partition).encode()),
        (HEADER_PREFIX + "source.offset", str(r.offset).encode()),
        (HEADER_PREFIX + "group", group.encode()),
        (HEADER_PREFIX + "delivery.count", str(delivery_count).encode()),
        (HEADER_PREFIX + "reason", reason.value.encode()),
    ]
    return r.key, r.value, headers


def ensure_topic(topics: TopicManager, name: str) -> bool:
    """Create the dead-letter topic with the broker's defaults if it does not exist."""
    if topics.store.topic(name) is not None:
        return True
    try:
        topics.create(TopicSpec(name))
        log.info("created dead-letter topic %(name)s", {"name": name})
    except TopicError as e:
        if topics.store.topic(name) is None:
            log.error("cannot create dead-letter topic %(name)s: %(error)s", {"name": name, "error": e.message})
            return False
    return True


def append(replicas: ReplicaManager, topics: TopicManager, dlq_topic: str, source_partition: int,
           records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]]) -> bool:
    """Append to the dead-letter topic's partition ``source_partition % partitions``; False if it could not."""
    if not records:
        return True
    if dlq_topic in INTERNAL_TOPICS:
        log.error("dead-letter topic %(dlq_topic)s is an internal topic: %(records)d record(s) not dead-lettered",
                  {"dlq_topic": dlq_topic, "records": len(records)})
        return False
    if not ensure_topic(topics, dlq_topic):
        return False
    rec = topics.store.topic(dlq_topic)
    if rec is None or not rec.partitions:
        return False
    idx = source_partition % len(rec.partitions)
    p = replicas.partition(dlq_topic, idx)
    if p is None or p.offline or p.leader_id != replicas.broker_id:
        log.error("dead-letter topic %(dlq_topic)s-%(partition)d is not led by this broker: %(records)d record(s) "
                  "not dead-lettered",
                  {"dlq_topic": dlq_topic, "partition": idx, "records": len(records)})
        return False
    now = now_ms()
    buf = bytearray(build_batch([(k, v, tuple(h)) for k, v, h in records], timestamp_ms=now))
    batches = validate_for_append(buf, max_batch_bytes=max(len(buf), p.log.config.max_message_bytes), now_ms=now,
                                  timestamp_type=0, from_client=False)
    p.log.append(buf, batches, leader_epoch=p.leader_epoch)
    replicas.on_appended(p)
    return True
