"""A full log dir (ENOSPC) answers KAFKA_STORAGE_ERROR and goes offline; the other dir keeps serving (KIP-112).

The broker runs with two log dirs: a normal one (first, so it also holds the metadata store)
and a 64 MiB tmpfs mounted for the test, partly taken by a filler file.  Producing to a
partition on the tmpfs fills it; that produce must be answered with error 56 (not a closed
connection), the tmpfs dir goes offline, partitions on the other dir keep serving a producer
and a consumer that run throughout, and the broker stays up.  After the filler is deleted and
the broker restarted, every acknowledged message is there and nothing else.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, TopicPartition

from pykbroker.protocol.records import build_batch
from tests.integration.conftest import (
    BrokerFactory,
    RawConnection,
    consume_partitions,
    create_topic,
    make_consumer,
    make_producer,
    wait_until,
)

KAFKA_STORAGE_ERROR = 56
LEADER_NOT_AVAILABLE = 5
TMPFS_MIB = 64
FILLER_MIB = 52  # leaves about 12 MiB for the partition on the tmpfs
VALUE_BYTES = 32 * 1024
STOP_AFTER_S = 60.0  # each phase below is bounded by this as well as by counts


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs mounted for this test only; unmounted at teardown whatever happened."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MIB}m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], check=False)  # still busy: detach it anyway


class Healthy:
    """A producer and an assign()ed consumer on one partition of the healthy dir, run in threads.

    They must never see a non-retriable error; ``produced`` / ``consumed`` show they make progress.
    """

    def __init__(self, bootstrap_owner: Any, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self.producer = make_producer(bootstrap_owner, acks="all", **{"enable.idempotence": True})
        self.consumer = make_consumer(bootstrap_owner)
        self.consumer.assign([TopicPartition(topic, partition, 0)])
        self.acked: list[bytes] = []
        self.consumed: list[bytes] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._produce, daemon=True),
                         threading.Thread(target=self._consume, daemon=True)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(f"delivery: {err}")
        else:
            self.acked.append(msg.value() or b"")

    def _produce(self) -> None:
        deadline = time.monotonic() + 4 * STOP_AFTER_S
        for i in range(100_000):
            if self._stop.is_set() or time.monotonic() > deadline:
                break
            self.producer.produce(self.topic, f"healthy-{i}".encode(), partition=self.partition,
                                  on_delivery=self._on_delivery)
            self.producer.poll(0.02)
        self.producer.flush(20)

    def _consume(self) -> None:
        deadline = time.monotonic() + 4 * STOP_AFTER_S
        for _ in range(100_000):
            if self._stop.is_set() or time.monotonic() > deadline:
                break
            for m in self.consumer.consume(num_messages=500, timeout=0.1):
                err = m.error()
                if err is None:
                    self.consumed.append(m.value() or b"")
                elif err.fatal() or not err.retriable():
                    self.errors.append(f"consume: {err}")

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        self.consumer.close()


def _raw_produce(conn: RawConnection, topic: str, partition: int, value: bytes, correlation_id: int) -> Any:
    body = {"transactional_id": None, "acks": -1, "timeout": 10_000, "topic_data": [
        {"name": topic, "partition_data": [{"index": partition,
                                            "records": build_batch([(b"raw", value, [])], timestamp_ms=0)}]}]}
    return conn.request(0, 9, body, correlation_id)


def test_full_log_dir_answers_storage_error_and_recovers_after_restart(
    tmpfs: Path, broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    healthy_dir, full_dir = tmp_path / "healthy", tmpfs / "logs"
    b = broker_factory({
        "log.dirs": f"{healthy_dir},{full_dir}",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.num.partitions": "1",
    })
    topic = f"full-{uuid.uuid4().hex[:8]}"
    create_topic(b, topic, partitions=4)
    on_tmpfs = sorted(p for p in range(4) if (full_dir / f"{topic}-{p}").is_dir())
    on_healthy = sorted(p for p in range(4) if (healthy_dir / f"{topic}-{p}").is_dir())
    assert on_tmpfs and on_healthy and sorted(on_tmpfs + on_healthy) == [0, 1, 2, 3]
    full_p, healthy_p = on_tmpfs[0], on_healthy[0]
    filler = tmpfs / "filler"
    with open(filler, "wb") as f:
        for _ in range(FILLER_MIB):
            f.write(b"\xa5" * (1 << 20))

    healthy = Healthy(b, topic, healthy_p)
    healthy.start()
    try:
        wait_until(lambda: len(healthy.consumed) >= 20, timeout=30, what="the healthy consumer to read")

        # Fill the tmpfs: no retries, so the storage error itself reaches the delivery report.
        producer = make_producer(b, acks="all", retries=0, **{"message.timeout.ms": 10_000, "linger.ms": 0})
        acked: dict[int, bytes] = {}
        failed: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                acked[msg.offset() or 0] = msg.value() or b""
            else:
                failed.append(err)

        deadline = time.monotonic() + STOP_AFTER_S
        limit = (TMPFS_MIB << 20) // VALUE_BYTES * 2
        for i in range(limit):
            if failed or time.monotonic() > deadline:
                break
            value = f"{i:08d}".encode() * (VALUE_BYTES // 8)
            producer.produce(topic, value, partition=full_p, on_delivery=on_delivery)
            if i % 8 == 7:
                producer.flush(20)
        assert producer.flush(30) == 0
        assert failed, f"{len(acked)} messages acknowledged and no error: the tmpfs did not fill"
        assert any(e.code() == KafkaError.KAFKA_STORAGE_ERROR for e in failed), failed
        assert acked, "nothing was acknowledged before the disk filled"
        assert b.proc is not None and b.proc.poll() is None, "the broker died"

        with RawConnection(b) as conn:
            # The produce itself answers 56 on the connection, which stays open.
            r = _raw_produce(conn, topic, full_p, b"after-full", 11)
            part = r.responses[0].partition_responses[0]
            assert int(part.error_code) == KAFKA_STORAGE_ERROR
            r = _raw_produce(conn, topic, healthy_p, b"raw-healthy", 12)
            assert int(r.responses[0].partition_responses[0].error_code) == 0
            # Fetch and ListOffsets on the offline partition answer 56 too; the healthy one serves.
            fetch = conn.request(1, 11, {
                "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
                "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": [
                    {"partition": p, "fetch_offset": 0, "partition_max_bytes": 1 << 16} for p in (full_p, healthy_p)
                ]}], "forgotten_topics_data": [], "rack_id": ""}, 13)
            codes = {int(p.partition_index): int(p.error_code) for p in fetch.responses[0].partitions}
            assert codes == {full_p: KAFKA_STORAGE_ERROR, healthy_p: 0}
            lo = conn.request(2, 5, {"replica_id": -1, "isolation_level": 0, "topics": [
                {"name": topic, "partitions": [{"partition_index": p, "current_leader_epoch": -1, "timestamp": -1}
                                               for p in (full_p, healthy_p)]}]}, 14)
            codes = {int(p.partition_index): int(p.error_code) for p in lo.topics[0].partitions}
            assert codes == {full_p: KAFKA_STORAGE_ERROR, healthy_p: 0}
            # Metadata: as Kafka for a partition whose only replica's log dir is offline.
            md = conn.request(3, 9, {"topics": [{"name": topic}], "allow_auto_topic_creation": False,
                                     "include_topic_authorized_operations": False}, 15)
            by_index = {int(p.partition_index): p for p in md.topics[0].partitions}
            offline = by_index[full_p]
            assert int(offline.error_code) == LEADER_NOT_AVAILABLE and int(offline.leader_id) == -1
            assert [int(x) for x in offline.offline_replicas] == [int(x) for x in offline.replica_nodes]
            online = by_index[healthy_p]
            assert int(online.error_code) == 0 and int(online.leader_id) >= 0 and not online.offline_replicas

        # The healthy side kept going after the failure.
        produced_then, consumed_then = len(healthy.acked), len(healthy.consumed)
        wait_until(lambda: len(healthy.acked) >= produced_then + 20 and len(healthy.consumed) >= consumed_then + 20,
                   timeout=30, what="the healthy producer and consumer to progress after the failure")
    finally:
        healthy.stop()
    assert not healthy.errors, healthy.errors[:5]
    in_order = [v for v in healthy.consumed if v != b"raw-healthy"]
    assert in_order == healthy.acked[:len(in_order)]
    assert "Log dir" in b.log() and "is offline" in b.log()

    # Free space and restart: the dir is back, with exactly what was acknowledged.
    assert b.stop() == 0
    filler.unlink()
    b.start()
    got = consume_partitions(b, [TopicPartition(topic, full_p, 0)], len(acked), timeout=30)
    assert {m.offset(): m.value() for m in got} == acked
    got = consume_partitions(b, [TopicPartition(topic, healthy_p, 0)], len(healthy.acked) + 1, timeout=30)
    values = [m.value() for m in got]
    assert set(healthy.acked) <= set(values) and b"raw-healthy" in values
    # And it takes writes again.
    producer = make_producer(b, acks="all")
    delivered: list[KafkaError | None] = []
    producer.produce(topic, b"after-restart", partition=full_p, on_delivery=lambda e, m: delivered.append(e))
    assert producer.flush(20) == 0 and delivered == [None]


def _fill(b: Any, topic: str, partition: int) -> tuple[dict[int, bytes], list[KafkaError]]:
    """Produce to ``partition`` until a delivery fails (bounded); returns (acknowledged by offset, errors)."""
    producer = make_producer(b, acks="all", retries=0, **{"message.timeout.ms": 10_000, "linger.ms": 0})
    acked: dict[int, bytes] = {}
    failed: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is None:
            acked[msg.offset() or 0] = msg.value() or b""
        else:
            failed.append(err)

    deadline = time.monotonic() + STOP_AFTER_S
    for i in range((TMPFS_MIB << 20) // VALUE_BYTES * 2):
        if failed or time.monotonic() > deadline:
            break
        producer.produce(topic, f"{i:08d}".encode() * (VALUE_BYTES // 8), partition=partition,
                         on_delivery=on_delivery)
        if i % 8 == 7:
            producer.flush(20)
    producer.flush(30)
    return acked, failed


def test_only_log_dir_full_shuts_down_then_starts_on_the_full_disk_for_reads(
    tmpfs: Path, broker_factory: BrokerFactory
) -> None:
    data = tmpfs / "logs"
    b = broker_factory({"log.dirs": str(data), "offsets.topic.num.partitions": "1",
                        "transaction.state.log.num.partitions": "1"})
    topic = f"only-{uuid.uuid4().hex[:8]}"
    create_topic(b, topic, partitions=1)
    filler = tmpfs / "filler"
    with open(filler, "wb") as f:
        for _ in range(FILLER_MIB):
            f.write(b"\x5a" * (1 << 20))
    acked, failed = _fill(b, topic, 0)
    assert acked and any(e.code() == KafkaError.KAFKA_STORAGE_ERROR for e in failed), failed
    # Kafka halts when no log dir is left; here: a clean stop of the rest and exit status 1.
    assert b.proc is not None
    rc = b.proc.wait(30)
    assert rc == 1, b.log()[-3000:]
    assert "no log dir is left online" in b.log()

    # Still full: the broker starts anyway and serves what it has.
    with open(filler, "ab", buffering=0) as f:  # take whatever the failed appends left free
        for _ in range(TMPFS_MIB * 16):
            try:
                if not f.write(b"\x5a" * (1 << 16)):
                    break
            except OSError:
                break
    assert os.statvfs(tmpfs).f_bavail * os.statvfs(tmpfs).f_frsize < 1 << 16
    b.start()
    got = consume_partitions(b, [TopicPartition(topic, 0, 0)], len(acked), timeout=30)
    assert {m.offset(): m.value() for m in got} == acked
    b.kill()

    # Space again: it takes writes, and nothing acknowledged was lost.
    filler.unlink()
    b.start()
    producer = make_producer(b, acks="all")
    delivered: list[tuple[KafkaError | None, int]] = []
    producer.produce(topic, b"after", on_delivery=lambda e, m: delivered.append((e, m.offset() or 0)))
    assert producer.flush(20) == 0
    assert delivered == [(None, max(acked) + 1)]
    got = consume_partitions(b, [TopicPartition(topic, 0, 0)], len(acked) + 1, timeout=30)
    assert {m.offset(): m.value() for m in got} == {**acked, max(acked) + 1: b"after"}
