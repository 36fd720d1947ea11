"""Delayed delivery in a cluster, sans-I/O: who delivers with which producer id, epoch and sequence.

The target's real producer state (pykbroker/storage/producer_state.py) judges the batches, so the tests
check what matters end to end: a new leader's re-send of its predecessor's last batch is a duplicate when
that batch was appended, appended when it was not, and the predecessor is fenced once the new leader
delivered in its own epoch.
"""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from pykbroker.delay.delivery import (
    CLUSTER_PRODUCER_ID_BASE,
    DELIVERED,
    FENCED,
    MAX_PRODUCER_EPOCH,
    RETRY,
    SEQ_MOD,
    Delivery,
    Ownership,
    forward_error,
    outcome,
    producer_epoch_for,
    producer_id_for,
)
from pykbroker.delay.serde import Entry, Intent, ProducerSequence
from pykbroker.delay.service import DELIVERY_PRODUCER_ID_BASE
from pykbroker.protocol.records import build_batch, parse_batch_header
from pykbroker.storage.producer_state import ProducerStateError, ProducerStateManager

NOW = 1_700_000_000_000


def entries(*uids: int, topic: str = "t", partition: int = 0) -> list[Entry]:
    return [Entry(NOW + uid, uid, topic, partition, NOW, b"k%d" % uid, b"v", ()) for uid in uids]


class Target:
    """A target partition's producer state and log end offset, as its leader applies an idempotent batch."""

    def __init__(self) -> None:
        self.state = ProducerStateManager()
        self.end = 0

    def append(self, d: Delivery) -> ErrorCode:
        buf = build_batch([(e.key, e.value, []) for e in d.entries], timestamp_ms=NOW, producer_id=d.producer_id,
                          producer_epoch=d.producer_epoch, base_sequence=d.base_sequence)
        header = parse_batch_header(bytearray(buf), 0)
        try:
            if self.state.check(header) is not None:
                return ErrorCode.none  # a duplicate: its original offsets, nothing appended
        except ProducerStateError as e:
            return ErrorCode(e.error_code)
        header.base_offset = self.end
        self.state.update(header)
        self.end += len(d.entries)
        return ErrorCode.none


def test_ids_and_epochs() -> None:
    assert producer_id_for(0) == CLUSTER_PRODUCER_ID_BASE > DELIVERY_PRODUCER_ID_BASE + (1 << 31)
    assert producer_id_for(7) == CLUSTER_PRODUCER_ID_BASE + 7
    assert producer_epoch_for(3) == 3 and producer_epoch_for(-1) == 0
    assert producer_epoch_for(1 << 20) == MAX_PRODUCER_EPOCH


def test_outcomes_and_forward_errors() -> None:
    assert outcome(ErrorCode.none) == outcome(ErrorCode.duplicate_sequence_number) == DELIVERED
    assert outcome(ErrorCode.invalid_producer_epoch) == FENCED
    for code in (ErrorCode.not_leader_or_follower, ErrorCode.request_timed_out, ErrorCode.not_enough_replicas,
                 ErrorCode.out_of_order_sequence_number):
        assert outcome(code) == RETRY
    assert forward_error(ErrorCode.none) == ErrorCode.none
    assert forward_error(None) == ErrorCode.request_timed_out  # unreachable: it may have been appended
    assert forward_error(ErrorCode.not_enough_replicas_after_append) == ErrorCode.request_timed_out
    for code in (ErrorCode.not_leader_or_follower, ErrorCode.coordinator_load_in_progress,
                 ErrorCode.unknown_topic_or_partition):
        assert forward_error(code) == ErrorCode.not_enough_replicas  # nothing written: retried safely


