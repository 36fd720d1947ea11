"""pykbroker._native.syncer and group commit over it: native threads fdatasync and close the descriptors a
log duplicated, report on an eventfd, and the event loop settles the waiting requests."""

from __future__ import annotations

import asyncio
import errno
import importlib
import os
import select
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from pykbroker.protocol.records import build_batch, validate_for_append
from pykbroker.replica import group_commit
from pykbroker.storage.log import KafkaStorageError, Log
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.log_flush import DataFlush

# The install step (pip install -e ., setup.py) builds it; the Python flusher threads are only a fallback.
syncer_mod = importlib.import_module("pykbroker._native.syncer")
T0 = 1_700_000_000_000


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as e:
        return e.errno == errno.EBADF
    return False


def _collect(s: object, want: int) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + 10
    while len(got) < want and time.monotonic() < deadline:
        select.select([s.fileno()], [], [], 0.2)  # type: ignore[attr-defined]
        got += s.completed()  # type: ignore[attr-defined]
    return got


def test_the_native_syncer_is_what_group_commit_uses() -> None:
    assert group_commit._Syncer is syncer_mod.Syncer


def test_jobs_are_synced_closed_and_reported(tmp_path: Path) -> None:
    s = syncer_mod.Syncer(3)
    try:
        baseline = len(os.listdir("/proc/self/fd"))
        for token in range(20):  # more jobs than threads: they queue
            fd = os.open(tmp_path / f"f{token}", os.O_RDWR | os.O_CREAT, 0o644)
            os.write(fd, b"x" * 100)
            dup = os.dup(fd)
            os.close(fd)
            dir_fd = os.open(tmp_path, os.O_RDONLY) if token % 2 else -1
            s.submit(token, (dup,), dir_fd)
        got = _collect(s, 20)
        assert sorted(got) == [(t, 0) for t in range(20)]
        assert len(os.listdir("/proc/self/fd")) == baseline  # the syncer closed every descriptor it took
    finally:
        s.close()


def test_a_failed_sync_reports_its_errno_and_still_closes(tmp_path: Path) -> None:
    s = syncer_mod.Syncer(1)
    try:
        r, w = os.pipe()  # fdatasync of a pipe: EINVAL
        s.submit(1, (r,), -1)
        s.submit(2, (), -1)
        got = dict(_collect(s, 2))
        assert got[1] == errno.EINVAL and got[2] == 0
        assert _closed(r)
        os.close(w)
    finally:
        s.close()


def test_bad_arguments_are_refused() -> None:
    s = syncer_mod.Syncer(1)
    try:
        with pytest.raises(TypeError):
            s.submit(1, [3], -1)  # a tuple, not a list
        with pytest.raises(ValueError):
            s.submit(1, (-5,), -1)
        with pytest.raises(ValueError):
            syncer_mod.Syncer(0)
    finally:
        s.close()
    with pytest.raises(ValueError):
        s.submit(1, (), -1)  # closed
    assert s.completed() == []


def _append(lg: Log, n: int) -> None:
    buf = bytearray(build_batch([(b"k", b"v" * 100, [])] * n, timestamp_ms=T0))
    lg.append(buf, validate_for_append(buf, max_batch_bytes=10**8, now_ms=T0, timestamp_type=0))


@pytest.fixture
def lg(tmp_path: Path) -> Iterator[Log]:
    log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=4000), recover=False, now_ms=lambda: T0)
    yield log
    if not log.closed:
        log.close()


def test_group_commit_syncs_through_the_native_threads(lg: Log) -> None:
    async def main() -> None:
        for _ in range(30):  # rolls segments too (segment_bytes=4000): the directory is synced with them
            _append(lg, 5)
            await group_commit.flush_to(lg, lg.log_end_offset)
            assert lg.begin_data_flush(lg.log_end_offset) is None  # durable: nothing left to sync
        assert group_commit._native[asyncio.get_running_loop()] is not None

    anyio.run(main)
    assert len(lg.segments) > 1


