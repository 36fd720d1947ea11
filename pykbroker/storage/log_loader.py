"""Loading a partition's log directory at open (Kafka's LogLoader), before the Log exists.

Finishes or discards what a crash interrupted (stray files of cleaning, swaps past their
commit point, orphaned indexes), opens the segments and, when the log was not shut down
cleanly, re-validates them from the recovery point and cuts at the first damage.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from pykbroker.storage.index import CorruptIndex
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.log_flush import fsync_dir
from pykbroker.storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    Segment,
    filename_prefix,
    floor_index,
    parse_base_offset,
)

__all__ = ["load_segments"]

log = logging.getLogger("pykbroker.storage.log")  # the partition log's lines, wherever its code lives

_STRAY_SUFFIXES = (".deleted", ".cleaned", ".swap", ".snapshot.tmp")


def load_segments(
    dir: Path,
    config: LogConfig,
    *,
    recover: bool,
    clock: Callable[[], int],
    log_start_offset: int | None,
    recovery_point: int | None,
) -> tuple[list[Segment], int]:
    """The segments of ``dir`` (repaired if ``recover``) and the log end offset; one empty segment
    at the log start offset in a new directory.  Every segment is closed again on failure."""
    bases = _clean_dir_and_list_bases(dir)
    now = clock()
    segments: list[Segment] = []
    try:
        if not bases:
            start = max(log_start_offset or 0, 0)
            segments.append(Segment(dir, start, config, active=True, now_ms=now))
        else:
            for i, base in enumerate(bases):
                segments.append(Segment(dir, base, config, active=i == len(bases) - 1, now_ms=now))
        if recover:
            _recover_segments(dir, segments, recovery_point or 0)
        _check_indexes(segments, skip_from=floor_index(segments, recovery_point or 0) if recover else None)
        leo, end = segments[-1].read_end()
        if end != segments[-1].size:
            # Claimed clean, yet the tail is not whole batches: never append after garbage.
            truncated, leo = segments[-1].recover()
            log.warning("Truncated %(truncated)d bytes of invalid data from %(segment)s",
                        {"truncated": truncated, "segment": segments[-1].log_path})
    except BaseException:
        for seg in segments:
            with contextlib.suppress(OSError):
                seg.close()
        raise
    return segments, leo


def _clean_dir_and_list_bases(dir: Path) -> list[int]:
    """Delete leftovers of interrupted operations and return the segment base offsets."""
    bases: set[int] = set()
    index_files: list[tuple[Path, int]] = []
    _complete_swaps(dir)  # a merged clean interrupted after its commit point
    for entry in os.scandir(dir):
        if not entry.is_file():
            continue
        name = entry.name
        if name.endswith(_STRAY_SUFFIXES):
            log.info("Deleting stray file %(name)s in %(log_dir)s", {"name": name, "log_dir": dir})
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
            continue
        base = parse_base_offset(name)
        if base is None:
            continue
        if name.endswith(LOG_SUFFIX):
            bases.add(base)
        elif name.endswith((INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)):
            index_files.append((Path(entry.path), base))
    for path, base in index_files:
        if base not in bases:
            log.info("Deleting orphaned index file %(path)s", {"path": path})
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return sorted(bases)


def _complete_swaps(dir: Path) -> None:  # finish Log.replace_segments after a crash
    for swap in sorted(dir.glob("*" + LOG_SUFFIX + ".swap")):
        base = parse_base_offset(swap.name)
        if base is None:
            continue
        data = swap.read_bytes()
        last, pos = base, 0
        while pos + 61 <= len(data):
            batch_base = int.from_bytes(data[pos:pos + 8], "big", signed=True)
            length = int.from_bytes(data[pos + 8:pos + 12], "big", signed=True)
            last = batch_base + int.from_bytes(data[pos + 23:pos + 27], "big", signed=True)
            if length <= 0:
                break
            pos += 12 + length
        prefix = filename_prefix(base)
        txn_swap = dir / (prefix + TXN_INDEX_SUFFIX + ".swap")
        for entry in list(os.scandir(dir)):
            b = parse_base_offset(entry.name)
            if b is None or not base <= b <= last or entry.name.endswith(".swap"):
                continue
            if entry.name.endswith(TXN_INDEX_SUFFIX) and b == base and not txn_swap.exists():
                continue  # already the merged index
            if entry.name.endswith((LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        if txn_swap.exists():
            os.replace(txn_swap, dir / (prefix + TXN_INDEX_SUFFIX))
        os.replace(swap, dir / (prefix + LOG_SUFFIX))
        log.info("Completed an interrupted segment swap at base offset %(base)d in %(log_dir)s",
                 {"base": base, "log_dir": dir})
        fsync_dir(dir)


def _recover_segments(dir: Path, segments: list[Segment], recovery_point: int) -> None:
    """Re-validate segments from the one holding the recovery point; cut at first damage."""
    start = floor_index(segments, recovery_point)
    expected = segments[start].base_offset
    total_truncated = 0
    for i in range(start, len(segments)):
        seg = segments[i]
        if seg.base_offset < expected:
            # Overlaps the previous segment's data: everything from here on is unusable.
            total_truncated += _drop_tail_segments(segments, i)
            break
        truncated, next_offset = seg.recover()
        total_truncated += truncated
        if truncated and i + 1 < len(segments):
            total_truncated += _drop_tail_segments(segments, i + 1)
            break
        expected = next_offset
    if not segments[-1].active:
        segments[-1].make_active()
    if total_truncated:
        log.warning(
            "Recovery of %(log_dir)s truncated %(total_truncated)d bytes of invalid or incomplete data (log end "
            "offset now %(next_offset)d)",
            {"log_dir": dir.name, "total_truncated": total_truncated, "next_offset": segments[-1].read_next_offset()},
        )
    else:
        log.debug("Recovered %(log_dir)s: %(segments)d segment(s) checked, no data lost",
                  {"log_dir": dir.name, "segments": len(segments) - start})


def _drop_tail_segments(segments: list[Segment], first: int) -> int:
    dropped = 0
    while len(segments) > first:
        seg = segments.pop()
        dropped += seg.size
        log.warning("Deleting segment %(segment)s after corruption in an earlier segment", {"segment": seg.log_path})
        seg.delete()
    if not segments:
        raise AssertionError("recovery dropped every segment")
    return dropped


def _check_indexes(segments: list[Segment], *, skip_from: int | None) -> None:
    """Sanity-check indexes not rebuilt by recovery; rebuild those that fail."""
    for i, seg in enumerate(segments):
        if skip_from is not None and i >= skip_from:
            break
        nxt = segments[i + 1].base_offset if i + 1 < len(segments) else None
        try:
            seg.sanity_check(nxt)
        except CorruptIndex as exc:
            log.warning("Rebuilding index of %(segment)s: %(error)s", {"segment": seg.log_path, "error": exc})
            truncated, _ = seg.recover()
            if truncated:
                log.warning("Truncated %(truncated)d invalid bytes from %(segment)s",
                            {"truncated": truncated, "segment": seg.log_path})
