"""What the group and transaction coordinators share about their internal topics.

``__consumer_offsets`` and ``__transaction_state`` are handled alike: a key (group id or
transactional id) hashes to a partition as in Kafka; the topic is created at start with embedded
metadata and on first use (FindCoordinator) in a cluster; the partitions this broker leads are
replayed off the event loop when it becomes their leader and dropped when it stops leading them;
the coordinator appends its records there as local, non-client appends.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable

import anyio
from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.logsetup import RateLimitedLog
from pykbroker.metadata.store import MetadataStore
from pykbroker.protocol.records import BatchHeader, build_batch, decode_records, iter_batches, validate_for_append
from pykbroker.replica import group_commit
from pykbroker.replica.replica_manager import Partition, ReplicaManager
from pykbroker.replica.topics import TopicError, TopicManager, TopicSpec

LOAD_CHUNK_BYTES = 4 << 20

log = logging.getLogger("pykbroker.coordinator")

KV = tuple[bytes | None, bytes | None]
BatchFeed = Callable[[BatchHeader, list[KV]], Iterable[KV]]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    """The coordinators' timer clock (sessions, rebalances, acquisition locks): unlike :func:`now_ms` it never
    steps when the wall clock does, so an NTP step neither expires every deadline nor postpones them all."""
    return time.monotonic_ns() // 1_000_000


@functools.lru_cache(maxsize=65536)
def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units).  Cached: every group and transaction request
    hashes its id, a loop over its characters here, and the same ids come back all the time."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: str, num_partitions: int) -> int:
    """Kafka's ``Utils.abs(key.hashCode) % numPartitions`` (group id or transactional id)."""
    h = java_string_hash(key)
    h = 0 if h == -(1 << 31) else abs(h)
    return h % num_partitions


def ensure_internal_topic(store: MetadataStore, topics: TopicManager, name: str, num_partitions: int,
                          replication_factor: int, configs: Callable[[int], dict[str, str | None]]) -> None:
    """Create the topic unless it exists; ``configs`` gets the replication factor actually used."""
    if store.topic(name) is not None:
        return
    rf = min(replication_factor, max(1, len(store.live_brokers())))
    spec = TopicSpec(name, num_partitions=num_partitions, replication_factor=rf, configs=configs(rf))
    try:
        topics.create(spec)
    except TopicError as e:
        if store.topic(name) is None:
            raise RuntimeError(f"cannot create {name}: {e.message}") from None


_told: set[tuple[str, int]] = set()


async def ensure_internal_topic_async(store: MetadataStore, topics: TopicManager, name: str, num_partitions: int,
                                      replication_factor: int, configs: Callable[[int], dict[str, str | None]]
                                      ) -> bool:
    """Cluster mode: create the topic on first use with the configured replication factor.

    As Kafka, no capping: with fewer live brokers than that the topic is not created and the
    caller answers COORDINATOR_NOT_AVAILABLE (False).
    """
    if store.topic(name) is not None:
        return True
    live = len(store.live_brokers())
    if live < replication_factor:
        if (name, live) not in _told:  # once per topic and broker count, not once per FindCoordinator
            _told.add((name, live))
            log.warning("cannot create %(name)s yet: %(live)d live broker(s), its replication factor is "
                        "%(replication_factor)d",
                        {"name": name, "live": live, "replication_factor": replication_factor})
        return False
    spec = TopicSpec(name, num_partitions=num_partitions, replication_factor=replication_factor,
                     configs=configs(replication_factor))
    try:
        await topics.create_async(spec)
    except TopicError as e:
        if store.topic(name) is None and e.code != ErrorCode.topic_already_exists:
            log.warning("cannot create %(name)s: %(error)s", {"name": name, "error": e.message})
            return False
    return True


def coordinator_node(store: MetadataStore, topic: str, partition: int) -> int | None:
    """The broker leading this partition of the internal topic, or None if unknown."""
    rec = store.topic(topic)
    if rec is None:
        return None
    a = rec.partitions.get(partition)
    if a is None or a.leader < 0:
        return None
    return a.leader


