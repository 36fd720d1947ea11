"""ResponseOrder: parked requests let later ones be processed, but answers leave in request order."""

from __future__ import annotations

import random

import pytest

from pykbroker.server.response_order import ResponseOrder, Slot


def _drain(order: ResponseOrder) -> list[Slot]:
    """What a writer would write now, in order (bounded: at most every entry once)."""
    out = []
    for _ in range(len(order) + 1):
        slot = order.take()
        if slot is None:
            break
        out.append(slot)
        order.written()
    return out


def test_ready_responses_go_out_at_once_when_nothing_is_parked() -> None:
    order = ResponseOrder(5)
    order.ready(b"r1", 10)
    assert [s.response for s in _drain(order)] == [b"r1"]
    assert order.idle


def test_a_later_response_waits_behind_a_parked_one() -> None:
    order = ResponseOrder(5)
    parked = order.park(100)
    order.ready(b"r2", 20)
    assert order.parked == 1
    assert _drain(order) == []  # r2 is ready, but r1 is not answered yet
    order.complete(parked, b"r1")
    assert [s.response for s in _drain(order)] == [b"r1", b"r2"]
    assert order.idle and order.parked == 0


def test_parked_requests_completing_out_of_order_are_written_in_order() -> None:
    order = ResponseOrder(5)
    a, b, c = order.park(1), order.park(2), order.park(3)
    order.complete(c, b"c")
    order.complete(b, b"b")
    assert _drain(order) == []
    order.complete(a, b"a")
    assert [s.response for s in _drain(order)] == [b"a", b"b", b"c"]


def test_only_one_writer_at_a_time() -> None:
    order = ResponseOrder(5)
    order.ready(b"r1", 0)
    order.ready(b"r2", 0)
    first = order.take()
    assert first is not None and first.response == b"r1"
    assert order.take() is None  # another task is writing r1; it writes r2 after it
    assert not order.idle
    order.written()
    second = order.take()
    assert second is not None and second.response == b"r2"
    order.written()
    assert order.idle


def test_acks_0_entries_are_taken_with_nothing_to_write() -> None:
    order = ResponseOrder(5)
    order.ready(None, 7)
    taken = _drain(order)
    assert len(taken) == 1 and taken[0].response is None and taken[0].reserved == 7


def test_a_close_after_parked_requests_waits_for_them_then_stops_everything() -> None:
    order = ResponseOrder(5)
    parked = order.park(0)
    order.closing("acks=0 produce failed", 0)
    order.ready(b"never", 0)  # cannot happen from the reader, but nothing after a close may go out
    assert _drain(order) == []
    order.complete(parked, b"r1")
    taken = _drain(order)
    assert [s.response for s in taken] == [b"r1", None]
    assert taken[1].close_reason == "acks=0 produce failed"
    assert order.close_reason == "acks=0 produce failed"
    assert order.take() is None


def test_a_parked_request_that_fails_closes_after_the_ones_before_it() -> None:
    order = ResponseOrder(5)
    order.ready(b"r1", 0)
    first = order.take()  # being written when the parked one fails
    parked = order.park(0)
    order.fail(parked, "fault injection")
    assert first is not None and order.take() is None
    order.written()
    taken = _drain(order)
    assert [s.close_reason for s in taken] == ["fault injection"]


def test_full_counts_every_unanswered_request() -> None:
    order = ResponseOrder(3)
    p = order.park(0)
    order.ready(b"x", 0)
    assert not order.full
    order.park(0)
    assert order.full  # 3 unanswered: read nothing more
    order.complete(p, b"p")
    _drain(order)
    assert not order.full and len(order) == 1


def test_one_means_no_pipelining() -> None:
    order = ResponseOrder(1)
    order.park(0)
    assert order.full
    assert ResponseOrder(0).max_unanswered == 1


def test_completing_twice_is_a_bug() -> None:
    order = ResponseOrder(5)
    slot = order.park(0)
    order.complete(slot, b"a")
    with pytest.raises(ValueError):
        order.complete(slot, b"b")


def test_clear_returns_the_reservations_still_held_and_ignores_late_completions() -> None:
    order = ResponseOrder(5)
    parked = order.park(100)
    order.ready(b"r2", 20)
    assert order.clear() == 120
    order.complete(parked, b"late")  # the connection is gone: nothing changes, nothing raises
    assert order.idle and order.parked == 0 and order.take() is None


def test_random_completion_orders_keep_request_order_and_account_every_byte() -> None:
    rng = random.Random(14)
    for _ in range(200):
        order = ResponseOrder(8)
        entries: list[tuple[int, Slot | None]] = []
        for i in range(rng.randint(1, 8)):
            if rng.random() < 0.5:
                entries.append((i, order.park(i + 1)))
            else:
                order.ready(bytes([i]), i + 1)
                entries.append((i, None))
        taken: list[Slot] = _drain(order)  # the ready ones before the first parked one go out at once
        pending = [(i, s) for i, s in entries if s is not None]
        rng.shuffle(pending)
        for i, slot in pending:
            order.complete(slot, bytes([i]))
            taken += _drain(order)
        assert [s.response for s in taken] == [bytes([i]) for i, _ in entries]
        assert sum(s.reserved for s in taken) == sum(i + 1 for i, _ in entries)  # each reservation once
        assert order.idle and order.parked == 0 and order.unanswered_bytes == 0