def test_many_waiters_share_native_syncs(lg: Log) -> None:
    async def main() -> None:
        async def one() -> None:
            _append(lg, 1)
            await group_commit.flush_to(lg, lg.log_end_offset)

        async with anyio.create_task_group() as tg:
            for _ in range(200):
                tg.start_soon(one)
        assert lg.begin_data_flush(lg.log_end_offset) is None

    anyio.run(main)
    assert lg.log_end_offset == 200


def test_a_failed_native_sync_takes_the_log_offline(lg: Log, monkeypatch: pytest.MonkeyPatch) -> None:
    _append(lg, 1)
    real = lg.begin_data_flush

    def with_a_pipe(offset: int) -> DataFlush | None:
        flush = real(offset)
        assert flush is not None
        r, w = os.pipe()
        os.close(w)
        for fd in flush.fds:
            os.close(fd)
        return DataFlush(flush.target, (r,), -1, flush.dir_dirty, flush.truncations)

    monkeypatch.setattr(lg, "begin_data_flush", with_a_pipe)

    async def main() -> None:
        with pytest.raises(KafkaStorageError):
            await group_commit.flush_to(lg, lg.log_end_offset)

    anyio.run(main)
    assert lg.offline


def test_a_truncation_during_the_sync_covers_nothing_after_it(lg: Log) -> None:
    _append(lg, 10)
    flush = lg.begin_data_flush(lg.log_end_offset)
    assert flush is not None and flush.target == 10
    for fd in flush.fds:
        os.fsync(fd)
        os.close(fd)
    if flush.dir_fd >= 0:
        os.close(flush.dir_fd)
    lg.truncate_to(4)
    _append(lg, 6)  # offsets 4..9 again, not synced by that flush
    lg.end_data_flush(flush, 0)
    again = lg.begin_data_flush(10)
    assert again is not None  # still to be synced
    for fd in again.fds:
        os.close(fd)
    if again.dir_fd >= 0:
        os.close(again.dir_fd)


def test_without_the_extension_python_threads_sync(lg: Log, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group_commit, "_Syncer", None)

    async def main() -> None:
        _append(lg, 3)
        await group_commit.flush_to(lg, lg.log_end_offset)
        assert group_commit._native[asyncio.get_running_loop()] is None
        assert lg.begin_data_flush(lg.log_end_offset) is None

    anyio.run(main)


def test_a_sync_that_cannot_be_submitted_goes_to_the_python_threads(
        lg: Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """No native thread could start (submit raises OSError): the descriptors are given back and the
    directory stays to be synced, by the ordinary flush."""
    class NoThreads:
        def __init__(self, max_threads: int) -> None:
            self._r, self._w = os.pipe()

        def fileno(self) -> int:
            return self._r

        def submit(self, token: int, fds: tuple[int, ...], dir_fd: int) -> None:
            raise OSError(errno.EAGAIN, "no thread")

        def completed(self) -> list[tuple[int, int]]:
            return []

    monkeypatch.setattr(group_commit, "_Syncer", NoThreads)
    synced_dir: list[bool] = []
    real_flush_data = lg._flush_data

    def spy() -> None:
        synced_dir.append(lg._dir_dirty)
        real_flush_data()

    monkeypatch.setattr(lg, "_flush_data", spy)
    abandoned: list[bool] = []
    real_abandon = lg.abandon_data_flush

    def abandon(flush: DataFlush) -> None:
        real_abandon(flush)
        abandoned.append(all(_closed(fd) for fd in (*flush.fds, flush.dir_fd) if fd >= 0))

    monkeypatch.setattr(lg, "abandon_data_flush", abandon)

    async def main() -> None:
        for _ in range(12):  # rolls segments (segment_bytes=4000): each roll leaves the directory to sync
            _append(lg, 5)
            await group_commit.flush_to(lg, lg.log_end_offset)
            assert lg.begin_data_flush(lg.log_end_offset) is None

    anyio.run(main)
    assert len(lg.segments) > 1 and any(synced_dir)  # the Python flush saw the directory still dirty
    assert abandoned and all(abandoned)  # every duplicated descriptor was closed when given back
