"""What a log's append and reads hand back: offsets, timestamps and the record batches as bytes or a file range."""

from __future__ import annotations

from dataclasses import dataclass

from pykbroker.protocol.file_range import FileRange


@dataclass(slots=True)
class AppendResult:
    first_offset: int
    last_offset: int
    log_append_time_ms: int  # -1 unless the topic uses LogAppendTime
    max_timestamp: int
    log_start_offset: int
    duplicate: bool = False  # a retried idempotent batch: nothing appended, the original offsets


@dataclass(slots=True)
class ReadResult:
    """Whole record batches starting with the one containing the requested offset."""

    records: bytes
    first_offset: int  # base offset of the first batch returned, or the requested offset if none
    next_offset: int  # offset following the last batch returned, or the requested offset if none
    log_start_offset: int
    log_end_offset: int
    first_batch_too_large: bool = False  # min_one_message=False and the first batch exceeds max_bytes


@dataclass(slots=True)
class SliceResult:
    """A fetch's read: whole batches as bytes, or as a range of a segment file when long."""

    records: bytes | FileRange
    first_offset: int  # base offset of the first batch returned, or the requested offset if none
    next_offset: int  # past the last batch returned (an upper bound across compaction gaps)
    first_batch_too_large: bool = False
