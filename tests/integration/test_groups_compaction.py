"""Log compaction with a real broker: user topics and __consumer_offsets."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import BrokerProcess, segment_sizes

OVERRIDES = {
    "log.cleaner.backoff.ms": "200",
    "offsets.topic.num.partitions": "1",
    "offsets.topic.segment.bytes": "16384",
    "group.min.session.timeout.ms": "1000",
}


def _dir_size(path: Path) -> int:
    return sum(segment_sizes(path).values())


@pytest.mark.timeout(120)
def test_compacted_topic_keeps_latest_value_per_key(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "broker", overrides=OVERRIDES).start()
    try:
        topic = f"c-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1, config={
            "cleanup.policy": "compact", "segment.bytes": "8192", "delete.retention.ms": "0"})])[topic].result(10)
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "batch.size": 2000})
        for i in range(2000):
            p.produce(topic, key=b"k%d" % (i % 20), value=b"v%d" % i)
            if i % 100 == 0:
                p.flush(10)
        for k in (3, 7):
            p.produce(topic, key=b"k%d" % k, value=None)  # tombstones
        for i in range(200):  # roll past the tombstones so they leave the active segment
            p.produce(topic, key=b"filler%d" % (i % 2), value=b"x" * 50)
        assert p.flush(10) == 0
        part_dir = tmp_path / "broker" / "logs" / f"{topic}-0"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _dir_size(part_dir) > 16000:
            time.sleep(0.2)
        assert _dir_size(part_dir) <= 16000, _dir_size(part_dir)
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"r-{uuid.uuid4().hex[:6]}",
                      "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.assign([TopicPartition(topic, 0, 0)])
        latest: dict[bytes, bytes | None] = {}
        offsets: list[int] = []
        end = time.monotonic() + 20
        while time.monotonic() < end:
            m = c.poll(0.5)
            if m is None:
                if offsets and offsets[-1] >= 2201:
                    break
                continue
            if m.error():
                continue
            offsets.append(m.offset())
            latest[m.key()] = m.value()
        c.close()
        assert offsets == sorted(offsets) and offsets[-1] == 2201
        assert len(offsets) < 500  # compacted
        for k in range(20):
            key = b"k%d" % k
            if k in (3, 7):
                assert latest.get(key) is None
            else:
                assert latest[key] == b"v%d" % (1980 + k)
    finally:
        b.kill()


@pytest.mark.timeout(120)
def test_consumer_offsets_bounded_under_constant_commits(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "broker", overrides=OVERRIDES).start()
    try:
        topic = f"t-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "committer", "enable.auto.commit": False})
        n = 3000
        started = time.monotonic()
        for i in range(n):
            c.commit(offsets=[TopicPartition(topic, 0, i)], asynchronous=False)
        rate = n / (time.monotonic() - started)
        offsets_dir = tmp_path / "broker" / "logs" / "__consumer_offsets-0"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _dir_size(offsets_dir) > 40_000:
            time.sleep(0.2)
        size = _dir_size(offsets_dir)
        print(f"COMMITS rate={rate:.0f}/s __consumer_offsets after {n} commits: {size} bytes")
        assert size <= 40_000, size  # vs ~100 bytes x 3000 commits uncompacted
        # The latest commit survives compaction and a restart.
        c.close()
        b.restart()
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "committer", "enable.auto.commit": False})
        assert c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == n - 1
        c.close()
    finally:
        b.kill()
