"""The request pipeline without sockets: frames in, frames out, through a real Broker's services."""

from __future__ import annotations

import datetime
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.protocol import codec
from pykbroker.protocol.framing import CloseConnection, FrameDecoder
from pykbroker.protocol.records import build_batch, decode_records
from pykbroker.server.broker import Broker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(BrokerConfig({"log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0"}))
    b.startup()
    try:
        yield b
    finally:
        b.log_manager.shutdown()


def frame_for(api_key: int, version: int, body: dict[str, Any], correlation_id: int = 1) -> bytes:
    client = b"unit"
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client)) + client
    if codec.is_flexible(api_key, version):
        header += b"\x00"
    return header + codec.encode_entity(codec.build(codec.request_class(api_key, version), body))


def call(b: Broker, api_key: int, version: int, body: dict[str, Any], correlation_id: int = 1) -> Any:
    out = anyio.run(b.dispatcher.handle, frame_for(api_key, version, body, correlation_id))
    assert out is not None
    dec = FrameDecoder(1 << 30)
    dec.feed(out)
    payload = dec.next_frame()
    assert payload is not None
    (corr,) = struct.unpack_from(">i", payload, 0)
    assert corr == correlation_id
    flexible = codec.is_flexible(api_key, version) and api_key != 18
    return codec.decode_response(api_key, version, payload, 5 if flexible else 4)


def test_api_versions_lists_the_table(broker: Broker) -> None:
    resp = call(broker, 18, 3, {"client_software_name": "unit", "client_software_version": "1"})
    assert resp.error_code == ErrorCode.none
    keys = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert keys[0] == (0, 11) and keys[1][0] == 0  # Kafka 3.9's floors (pykbroker.protocol.legacy)


def test_unsupported_api_versions_answers_v0(broker: Broker) -> None:
    frame = struct.pack(">hhih", 18, 99, 7, -1)
    out = anyio.run(broker.dispatcher.handle, frame)
    assert out is not None
    resp = codec.decode_response(18, 0, out[4:], 4)
    assert resp.error_code == ErrorCode.unsupported_version
    assert resp.api_keys


@pytest.mark.parametrize("frame", [
    struct.pack(">hhih", 0, 99, 1, -1),        # unsupported produce version
    struct.pack(">hhih", 999, 0, 1, -1),       # unknown API key
    b"\x00\x03",                               # truncated header
    struct.pack(">hhih", 3, 12, 1, -1) + b"\x00\xff\xff\xff\xff\xff",  # garbage body
])
def test_unparseable_requests_close_the_connection(broker: Broker, frame: bytes) -> None:
    with pytest.raises(CloseConnection):
        anyio.run(broker.dispatcher.handle, frame)


def test_create_produce_fetch_roundtrip(broker: Broker) -> None:
    created = call(broker, 19, 7, {"topics": [{"name": "t", "num_partitions": 2, "replication_factor": 1,
                                               "assignments": [], "configs": []}],
                                   "timeout": 1000, "validate_only": False})
    assert created.topics[0].error_code == ErrorCode.none
    assert created.topics[0].num_partitions == 2
    dup = call(broker, 19, 7, {"topics": [{"name": "t", "num_partitions": 1, "replication_factor": 1,
                                           "assignments": [], "configs": []}], "timeout": 1000})
    assert dup.topics[0].error_code == ErrorCode.topic_already_exists

    batch = build_batch([(b"k", b"v1", []), (None, b"v2", [("h", b"x")])], timestamp_ms=1_700_000_000_000)
    produced = call(broker, 0, 9, {"acks": 1, "timeout": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 1, "records": batch}]}]})
    part = produced.responses[0].partition_responses[0]
    assert part.error_code == ErrorCode.none and part.base_offset == 0

    bad = bytearray(batch)
    bad[-1] ^= 0xFF
    rejected = call(broker, 0, 9, {"acks": 1, "timeout": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 1, "records": bytes(bad)}]}]})
    assert rejected.responses[0].partition_responses[0].error_code == ErrorCode.corrupt_message

    fetched = call(broker, 1, 12, {"max_wait": datetime.timedelta(0), "min_bytes": 1, "max_bytes": 1 << 20,
                                   "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
        {"topic": "t", "partitions": [{"partition": 1, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                                       "current_leader_epoch": -1, "last_fetched_epoch": -1,
                                       "log_start_offset": -1}]}],
        "forgotten_topics_data": [], "rack_id": ""})
    fp = fetched.responses[0].partitions[0]
    assert fp.error_code == ErrorCode.none and fp.high_watermark == 2
    records = decode_records(fp.records)
    assert [(r.key, r.value) for r in records] == [(b"k", b"v1"), (None, b"v2")]
    assert [r.offset for r in records] == [0, 1]