def append_records(replicas: ReplicaManager, topic: str, partition: int,
                   records: list[tuple[bytes, bytes | None]]) -> None:
    """Append ``(key, value)`` records as one batch to a partition this broker leads."""
    p = replicas.partition(topic, partition)
    if p is None or p.leader_id != replicas.broker_id:
        raise RuntimeError(f"not the leader of {topic}-{partition}")
    now = now_ms()
    buf = bytearray(build_batch([(k, v, ()) for k, v in records], timestamp_ms=now))
    batches = validate_for_append(buf, max_batch_bytes=max(len(buf), p.log.config.max_message_bytes),
                                  now_ms=now, timestamp_type=0, from_client=False)
    p.log.append(buf, batches, leader_epoch=p.leader_epoch)
    replicas.on_appended(p)


async def flush_partition(replicas: ReplicaManager, topic: str, partition: int) -> None:
    """Make what the coordinator appended to ``topic``-``partition`` durable (``log.flush.on.ack``).

    Through group commit, as a produce is: the commits of many groups that hash to one partition share one
    data sync, in the native fsync threads where they are built, instead of each taking a worker thread for
    a full flush of the segment and both its indexes (recovery rebuilds the indexes past the recovery
    point).  Raises KafkaStorageError when the log dir failed."""
    p = replicas.partition(topic, partition)
    if p is not None:
        await group_commit.flush_to(p.log, p.log.log_end_offset)


def min_insync_replicas(store: MetadataStore, topic: str, default: int) -> int:
    """The topic's ``min.insync.replicas``, else the broker's (``__consumer_offsets`` has none of its own)."""
    rec = store.topic(topic)
    value = rec.configs.get("min.insync.replicas") if rec is not None else None
    return int(value) if value else default


# The settings that size each internal topic, for the warning when its min ISR can never be met.
_SIZED_BY = {
    "__consumer_offsets": ("offsets.topic.replication.factor", "min.insync.replicas"),
    "__transaction_state": ("transaction.state.log.replication.factor", "transaction.state.log.min.isr"),
}
_unmeetable_logs: dict[str, RateLimitedLog] = {}
UNMEETABLE_LOG_INTERVAL_S = 60.0


def unmeetable_min_isr(topic: str, replication_factor: int, min_isr: int) -> str | None:
    """The warning for an internal topic whose replication factor is below its min ISR: its coordinator can
    never write (every commit, SyncGroup or transaction answers COORDINATOR_NOT_AVAILABLE), or None."""
    if replication_factor >= min_isr:
        return None
    rf_key, isr_key = _SIZED_BY.get(topic, ("its replication factor", "min.insync.replicas"))
    return (f"internal topic {topic} has replication factor {replication_factor} but min.insync.replicas "
            f"{min_isr}: its coordinator can never write, so clients get COORDINATOR_NOT_AVAILABLE (consumer "
            f"groups never finish joining, transactions never start). Fix: set {rf_key} to at least {min_isr} "
            f"before the topic is created (3 in a cluster of 3 or more brokers), or lower {isr_key} to at most "
            f"{replication_factor}; a topic that already exists keeps its replicas: add some with "
            "kafka-reassign-partitions, or set its min.insync.replicas topic config")


def can_append(replicas: ReplicaManager, topic: str, partition: int, min_isr: int) -> ErrorCode:
    """Kafka's checks before an acks=all append: this broker leads the partition and its ISR is large enough
    (NOT_ENOUGH_REPLICAS: nothing is written, the coordinator answers COORDINATOR_NOT_AVAILABLE).  A partition
    with fewer replicas than its min ISR is said, rate-limited, at WARN: it would fail forever."""
    p = replicas.partition(topic, partition)
    if p is None or p.offline or p.leader_id != replicas.broker_id:
        return ErrorCode.not_leader_or_follower
    if len(p.isr) < min_isr:
        warning = unmeetable_min_isr(topic, len(p.replicas), min_isr)
        if warning is not None:
            limiter = _unmeetable_logs.setdefault(topic, RateLimitedLog(log, UNMEETABLE_LOG_INTERVAL_S))
            limiter.log(time.monotonic(), logging.WARNING, warning, topic=topic, partition=partition,
                        replication_factor=len(p.replicas), min_insync_replicas=min_isr)
        return ErrorCode.not_enough_replicas
    return ErrorCode.none


