"""Dead-letter records and the read_committed view of batches (pykbroker.coordinator.share)."""

from __future__ import annotations

from dataclasses import dataclass

from pykbroker.coordinator.share.dlq import dead_letter_reasons, dead_letter_record
from pykbroker.coordinator.share.partition import Archived, ArchiveReason, LogBatch
from pykbroker.coordinator.share.service import _log_batches
from pykbroker.protocol.records import Record


def test_dead_letter_record_keeps_the_record_and_adds_provenance() -> None:
    r = Record(offset=42, timestamp=1, key=b"k", value=b"v", headers=[("h", b"1")])
    key, value, headers = dead_letter_record(r, topic="t", partition=3, group="g", delivery_count=5,
                                             reason=ArchiveReason.DELIVERY_COUNT_EXCEEDED)
    assert (key, value) == (b"k", b"v")
    assert headers == [("h", b"1"), ("pykbroker.dlq.source.topic", b"t"), ("pykbroker.dlq.source.partition", b"3"),
                       ("pykbroker.dlq.source.offset", b"42"), ("pykbroker.dlq.group", b"g"),
                       ("pykbroker.dlq.delivery.count", b"5"), ("pykbroker.dlq.reason", b"delivery-count-exceeded")]


def test_only_rejected_and_exhausted_records_are_dead_lettered() -> None:
    archived = [Archived(1, 1, ArchiveReason.REJECTED), Archived(2, 0, ArchiveReason.GAP),
                Archived(3, 5, ArchiveReason.DELIVERY_COUNT_EXCEEDED)]
    assert [a.offset for a in dead_letter_reasons(archived)] == [1, 3]


@dataclass
class H:
    base_offset: int
    last_offset: int
    producer_id: int = -1
    is_control: bool = False
    is_transactional: bool = False


def test_read_committed_skips_aborted_transactions_and_markers() -> None:
    headers = [
        H(0, 1),                                         # plain records
        H(2, 3, producer_id=7, is_transactional=True),   # aborted below
        H(4, 4, producer_id=8, is_transactional=True),   # committed
        H(5, 5, producer_id=7, is_control=True),         # abort marker of 7
        H(6, 6, producer_id=8, is_control=True),         # commit marker of 8
        H(7, 8, producer_id=7, is_transactional=True),   # 7's next transaction, not aborted
    ]
    assert _log_batches(headers, [(7, 2)]) == [
        LogBatch(0, 1), LogBatch(2, 3, False), LogBatch(4, 4), LogBatch(5, 5, False), LogBatch(6, 6, False),
        LogBatch(7, 8)]
    # read_uncommitted (no aborted list): only the markers are skipped.
    assert [b.deliverable for b in _log_batches(headers, [])] == [True, True, True, False, False, True]
