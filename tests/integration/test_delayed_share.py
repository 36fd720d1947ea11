"""Delayed delivery (docs/queues.md "Delayed delivery") read by share consumers (KIP-932).

With ``pykbroker.delay.enable`` and ``group.share.enable``, records produced with a ``pykbroker.delay.ms``
header must be acquired by a confluent-kafka ShareConsumer neither before their due time nor more than
LATE_S after it, each once; also when the broker is killed with SIGKILL while records are still scheduled
(those due while it was down come at once after the restart, the others on time).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, ShareConsumer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from tests.integration.conftest import BrokerFactory, admin_for, create_topic, make_producer, unique_topic
from tests.support.broker import BrokerProcess

# How late a record may be acquired after its due time on this shared 2-core machine (scheduler timer,
# ShareFetch long poll, client scheduling); the same margin as tests/integration/test_delayed_delivery.py.
LATE_S = 1.5
ENABLED = {"pykbroker.delay.enable": "true", "group.share.enable": "true"}
CLIENT_TIMEOUT = 20
CLOSE_TIMEOUT_MS = 5000
Arrival = tuple[int, Any]  # (wall-clock ms the application got it, message)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def share_consumer(b: BrokerProcess, group: str, topic: str, **conf: Any) -> ShareConsumer:
    admin = admin_for(b)
    res = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(timeout=CLIENT_TIMEOUT)
    c = ShareConsumer({"bootstrap.servers": b.bootstrap, "broker.address.family": "v4", "group.id": group,
                       "share.acknowledgement.mode": "explicit", "fetch.wait.max.ms": 100, **conf})
    c.subscribe([topic])
    return c


def close_quietly(c: ShareConsumer) -> None:
    try:
        c.close()
    except Exception:  # the broker is gone
        pass


def collect(c: ShareConsumer, until: Any, timeout: float) -> list[Arrival]:
    """Poll, ACCEPT and commit what comes (so nothing seen is delivered again), until ``until(arrivals)``
    or ``timeout`` seconds."""
    out: list[Arrival] = []
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.05) + 10):
        if until(out) or time.monotonic() >= deadline:
            break
        msgs = c.poll(0.05)
        at = now_ms()
        for m in msgs:
            assert m.error() is None, m.error()
            out.append((at, m))
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        if msgs:
            result = c.commit_sync(CLIENT_TIMEOUT)
            assert all(e is None for e in result.values()), result
    return out


def produce_delayed(b: BrokerProcess, topic: str, base: int, delays: dict[bytes, int]) -> None:
    p = make_producer(b)
    errors: list[Any] = []
    for key, delay in delays.items():
        headers = [("pykbroker.delay.ms", str(delay).encode())] if delay else None
        p.produce(topic, key=key, value=b"v-" + key, timestamp=base, headers=headers,
                  on_delivery=lambda err, _m: errors.append(err) if err is not None else None)
    assert p.flush(CLIENT_TIMEOUT) == 0
    assert errors == []


def test_share_consumer_acquires_delayed_records_on_time(broker_factory: BrokerFactory) -> None:
    b = broker_factory(ENABLED)
    topic, group = unique_topic("delay-share"), unique_topic("g")
    create_topic(b, topic, 1)
    c = share_consumer(b, group, topic)
    try:
        produce_delayed(b, topic, now_ms(), {b"ready": 0})
        [(_, ready)] = collect(c, lambda out: len(out) >= 1, 30)  # the member is in and fetching
        assert ready.key() == b"ready"
        base = now_ms()
        delays = {b"now": 0, **{b"d%d-%d" % (d, i): d for d in (1500, 3000, 4500) for i in range(3)}}
        produce_delayed(b, topic, base, delays)
        arrivals = collect(c, lambda out: len(out) >= len(delays), 20)
        arrivals += collect(c, lambda out: False, 1.5)  # anything delivered twice
    finally:
        c.close()
    got = [m.key() for _, m in arrivals]
    assert sorted(got) == sorted(delays), f"each record once: {got}"
    for at, m in arrivals:
        due = base + delays[m.key()]
        assert at >= due, f"{m.key()!r} acquired {due - at} ms before its due time"
        assert at - due <= LATE_S * 1000, f"{m.key()!r} acquired {at - due} ms after its due time"
        assert m.delivery_count() == 1 and m.value() == b"v-" + m.key()
        want_headers = [("pykbroker.delay.ms", str(delays[m.key()]).encode())] if delays[m.key()] else None
        assert m.headers() == want_headers


@pytest.mark.timeout(120)
def test_kill_9_with_records_still_scheduled(broker_factory: BrokerFactory) -> None:
    b = broker_factory(ENABLED)
    topic, group = unique_topic("delay-share-kill"), unique_topic("g")
    create_topic(b, topic, 1)
    c = share_consumer(b, group, topic, **{"socket.timeout.ms": CLOSE_TIMEOUT_MS})
    produce_delayed(b, topic, now_ms(), {b"ready": 0})
    assert len(collect(c, lambda out: len(out) >= 1, 30)) == 1
    base = now_ms()
    # Due before the kill (acknowledged then), while the broker is down, and after the restart.
    # Spread over 20 s so that some still fall due after a restart slowed by a loaded machine.
    delays = {b"k%03d" % i: 500 + i * 500 for i in range(40)}
    produce_delayed(b, topic, base, delays)
    before = collect(c, lambda out: now_ms() >= base + 2500, 10)
    b.kill()
    # Closing a consumer whose broker is gone can wait for a request it still has queued (its leave
    # heartbeat) to time out, which took socket.timeout.ms (60 s by default) in one CI run and pushed the
    # restart past every due time. So the close runs beside the restart, and socket.timeout.ms bounds it.
    closing = threading.Thread(target=close_quietly, args=(c,), daemon=True)
    closing.start()
    time.sleep(1.0)
    b.start()
    restarted = now_ms()
    c2 = share_consumer(b, group, topic)
    try:
        after = collect(c2, lambda out: len(before) + len(out) >= len(delays), 30)
        after += collect(c2, lambda out: False, 1.5)
    finally:
        c2.close()
    closing.join(CLOSE_TIMEOUT_MS / 1000 + 10)
    assert not closing.is_alive(), "socket.timeout.ms bounds the first consumer's close"
    assert before, "some records were due and acquired before the kill"
    got = [m.key() for _, m in before + after]
    assert sorted(got) == sorted(delays), \
        f"missing {sorted(set(delays) - set(got))[:5]}, twice {sorted(k for k in set(got) if got.count(k) > 1)[:5]}"
    for at, m in before + after:
        due = base + delays[m.key()]
        assert at >= due, f"{m.key()!r} acquired {due - at} ms before its due time"
    # Due while the broker was down: at once after the restart; due later: on time.
    for at, m in after:
        due = base + delays[m.key()]
        if due > restarted + 2000:
            assert at - due <= LATE_S * 1000, f"{m.key()!r} acquired {at - due} ms after its due time"
    assert any(base + delays[m.key()] > restarted + 2000 for _, m in after), "some records fell due after the restart"