async def wait_replicated(replicas: ReplicaManager, topic: str, partition: int, timeout_s: float,
                          min_isr: int = 1) -> ErrorCode:
    """Cluster mode: until the ISR has every record appended so far, as an acks=all produce (Kafka's
    coordinators and markers write with acks=all); its outcome as a produce would answer it."""
    p = replicas.partition(topic, partition)
    if p is None or p.offline or not p.is_leader:
        return ErrorCode.not_leader_or_follower
    end = p.log.log_end_offset
    if p.high_watermark < end and not await replicas.wait_for_high_watermark(p, end, timeout_s):
        if replicas.partition(topic, partition) is not p or not p.is_leader:
            return ErrorCode.not_leader_or_follower
        log.warning("%(topic)s-%(partition)d: records up to offset %(end)d not replicated to the ISR %(isr)s within "
                    "%(timeout_s).1f s",
                    {"topic": topic, "partition": partition, "end": end, "isr": p.isr, "timeout_s": timeout_s})
        return ErrorCode.request_timed_out
    if len(p.isr) < min_isr:
        return ErrorCode.not_enough_replicas_after_append
    return ErrorCode.none


def coordinator_error(code: ErrorCode) -> ErrorCode:
    """What a coordinator answers when its acks=all append failed with ``code`` (Kafka's mapping): retriable
    COORDINATOR_NOT_AVAILABLE, or NOT_COORDINATOR (rediscover) when it no longer leads the partition."""
    if code in (ErrorCode.none, ErrorCode.not_coordinator, ErrorCode.coordinator_not_available):
        return code
    if code in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error):
        return ErrorCode.not_coordinator
    if code in (ErrorCode.unknown_topic_or_partition, ErrorCode.not_enough_replicas,
                ErrorCode.not_enough_replicas_after_append, ErrorCode.request_timed_out):
        return ErrorCode.coordinator_not_available
    return ErrorCode.unknown_server_error


def read_records(p: Partition, feed: BatchFeed | None = None) -> list[KV]:
    """The ``(key, value)`` records of a partition up to its log end (blocking: run off-loop).

    Without ``feed`` control batches are skipped; with it, every batch's records go through
    ``feed`` and what it returns is kept.
    """
    lg = p.log
    out: list[KV] = []
    offset = lg.log_start_offset
    # As Kafka's coordinators: up to the log end. A new leader's high watermark may still lag records
    # the previous leader had acknowledged (it advances with the followers' next fetches).
    end = lg.log_end_offset
    while offset < end:
        res = lg.read(offset, LOAD_CHUNK_BYTES, max_offset=end)
        if not res.records:
            break
        before = offset
        data = res.records
        for h in iter_batches(data):
            if h.next_offset <= offset:
                continue
            if feed is not None or not h.is_control:
                view = memoryview(data)[h.position:h.position + h.size]
                recs = [(r.key, r.value) for r in decode_records(view) if r.offset >= offset]
                out.extend(recs if feed is None else feed(h, recs))
            offset = max(offset, h.next_offset)
        if offset == before:
            break
    return out


class PartitionLoader:
    """A service over an internal topic (group and transaction coordinators, share state, delayed records):
    loads the partitions queued in ``_to_load`` one at a time, lowest first (see ``_loader``)."""

    load_topic = ""  # the internal topic, for the one summary line per burst of loads

    def __init__(self, config: BrokerConfig, store: MetadataStore, replicas: ReplicaManager,
                 topics: TopicManager) -> None:
        self.config = config
        self.store = store
        self.replicas = replicas
        self.topics = topics
        self._to_load: set[int] = set()
        self._load_wake = anyio.Event()

    async def _load(self, partition: int) -> None:
        raise NotImplementedError

    async def _loader(self) -> None:
        while True:
            started, loaded = time.monotonic(), 0
            while self._to_load:
                p = min(self._to_load)
                self._to_load.discard(p)
                await self._load(p)
                loaded += 1
            if loaded:
                log.info("loaded %(loaded)d %(topic)s partition(s) in %(elapsed_s).2f s",
                         {"loaded": loaded, "topic": self.load_topic, "elapsed_s": time.monotonic() - started})
            self._load_wake = anyio.Event()
            if not self._to_load:
                await self._load_wake.wait()
