"""fetch.max.bytes caps a Fetch response whatever the client asks for, as in Kafka."""

from __future__ import annotations

import datetime
from pathlib import Path

from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.protocol.records import build_batch, decode_records, iter_batches
from pykbroker.server.broker import Broker
from tests.unit.test_dispatcher import call


def _fetched_values(tmp_path: Path, settings: dict[str, str]) -> list[bytes | None]:
    b = Broker(BrokerConfig({"log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0", **settings}))
    b.startup()
    try:
        created = call(b, 19, 7, {"topics": [{"name": "t", "num_partitions": 1, "replication_factor": 1,
                                              "assignments": [], "configs": []}], "timeout": 1000})
        assert created.topics[0].error_code == ErrorCode.none
        for i in range(3):  # three batches of about 700 bytes
            batch = build_batch([(None, bytes([65 + i]) * 600, [])], timestamp_ms=1_700_000_000_000)
            produced = call(b, 0, 9, {"acks": 1, "timeout": 1000, "topic_data": [
                {"name": "t", "partition_data": [{"index": 0, "records": batch}]}]})
            assert produced.responses[0].partition_responses[0].error_code == ErrorCode.none
        fetched = call(b, 1, 12, {"max_wait": datetime.timedelta(0), "min_bytes": 1, "max_bytes": 1 << 20,
                                  "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
            {"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                                           "current_leader_epoch": -1, "last_fetched_epoch": -1,
                                           "log_start_offset": -1}]}],
            "forgotten_topics_data": [], "rack_id": ""})
        fp = fetched.responses[0].partitions[0]
        assert fp.error_code == ErrorCode.none and fp.high_watermark == 3
        data = bytes(fp.records)
        return [r.value for h in iter_batches(data) for r in decode_records(data[h.position:h.position + h.size])]
    finally:
        b.log_manager.shutdown()


def test_fetch_max_bytes_limits_the_response(tmp_path: Path) -> None:
    assert len(_fetched_values(tmp_path / "default", {})) == 3  # the client's 1 MiB fits all three
    # 1024 bytes: the first batch always (so a consumer can progress), the second would exceed the cap
    assert _fetched_values(tmp_path / "capped", {"fetch.max.bytes": "1024"}) == [b"A" * 600]
