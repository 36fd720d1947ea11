"""The request memory pool and the connection limits, driven without sockets."""

from __future__ import annotations

import anyio
import pytest

from pykbroker.config import parse_ip_overrides
from pykbroker.server.connection_quotas import INT_MAX, ConnectionQuotas, ListenerLimits, WindowedRate, normalise_ip
from pykbroker.server.memory_pool import MemoryPool

MiB = 1 << 20


# --- MemoryPool ------------------------------------------------------------------------------------


def test_unbounded_pool_always_grants() -> None:
    pool = MemoryPool(-1, 100 * MiB)
    assert not pool.bounded
    assert all(pool.try_reserve(100 * MiB) for _ in range(50))
    assert not pool.out_of_memory
    pool.release(100 * MiB)


def test_non_strict_pool_grants_while_any_memory_is_left() -> None:
    """Kafka's non-strict SimpleMemoryPool: one reservation may overdraw the pool, the next must wait."""
    pool = MemoryPool(100, 60)
    assert pool.try_reserve(60)
    assert pool.available == 40
    assert pool.try_reserve(60)  # 40 left >= 1: granted, the pool dips below zero
    assert pool.available == -20 and pool.out_of_memory
    assert not pool.try_reserve(1)
    pool.release(60)
    assert pool.available == 40 and not pool.out_of_memory
    assert pool.try_reserve(1)


def test_pool_rejects_sizes_it_can_never_hold() -> None:
    with pytest.raises(ValueError):
        MemoryPool(10, 100)  # smaller than one request: Kafka refuses this configuration too
    pool = MemoryPool(100, 100)
    with pytest.raises(ValueError):
        pool.try_reserve(101)
    with pytest.raises(ValueError):
        pool.try_reserve(-1)


def test_release_more_than_reserved_is_a_bug() -> None:
    pool = MemoryPool(100, 100)
    with pytest.raises(RuntimeError):
        pool.release(1)


def test_waiters_are_served_in_order_when_memory_frees() -> None:
    async def main() -> None:
        pool = MemoryPool(100, 100)
        assert pool.try_reserve(100)
        granted: list[str] = []

        async def want(name: str, size: int) -> None:
            await pool.reserve(size)
            granted.append(name)

        async with anyio.create_task_group() as tg:
            tg.start_soon(want, "a", 80)
            await anyio.sleep(0.01)
            tg.start_soon(want, "b", 10)
            await anyio.sleep(0.01)
            assert pool.waiting == 2 and granted == []
            assert not pool.try_reserve(1), "a newcomer must not overtake the queue"
            pool.release(50)  # 50 left: a (80) gets it and overdraws; b must wait for more
            await anyio.sleep(0.01)
            assert granted == ["a"] and pool.available == -30
            pool.release(50)
            await anyio.sleep(0.01)
            assert granted == ["a", "b"] and pool.available == 10
        pool.release(80)
        pool.release(10)
        assert pool.available == 100

    anyio.run(main)


def test_cancelled_waiter_leaves_the_pool_as_it_was() -> None:
    async def main() -> None:
        pool = MemoryPool(100, 100)
        assert pool.try_reserve(100)
        with anyio.move_on_after(0.05):
            await pool.reserve(10)
        assert pool.waiting == 0 and pool.available == 0
        # Granted and cancelled in the same instant: either the waiter owns the grant or the pool has it back.
        held = []
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def waiter() -> None:
                with scope:
                    await pool.reserve(10)
                    held.append(10)

            tg.start_soon(waiter)
            await anyio.sleep(0.01)
            pool.release(100)
            scope.cancel()
        assert pool.available + sum(held) == 100 and pool.waiting == 0

    anyio.run(main)


# --- WindowedRate --------------------------------------------------------------------------------


def test_rate_lets_ten_seconds_worth_through_then_throttles() -> None:
    """As Kafka's quota: the rate is averaged over at least ten one-second windows."""
    r = WindowedRate(5)
    delays = [r.record(0.0) for _ in range(50)]
    assert delays == [0.0] * 50
    d = r.record(0.0)
    assert 0 < d <= 1.0
    assert r.record(0.0) > d  # the further above the quota, the longer the wait


def test_rate_delay_is_at_most_one_window_and_recovers() -> None:
    r = WindowedRate(1)
    for _ in range(100):
        r.record(0.0)
    assert r.record(0.0) == 1.0
    assert r.record(30.0) == 0.0  # the old windows have expired


def test_sustained_rate_converges_to_the_quota() -> None:
    r = WindowedRate(20)
    now, accepted = 0.0, 0
    for _ in range(2000):  # a client connecting as fast as it is let in, for 60 s of broker time
        now += r.record(now) + 0.001
        accepted += 1
        if now >= 60.0:
            break
    assert 20 * 60 * 0.9 <= accepted <= 20 * 60 + 200 + 50  # the burst allowance plus the quota


def test_unlimited_rate_never_delays() -> None:
    r = WindowedRate(INT_MAX)
    assert all(r.record(0.0) == 0.0 for _ in range(10_000))


# --- ConnectionQuotas ----------------------------------------------------------------------------


