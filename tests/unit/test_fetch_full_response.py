"""Fetch at many partitions. Limits: once the response is full the remaining partitions answer
without reading their logs, exactly as Kafka's read with a limit of 0 would (empty records, their
high watermarks, OFFSET_OUT_OF_RANGE where the offset is outside the log). Long polls: one that times
out with no partition notified answers with its first pass instead of reading every partition again."""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.protocol import codec
from pykbroker.protocol.framing import FrameDecoder
from pykbroker.protocol.records import build_batch, iter_batches
from pykbroker.server.broker import Broker
from pykbroker.server.handlers import fetch as fetch_handler
from tests.unit.test_dispatcher import call, frame_for

PARTITIONS = 6


def _broker(tmp_path: Path) -> Broker:
    b = Broker(BrokerConfig({"log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0"}))
    b.startup()
    created = call(b, 19, 7, {"topics": [{"name": "t", "num_partitions": PARTITIONS, "replication_factor": 1,
                                          "assignments": [], "configs": []}], "timeout": 1000})
    assert created.topics[0].error_code == ErrorCode.none
    for p in range(PARTITIONS):
        for i in range(3):  # three batches of about 680 bytes in every partition
            batch = build_batch([(None, bytes([65 + i]) * 600, [])], timestamp_ms=1_700_000_000_000)
            produced = call(b, 0, 9, {"acks": 1, "timeout": 1000, "topic_data": [
                {"name": "t", "partition_data": [{"index": p, "records": batch}]}]})
            assert produced.responses[0].partition_responses[0].error_code == ErrorCode.none
    return b


def _fetch(b: Broker, offsets: dict[int, int], max_bytes: int, partition_max_bytes: int = 1 << 20) -> list[Any]:
    fetched = call(b, 1, 12, {"max_wait": datetime.timedelta(0), "min_bytes": 1, "max_bytes": max_bytes,
                              "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
        {"topic": "t", "partitions": [{"partition": p, "fetch_offset": o, "partition_max_bytes": partition_max_bytes,
                                       "current_leader_epoch": -1, "last_fetched_epoch": -1, "log_start_offset": -1}
                                      for p, o in offsets.items()]}],
        "forgotten_topics_data": [], "rack_id": ""})
    return list(fetched.responses[0].partitions)


def _batches(records: Any) -> list[tuple[int, int]]:
    data = bytes(records or b"")
    return [(h.base_offset, h.last_offset) for h in iter_batches(data)]


def test_a_full_response_answers_the_other_partitions_empty(tmp_path: Path) -> None:
    b = _broker(tmp_path)
    try:
        offsets = {0: 1, 1: 0, 2: 3, 3: 99, 4: 0, 5: 2}
        # 500 bytes: less than one batch, but the first partition with data always gets a whole one.
        for _ in range(2):  # the second time the remembered batch headers answer
            got = {p.partition_index: p for p in _fetch(b, offsets, 500)}
            assert list(got) == list(offsets)  # every partition answered, in the request's order
            assert _batches(got[0].records) == [(1, 1)]
            for i in (1, 2, 4, 5):
                assert got[i].error_code == ErrorCode.none and _batches(got[i].records) == []
                assert got[i].high_watermark == 3 and got[i].log_start_offset == 0
            assert got[3].error_code == ErrorCode.offset_out_of_range
        # Room for exactly the two remaining batches of partition 0 and nothing more.
        two = len(bytes(_fetch(b, {0: 1}, 1 << 20)[0].records))
        got = {p.partition_index: p for p in _fetch(b, {0: 1, 1: 0, 4: 0}, two)}
        assert _batches(got[0].records) == [(1, 1), (2, 2)]
        assert _batches(got[1].records) == [] and _batches(got[4].records) == []
        # A per-partition limit cuts at whole batches; the response limit goes on to the next partition.
        got = {p.partition_index: p for p in _fetch(b, {0: 0, 1: 0, 4: 0}, 1 << 20, partition_max_bytes=1400)}
        assert [_batches(got[i].records) for i in (0, 1, 4)] == [[(0, 0), (1, 1)]] * 3
    finally:
        b.log_manager.shutdown()


def _fetch_request(offsets: dict[int, int], max_wait_ms: int) -> dict[str, Any]:
    return {"max_wait": datetime.timedelta(milliseconds=max_wait_ms), "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
                {"topic": "t", "partitions": [
                    {"partition": p, "fetch_offset": o, "partition_max_bytes": 1 << 20, "current_leader_epoch": -1,
                     "last_fetched_epoch": -1, "log_start_offset": -1} for p, o in offsets.items()]}],
            "forgotten_topics_data": [], "rack_id": ""}


def test_an_idle_long_poll_reads_its_partitions_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """max_wait passing with no partition notified answers with the first pass; a notification during
    the wait makes it read again and return the new records."""
    b = _broker(tmp_path)
    passes: list[int] = []
    real = fetch_handler._read_all

    def counting(*args: Any, **kwargs: Any) -> Any:
        passes.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(fetch_handler, "_read_all", counting)
    try:
        caught_up = {p: 3 for p in range(PARTITIONS)}
        started = time.monotonic()
        got = call(b, 1, 12, _fetch_request(caught_up, 300))
        assert time.monotonic() - started >= 0.25
        assert len(passes) == 1
        assert [p.high_watermark for p in got.responses[0].partitions] == [3] * PARTITIONS

        async def fetch_while_producing() -> Any:
            async def produce_later() -> None:
                await anyio.sleep(0.2)
                batch = build_batch([(None, b"new", [])], timestamp_ms=1_700_000_000_000)
                await b.dispatcher.handle(frame_for(0, 9, {"acks": 1, "timeout": 1000, "topic_data": [
                    {"name": "t", "partition_data": [{"index": 4, "records": batch}]}]}, 7))

            async with anyio.create_task_group() as tg:
                tg.start_soon(produce_later)
                out = await b.dispatcher.handle(frame_for(1, 12, _fetch_request(caught_up, 5_000), 8))
            return out

        passes.clear()
        started = time.monotonic()
        out = anyio.run(fetch_while_producing)
        assert time.monotonic() - started < 4
        assert out is not None and len(passes) == 2
        dec = FrameDecoder(1 << 30)
        dec.feed(out)
        payload = dec.next_frame()
        assert payload is not None
        parts = codec.decode_response(1, 12, payload, 5).responses[0].partitions
        assert _batches(parts[4].records) == [(3, 3)] and parts[4].high_watermark == 4
    finally:
        b.log_manager.shutdown()
