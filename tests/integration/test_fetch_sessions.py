"""Incremental fetch sessions (KIP-227) with a client that uses them: kafka-python keeps one
session per broker and, after the first full fetch, names only partitions whose position moved."""

from __future__ import annotations

import time
from typing import Any

from kafka import KafkaConsumer
from kafka import TopicPartition as KPTopicPartition

from tests.integration.conftest import BrokerFactory, create_topic, make_producer, produce_all, unique_topic

PARTITIONS = 12


def _session_of(consumer: KafkaConsumer) -> tuple[int, int]:
    """(session id, next epoch) of the client's fetch session with the one broker."""
    handlers = consumer._fetcher._session_handlers  # the client's own bookkeeping, read-only
    assert len(handlers) == 1
    meta = next(iter(handlers.values())).next_metadata
    return int(meta.session_id), int(meta.epoch)


def test_kafka_python_consumes_everything_through_an_incremental_session(broker_factory: BrokerFactory) -> None:
    b = broker_factory()
    topic = unique_topic("kip227")
    create_topic(b, topic, partitions=PARTITIONS)
    consumer = KafkaConsumer(bootstrap_servers=b.bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", request_timeout_ms=15000, fetch_max_wait_ms=100)
    got: dict[int, list[Any]] = {p: [] for p in range(PARTITIONS)}

    def drain(total: int) -> None:
        deadline = time.monotonic() + 30
        for _ in range(600):
            if sum(len(v) for v in got.values()) >= total or time.monotonic() > deadline:
                return
            for tp, records in consumer.poll(timeout_ms=100).items():
                got[tp.partition].extend(records)

    try:
        consumer.assign([KPTopicPartition(topic, p) for p in range(PARTITIONS)])
        sent: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        sessions: list[tuple[int, int]] = []
        producer = make_producer(b)
        # Three waves, each to a different subset of partitions, so incremental responses must
        # bring exactly the partitions that changed and the session must keep every position.
        for wave, parts in enumerate(([0, 1, 2, 3], [5, 7, 11], list(range(PARTITIONS)))):
            msgs = [{"value": f"w{wave}-p{p}-{i}".encode(), "partition": p} for p in parts for i in range(25)]
            produce_all(producer, topic, msgs)
            for m in msgs:
                sent[m["partition"]].append(m["value"])
            drain(sum(len(v) for v in sent.values()))
            sessions.append(_session_of(consumer))
        # One session throughout, its epoch moving: every fetch after the first was incremental.
        assert sessions[0][0] != 0 and len({sid for sid, _ in sessions}) == 1, sessions
        assert sessions[0][1] < sessions[1][1] < sessions[2][1], sessions
        for p in range(PARTITIONS):
            assert [r.offset for r in got[p]] == list(range(len(sent[p]))), p
            assert [r.value for r in got[p]] == sent[p]
    finally:
        consumer.close()