def test_max_connections_and_per_ip() -> None:
    q = ConnectionQuotas(listeners=["PLAINTEXT"], max_connections=3, max_per_ip=2,
                         per_ip_overrides={"10.0.0.9": 3})
    assert q.try_add("PLAINTEXT", "10.0.0.1")
    assert q.try_add("PLAINTEXT", "10.0.0.1")
    assert not q.try_add("PLAINTEXT", "10.0.0.1"), "third from one address is over max.connections.per.ip"
    assert q.total == 2 and q.ip_count("10.0.0.1") == 2
    assert q.slot_available("PLAINTEXT")
    assert q.try_add("PLAINTEXT", "10.0.0.9")
    assert not q.slot_available("PLAINTEXT"), "max.connections reached"
    q.remove("PLAINTEXT", "10.0.0.1")
    assert q.slot_available("PLAINTEXT") and q.ip_count("10.0.0.1") == 1
    with pytest.raises(ValueError):
        q.remove("PLAINTEXT", "10.9.9.9")


def test_override_allows_more_and_zero_blocks() -> None:
    q = ConnectionQuotas(listeners=["A"], max_per_ip=0, per_ip_overrides={"127.0.0.1": 2})
    assert not q.try_add("A", "10.0.0.1")
    assert q.try_add("A", "127.0.0.1") and q.try_add("A", "127.0.0.1")
    assert not q.try_add("A", "127.0.0.1")


def test_listener_limit_and_inter_broker_listener() -> None:
    q = ConnectionQuotas(listeners=["PLAINTEXT", "EXTERNAL"], max_connections=2,
                         listener_limits={"EXTERNAL": ListenerLimits(max_connections=1)})
    assert q.try_add("EXTERNAL", "1.1.1.1")
    assert not q.slot_available("EXTERNAL"), "listener.name.external.max.connections=1"
    assert q.try_add("PLAINTEXT", "1.1.1.2")
    # PLAINTEXT is the inter-broker listener by default: exempt from the broker-wide limit.
    assert q.slot_available("PLAINTEXT")
    assert q.try_add("PLAINTEXT", "1.1.1.3")
    assert q.over_broker_limit()
    single = ConnectionQuotas(listeners=["PLAINTEXT"], max_connections=1)
    assert single.try_add("PLAINTEXT", "1.1.1.1")
    assert not single.slot_available("PLAINTEXT"), "with one listener nothing is exempt"


def test_creation_rate_broker_and_listener() -> None:
    q = ConnectionQuotas(listeners=["PLAINTEXT", "EXTERNAL"], max_creation_rate=1,
                         listener_limits={"EXTERNAL": ListenerLimits(max_creation_rate=INT_MAX)})
    assert [q.record_creation("EXTERNAL", 0.0) for _ in range(10)] == [0.0] * 10
    assert q.record_creation("EXTERNAL", 0.0) > 0
    assert q.record_creation("PLAINTEXT", 0.0) == 0.0, "the inter-broker listener ignores the broker rate"


def test_parse_ip_overrides() -> None:
    assert parse_ip_overrides("host1:10, 1.2.3.4:20,::1:5,[fe80::1]:6") == {
        "host1": 10, "1.2.3.4": 20, "::1": 5, "fe80::1": 6}
    assert parse_ip_overrides("") == {}
    for bad in ("host", "host:x", ":3", "h:-1"):
        with pytest.raises(ValueError):
            parse_ip_overrides(bad)
    assert normalise_ip("::ffff:127.0.0.1") == "127.0.0.1"
    assert normalise_ip("::1") == "::1"


# --- configuration ---------------------------------------------------------------------------------


def test_connection_settings_have_kafkas_defaults_and_checks() -> None:
    from pykbroker.config import BrokerConfig, ConfigError
    from pykbroker.server.connection_quotas import quotas_from_config

    cfg = BrokerConfig()
    assert (cfg["max.connections"], cfg["max.connections.per.ip"], cfg["max.connection.creation.rate"],
            cfg["max.connections.per.ip.overrides"], cfg["queued.max.request.bytes"]) == (
        INT_MAX, INT_MAX, INT_MAX, "", -1)
    cfg = BrokerConfig({
        "listeners": "PLAINTEXT://127.0.0.1:9092,EXTERNAL://127.0.0.1:9093",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT",
        "listener.name.external.max.connections": "7",
        "listener.name.external.max.connection.creation.rate": "3",
        "max.connections.per.ip.overrides": "127.0.0.1:4",
        "queued.max.request.bytes": str(200 * MiB),
    })
    q = quotas_from_config(cfg)
    assert q.listener_max_connections("EXTERNAL") == 7
    assert q.listener_max_connections("PLAINTEXT") == INT_MAX
    assert q.ip_limit("127.0.0.1") == 4 and q.ip_limit("10.0.0.1") == INT_MAX
    assert q.protected("PLAINTEXT") and not q.protected("EXTERNAL")
    for bad in (
        {"queued.max.request.bytes": str(MiB)},  # below socket.request.max.bytes
        {"max.connections.per.ip": "0"},  # 0 only with overrides
        {"max.connections": "-1"},
        {"max.connections.per.ip.overrides": "127.0.0.1"},
        {"listener.name.other.max.connections": "3"},
        {"listener.name.plaintext.max.connections": "x"},
    ):
        with pytest.raises(ConfigError):
            BrokerConfig(bad)
