"""The campaign's load, with real clients (confluent-kafka): an idempotent acks=all producer and a consumer
group of two members committing what they polled, each recording exactly what it observed."""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from tests.cluster.steady import SteadyProducer
from tests.nemesis.checker import ASSIGNED, Record


class Writer(SteadyProducer):
    """Numbered values ``<tag>-<n>``, one per ``1/rate`` seconds until stopped; each acknowledgement's time and
    latency are kept for the timeline."""

    def __init__(self, bootstrap: str, topic: str, tag: str, *, rate: int = 200, max_seconds: float = 900.0) -> None:
        super().__init__(bootstrap, topic, rate=rate, max_seconds=max_seconds, prefix=f"{tag}-", settings={
            "broker.address.family": "v4", "message.timeout.ms": 180000, "client.id": f"nemesis-{tag}"})
        self.acks: list[tuple[float, float]] = []  # (monotonic time of the ack, latency in seconds)

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        super()._delivered(err, msg)
        if err is None:
            latency = msg.latency()
            self.acks.append((time.monotonic(), latency if latency is not None else 0.0))

    def start(self) -> Writer:
        super().start()
        return self

    def stop_and_flush(self, flush_timeout: float = 180.0) -> int:
        """Stop sending and wait for every delivery report; the count still unreported."""
        self._stop.set()
        self._thread.join(30)
        return int(self._producer.flush(flush_timeout))


class Reader:
    """One member of the group: polls, records every record and rebalance, commits after each poll."""

    def __init__(self, bootstrap: str, topic: str, group: str, name: str, *, max_seconds: float = 900.0,
                 settings: dict[str, Any] | None = None) -> None:
        self.name = name
        self.topic = topic
        self.max_seconds = max_seconds
        self.polls: list[Record | str] = []
        self.polled_at: list[float] = []  # the monotonic time each polled record (not marker) was returned
        self.commits: list[tuple[int, int] | str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._consumer = Consumer({
            "bootstrap.servers": bootstrap, "broker.address.family": "v4", "group.id": group,
            "client.id": f"nemesis-{name}", "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000, "heartbeat.interval.ms": 1000, "topic.metadata.refresh.interval.ms": 1000,
            **(settings or {}),
        })
        self._thread = threading.Thread(target=self._run, name=f"nemesis-{name}", daemon=True)

    def _assigned(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.polls.append(ASSIGNED)
        self.commits.append(ASSIGNED)

    def _run(self) -> None:
        self._consumer.subscribe([self.topic], on_assign=self._assigned, on_revoke=self._assigned)
        deadline = time.monotonic() + self.max_seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            msgs = self._consumer.consume(500, 0.5)
            got = False
            for m in msgs:
                if m.error() is not None:
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        self.errors.append(f"{m.error().name()}: {m.error().str()}")
                    continue
                self.polls.append((m.partition(), m.offset(), m.value()))
                self.polled_at.append(time.monotonic())
                got = True
            if got:
                try:
                    done = self._consumer.commit(asynchronous=False)
                except KafkaException as e:  # a coordinator moving: the next poll's commit covers it
                    self.errors.append(f"commit: {e.args[0].name()}")
                    continue
                for tp in done or []:
                    if tp.error is None and tp.offset >= 0:
                        self.commits.append((tp.partition, tp.offset))
        self._consumer.close()

    def start(self) -> Reader:
        self._thread.start()
        return self

    def consumed(self) -> int:
        return sum(1 for r in self.polls if not isinstance(r, str))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
