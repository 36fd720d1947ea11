"""Large topics have their logs made on a worker thread before the store write; a failed creation
leaves none of them behind."""

from __future__ import annotations

from pathlib import Path

from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.replica.topics import PRECREATE_LOGS_FROM
from pykbroker.server.broker import Broker
from tests.unit.test_dispatcher import call


def _create(b: Broker, name: str, partitions: int) -> ErrorCode:
    r = call(b, 19, 7, {"topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1,
                                    "assignments": [], "configs": []}], "timeout": 1000})
    return ErrorCode(r.topics[0].error_code)


def test_precreated_logs_serve_the_topic_and_a_failed_creation_removes_its_own(tmp_path: Path) -> None:
    b = Broker(BrokerConfig({"log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0"}))
    b.startup()
    try:
        n = PRECREATE_LOGS_FROM + 6
        assert _create(b, "big", n) == ErrorCode.none
        logs = {i for (t, i) in b.log_manager.all_logs() if t == "big"}
        assert logs == set(range(n))
        assert all(b.replicas.partition("big", i) is not None for i in range(n))  # led, not just on disk
        # The same name again, with more partitions: refused, and the extra logs made for it are gone.
        assert _create(b, "big", n + 10) == ErrorCode.topic_already_exists
        assert {i for (t, i) in b.log_manager.all_logs() if t == "big"} == logs
        assert not (tmp_path / f"big-{n}").exists()
    finally:
        b.log_manager.shutdown()
