"""Putting the log cleaner's output in place of the segments it cleaned, crash-safely on disk.

One segment: a single rename of the cleaned file over the old ``.log`` (indexes are rebuilt).  Several
adjacent segments merged into one: Kafka's ``.swap`` protocol, whose rename to ``<base>.log.swap`` is the
commit point that recovery (:mod:`~pykbroker.storage.log_loader`) completes after a crash.  The log's own
bookkeeping (its segment list, under its lock) stays with :class:`~pykbroker.storage.log.Log`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.log_flush import fsync_dir, write_synced
from pykbroker.storage.segment import LOG_SUFFIX, TXN_INDEX_SUFFIX, Segment, filename_prefix


def replace_with_cleaned(dir: Path, old: Segment, cleaned: Path, config: LogConfig, now_ms: int) -> Segment:
    """Rename ``cleaned`` over ``old``'s data file (closed first) and open the result, indexes rebuilt."""
    old.close()
    os.replace(cleaned, old.log_path)
    for index in (old.offset_index, old.time_index):
        with contextlib.suppress(FileNotFoundError):
            index.path.unlink()
    fsync_dir(dir)
    new = Segment(dir, old.base_offset, config, active=False, now_ms=now_ms)
    new.recover(verify_crc=False)
    return new


def swap_in_merged(dir: Path, olds: list[Segment], cleaned: Path, txn_index: bytes, config: LogConfig,
                   now_ms: int) -> Segment:
    """Replace adjacent segments ``olds`` by ``cleaned`` (fsynced by the caller) through ``.swap`` files, with
    ``txn_index`` as the merged segment's raw transaction-index entries; the opened merged segment."""
    base = olds[0].base_offset
    prefix = filename_prefix(base)
    log_swap = dir / (prefix + LOG_SUFFIX + ".swap")
    txn_swap = dir / (prefix + TXN_INDEX_SUFFIX + ".swap")
    if txn_index:
        write_synced(txn_swap, txn_index)
    os.replace(cleaned, log_swap)
    fsync_dir(dir)  # committed: recovery completes the swap from here on
    for seg in olds:
        seg.delete()
    if txn_index:
        os.replace(txn_swap, dir / (prefix + TXN_INDEX_SUFFIX))
    os.replace(log_swap, dir / (prefix + LOG_SUFFIX))
    fsync_dir(dir)
    new = Segment(dir, base, config, active=False, now_ms=now_ms)
    new.recover(verify_crc=False)
    return new