def test_metadata_auto_creates_and_rejects_bad_names(broker: Broker) -> None:
    resp = call(broker, 3, 12, {"topics": [{"name": "auto", "topic_id": None}, {"name": "bad/name"}],
                                "allow_auto_topic_creation": True})
    by_name = {t.name: t for t in resp.topics}
    # Created by this request: answered as Kafka does, with no partitions yet and a retriable error.
    assert by_name["auto"].error_code == ErrorCode.leader_not_available and not by_name["auto"].partitions
    assert by_name["bad/name"].error_code == ErrorCode.invalid_topic_exception
    assert resp.brokers[0].node_id == 0
    again = call(broker, 3, 12, {"topics": [{"name": "auto", "topic_id": None}], "allow_auto_topic_creation": True})
    assert again.topics[0].error_code == ErrorCode.none and len(again.topics[0].partitions) == 1


def _flush_on_ack_broker(tmp_path: Path) -> Broker:
    b = Broker(BrokerConfig({"log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0",
                             "log.flush.on.ack": "true"}))
    b.startup()
    return b


def _produce_frame(acks: int, n: int = 3) -> bytes:
    batch = bytes(build_batch([(None, b"v%d" % i, []) for i in range(n)], timestamp_ms=1_700_000_000_000))
    return frame_for(0, 9, {"transactional_id": None, "acks": acks, "timeout": 30000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": batch}]}]})


def test_a_flush_on_ack_produce_settles_by_callback_once_durable(tmp_path: Path) -> None:
    """acks=1 with log.flush.on.ack: the answer comes from the fsync's callback (no task), and only once the
    appended data is durable."""
    from pykbroker.server.parked import Parked
    b = _flush_on_ack_broker(tmp_path)
    try:
        call(b, 19, 4, {"topics": [{"name": "t", "num_partitions": 1, "replication_factor": 1}], "timeout": 30000})
        lg = b.services.replicas.partition("t", 0).log

        async def main() -> tuple[Any, BaseException | None, bool]:
            out = await b.dispatcher.handle_pipelined(_produce_frame(1))
            assert isinstance(out, Parked) and out.settle is not None
            settled: list[tuple[Any, BaseException | None, bool]] = []
            out.settle(lambda response, error: settled.append(
                (response, error, lg.begin_data_flush(lg.log_end_offset) is None)))
            assert not settled  # never inside settle
            with anyio.fail_after(10):
                for _ in range(1000):
                    if settled:
                        break
                    await anyio.sleep(0.005)
            # acks=all on a lone broker: the high watermark is reached on append, only the fsync is left.
            # The awaitable form gives the same answer (callers that do not pipeline use it).
            everything = await b.dispatcher.handle_pipelined(_produce_frame(-1))
            assert isinstance(everything, Parked) and everything.settle is not None
            assert isinstance(await everything.finish(), bytes)
            return settled[0]

        response, error, durable = anyio.run(main)
        assert error is None and durable
        dec = FrameDecoder(1 << 30)
        dec.feed(response)
        payload = dec.next_frame()
        resp = codec.decode_response(0, 9, payload, 5)
        part = resp.responses[0].partition_responses[0]
        assert part.error_code == ErrorCode.none and part.base_offset == 0
    finally:
        b.log_manager.shutdown()


def test_a_failed_fsync_settles_as_kafka_storage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pykbroker.server.parked import Parked
    from pykbroker.storage.log import KafkaStorageError
    b = _flush_on_ack_broker(tmp_path)
    try:
        call(b, 19, 4, {"topics": [{"name": "t", "num_partitions": 1, "replication_factor": 1}], "timeout": 30000})
        lg = b.services.replicas.partition("t", 0).log

        def offline(offset: int) -> None:
            raise KafkaStorageError("the log dir is offline")

        monkeypatch.setattr(lg, "begin_data_flush", offline)

        async def main() -> tuple[Any, BaseException | None]:
            out = await b.dispatcher.handle_pipelined(_produce_frame(1))
            assert isinstance(out, Parked) and out.settle is not None
            settled: list[tuple[Any, BaseException | None]] = []
            out.settle(lambda response, error: settled.append((response, error)))
            with anyio.fail_after(10):
                for _ in range(1000):
                    if settled:
                        break
                    await anyio.sleep(0.005)
            return settled[0]

        response, error = anyio.run(main)
        assert error is None
        dec = FrameDecoder(1 << 30)
        dec.feed(response)
        resp = codec.decode_response(0, 9, dec.next_frame(), 5)
        assert resp.responses[0].partition_responses[0].error_code == ErrorCode.kafka_storage_error
    finally:
        b.log_manager.shutdown()
