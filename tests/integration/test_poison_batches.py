"""Batches Kafka would refuse are refused, and consumers read on past them.

Each poison batch goes to a subprocess broker in a raw Produce request between two good
batches; the broker must answer with Kafka's error code (and per-record errors on v8+), leave
the log end offset where it was, and a confluent-kafka consumer must then read every good
message to the end with no error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import zstandard
from confluent_kafka import KafkaError, Message, TopicPartition

from pykbroker.protocol import record_validator as rv
from pykbroker.protocol.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    INVALID_TIMESTAMP,
    build_batch,
)
from pykbroker.storage.log_config import LogConfig
from tests.integration.conftest import (
    CLIENT_TIMEOUT,
    BrokerFactory,
    RawConnection,
    consume_partitions,
    create_topic,
    make_producer,
    unique_topic,
    watermarks,
)
from tests.support.broker import BrokerProcess
from tests.unit.test_record_validation import _varint, batch, record

NONE_ERROR = 0


@pytest.fixture(scope="module")
def poison_broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    return module_broker_factory()


def _now() -> int:
    return int(time.time() * 1000)


def _good(i: int) -> bytes:
    return build_batch([(b"good-%d" % i, b"value-%d" % i, [])], timestamp_ms=_now())


def _zstd_bomb() -> bytes:
    limit = rv.max_uncompressed_bytes(LogConfig().max_message_bytes)
    cobj = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    chunk = b"\x00" * (1 << 20)
    return b"".join(cobj.compress(chunk) for _ in range(limit // len(chunk) + 4)) + cobj.flush()


def _crc_mismatch() -> bytes:
    b = bytearray(_good(99))
    b[-1] ^= 0xFF
    return bytes(b)


_GARBAGE = bytes(range(7, 250)) * 3

# name -> (batch builder, Kafka's error code, per-record errors expected on v8+)
POISON: dict[str, tuple[Callable[[], bytes], int, bool]] = {
    "record-length-lies": (lambda: bytes(batch(record(size_adjust=1) + record(offset_delta=1), 2,
                                               base_ts=_now())), INVALID_RECORD, False),
    "garbage-gzip": (lambda: bytes(batch(record(), 1, codec=COMPRESSION_GZIP, compressed_body=_GARBAGE,
                                         base_ts=_now())), CORRUPT_MESSAGE, False),
    "garbage-snappy": (lambda: bytes(batch(record(), 1, codec=COMPRESSION_SNAPPY, compressed_body=_GARBAGE,
                                           base_ts=_now())), CORRUPT_MESSAGE, False),
    "garbage-lz4": (lambda: bytes(batch(record(), 1, codec=COMPRESSION_LZ4, compressed_body=_GARBAGE,
                                        base_ts=_now())), CORRUPT_MESSAGE, False),
    "garbage-zstd": (lambda: bytes(batch(record(), 1, codec=COMPRESSION_ZSTD, compressed_body=_GARBAGE,
                                         base_ts=_now())), CORRUPT_MESSAGE, False),
    "count-2^31-1": (lambda: bytes(batch(record(), (1 << 31) - 1, base_ts=_now())), INVALID_RECORD, False),
    "bad-varint": (lambda: bytes(batch(_varint(11) + b"\x00\x00\x80\x80\x80\x80\x80\x01\x00\x00\x00", 1,
                                       base_ts=_now())), INVALID_RECORD, False),
    "header-count-overrun": (lambda: bytes(batch(record(headers=_varint(1000)), 1, base_ts=_now())),
                             INVALID_RECORD, False),
    "trailing-bytes": (lambda: bytes(batch(record() + b"\x00\x00\x00", 1, base_ts=_now())), INVALID_RECORD, False),
    "crc-mismatch": (_crc_mismatch, CORRUPT_MESSAGE, False),
    "log-append-time-without-timestamp": (lambda: bytes(batch(record(), 1, attributes=0x08, max_ts=-1,
                                                              base_ts=_now())), INVALID_TIMESTAMP, True),
    "zstd-bomb": (lambda: bytes(batch(b"", 1, codec=COMPRESSION_ZSTD, compressed_body=_zstd_bomb(),
                                      base_ts=_now())), INVALID_RECORD, False),
}


def _produce(conn: RawConnection, topic: str, records: bytes, version: int, cid: int) -> Any:
    body = {"transactional_id": None, "acks": 1, "timeout": 10000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}]}
    resp = conn.request(0, version, body, correlation_id=cid)
    return resp.responses[0].partition_responses[0]


def _read_all(b: BrokerProcess, topic: str, expected: int) -> list[Message]:
    msgs = consume_partitions(b, [TopicPartition(topic, 0, 0)], expected)  # asserts no consumer error
    assert len(msgs) == expected
    return msgs


@pytest.mark.parametrize("name", list(POISON))
def test_poison_batch_is_refused_and_the_log_stays_readable(poison_broker: BrokerProcess, name: str) -> None:
    build, code, per_record = POISON[name]
    topic = unique_topic("poison")
    create_topic(poison_broker, topic)
    with RawConnection(poison_broker) as conn:
        first = _produce(conn, topic, _good(0), 9, 1)
        assert (first.error_code, first.base_offset) == (NONE_ERROR, 0)
        for cid, version in ((2, 9), (3, 7)):  # flexible v9 with record_errors, and v7 without them
            p = _produce(conn, topic, build(), version, cid)
            assert p.error_code == code, f"{name} v{version}: error {p.error_code}, message {p.error_message!r}"
            assert p.base_offset == -1
            if version >= 8:
                assert p.error_message
                if per_record:
                    assert [e.batch_index for e in p.record_errors] == [0]
                    assert "LogAppendTime" in p.record_errors[0].batch_index_error_message
                else:
                    assert not p.record_errors
        assert watermarks(poison_broker, topic) == (0, 1)
        after = _produce(conn, topic, _good(1), 9, 4)
        assert (after.error_code, after.base_offset) == (NONE_ERROR, 1)
    msgs = _read_all(poison_broker, topic, 2)
    assert [(m.offset(), m.key()) for m in msgs] == [(0, b"good-0"), (1, b"good-1")]
    assert watermarks(poison_broker, topic) == (0, 2)


def test_keyless_records_on_a_compacted_topic(poison_broker: BrokerProcess) -> None:
    topic = unique_topic("poison-compact")
    create_topic(poison_broker, topic, config={"cleanup.policy": "compact"})
    keyless = build_batch([(b"a", b"1", []), (None, b"2", []), (None, b"3", [])], timestamp_ms=_now())
    with RawConnection(poison_broker) as conn:
        assert _produce(conn, topic, _good(0), 9, 1).error_code == NONE_ERROR
        p = _produce(conn, topic, keyless, 9, 2)
        assert p.error_code == INVALID_RECORD
        expected = f"Compacted topic cannot accept message without key in topic partition {topic}-0."
        assert [(e.batch_index, e.batch_index_error_message) for e in p.record_errors] == [
            (1, expected), (2, expected)]
        assert p.error_message.startswith("One or more records have been rejected due to 2 record errors")
        assert _produce(conn, topic, _good(1), 9, 3).base_offset == 1
    assert [m.key() for m in _read_all(poison_broker, topic, 2)] == [b"good-0", b"good-1"]


def test_well_behaved_producer_alongside_sees_no_error(poison_broker: BrokerProcess) -> None:
    topic = unique_topic("poison-mixed")
    create_topic(poison_broker, topic)
    errors: list[KafkaError] = []
    refusals: list[int] = []
    delivered: list[int] = []
    stop = threading.Event()

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append(msg.offset() or 0)

    def poison_loop() -> None:
        with RawConnection(poison_broker) as conn:
            for i, (build, _code, _) in enumerate(v for k, v in POISON.items() if k != "zstd-bomb"):
                if stop.is_set():
                    return
                refusals.append(_produce(conn, topic, build(), 9, 100 + i).error_code)

    producer = make_producer(poison_broker, **{"linger.ms": 1, "compression.type": "lz4"})
    t = threading.Thread(target=poison_loop)
    t.start()
    try:
        total = 2000
        deadline = time.monotonic() + CLIENT_TIMEOUT
        for i in range(total):
            producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, on_delivery=on_delivery)
            if i % 100 == 0:
                producer.poll(0.01)
            if time.monotonic() > deadline:
                break
        assert producer.flush(CLIENT_TIMEOUT) == 0
    finally:
        stop.set()
        t.join(timeout=30)
    assert not t.is_alive()
    assert errors == []
    assert len(delivered) == total
    msgs = _read_all(poison_broker, topic, total)
    assert [m.value() for m in msgs] == [b"v%d" % i for i in range(total)]
    assert refusals == [code for k, (_, code, _) in POISON.items() if k != "zstd-bomb"]
