"""Offsets: earliest and latest, lookup by timestamp, and out-of-range fetches under each auto.offset.reset."""

from __future__ import annotations

import threading
import time

import pytest

from compat import scenario as s
from compat.check import text_msgs
from compat.clients import base
from compat.clients.base import Client, ClientError, Msg


@s.scenario("offsets.earliest-latest", "offsets", needs=(base.LIST_OFFSETS,), apis=(2, 0, 1))
def test_earliest_latest(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=2)
    client.produce(topic, text_msgs(10, partition=0))
    assert client.list_offset(topic, 0, "earliest") == 0
    assert client.list_offset(topic, 0, "latest") == 10
    assert client.list_offset(topic, 1, "earliest") == 0
    assert client.list_offset(topic, 1, "latest") == 0
    recs = client.consume(topic, [0], start=7, count=3)
    assert [r.offset for r in recs] == [7, 8, 9]
    assert [r.value for r in recs] == [b"m-value-7", b"m-value-8", b"m-value-9"]


@s.scenario("offsets.by-timestamp", "offsets", needs=(base.LIST_OFFSETS,), apis=(2, 0, 1))
def test_by_timestamp(client: Client, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=1)
    base_ts = (int(time.time()) - 3600) * 1000
    msgs = [Msg(value=f"ts-{i}".encode(), key=b"k", partition=0, timestamp=base_ts + i * 1000) for i in range(10)]
    # kcat cannot set a record's timestamp: the helper writes the records, kcat looks them up.
    (client if base.TIMESTAMPS in client.caps else helper).produce(topic, msgs)
    assert client.list_offset(topic, 0, base_ts) == 0
    assert client.list_offset(topic, 0, base_ts + 2500) == 3       # first record with timestamp >= target
    assert client.list_offset(topic, 0, base_ts + 9000) == 9
    assert client.list_offset(topic, 0, base_ts + 60_000) == -1    # none that late
    recs = client.consume(topic, [0], count=10)
    assert [r.timestamp for r in recs] == [m.timestamp for m in msgs]


@s.scenario("offsets.out-of-range", "offsets", apis=(0, 1, 2))
@pytest.mark.parametrize("reset", ["earliest", "latest", "none"])
def test_out_of_range(client: Client, helper: Client, new_topic, reset: str) -> None:  # type: ignore[no-untyped-def]
    if reset == "none" and base.RESET_NONE not in client.caps:
        raise base.NotSupportedByClient("auto.offset.reset=none")
    topic = new_topic(partitions=1)
    client.produce(topic, text_msgs(5, partition=0))
    if reset == "earliest":
        recs = client.consume(topic, [0], start=50, count=5, reset="earliest")
        assert [r.offset for r in recs] == [0, 1, 2, 3, 4]
    elif reset == "none":
        try:
            recs = client.consume(topic, [0], start=50, count=1, reset="none", timeout=15)
        except ClientError as e:
            assert e.name == "OFFSET_OUT_OF_RANGE", f"expected OFFSET_OUT_OF_RANGE, got {e}"
        else:
            raise AssertionError(f"no OFFSET_OUT_OF_RANGE; consumed {[r.offset for r in recs]}")
    else:
        # Reset to the end: none of the five existing records, but what is written afterwards.
        stop = threading.Event()

        def writer() -> None:
            i = 0
            while not stop.wait(0.5) and i < 60:
                helper.produce(topic, [Msg(value=f"late-{i}".encode(), partition=0)])
                i += 1

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        try:
            recs = client.consume(topic, [0], start=50, count=1, reset="latest", timeout=30)
        finally:
            stop.set()
            t.join(10)
        assert recs, "nothing consumed after the reset to latest"
        assert recs[0].offset >= 5 and (recs[0].value or b"").startswith(b"late-"), recs[0]
