"""LogManager: loading, placement, checkpoints, clean shutdown marker, deletion."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from pykbroker.protocol.records import build_batch, validate_for_append
from pykbroker.storage.log import Log, LogStartOffsetIncrementReason
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.log_manager import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_OFFSET_CHECKPOINT_FILE,
    RECOVERY_POINT_CHECKPOINT_FILE,
    LogManager,
    parse_partition_dir_name,
    read_offset_checkpoint,
    write_offset_checkpoint,
)

T0 = 1_700_000_000_000

DELETE_RECORDS = LogStartOffsetIncrementReason.CLIENT_RECORD_DELETION


def append(lg: Log, n: int = 1, ts: int = T0) -> None:
    buf = bytearray(build_batch([(b"k", b"v" * 30, [])] * n, timestamp_ms=ts))
    lg.append(buf, validate_for_append(buf, max_batch_bytes=10**6, now_ms=ts, timestamp_type=0))


def test_parse_partition_dir_name() -> None:
    assert parse_partition_dir_name("my-topic.v1_x-12") == ("my-topic.v1_x", 12)
    assert parse_partition_dir_name("__consumer_offsets-0") == ("__consumer_offsets", 0)
    assert parse_partition_dir_name("nodash") is None
    assert parse_partition_dir_name("t-") is None
    assert parse_partition_dir_name("t-x") is None
    assert parse_partition_dir_name("t-01") is None


def test_checkpoint_file_format(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    write_offset_checkpoint(path, {("a-b", 1): 10, ("a", 0): 5})
    assert path.read_text() == "0\n2\na 0 5\na-b 1 10\n"
    assert read_offset_checkpoint(path) == {("a", 0): 5, ("a-b", 1): 10}
    assert read_offset_checkpoint(tmp_path / "missing") == {}
    assert not list(tmp_path.glob("*.tmp"))
    path.write_text("1\n0\n")
    with pytest.raises(ValueError):
        read_offset_checkpoint(path)


def test_lifecycle(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dirs = [tmp_path / "d1", tmp_path / "d2"]
    cfg = LogConfig(segment_bytes=600)
    mgr = LogManager(dirs, cfg, now_ms=lambda: T0)
    mgr.startup()
    assert all(d.is_dir() for d in dirs)
    logs = [mgr.get_or_create_log("a-b.c_d", p, cfg) for p in range(4)]
    assert mgr.get_or_create_log("a-b.c_d", 0, cfg) is logs[0]
    # Placement balances partitions over log dirs.
    assert sorted(len(list(d.iterdir())) for d in dirs) == [2, 2]
    for lg in logs:
        for _ in range(10):
            append(lg, 2)
    logs[1].delete_records_before(7, reason=DELETE_RECORDS)
    assert mgr.get_log("a-b.c_d", 9) is None
    assert set(mgr.all_logs()) == {("a-b.c_d", p) for p in range(4)}
    mgr.shutdown()
    for d in dirs:
        assert (d / CLEAN_SHUTDOWN_FILE).exists()
        rp = read_offset_checkpoint(d / RECOVERY_POINT_CHECKPOINT_FILE)
        assert set(rp.values()) == {20} and len(rp) == 2
    lso = {}
    for d in dirs:
        lso.update(read_offset_checkpoint(d / LOG_START_OFFSET_CHECKPOINT_FILE))
    assert lso[("a-b.c_d", 1)] == 7

    # Clean restart: no recovery, marker consumed, state restored.
    caplog.set_level(logging.INFO)
    mgr2 = LogManager(dirs, cfg, now_ms=lambda: T0)
    mgr2.startup()
    assert not any((d / CLEAN_SHUTDOWN_FILE).exists() for d in dirs)
    assert not any("Recovered" in r.getMessage() for r in caplog.records)
    assert any("Loaded 4 partition log(s)" in r.getMessage() for r in caplog.records)
    lg1 = mgr2.get_log("a-b.c_d", 1)
    assert lg1 is not None and lg1.log_start_offset == 7 and lg1.log_end_offset == 20
    append(lg1)
    # Crash (no shutdown): next startup recovers.
    mgr2.checkpoint()
    for lg in mgr2.all_logs().values():
        lg.close()
    caplog.clear()
    mgr3 = LogManager(dirs, cfg, now_ms=lambda: T0)
    mgr3.startup()
    # one summary line at INFO (the per-partition "Recovered ..." lines are DEBUG)
    assert any("(4 recovered after unclean shutdown)" in r.getMessage() for r in caplog.records)
    lg1 = mgr3.get_log("a-b.c_d", 1)
    assert lg1 is not None and lg1.log_end_offset == 21 and lg1.log_start_offset == 7
    mgr3.shutdown()


def test_skips_and_finishes_deletions(tmp_path: Path) -> None:
    d = tmp_path / "d"
    (d / "t-0.0123456789abcdef-delete").mkdir(parents=True)
    (d / "t-0.0123456789abcdef-delete" / "00000000000000000000.log").write_bytes(b"junk")
    (d / "__cluster_metadata-0").mkdir()
    (d / "__cluster_metadata-0" / "00000000000000000000.log").write_bytes(b"not ours")
    (d / "not-a-partition").mkdir()
    (d / "meta.properties").write_text("x")
    mgr = LogManager([d], LogConfig())
    mgr.startup()
    assert mgr.all_logs() == {}
    assert not (d / "t-0.0123456789abcdef-delete").exists()
    assert (d / "__cluster_metadata-0" / "00000000000000000000.log").read_bytes() == b"not ours"
    mgr.shutdown()


def test_delete_log(tmp_path: Path) -> None:
    d = tmp_path / "d"
    mgr = LogManager([d], LogConfig())
    mgr.startup()
    lg = mgr.get_or_create_log("t", 0, LogConfig())
    append(lg)
    mgr.delete_log("t", 0)
    assert mgr.get_log("t", 0) is None
    assert [p.name for p in d.iterdir() if p.is_dir()] == []
    mgr.delete_log("t", 0)  # idempotent
    mgr.checkpoint()
    assert read_offset_checkpoint(d / RECOVERY_POINT_CHECKPOINT_FILE) == {}
    mgr.shutdown()


def test_retention_and_flush_dirty(tmp_path: Path) -> None:
    now = [T0]
    cfg = LogConfig(segment_bytes=500, retention_ms=1000, flush_messages=3)
    mgr = LogManager([tmp_path / "d"], cfg, now_ms=lambda: now[0])
    mgr.startup()
    lg = mgr.get_or_create_log("t", 0, cfg)
    for _ in range(10):
        append(lg, 2)
    assert lg.needs_flush(now[0])
    mgr.flush_dirty()
    assert lg.recovery_point == 20 and not lg.needs_flush(now[0])
    now[0] = T0 + 5000
    mgr.run_retention()
    assert lg.log_start_offset == lg.log_end_offset == 20
    assert len(lg.segments) == 1
    mgr.shutdown()


def test_config_for_at_startup(tmp_path: Path) -> None:
    d = tmp_path / "d"
    mgr = LogManager([d], LogConfig())
    mgr.startup()
    mgr.get_or_create_log("t", 0, LogConfig())
    mgr.shutdown()
    special = LogConfig(retention_ms=5)
    mgr = LogManager([d], LogConfig())
    mgr.startup(config_for=lambda topic: special)
    lg = mgr.get_log("t", 0)
    assert lg is not None and lg.config is special
    mgr.shutdown()
    assert os.path.exists(d / CLEAN_SHUTDOWN_FILE)


def test_log_config_properties() -> None:
    cfg = LogConfig().with_properties(
        {"retention.ms": "-1", "preallocate": "true", "cleanup.policy": "compact", "x.unknown": "1"}
    )
    assert cfg.retention_ms == -1 and cfg.preallocate and not cfg.delete_enabled and cfg.compact_enabled
    with pytest.raises(ValueError):
        LogConfig().with_properties({"segment.bytes": "lots"})


def test_deleting_a_log_with_the_longest_legal_topic_name(tmp_path: Path) -> None:
    from pykbroker.storage.log_config import LogConfig
    from pykbroker.storage.log_manager import LogManager, delete_dir_name

    topic = "t" * 249
    assert len(delete_dir_name(topic, 12345)) <= 255
    manager = LogManager([tmp_path], LogConfig())
    manager.startup()
    manager.get_or_create_log(topic, 0, LogConfig())
    manager.delete_log(topic, 0)
    assert manager.get_log(topic, 0) is None
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []
    manager.shutdown()


def test_out_of_file_descriptors_fails_one_partition_not_the_log_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from pykbroker.storage.log import KafkaStorageError

    mgr = LogManager([tmp_path / "d"], LogConfig(), now_ms=lambda: T0)
    real_open = Log.open

    def no_fds(*args: object, **kwargs: object) -> Log:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(Log, "open", no_fds)
    with pytest.raises(KafkaStorageError, match="open-file limit"):
        mgr.get_or_create_log("t", 0, LogConfig())
    assert mgr.online_dirs() == [tmp_path / "d"]
    monkeypatch.setattr(Log, "open", real_open)
    append(mgr.get_or_create_log("t", 0, LogConfig()))  # once descriptors are free again it works
    mgr.shutdown()
