"""Incremental fetch sessions (KIP-227): the session cache on its own, then Fetch through it."""

from __future__ import annotations

import datetime
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.protocol.records import build_batch
from pykbroker.server.broker import Broker
from pykbroker.server.fetch_session import FetchSessionCache, FetchSessionError, next_epoch
from tests.unit.test_dispatcher import call

# -- the cache, sans-I/O -------------------------------------------------------------------------


def test_epochs_wrap_to_one_never_zero() -> None:
    assert next_epoch(1) == 2
    assert next_epoch(2**31 - 1) == 1


def test_incremental_requests_must_name_a_live_session_and_its_next_epoch() -> None:
    now = [0]
    cache = FetchSessionCache(2, 1000, lambda: now[0], random.Random(1))
    s = cache.create(by_id=True, size=3)
    assert s is not None and s.id != 0 and s.epoch == 1
    assert cache.incremental(s.id, 1) is s
    with pytest.raises(FetchSessionError) as e:
        cache.incremental(s.id, 2)
    assert e.value.code == ErrorCode.invalid_fetch_session_epoch
    with pytest.raises(FetchSessionError) as e:
        cache.incremental(s.id + 1, 1)
    assert e.value.code == ErrorCode.fetch_session_id_not_found
    cache.remove(s.id)
    with pytest.raises(FetchSessionError):
        cache.incremental(s.id, 1)


def test_a_full_cache_evicts_stale_then_smaller_sessions_else_refuses() -> None:
    now = [0]
    cache = FetchSessionCache(2, 1000, lambda: now[0], random.Random(2))
    a, b = cache.create(True, 5), cache.create(True, 5)
    assert a is not None and b is not None
    for s in (a, b):
        s.partitions = {(uuid.uuid4(), i): None for i in range(5)}  # type: ignore[misc]
    assert cache.create(True, 5) is None  # nothing stale, nothing smaller: no session
    now[0] = 500
    cache.incremental(b.id, 1)  # b is in use
    now[0] = 1200
    c = cache.create(True, 1)
    assert c is not None and cache.get(a.id) is None and cache.get(b.id) is b  # a was stale
    d = cache.create(True, 3)  # c (size 0) is smaller than 3: it goes
    assert d is not None and cache.get(c.id) is None and len(cache) == 2 and cache.evictions == 2
    assert FetchSessionCache(0, 1000, lambda: 0).create(True, 1) is None  # slots=0: sessionless


# -- Fetch through sessions, in process ------------------------------------------------------------


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(BrokerConfig({"log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0"}))
    b.startup()
    created = call(b, 19, 7, {"topics": [{"name": "t", "num_partitions": 3, "replication_factor": 1,
                                          "assignments": [], "configs": []}], "timeout": 1000})
    assert created.topics[0].error_code == ErrorCode.none
    try:
        yield b
    finally:
        b.log_manager.shutdown()


def _produce(b: Broker, partition: int, value: bytes) -> None:
    batch = build_batch([(None, value, [])], timestamp_ms=1_700_000_000_000)
    r = call(b, 0, 9, {"acks": 1, "timeout": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": partition, "records": batch}]}]})
    assert r.responses[0].partition_responses[0].error_code == ErrorCode.none


def _fetch(b: Broker, session_id: int, epoch: int, positions: dict[int, int], forgotten: list[int] | None = None,
           version: int = 12) -> Any:
    parts = [{"partition": p, "fetch_offset": o, "partition_max_bytes": 1 << 20, "current_leader_epoch": -1,
              "last_fetched_epoch": -1, "log_start_offset": -1} for p, o in positions.items()]
    return call(b, 1, version, {
        "max_wait": datetime.timedelta(0), "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": session_id, "session_epoch": epoch,
        "topics": [{"topic": "t", "partitions": parts}] if parts else [],
        "forgotten_topics_data": [{"topic": "t", "partitions": forgotten}] if forgotten else [],
        "rack_id": ""})


def _seen(resp: Any) -> dict[int, tuple[int, int]]:
    """partition -> (high watermark, bytes of records) for every partition in the response."""
    return {int(p.partition_index): (int(p.high_watermark), len(p.records or b""))
            for t in resp.responses for p in t.partitions}


def test_incremental_fetches_carry_only_what_changed(broker: Broker) -> None:
    _produce(broker, 0, b"a")
    full = _fetch(broker, 0, 0, {0: 0, 1: 0, 2: 0})
    sid = int(full.session_id)
    assert full.error_code == ErrorCode.none and sid != 0
    assert set(_seen(full)) == {0, 1, 2} and _seen(full)[0][1] > 0

    # The client moved partition 0 past the record; nothing else is new: an empty response.
    quiet = _fetch(broker, sid, 1, {0: 1})
    assert (quiet.error_code, int(quiet.session_id), _seen(quiet)) == (ErrorCode.none, sid, {})

    _produce(broker, 2, b"b")
    news = _fetch(broker, sid, 2, {})  # the session remembers every position
    assert set(_seen(news)) == {2} and _seen(news)[2][0] == 1 and _seen(news)[2][1] > 0

    # A forgotten partition is no longer read, whatever happens to it.
    _fetch(broker, sid, 3, {2: 1}, forgotten=[1])
    _produce(broker, 1, b"c")
    assert _seen(_fetch(broker, sid, 4, {})) == {}

    # Out of step: a repeated epoch, an unknown session.
    assert _fetch(broker, sid, 4, {}).error_code == ErrorCode.invalid_fetch_session_epoch
    assert _fetch(broker, sid + 1, 1, {}).error_code == ErrorCode.fetch_session_id_not_found

    # A sessionless full fetch naming the session closes it.
    closing = _fetch(broker, sid, -1, {0: 1, 1: 0, 2: 1})
    assert int(closing.session_id) == 0 and set(_seen(closing)) == {0, 1, 2}
    assert _fetch(broker, sid, 5, {}).error_code == ErrorCode.fetch_session_id_not_found


def test_partitions_that_returned_data_are_read_last_next_time(broker: Broker) -> None:
    for p in (0, 1, 2):
        _produce(broker, p, b"x")
    full = _fetch(broker, 0, 0, {0: 0, 1: 0, 2: 0})
    sid = int(full.session_id)
    session = broker.services.fetch_sessions.get(sid)
    assert session is not None
    assert [k[1] for k in session.partitions] == [0, 1, 2]  # a new session reads in the request's order
    _produce(broker, 0, b"y")
    _fetch(broker, sid, 1, {0: 1, 1: 1, 2: 1})
    assert [k[1] for k in session.partitions] == [1, 2, 0]


def test_no_session_without_slots(tmp_path: Path) -> None:
    b = Broker(BrokerConfig({"log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0",
                             "max.incremental.fetch.session.cache.slots": "0"}))
    b.startup()
    try:
        call(b, 19, 7, {"topics": [{"name": "t", "num_partitions": 1, "replication_factor": 1,
                                    "assignments": [], "configs": []}], "timeout": 1000})
        resp = _fetch(b, 0, 0, {0: 0})
        assert resp.error_code == ErrorCode.none and int(resp.session_id) == 0
    finally:
        b.log_manager.shutdown()