def test_the_byte_bound_stops_reading_behind_large_requests_only() -> None:
    order = ResponseOrder(32, 4 << 20)
    order.park(1 << 20)
    order.park(1 << 20)
    order.park(1 << 20)
    assert not order.full and order.unanswered_bytes == 3 << 20
    order.park(1 << 20)
    assert order.full  # 4 MiB of requests wait: read nothing more
    small = ResponseOrder(32, 4 << 20)
    for _ in range(31):
        small.park(1000)  # many small acknowledgements may wait together (one fsync covers them)
    assert not small.full
    small.park(1000)
    assert small.full  # the count bound still holds


def test_one_request_larger_than_the_byte_bound_is_still_read() -> None:
    order = ResponseOrder(32, 1000)
    assert not order.full
    slot = order.park(5000)
    assert order.full
    order.complete(slot, b"r")
    taken = _drain(order)
    assert [s.response for s in taken] == [b"r"]
    assert order.unanswered_bytes == 0 and not order.full


def test_fsync_waits_are_bounded_apart_from_replication_waits() -> None:
    """Requests parked only for this broker's fsync are read on up to the local bound; once one of the
    unanswered requests waits for the ISR, the replication bound applies again."""
    order = ResponseOrder(2, None, 4)
    flushes = [order.park(10, replicated=False) for _ in range(3)]
    assert not order.full  # 3 < 4: one fsync covers them all, so read on
    replicated = order.park(10)  # an acks=all produce waiting for the followers
    assert order.parked_replicated == 1
    assert order.full  # 4 unanswered, and one waits for the ISR: the bound of 2 holds
    for slot in flushes:
        order.complete(slot, b"ok")
    assert len(_drain(order)) == 3 and len(order) == 1
    assert not order.full and order.parked_replicated == 1  # 1 < 2
    order.park(10, replicated=False)
    assert order.full  # 2 unanswered, one of them replicated
    order.complete(replicated, b"ok")
    assert order.parked_replicated == 0 and not order.full  # only an fsync wait is left: 1 < 4
    for _ in range(3):
        order.park(10, replicated=False)
    assert order.full  # 4 fsync waits: the local bound holds too


def test_the_local_bound_defaults_to_the_replication_bound_and_clear_resets_it() -> None:
    order = ResponseOrder(2)  # TLS connections: no local bound given
    order.park(10, replicated=False)
    order.park(10, replicated=False)
    assert order.full
    order.clear()
    assert order.parked_replicated == 0 and order.parked == 0 and not order.full
    other = ResponseOrder(1, None, 3)
    other.park(5)
    other.clear()
    assert other.parked_replicated == 0


def test_the_byte_bound_also_holds_for_fsync_waits() -> None:
    order = ResponseOrder(5, 4 << 20, 32)
    order.park(3 << 20, replicated=False)
    assert not order.full
    order.park(1 << 20, replicated=False)
    assert order.full  # 4 MiB of requests wait, however few


def test_a_waiting_fetch_does_not_stop_the_reading_even_at_one() -> None:
    """A long-polling fetch waits for data, not an acknowledgement: the connection reads on past it, so the
    produce that brings its data is not stuck behind it; the answers still leave in request order."""
    order = ResponseOrder(1, max_unanswered_local=1024)
    fetch = order.park(0, long_poll=True)
    assert not order.full
    order.ready(b"produce", 0)  # read and processed while the fetch waits
    assert order.full  # one request beyond the waiting fetch, at max_unanswered 1
    assert _drain(order) == []  # the produce's answer waits behind the fetch
    order.complete(fetch, b"fetch")
    assert [s.response for s in _drain(order)] == [b"fetch", b"produce"]
    assert order.idle and not order.full


def test_waiting_fetches_are_bounded_too() -> None:
    order = ResponseOrder(2, max_unanswered_local=1024)
    polls = [order.park(0, long_poll=True) for _ in range(2)]
    assert not order.full
    polls.append(order.park(0, long_poll=True))
    assert order.full  # more waiting fetches than max_unanswered
    for p in polls:
        order.complete(p, b"f")
    _drain(order)
    # Requests read behind a waiting fetch are bounded by max_unanswered, not the fsync-only limit.
    order.park(0, long_poll=True)
    order.ready(b"a", 0)
    assert not order.full
    order.ready(b"b", 0)
    assert order.full


def test_on_tls_a_waiting_fetch_counts_like_any_request() -> None:
    order = ResponseOrder(1, read_past_long_polls=False)
    order.park(0, long_poll=True)
    assert order.full