def test_sequences_per_target_one_delivery_in_flight() -> None:
    o = Ownership(3, leader_epoch=4)
    d1 = o.begin("t", 0, entries(1, 2, 3), offset_before=-1)
    assert (d1.producer_id, d1.producer_epoch, d1.base_sequence) == (producer_id_for(3), 4, 0)
    with pytest.raises(ValueError):
        o.begin("t", 0, entries(4), offset_before=-1)
    other = o.begin("t", 1, entries(5), offset_before=10)
    assert other.base_sequence == 0 and other.intent().offset_before == 10
    o.finish(d1)
    d2 = o.begin("t", 0, entries(4), offset_before=-1)
    assert d2.base_sequence == 3
    o.abort(d2)  # its intent was not written: the sequence is used again
    assert o.begin("t", 0, entries(4), offset_before=-1).base_sequence == 3
    assert set(o.inflight) == {("t", 0), ("t", 1)}


def test_sequences_wrap() -> None:
    o = Ownership(0, 1)
    o.next_sequence[("t", 0)] = SEQ_MOD - 2
    d = o.begin("t", 0, entries(1, 2, 3), -1)
    o.finish(d)
    assert o.begin("t", 0, entries(4), -1).base_sequence == 1


def test_takeover_resends_the_last_batch_duplicate_if_appended_then_fences_the_old_leader() -> None:
    target = Target()
    old = Ownership(2, leader_epoch=5)
    d = old.begin("t", 0, entries(1, 2), -1)
    assert target.append(d) == ErrorCode.none  # appended, but the old leader died before its tombstones
    old.finish(d)
    new = Ownership(2, leader_epoch=6)
    it = d.intent()
    new.resume(it)  # another epoch: its own sequences still start at 0
    again = new.settle(it, entries(1, 2))
    assert (again.producer_epoch, again.base_sequence) == (5, 0)
    assert target.append(again) == ErrorCode.none and target.end == 2  # a duplicate: not appended twice
    new.finish(again)
    mine = new.begin("t", 0, entries(3), -1)
    assert (mine.producer_epoch, mine.base_sequence) == (6, 0)
    assert target.append(mine) == ErrorCode.none and target.end == 3
    # A zombie delivery of the old leader, in its epoch, after the new one delivered: fenced.
    zombie = Delivery("t", 0, old.producer_id, 5, 2, -1, entries(9))
    assert outcome(target.append(zombie)) == FENCED and target.end == 3


def test_takeover_appends_the_last_batch_if_it_never_arrived() -> None:
    target = Target()
    old = Ownership(2, leader_epoch=5)
    first = old.begin("t", 0, entries(1), -1)
    assert target.append(first) == ErrorCode.none
    old.finish(first)
    lost = old.begin("t", 0, entries(2, 3), -1)  # intent written, the append never happened
    new = Ownership(2, leader_epoch=6)
    again = new.settle(lost.intent(), entries(2, 3))
    assert target.append(again) == ErrorCode.none and target.end == 3
    assert target.append(again) == ErrorCode.none and target.end == 3  # a retry of it: duplicate


def test_same_epoch_loaded_again_continues_its_sequences() -> None:
    o = Ownership(1, leader_epoch=MAX_PRODUCER_EPOCH + 10)
    it = Intent("t", 0, 40, -1, (1, 2, 3), o.producer_id, o.producer_epoch)
    o.resume(it)
    o.resume(Intent("t", 1, 7, -1, (4,), o.producer_id, o.producer_epoch - 1))  # an older epoch: ignored
    assert o.begin("t", 0, entries(5), -1).base_sequence == 43
    assert o.begin("t", 1, entries(6), -1).base_sequence == 0


def test_forwarded_retry_of_a_scheduled_idempotent_batch_is_a_duplicate() -> None:
    o = Ownership(0, 1)
    seq = ProducerSequence(1000, "t", 0, 2, 40, 9, NOW)
    assert not o.is_duplicate(seq)
    o.record_sequence(seq)
    assert o.is_duplicate(seq)
    assert not o.is_duplicate(ProducerSequence(1000, "t", 0, 2, 50, 9, NOW))
    assert not o.is_duplicate(ProducerSequence(1000, "t", 1, 2, 40, 9, NOW))
