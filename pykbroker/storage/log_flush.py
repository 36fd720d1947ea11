"""A log's data sync handed to a syncer, and the fsync of a log directory.

:meth:`Log.begin_data_flush` duplicates the descriptors a sync needs on the event loop; a
syncer (a worker of ``pykbroker/_native/syncer.c``, or :func:`sync_data_flush` in Python)
syncs and closes them off it, and :meth:`Log.end_data_flush` takes its report.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DataFlush", "fsync_dir", "sync_data_flush", "write_synced"]


@dataclass(frozen=True, slots=True)
class DataFlush:
    """A data sync handed to a syncer (Log.begin_data_flush): the descriptors are the syncer's to close."""

    target: int  # every offset below it was written before the descriptors were duplicated
    fds: tuple[int, ...]  # duplicated .log descriptors: fdatasync each
    dir_fd: int  # the log's directory to fsync after a roll (a new segment file), or -1
    dir_dirty: bool
    truncations: int  # the log's truncation count when it began


def sync_data_flush(flush: DataFlush) -> int:
    """fdatasync the flush's segment descriptors (fsync its directory) and close them all; the errno of
    the first failure, or 0.  What a worker of ``pykbroker/_native/syncer.c`` does, in Python."""
    error = 0
    try:
        for fd in flush.fds:
            if not error:
                try:
                    os.fdatasync(fd)
                except OSError as e:
                    error = e.errno or errno.EIO
        if flush.dir_fd >= 0 and not error:
            try:
                os.fsync(flush.dir_fd)
            except OSError as e:
                error = e.errno or errno.EIO
    finally:
        for fd in (*flush.fds, flush.dir_fd):
            if fd >= 0:
                os.close(fd)
    return error


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes | bytearray) -> None:
    """Write ``data`` as the whole of ``path`` (created or truncated) and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        for _ in range(len(view) + 1):  # each write takes at least one byte
            if not view:
                break
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
