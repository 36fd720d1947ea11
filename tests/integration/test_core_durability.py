"""Restarts, crashes and damaged logs: what was acknowledged survives, damage is cut off and reported."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, TopicCollection, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from pykbroker.protocol.records import build_batch, iter_batches
from tests.integration.conftest import (
    CLIENT_TIMEOUT,
    BrokerFactory,
    admin_for,
    consume_partitions,
    create_topic,
    make_consumer,
    make_producer,
    produce_all,
    unique_topic,
    wait_until,
    watermarks,
)
from tests.support.broker import BrokerProcess

CLEAN_SHUTDOWN_MARKER = ".kafka_cleanshutdown"
RECOVERED_RE = re.compile(r"Loaded (\d+) partition log\(s\) .* \((\d+) recovered after unclean shutdown\)")


def _log_since(b: BrokerProcess, position: int) -> str:
    return b.log()[position:]


def _recovered_counts(text: str) -> list[tuple[int, int]]:
    """(loaded, recovered) from each startup in ``text``."""
    return [(int(m.group(1)), int(m.group(2))) for m in RECOVERED_RE.finditer(text)]


def _segments(b: BrokerProcess, topic: str, partition: int = 0) -> list[Path]:
    return sorted((b.data_dir / "logs" / f"{topic}-{partition}").glob("*.log"))


def _records(msgs: list[Message]) -> list[tuple[int, int, bytes | None, bytes | None, list[Any]]]:
    """(partition, offset, key, value, headers), sorted by partition and offset."""
    return sorted((m.partition() or 0, m.offset() or 0, m.key(), m.value(), list(m.headers() or [])) for m in msgs)


def test_graceful_shutdown_writes_marker_and_exits_zero(broker_factory: BrokerFactory) -> None:
    b = broker_factory()
    topic = unique_topic("dur-marker")
    create_topic(b, topic)
    produce_all(make_producer(b), topic, [{"value": b"x"}] * 10)
    marker = b.data_dir / "logs" / CLEAN_SHUTDOWN_MARKER
    assert not marker.exists()  # only between a clean shutdown and the next start
    assert b.stop() == 0, b.log()[-3000:]
    assert marker.exists()
    assert "shutdown complete" in b.log()
    # The next start consumes the marker (a later crash must not look clean).
    b.start()
    assert not marker.exists()
    assert b.stop() == 0
    assert marker.exists()


def test_restart_keeps_all_data_and_topics(broker_factory: BrokerFactory) -> None:
    b = broker_factory()
    admin = admin_for(b)
    t1, t2 = unique_topic("dur-a"), unique_topic("dur-b")
    create_topic(b, t1, partitions=3, config={"retention.ms": "86400000", "max.message.bytes": "500000"})
    create_topic(b, t2, partitions=1)
    msgs: list[dict[str, Any]] = [
        {"key": f"k{i}".encode() if i % 3 else None, "value": None if i % 13 == 5 else f"value-{i}".encode() * 3,
         "headers": [("i", f"{i}".encode())], "partition": i % 3}
        for i in range(600)
    ]
    produce_all(make_producer(b, **{"compression.type": "lz4"}), t1, msgs)
    produce_all(make_producer(b), t2, [{"value": f"t2-{i}".encode()} for i in range(100)], flush_each=False)
    ids_before = {n: str(d.result(timeout=CLIENT_TIMEOUT).topic_id) for n, d in admin.describe_topics(
        TopicCollection([t1, t2]), request_timeout=CLIENT_TIMEOUT).items()}
    before = consume_partitions(b, [TopicPartition(t1, p, 0) for p in range(3)], 600)
    assert len(before) == 600

    mark = len(b.log())
    assert b.stop() == 0
    b.start()
    after_log = _log_since(b, mark)
    counts = _recovered_counts(after_log)
    assert counts and counts[0][1] == 0, f"expected no recovery after a clean shutdown: {counts}"
    assert counts[0][0] >= 4  # our 4 partitions (plus any internal ones)
    assert "Recovered " not in after_log and "Truncated" not in after_log

    admin = admin_for(b)
    md = admin.list_topics(timeout=CLIENT_TIMEOUT)
    assert sorted(md.topics[t1].partitions) == [0, 1, 2]
    assert sorted(md.topics[t2].partitions) == [0]
    ids_after = {n: str(d.result(timeout=CLIENT_TIMEOUT).topic_id) for n, d in admin.describe_topics(
        TopicCollection([t1, t2]), request_timeout=CLIENT_TIMEOUT).items()}
    assert ids_after == ids_before
    cfg = admin.describe_configs([ConfigResource(ResourceType.TOPIC, t1)], request_timeout=CLIENT_TIMEOUT)
    entries = next(iter(cfg.values())).result(timeout=CLIENT_TIMEOUT)
    assert entries["retention.ms"].value == "86400000"
    assert entries["max.message.bytes"].value == "500000"

    after = consume_partitions(b, [TopicPartition(t1, p, 0) for p in range(3)], 600)
    assert _records(after) == _records(before)
    assert watermarks(b, t2) == (0, 100)

    # Appends continue after the old end instead of overwriting it.
    rep = produce_all(make_producer(b), t2, [{"value": b"after restart"}])
    assert rep[0].error is None and rep[0].offset == 100
    tail = consume_partitions(b, [TopicPartition(t2, 0, 99)], 2)
    assert [(m.offset(), m.value()) for m in tail] == [(99, b"t2-99"), (100, b"after restart")]


def test_sigkill_mid_produce_keeps_every_acknowledged_message(broker_factory: BrokerFactory) -> None:
    b = broker_factory({"log.flush.on.ack": "true"})
    topic = unique_topic("dur-kill")
    create_topic(b, topic, partitions=2)
    acked: list[tuple[int, int, bytes]] = []
    failed: list[KafkaError] = []
    lock = threading.Lock()
    stop = threading.Event()
    producer = make_producer(b, acks="all", **{"linger.ms": 1, "message.timeout.ms": 4000, "retries": 0})

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        with lock:
            if err is None:
                acked.append((msg.partition() or 0, msg.offset() or 0, msg.value() or b""))
            else:
                failed.append(err)

    def produce_forever() -> None:
        for i in range(1_000_000):
            if stop.is_set():
                return
            try:
                producer.produce(topic, value=f"crash-{i:07d}".encode(), partition=i % 2, on_delivery=on_delivery)
            except BufferError:
                pass
            producer.poll(0.001 if i % 20 == 0 else 0)

    t = threading.Thread(target=produce_forever, daemon=True)
    t.start()
    try:
        wait_until(lambda: len(acked) >= 2000, timeout=60, what="2000 acknowledged messages")
        b.kill()  # SIGKILL mid-produce
    finally:
        stop.set()
        t.join(10)
    assert not t.is_alive()
    producer.purge()
    producer.flush(10)
    with lock:
        acknowledged = list(acked)
    assert len(acknowledged) >= 2000

    mark = len(b.log())
    b.start()
    counts = _recovered_counts(_log_since(b, mark))
    assert counts and counts[0][1] >= 2, f"an unclean shutdown must recover the logs: {counts}"

    highs = {p: watermarks(b, topic, p)[1] for p in (0, 1)}
    stored = consume_partitions(b, [TopicPartition(topic, p, 0) for p in (0, 1)], sum(highs.values()))
    by_pos = {(m.partition() or 0, m.offset() or 0): m.value() for m in stored}
    assert len(by_pos) == sum(highs.values())
    missing = [(p, o, v) for p, o, v in acknowledged if by_pos.get((p, o)) != v]
    assert not missing, f"{len(missing)} acknowledged messages lost or changed, e.g. {missing[:5]}"
    # What is there is whole and in order: offsets contiguous from 0 in each partition.
    for p in (0, 1):
        assert sorted(o for (pp, o) in by_pos if pp == p) == list(range(highs[p]))
    # The broker keeps working: appends continue after the recovered end.
    rep = produce_all(make_producer(b), topic, [{"value": b"post-crash", "partition": 0}])
    assert rep[0].error is None and rep[0].offset == highs[0]


def _produce_batches(b: BrokerProcess, topic: str, batches: int, per_batch: int, tag: str = "") -> list[bytes]:
    """Produce ``batches`` separate batches (flushed one by one); returns every value in offset order."""
    # Each flush sends what is queued at once; a long linger keeps a slow loop from splitting a batch.
    producer = make_producer(b, **{"linger.ms": 5000})
    # Learn the topic's partitions first: records produced before that wait unassigned, and if the flush
    # begins before the metadata arrives (seen under CI load), the client sends each record as it assigns
    # it, one batch per record.
    producer.list_topics(topic, timeout=CLIENT_TIMEOUT)
    values: list[bytes] = []
    for n in range(batches):
        chunk = [f"{tag}batch {n} record {i} ".encode() * 4 for i in range(per_batch)]
        produce_all(producer, topic, [{"value": v} for v in chunk])
        values += chunk
    return values


def _damage_garbage(seg: Path) -> None:
    with seg.open("ab") as f:
        f.write(b"\xde\xad\xbe\xef" * 64)


def _damage_torn_batch(seg: Path) -> None:
    batch = build_batch([(None, b"torn" * 100, [])], base_offset=10_000, timestamp_ms=int(time.time() * 1000))
    with seg.open("ab") as f:
        f.write(batch[: len(batch) // 2])


def _damage_zeros(seg: Path) -> None:
    with seg.open("ab") as f:
        f.write(b"\x00" * 4096)


@pytest.mark.parametrize("damage", [_damage_garbage, _damage_torn_batch, _damage_zeros],
                         ids=["garbage", "torn-batch", "zeros"])
def test_damaged_tail_after_clean_stop_is_truncated_and_reported(
    broker_factory: BrokerFactory, damage: Any
) -> None:
    b = broker_factory()
    topic = unique_topic("dur-tail")
    create_topic(b, topic)
    values = _produce_batches(b, topic, batches=8, per_batch=25)
    assert b.stop() == 0
    seg = _segments(b, topic)[-1]
    good_size = seg.stat().st_size
    damage(seg)
    assert seg.stat().st_size > good_size

    mark = len(b.log())
    b.start()
    new_log = _log_since(b, mark)
    warnings = [line for line in new_log.splitlines() if "WARNING" in line and topic in line]
    assert warnings, f"no WARNING about the damaged tail of {topic}:\n{new_log[-3000:]}"
    assert seg.stat().st_size == good_size  # exactly the damage was cut off

    assert watermarks(b, topic) == (0, len(values))
    got = consume_partitions(b, [TopicPartition(topic, 0, 0)], len(values))
    assert [m.value() for m in got] == values
    rep = produce_all(make_producer(b), topic, [{"value": b"after repair"}])
    assert rep[0].error is None and rep[0].offset == len(values)
    tail = consume_partitions(b, [TopicPartition(topic, 0, len(values) - 1)], 2)
    assert [m.value() for m in tail] == [values[-1], b"after repair"]


def test_flipped_bytes_in_last_batch_after_crash_are_truncated(broker_factory: BrokerFactory) -> None:
    b = broker_factory()
    topic = unique_topic("dur-flip")
    create_topic(b, topic)
    values = _produce_batches(b, topic, batches=6, per_batch=20)
    last = _produce_batches(b, topic, batches=1, per_batch=5, tag="last ")
    b.kill()  # unclean: the next start re-validates (CRC) what was not checkpointed
    seg = _segments(b, topic)[-1]
    data = bytearray(seg.read_bytes())
    headers = list(iter_batches(bytes(data), verify_crc=True))
    # The "last" records are the segment's last batch, alone and whole (how librdkafka cut the
    # earlier 120 records into batches does not matter here).
    assert [h.base_offset for h in headers if h.base_offset >= len(values)] == [len(values)]
    assert headers[-1].records_count == len(last) and headers[-1].position + headers[-1].size == len(data)
    for pos in (len(data) - 3, len(data) - 10):  # inside the last batch's records, covered by its CRC
        data[pos] ^= 0xFF
    seg.write_bytes(bytes(data))

    mark = len(b.log())
    b.start()
    new_log = _log_since(b, mark)
    warnings = [line for line in new_log.splitlines() if "WARNING" in line and topic in line]
    assert warnings, f"no WARNING about the corrupt batch of {topic}:\n{new_log[-3000:]}"
    assert seg.stat().st_size == headers[-1].position  # the whole corrupt batch, nothing more

    assert watermarks(b, topic) == (0, len(values))
    got = consume_partitions(b, [TopicPartition(topic, 0, 0)], len(values))
    assert [m.value() for m in got] == values
    assert not set(last) & {m.value() for m in got}


def test_commits_and_transactions_under_flush_on_ack_are_answered_and_survive_sigkill(
        broker_factory: BrokerFactory) -> None:
    """With log.flush.on.ack the coordinators answer a commit (and EndTxn) only once their record is
    synced, through the same group commit as a produce: many groups committing at once are all answered,
    and what they were told is there after kill -9 and recovery."""
    b = broker_factory({"log.flush.on.ack": "true"})
    topic = unique_topic("dur-coord")
    create_topic(b, topic, partitions=2)
    produce_all(make_producer(b), topic, [{"value": f"m{i}".encode(), "partition": i % 2} for i in range(20)])
    groups = [unique_topic("g") for _ in range(8)]
    failures: list[str] = []

    def commit(i: int, group: str) -> None:
        c = make_consumer(b, **{"group.id": group})
        try:
            for n in range(5):  # sequential commits of one group, the last one wins
                c.commit(offsets=[TopicPartition(topic, i % 2, n + i)], asynchronous=False)
        except Exception as e:  # reported below: a commit that was not answered
            failures.append(f"{group}: {e}")
        finally:
            c.close()

    threads = [threading.Thread(target=commit, args=(i, g), daemon=True) for i, g in enumerate(groups)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CLIENT_TIMEOUT)
    assert not failures and not any(t.is_alive() for t in threads), failures

    tp = make_producer(b, **{"transactional.id": unique_topic("tx")})
    tp.init_transactions(CLIENT_TIMEOUT)
    tp.begin_transaction()
    produce_all(tp, topic, [{"value": f"tx{i}".encode(), "partition": 0} for i in range(5)])
    tp.commit_transaction(CLIENT_TIMEOUT)

    b.kill()
    b.start()
    for i, group in enumerate(groups):
        c = make_consumer(b, **{"group.id": group})
        try:
            committed = c.committed([TopicPartition(topic, i % 2)], timeout=CLIENT_TIMEOUT)
        finally:
            c.close()
        assert committed[0].offset == 4 + i, (group, committed)
    read_committed: dict[str, Any] = {"isolation.level": "read_committed"}
    got = consume_partitions(b, [TopicPartition(topic, 0, 0)], 15, **read_committed)
    assert [m.value() for m in got if (m.value() or b"").startswith(b"tx")] == [f"tx{i}".encode() for i in range(5)]
