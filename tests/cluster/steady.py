"""A producer at steady load that records what was acknowledged, and the check that it all survived."""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition


class SteadyProducer:
    """An idempotent acks=all producer sending numbered values until stopped (bounded by ``max_seconds``)."""

    def __init__(self, bootstrap: str, topic: str, *, rate: int = 200, max_seconds: float = 120.0,
                 prefix: str = "m", settings: dict[str, Any] | None = None) -> None:
        self.topic = topic
        self.rate = rate
        self.max_seconds = max_seconds
        self.prefix = prefix  # values are <prefix><8-digit number>
        self.acked: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset)
        self.errors: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self._producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "message.timeout.ms": 120000, "request.timeout.ms": 10000,
            "retry.backoff.ms": 100, "topic.metadata.refresh.interval.ms": 1000, **(settings or {}),
        })
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"{err.name()}: {err.str()}")
        else:
            self.acked[msg.value()] = (msg.partition(), msg.offset())

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        interval = 1.0 / self.rate
        while not self._stop.is_set() and time.monotonic() < deadline:
            value = f"{self.prefix}{self.sent:08d}".encode()
            try:
                self._producer.produce(self.topic, value, key=value, on_delivery=self._delivered)
                self.sent += 1
            except BufferError:
                pass
            self._producer.poll(0)
            time.sleep(interval)

    def start(self) -> SteadyProducer:
        self._thread.start()
        return self

    def acked_count(self) -> int:
        return len(self.acked)

    def stop(self, flush_timeout: float = 120.0) -> None:
        self._stop.set()
        self._thread.join(30)
        remaining = self._producer.flush(flush_timeout)
        assert remaining == 0, f"{remaining} messages still unacknowledged after {flush_timeout}s"

    def close(self) -> None:
        """Destroy the client, so that it stops connecting to brokers that go away with their network; what it
        still holds is purged (each purged record's delivery report says so), not waited for."""
        self._producer.purge()
        self._producer.close()


def read_all(bootstrap: str, topic: str, partitions: int, timeout: float = 60.0) -> dict[bytes, list[tuple[int, int]]]:
    """Every record of the topic up to the end offsets at the time of the call: value -> [(partition, offset)]."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "verify", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "enable.partition.eof": True})
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=20)[1] for p in range(partitions)}
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        seen: dict[bytes, list[tuple[int, int]]] = {}
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + timeout
        for _ in range(1_000_000):
            if len(done) == partitions or time.monotonic() > deadline:
                break
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= ends[msg.partition()]:
                    done.add(msg.partition())
                continue
            seen.setdefault(msg.value(), []).append((msg.partition(), msg.offset()))
            if msg.offset() + 1 >= ends[msg.partition()]:
                done.add(msg.partition())
        assert len(done) == partitions, f"read only partitions {sorted(done)} of {partitions} within {timeout}s"
        return seen
    finally:
        c.close()


def assert_nothing_lost(producer: SteadyProducer, seen: dict[bytes, list[tuple[int, int]]]) -> None:
    missing = [v for v in producer.acked if v not in seen]
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
    dupes = {v: where for v, where in seen.items() if len(where) > 1}
    assert not dupes, f"{len(dupes)} messages written twice by an idempotent producer, e.g. {list(dupes.items())[:3]}"
    moved = [v for v, where in producer.acked.items() if seen[v][0] != where]
    assert not moved, f"{len(moved)} acknowledged messages are not at their acknowledged offsets: {moved[:5]}"
