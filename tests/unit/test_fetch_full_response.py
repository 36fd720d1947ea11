"""Fetch limits across many partitions: once the response is full the remaining partitions answer
without reading their logs, exactly as Kafka's read with a limit of 0 would (empty records, their
high watermarks, OFFSET_OUT_OF_RANGE where the offset is outside the log)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.protocol.records import build_batch, iter_batches
from pykbroker.server.broker import Broker
from tests.unit.test_dispatcher import call

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
