"""The coordinators' log.flush.on.ack syncs go through group commit: the commits of many groups that hash to
one internal partition share a data sync, and none is answered before its append is durable.  A real Log
in a temporary directory; the replica manager is reduced to the one lookup the coordinators make."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from pykbroker.coordinator.internal_topic import flush_partition
from pykbroker.protocol.records import build_batch, validate_for_append
from pykbroker.replica.replica_manager import ReplicaManager
from pykbroker.storage.log import KafkaStorageError, Log
from pykbroker.storage.log_config import LogConfig

T0 = 1_700_000_000_000


class _Partition:
    def __init__(self, log: Log) -> None:
        self.log = log


class _Replicas:
    def __init__(self, log: Log) -> None:
        self._p = _Partition(log)

    def partition(self, topic: str, index: int) -> _Partition | None:
        return self._p if (topic, index) == ("__consumer_offsets", 7) else None


def _append(lg: Log) -> int:
    buf = bytearray(build_batch([(b"group", b"offset" * 10, [])], timestamp_ms=T0))
    lg.append(buf, validate_for_append(buf, max_batch_bytes=1 << 20, now_ms=T0, timestamp_type=0),
              origin="coordinator")
    return lg.log_end_offset


def _counting(lg: Log) -> list[int]:
    """Record the target of every data sync the log starts."""
    targets: list[int] = []
    begin = lg.begin_data_flush

    def counted(offset: int) -> Any:
        flush = begin(offset)
        if flush is not None:
            targets.append(flush.target)
        return flush

    lg.begin_data_flush = counted  # type: ignore[method-assign]
    return targets


def test_commits_appended_together_share_a_sync_and_each_is_durable_when_answered(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "__consumer_offsets-7", LogConfig(), recover=False, now_ms=lambda: T0)
    try:
        replicas = cast(ReplicaManager, _Replicas(lg))
        targets = _counting(lg)
        answered: list[tuple[int, int]] = []  # (log end when the commit appended, durable when answered)

        async def commit() -> None:
            end = _append(lg)
            await flush_partition(replicas, "__consumer_offsets", 7)
            answered.append((end, lg._durable_offset))

        async def main() -> None:
            async with anyio.create_task_group() as tg:
                for _ in range(30):
                    tg.start_soon(commit)

        anyio.run(main)
        assert len(answered) == 30
        assert all(durable >= end for end, durable in answered)  # never answered before durable
        # The first commit's sync covers itself; the 29 appended while it ran share the next one.
        assert targets == [1, 30]
        before = len(targets)
        anyio.run(flush_partition, replicas, "__consumer_offsets", 7)
        assert len(targets) == before  # nothing new appended: no sync at all
        anyio.run(flush_partition, replicas, "__consumer_offsets", 3)  # not led here: nothing to do
    finally:
        lg.close()


def test_a_failed_log_dir_fails_the_coordinator_flush(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "__consumer_offsets-7", LogConfig(), recover=False, now_ms=lambda: T0)
    try:
        _append(lg)
        lg.offline = True  # the log dir failed (KIP-112): not durable, so not answered as if it were
        with pytest.raises(KafkaStorageError):
            anyio.run(flush_partition, cast(ReplicaManager, _Replicas(lg)), "__consumer_offsets", 7)
    finally:
        lg.offline = False
        lg.close()
