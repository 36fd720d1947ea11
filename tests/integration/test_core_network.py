"""The socket edge: bad input, oversized and truncated frames, idle connections and request pipelining.

Bad input must get Kafka's answer (an error code, or a closed connection) and must not
disturb anybody else: a well-behaved confluent-kafka producer and consumer run
throughout the barrage and must finish without a single error.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition
from kio.schema.errors import ErrorCode

from pykbroker.cli import healthcheck
from pykbroker.protocol.records import build_batch
from pykbroker.server.dispatcher import API_TABLE
from tests.integration.conftest import (
    API_VERSIONS_V3_BODY,
    BrokerFactory,
    RawConnection,
    create_topic,
    make_consumer,
    make_producer,
    produce_all,
    request_frame,
    unique_topic,
    wait_until,
    watermarks,
)
from tests.support.broker import BrokerProcess

SOCKET_REQUEST_MAX_BYTES = 2_000_000  # must stay >= message.max.bytes (1048588)
PRODUCE = 0
METADATA = 3
API_VERSIONS = 18


@pytest.fixture(scope="module")
def net_broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    return module_broker_factory({"socket.request.max.bytes": str(SOCKET_REQUEST_MAX_BYTES)})


def _assert_still_usable(conn: RawConnection, correlation_id: int = 4242) -> None:
    resp = conn.request(API_VERSIONS, 3, API_VERSIONS_V3_BODY, correlation_id)
    assert resp.error_code == ErrorCode.none


def _header(api_key: int, version: int, correlation_id: int, client_id: bytes = b"bad") -> bytes:
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _produce_v9(topic: str, records: bytes, correlation_id: int, acks: int = 1) -> bytes:
    return request_frame(PRODUCE, 9, {
        "transactional_id": None, "acks": acks, "timeout": 5000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}],
    }, correlation_id)


# --- the individual bad inputs; each asserts Kafka's answer ----------------------------------------


def bad_http_request(b: BrokerProcess) -> None:
    """Someone points a web client at the Kafka port: the 'size' is ~1.2 GB, over the limit."""
    with RawConnection(b) as conn:
        conn.send(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: curl\r\n\r\n")
        assert conn.wait_closed(5), "connection not closed after HTTP garbage"


def bad_small_garbage_frame(b: BrokerProcess) -> None:
    with RawConnection(b) as conn:
        conn.send(_frame(b"\xff" * 8))  # api key -1
        assert conn.wait_closed(5), "connection not closed after a garbage frame"


def bad_negative_size(b: BrokerProcess) -> None:
    with RawConnection(b) as conn:
        conn.send(struct.pack(">i", -5) + b"abcdef")
        assert conn.wait_closed(5), "connection not closed after a negative frame size"


def bad_short_header(b: BrokerProcess) -> None:
    with RawConnection(b) as conn:
        conn.send(_frame(b"\x00\x03"))  # a frame too short for a request header
        assert conn.wait_closed(5), "connection not closed after a truncated header"


def bad_oversized_frame(b: BrokerProcess) -> None:
    """A frame one byte over socket.request.max.bytes: closed as soon as the size is read."""
    with RawConnection(b) as conn:
        conn.send(struct.pack(">i", SOCKET_REQUEST_MAX_BYTES + 1) + _header(METADATA, 12, 1))
        assert conn.wait_closed(5), "connection not closed after an oversized frame"
        # and the body is never needed: keep writing, the broker has gone away
        with pytest.raises(OSError):
            for _ in range(200):
                conn.send(b"\x00" * 65536)


def bad_truncated_frame_then_close(b: BrokerProcess) -> None:
    with RawConnection(b) as conn:
        frame = request_frame(API_VERSIONS, 3, API_VERSIONS_V3_BODY, 1)
        conn.send(frame[: len(frame) // 2])
    # The broker simply drops the half frame; a new connection is served normally.
    with RawConnection(b) as conn:
        _assert_still_usable(conn)


def bad_truncated_frame_kept_open(b: BrokerProcess) -> None:
    with RawConnection(b) as conn:
        conn.send(struct.pack(">i", 1000) + _header(METADATA, 12, 9) + b"\x00" * 10)
        assert not conn.wait_closed(0.5), "a partial frame must just wait for the rest"


def bad_crc_produce(b: BrokerProcess, topic: str) -> None:
    batch = bytearray(build_batch([(b"k", b"value with a flipped byte", [])], timestamp_ms=int(time.time() * 1000)))
    batch[-3] ^= 0x01  # inside the records: covered by the CRC
    before = watermarks(b, topic)
    with RawConnection(b) as conn:
        conn.send(_produce_v9(topic, bytes(batch), 77))
        resp = conn.read_response(PRODUCE, 9, 77)
        (tresp,) = resp.responses
        (presp,) = tresp.partition_responses
        assert presp.error_code == ErrorCode.corrupt_message, presp
        assert presp.base_offset == -1
        _assert_still_usable(conn)  # an error code, not a closed connection
    assert watermarks(b, topic) == before, "a corrupt batch was appended"


def bad_unknown_api_key(b: BrokerProcess) -> None:
    with RawConnection(b) as conn:
        conn.send(_frame(_header(1000, 0, 5) + b"\x00" * 16))
        assert conn.wait_closed(5), "connection not closed after an unknown API key"


def bad_produce_v99(b: BrokerProcess) -> None:
    with RawConnection(b) as conn:
        conn.send(_frame(_header(PRODUCE, 99, 6) + b"\x00" * 32))
        assert conn.wait_closed(5), "connection not closed after Produce v99"


def bad_api_versions_v99(b: BrokerProcess) -> None:
    """KIP-511: an unsupported ApiVersions version gets a v0 answer with UNSUPPORTED_VERSION and our versions."""
    with RawConnection(b) as conn:
        conn.send(_frame(_header(API_VERSIONS, 99, 31337) + b"\x00\x01\x02 future request body"))
        resp = conn.read_response(API_VERSIONS, 0, 31337)
        assert resp.error_code == ErrorCode.unsupported_version
        versions = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys}
        assert versions[API_VERSIONS] == (API_TABLE[API_VERSIONS].min_version, API_TABLE[API_VERSIONS].max_version)
        assert PRODUCE in versions and METADATA in versions
        _assert_still_usable(conn)  # the client retries with a version we have, on the same connection


def bad_malformed_body(b: BrokerProcess) -> None:
    with RawConnection(b) as conn:
        conn.send(_frame(_header(METADATA, 12, 8) + b"\x00" + b"\xff\xff\xff\xff\xff"))
        assert conn.wait_closed(5), "connection not closed after a malformed Metadata body"


# --- tests ------------------------------------------------------------------------------------------

SIMPLE_BAD_INPUTS: list[Callable[[BrokerProcess], None]] = [
    bad_http_request,
    bad_small_garbage_frame,
    bad_negative_size,
    bad_short_header,
    bad_oversized_frame,
    bad_truncated_frame_then_close,
    bad_truncated_frame_kept_open,
    bad_unknown_api_key,
    bad_produce_v99,
    bad_api_versions_v99,
    bad_malformed_body,
]


@pytest.mark.parametrize("bad_input", SIMPLE_BAD_INPUTS, ids=[f.__name__ for f in SIMPLE_BAD_INPUTS])
def test_bad_input_gets_the_right_answer(net_broker: BrokerProcess, bad_input: Callable[[BrokerProcess], None]) -> None:
    bad_input(net_broker)
    assert healthcheck(net_broker.bootstrap, 5.0)


def test_bad_crc_produce_is_rejected(net_broker: BrokerProcess) -> None:
    topic = unique_topic("net-crc")
    create_topic(net_broker, topic)
    bad_crc_produce(net_broker, topic)
    # the same batch without the flipped byte is accepted on a raw connection
    batch = build_batch([(b"k", b"good value", [])], timestamp_ms=int(time.time() * 1000))
    with RawConnection(net_broker) as conn:
        conn.send(_produce_v9(topic, batch, 78))
        (tresp,) = conn.read_response(PRODUCE, 9, 78).responses
        assert tresp.partition_responses[0].error_code == ErrorCode.none
        assert tresp.partition_responses[0].base_offset == 0


def test_oversized_frame_is_logged(net_broker: BrokerProcess) -> None:
    bad_oversized_frame(net_broker)
    wait_until(lambda: "exceeds socket.request.max.bytes" in net_broker.log(), timeout=5,
               what="a log line about the oversized frame")


class _WellBehavedClients:
    """A confluent-kafka producer and an assign()-mode consumer running in threads."""

    def __init__(self, b: BrokerProcess, topic: str) -> None:
        self.topic = topic
        self.errors: list[str] = []
        self.acked: list[tuple[int, bytes]] = []
        self.consumed: list[tuple[int, bytes]] = []
        self.produced = 0
        self.stop = threading.Event()
        self.producer_done = threading.Event()

        def on_error(err: KafkaError) -> None:
            self.errors.append(f"client error: {err}")

        self.producer = make_producer(b, acks="all", error_cb=on_error, **{"linger.ms": 2})
        self.consumer = make_consumer(b, error_cb=on_error)
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"delivery failed: {err}")
        else:
            self.acked.append((msg.offset(), msg.value()))

    def _produce(self) -> None:
        try:
            for i in range(100_000):
                if self.stop.is_set():
                    break
                self.producer.produce(self.topic, value=f"steady {i}".encode(), partition=0,
                                      on_delivery=self._on_delivery)
                self.produced += 1
                self.producer.poll(0.01)
            left = self.producer.flush(20)
            if left:
                self.errors.append(f"{left} messages never delivered")
        finally:
            self.producer_done.set()

    def _consume(self) -> None:
        try:
            self.consumer.assign([TopicPartition(self.topic, 0, 0)])
            deadline = time.monotonic() + 120
            for _ in range(100_000):
                if time.monotonic() > deadline:
                    self.errors.append("consumer ran out of time")
                    break
                if self.producer_done.is_set() and len(self.consumed) >= len(self.acked):
                    break
                for m in self.consumer.consume(100, timeout=0.1):
                    if m.error() is not None:
                        self.errors.append(f"consume error: {m.error()}")
                    else:
                        self.consumed.append((m.offset() or 0, m.value() or b""))
        finally:
            self.consumer.close()

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        assert not any(t.is_alive() for t in self.threads), "client threads did not finish"


def test_bad_input_barrage_while_clients_keep_working(net_broker: BrokerProcess) -> None:
    topic, crc_topic = unique_topic("net-steady"), unique_topic("net-barrage")
    create_topic(net_broker, topic)
    create_topic(net_broker, crc_topic)
    clients = _WellBehavedClients(net_broker, topic)
    log_mark = len(net_broker.log())
    clients.start()
    try:
        wait_until(lambda: len(clients.consumed) >= 20, timeout=20, what="the clients to get going")
        progress = []
        for _round in range(3):
            for bad in SIMPLE_BAD_INPUTS:
                bad(net_broker)
            bad_crc_produce(net_broker, crc_topic)
            progress.append(len(clients.consumed))
    finally:
        clients.finish()

    assert clients.errors == []
    assert clients.produced >= 50
    assert [o for o, _ in clients.acked] == list(range(clients.produced))
    assert clients.consumed == sorted(clients.acked)
    # The clients made progress during the barrage, not only before and after it.
    assert progress[0] < progress[-1], progress
    barrage_log = net_broker.log()[log_mark:]
    assert "Traceback" not in barrage_log
    assert " ERROR " not in barrage_log
    assert barrage_log.count("closing connection") >= 3 * 8


def test_idle_connections_are_closed(broker_factory: BrokerFactory) -> None:
    b = broker_factory({"connections.max.idle.ms": "1000"})
    with RawConnection(b) as idle:
        started = time.monotonic()
        assert not idle.wait_closed(0.5), "closed long before connections.max.idle.ms"
        assert idle.wait_closed(8), "idle connection was never closed"
        elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 8, elapsed
    assert "closing idle connection" in b.log()

    # A connection in use is not idle: requests every 300 ms for 3 s are all answered.
    with RawConnection(b) as busy:
        for i in range(10):
            _assert_still_usable(busy, correlation_id=i)
            time.sleep(0.3)

    # Clients reconnect transparently after their idle connection is closed.
    topic = unique_topic("net-idle")
    create_topic(b, topic)
    producer = make_producer(b)
    first = produce_all(producer, topic, [{"value": b"before idle"}])
    time.sleep(2.0)
    second = produce_all(producer, topic, [{"value": b"after idle"}])
    assert [(r.offset, r.error) for r in first + second] == [(0, None), (1, None)]


def test_pipelined_requests_are_answered_in_order(net_broker: BrokerProcess) -> None:
    topic = unique_topic("net-pipe")
    create_topic(net_broker, topic)
    kinds: list[tuple[int, int]] = []
    data = bytearray()
    for i in range(1, 51):
        if i % 2:
            kinds.append((API_VERSIONS, 3))
            data += request_frame(API_VERSIONS, 3, API_VERSIONS_V3_BODY, i)
        else:
            kinds.append((METADATA, 12))
            data += request_frame(METADATA, 12, {"topics": [{"name": topic, "topic_id": None}],
                                                 "allow_auto_topic_creation": False,
                                                 "include_topic_authorized_operations": False}, i)
    with RawConnection(net_broker) as conn:
        conn.send(bytes(data))  # all 50 in one write
        for i, (api_key, version) in enumerate(kinds, start=1):
            resp = conn.read_response(api_key, version, i)  # asserts the correlation id
            if api_key == METADATA:
                assert [t.name for t in resp.topics] == [topic]
                assert resp.topics[0].error_code == ErrorCode.none
            else:
                assert resp.error_code == ErrorCode.none


def test_pipelined_produce_requests_are_appended_in_order(net_broker: BrokerProcess) -> None:
    topic = unique_topic("net-pipe-produce")
    create_topic(net_broker, topic)
    now = int(time.time() * 1000)
    data = b"".join(
        _produce_v9(topic, build_batch([(None, f"pipelined {i}".encode(), [])] * 3, timestamp_ms=now), 100 + i)
        for i in range(20)
    )
    with RawConnection(net_broker) as conn:
        conn.send(data)
        offsets = []
        for i in range(20):
            (tresp,) = conn.read_response(PRODUCE, 9, 100 + i).responses
            (presp,) = tresp.partition_responses
            assert presp.error_code == ErrorCode.none
            offsets.append(int(presp.base_offset))
    assert offsets == [3 * i for i in range(20)]
    assert watermarks(net_broker, topic) == (0, 60)


def test_acks_zero_produce_gets_no_response(net_broker: BrokerProcess) -> None:
    topic = unique_topic("net-acks0")
    create_topic(net_broker, topic)
    batch = build_batch([(None, b"fire and forget", [])], timestamp_ms=int(time.time() * 1000))
    with RawConnection(net_broker) as conn:
        conn.send(_produce_v9(topic, batch, 500, acks=0))
        # The next response on the connection is for the next request: nothing came for the produce.
        conn.send(request_frame(API_VERSIONS, 3, API_VERSIONS_V3_BODY, 501))
        assert conn.read_response(API_VERSIONS, 3, 501).error_code == ErrorCode.none
        # acks=0 with an error (unknown topic): Kafka closes the connection to tell the producer.
        conn.send(_produce_v9(unique_topic("net-nowhere"), batch, 502, acks=0))
        assert conn.wait_closed(5)
    assert watermarks(net_broker, topic) == (0, 1)


FETCH = 1
MAX_WAIT_FOREVER_MS = 2**31 - 1  # kafka-go's Conn asks for this


def _fetch_v4_at(topic: str, offset: int, correlation_id: int) -> bytes:
    return request_frame(FETCH, 4, {
        "replica_id": -1, "max_wait": MAX_WAIT_FOREVER_MS, "min_bytes": 1, "max_bytes": 1 << 20,
        "isolation_level": 0,
        "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": offset,
                                                     "partition_max_bytes": 1 << 20}]}],
    }, correlation_id)


def _produce_v3(topic: str, records: bytes, correlation_id: int) -> bytes:
    return request_frame(PRODUCE, 3, {
        "transactional_id": None, "acks": 1, "timeout": 5000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}],
    }, correlation_id)


@pytest.mark.parametrize("max_inflight", ["5", "1"])
def test_fetch_waiting_at_the_log_end_does_not_block_the_produce_behind_it(
        broker_factory: BrokerFactory, max_inflight: str) -> None:
    """One connection: a Fetch at the log end that may wait ~25 days, then at once the Produce that writes at
    that offset (kafka-go's Conn reads and writes concurrently on one socket).  The produce is read and
    appended while the fetch waits, the fetch answers with its data, and the responses keep request order."""
    b = broker_factory({"pykbroker.max.inflight.requests.per.connection": max_inflight})
    topic = unique_topic("net-longpoll")
    create_topic(b, topic)
    produce_all(make_producer(b), topic, [{"value": b"before", "partition": 0}])
    batch = build_batch([(None, b"wakes the fetch", [])], timestamp_ms=int(time.time() * 1000))
    with RawConnection(b, timeout=10) as conn:
        conn.send(_fetch_v4_at(topic, 1, 1) + _produce_v3(topic, batch, 2))
        fetched = conn.read_response(FETCH, 4, 1)  # first: request order
        (part,) = fetched.responses[0].partitions
        assert part.error_code == ErrorCode.none and part.high_watermark == 2
        assert part.records, "the fetch answered with the record the produce behind it wrote"
        (tresp,) = conn.read_response(PRODUCE, 3, 2).responses
        assert tresp.partition_responses[0].error_code == ErrorCode.none
        assert tresp.partition_responses[0].base_offset == 1
        # The connection goes on serving in order.
        _assert_still_usable(conn)
