"""Log dir failure (KIP-112): disk errors become KAFKA_STORAGE_ERROR and take the whole dir offline.

The disk errors are injected by replacing ``os`` functions for the duration of one call, so the
rest of each test runs against real files.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from pykbroker.protocol.records import build_batch, iter_batches, validate_for_append
from pykbroker.replica.replica_manager import ReplicaManager
from pykbroker.storage.log import KafkaStorageError, Log
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.log_manager import (
    CLEAN_SHUTDOWN_FILE,
    RECOVERY_POINT_CHECKPOINT_FILE,
    LogDirFailureChannel,
    LogManager,
    read_offset_checkpoint,
)

T0 = 1_700_000_000_000


def append(lg: Log, n: int = 1, tag: bytes = b"v") -> int:
    buf = bytearray(build_batch([(b"k", tag * 30, [])] * n, timestamp_ms=T0))
    return lg.append(buf, validate_for_append(buf, max_batch_bytes=10**6, now_ms=T0, timestamp_type=0)).first_offset


def read_values(lg: Log) -> list[bytes]:
    from pykbroker.protocol.records import decode_records

    out: list[bytes] = []
    offset = lg.log_start_offset
    for _ in range(10_000):
        if offset >= lg.log_end_offset:
            break
        res = lg.read(offset, 1 << 20)
        for h in iter_batches(res.records):
            out += [r.value or b"" for r in decode_records(res.records[h.position:h.position + h.size])]
        offset = res.next_offset
    return out


def failing(exc_errno: int, after_bytes: int = 0) -> Callable[..., int]:
    """An ``os.pwrite`` that writes ``after_bytes`` for real, then fails like a full or broken disk."""
    real = os.pwrite
    state = {"written": 0}

    def pwrite(fd: int, data: Any, offset: int) -> int:
        room = after_bytes - state["written"]
        if room <= 0:
            raise OSError(exc_errno, os.strerror(exc_errno))
        n = real(fd, bytes(data)[:room], offset)
        state["written"] += n
        return n

    return pwrite


@pytest.fixture
def mgr(tmp_path: Path) -> Iterator[LogManager]:
    m = LogManager([tmp_path / "d1", tmp_path / "d2"], LogConfig(), now_ms=lambda: T0)
    m.startup()
    try:
        yield m
    finally:
        for lg in m.all_logs().values():
            lg.release()


# --- the channel (sans-I/O bookkeeping) -------------------------------------------------------------


def test_channel_queues_each_dir_once_and_wakes() -> None:
    ch = LogDirFailureChannel()
    woken: list[int] = []
    ch.wakeup = lambda: woken.append(1)
    a, b = Path("/a"), Path("/b")
    assert ch.maybe_add_offline_log_dir(a, "ENOSPC")
    assert not ch.maybe_add_offline_log_dir(a, "EIO again")
    assert ch.is_offline(a) and not ch.is_offline(b)
    assert ch.take_pending() == [a]
    assert ch.take_pending() == []
    assert ch.maybe_add_offline_log_dir(b, "EIO")
    assert ch.take_pending() == [b]
    assert ch.offline_dirs() == {a: "ENOSPC", b: "EIO"}
    assert woken == [1, 1]


# --- a failed write leaves the log as it was ---------------------------------------------------------


@pytest.mark.parametrize(("code", "partial"), [(errno.EIO, 0), (errno.ENOSPC, 50)])
def test_failed_segment_write_changes_nothing_and_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, partial: int
) -> None:
    lg = Log.open(tmp_path / "t-0", LogConfig(), recover=False, now_ms=lambda: T0)
    reports: list[str] = []
    lg.on_storage_error = lambda _lg, reason: reports.append(reason)
    append(lg, 3, b"a")
    seg = lg.active_segment
    before = (lg.log_end_offset, lg.size_bytes, seg.size, os.path.getsize(seg.log_path), lg.recovery_point)
    with monkeypatch.context() as m:
        m.setattr(os, "pwrite", failing(code, after_bytes=partial))
        with pytest.raises(KafkaStorageError) as info:
            append(lg, 2, b"b")
    assert info.value.error_code == 56
    assert (lg.log_end_offset, lg.size_bytes, seg.size, os.path.getsize(seg.log_path), lg.recovery_point) == before
    assert lg.offline and len(reports) == 1 and os.strerror(code) in reports[0]
    # Offline for good: even a write the disk would take now is refused, and so are reads.
    with pytest.raises(KafkaStorageError):
        append(lg, 1, b"c")
    with pytest.raises(KafkaStorageError):
        lg.read(0, 1000)
    lg.release()
    # A restart finds exactly what was acknowledged.
    again = Log.open(tmp_path / "t-0", LogConfig(), recover=True, now_ms=lambda: T0)
    try:
        assert again.log_end_offset == 3
        assert read_values(again) == [b"a" * 30] * 3
    finally:
        again.close()


def test_full_disk_while_writing_an_index_costs_entries_not_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The active index is written when the log is flushed; on a full disk the file keeps a
    # valid prefix and the rest waits for the next flush, while the log's data is fsynced.
    lg = Log.open(tmp_path / "t-0", LogConfig(index_interval_bytes=1), recover=False, now_ms=lambda: T0)
    failures: list[str] = []
    lg.on_storage_error = lambda _lg, reason: failures.append(reason)
    for _ in range(3):
        append(lg)
    index = lg.active_segment.offset_index
    assert index.entries == 2
    real_pwrite = os.pwrite

    calls: list[int] = []

    def half_then_full(fd: int, data: bytes, offset: int) -> int:
        calls.append(offset)
        if len(calls) == 1:
            return real_pwrite(fd, bytes(data)[:4], offset)  # half an entry, then ENOSPC
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(os, "pwrite", half_then_full)
        lg.flush()
    assert not failures and lg.recovery_point == 3
    assert os.path.getsize(index.path) == 0  # no partial entry left behind
    lg.flush()  # space again: the entries follow
    assert os.path.getsize(index.path) == 16

    def broken(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    append(lg)
    with monkeypatch.context() as m:
        m.setattr(os, "pwrite", broken)
        with pytest.raises(KafkaStorageError):
            lg.flush()
    assert failures  # a failing disk still takes the log dir offline
    lg.release()


def test_an_open_partition_holds_one_file_descriptor(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    logs = [Log.open(tmp_path / f"t-{i}", LogConfig(index_interval_bytes=1), recover=False, now_ms=lambda: T0)
            for i in range(20)]
    for lg in logs:
        for _ in range(3):
            append(lg)
    assert len(os.listdir("/proc/self/fd")) - before == 20  # each active .log; indexes hold none
    for lg in logs:
        lg.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_failed_flush_takes_the_log_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lg = Log.open(tmp_path / "t-0", LogConfig(), recover=False, now_ms=lambda: T0)
    reports: list[str] = []
    lg.on_storage_error = lambda _lg, reason: reports.append(reason)
    append(lg)

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", eio)
        with pytest.raises(KafkaStorageError):
            lg.flush()
    assert lg.recovery_point == 0 and lg.offline and reports
    assert not lg.needs_flush(T0 + 10**9)  # the flusher does not retry an offline log
    lg.release()


# --- the log manager takes the dir offline, the other keeps serving ------------------------------------


def test_failed_dir_goes_offline_other_dir_keeps_serving(
    tmp_path: Path, mgr: LogManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = LogConfig()
    logs = {p: mgr.get_or_create_log("t", p, cfg) for p in range(4)}
    d1, d2 = mgr.log_dirs
    in_d1 = [p for p, lg in logs.items() if lg.dir.parent == d1]
    in_d2 = [p for p, lg in logs.items() if lg.dir.parent == d2]
    assert len(in_d1) == len(in_d2) == 2
    for lg in logs.values():
        append(lg, 2)
    mgr.checkpoint()
    woken: list[int] = []
    mgr.failure_channel.wakeup = lambda: woken.append(1)

    with monkeypatch.context() as m:
        m.setattr(os, "pwrite", failing(errno.EIO))
        with pytest.raises(KafkaStorageError):
            append(logs[in_d1[0]])
    # The whole dir is offline at once (even its logs that saw no error), the other is not.
    assert woken == [1]
    assert mgr.failure_channel.offline_dirs().keys() == {d1}
    assert all(logs[p].offline for p in in_d1) and not any(logs[p].offline for p in in_d2)
    with pytest.raises(KafkaStorageError):
        append(logs[in_d1[1]])
    assert mgr.failure_channel.take_pending() == [d1]

    assert sorted(mgr.handle_log_dir_failure(d1)) == [("t", p) for p in in_d1]
    assert all(logs[p].closed for p in in_d1)
    assert mgr.online_dirs() == [d2]
    for p in in_d1:
        assert mgr.get_log("t", p) is None and mgr.is_offline("t", p)
        with pytest.raises(KafkaStorageError):
            mgr.get_or_create_log("t", p, cfg)  # never recreated elsewhere: that would fork it
    for p in in_d2:
        append(logs[p])
        assert logs[p].log_end_offset == 3 and not mgr.is_offline("t", p)
    new = mgr.get_or_create_log("u", 0, cfg)
    assert new.dir.parent == d2

    # Background work leaves the offline dir alone; shutdown marks only the online dir clean.
    recovery_before = (d1 / RECOVERY_POINT_CHECKPOINT_FILE).read_bytes()
    mgr.flush_dirty()
    mgr.run_retention()
    for p in in_d2:
        logs[p].flush()
    assert mgr.checkpoint()
    assert (d1 / RECOVERY_POINT_CHECKPOINT_FILE).read_bytes() == recovery_before
    assert read_offset_checkpoint(d2 / RECOVERY_POINT_CHECKPOINT_FILE)[("t", in_d2[0])] == 3
    mgr.shutdown()
    assert (d2 / CLEAN_SHUTDOWN_FILE).exists() and not (d1 / CLEAN_SHUTDOWN_FILE).exists()

    # A restart brings the dir back with what was acknowledged.
    again = LogManager([d1, d2], cfg, now_ms=lambda: T0)
    again.startup()
    try:
        assert not again.failure_channel.offline_dirs()
        assert {p: again.get_log("t", p).log_end_offset for p in range(4)} == {  # type: ignore[union-attr]
            **dict.fromkeys(in_d1, 2), **dict.fromkeys(in_d2, 3)}
    finally:
        again.shutdown()


def test_dir_that_cannot_load_is_offline_and_its_partitions_are_not_recreated(tmp_path: Path) -> None:
    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    d2.write_text("not a directory")  # mkdir fails: an OSError while loading d2
    m = LogManager([d1, d2], LogConfig(), now_ms=lambda: T0)
    m.startup()
    assert m.online_dirs() == [d1] and m.failure_channel.is_offline(d2)
    # Until the broker has opened what it already had, an unknown partition may be in d2.
    with pytest.raises(KafkaStorageError):
        m.get_or_create_log("t", 0, LogConfig())
    replicas = ReplicaManager(1, m)
    assert replicas.make_leader("t", 0, LogConfig(), leader_epoch=0, replicas=[1], isr=[1]) is None
    assert replicas.is_offline("t", 0) and replicas.partition("t", 0) is None
    m.startup_complete()
    assert m.get_or_create_log("t", 1, LogConfig()).dir.parent == d1
    m.shutdown()


def test_no_loadable_dir_fails_startup_with_a_clear_message(tmp_path: Path) -> None:
    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    d1.write_text("x")
    d2.write_text("x")
    with pytest.raises(OSError, match="no usable log dir"):
        LogManager([d1, d2], LogConfig(), now_ms=lambda: T0).startup()


def test_replica_manager_marks_offline_partitions_and_wakes_fetches(tmp_path: Path, mgr: LogManager) -> None:
    import anyio

    replicas = ReplicaManager(1, mgr)
    parts = [replicas.make_leader("t", p, LogConfig(), leader_epoch=0, replicas=[1], isr=[1]) for p in range(2)]
    assert all(p is not None for p in parts)
    failed = next(p for p in parts if p is not None and p.log.dir.parent == mgr.log_dirs[0])
    event = anyio.Event()
    replicas.fetch_waiters.register([failed.tp], event)
    mgr.mark_dir_offline(mgr.log_dirs[0], "test: EIO")
    replicas.on_log_dir_offline(mgr.handle_log_dir_failure(mgr.log_dirs[0]))
    assert event.is_set()
    assert failed.offline and replicas.is_offline(*failed.tp)
    other = next(p for p in parts if p is not None and p is not failed)
    assert not other.offline and not replicas.is_offline(*other.tp)


def test_produce_to_a_partition_whose_dir_failed_before_start_is_a_storage_error(tmp_path: Path) -> None:
    """Kafka answers KAFKA_STORAGE_ERROR for a partition hosted in an offline dir, not NOT_LEADER_OR_FOLLOWER."""
    from pykbroker.config import BrokerConfig
    from pykbroker.server.broker import Broker
    from tests.unit.test_dispatcher import call

    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    settings = {"log.dirs": f"{d1},{d2}", "listeners": "PLAINTEXT://127.0.0.1:0",
                "offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1"}

    def produce(b: Broker, index: int) -> ErrorCode:
        batch = build_batch([(None, b"v", [])], timestamp_ms=T0)
        r = call(b, 0, 9, {"acks": 1, "timeout": 1000, "topic_data": [
            {"name": "t", "partition_data": [{"index": index, "records": batch}]}]})
        return ErrorCode(r.responses[0].partition_responses[0].error_code)

    b = Broker(BrokerConfig(settings))
    b.startup()
    created = call(b, 19, 7, {"topics": [{"name": "t", "num_partitions": 2, "replication_factor": 1,
                                          "assignments": [], "configs": []}], "timeout": 1000})
    assert created.topics[0].error_code == ErrorCode.none
    in_d2 = [i for i in range(2) if (d2 / f"t-{i}").is_dir()]
    assert len(in_d2) == 1
    b.log_manager.shutdown()
    b.store.close()
    shutil.rmtree(d2)
    d2.write_text("no longer a directory")  # d2 cannot load at the next start
    b = Broker(BrokerConfig(settings))
    b.startup()
    try:
        assert produce(b, in_d2[0]) == ErrorCode.kafka_storage_error
        assert produce(b, 1 - in_d2[0]) == ErrorCode.none
    finally:
        b.log_manager.shutdown()
        b.store.close()


def test_out_of_descriptors_at_a_roll_fails_that_append_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # EMFILE is the process's limit, not the disk's failure: the append that needed a new
    # segment fails, the log stays online and takes the next append once descriptors are free.
    lg = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=200), recover=False, now_ms=lambda: T0)
    failures: list[str] = []
    lg.on_storage_error = lambda _lg, reason: failures.append(reason)
    append(lg)
    append(lg)
    real_open = os.open

    def no_fds(path: Any, flags: int, *args: Any) -> int:
        if str(path).endswith(".log"):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(path, flags, *args)

    with monkeypatch.context() as m:
        m.setattr(os, "open", no_fds)
        with pytest.raises(KafkaStorageError):
            for _ in range(5):  # bounded: the segment is full after a few appends
                append(lg)
    assert not lg.offline and not failures
    end = lg.log_end_offset
    append(lg)
    assert lg.log_end_offset == end + 1 and len(lg.segments) >= 2
    lg.close()
