"""IP connection creation quotas (KIP-612 ``connection_creation_rate`` on ``ip`` entities) on a real broker.

The clients connect from 127.0.0.2 (all of 127/8 is loopback on Linux), so the quotas under test never
touch the admin client's own connections from 127.0.0.1.  The broker measures over 2 windows of 1 s
(quota.window.num / quota.window.size.seconds, which Kafka's connection quotas use too): the rate is
counted over at least one second, so with a quota of N the (N+1)th connection within a second is over
it.  Kafka holds such a connection for its throttle time (at most one window) and closes it unserved.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest

from tests.integration.conftest import BrokerFactory, request_frame
from tests.support.broker import BrokerProcess
from tests.support.quotas import KpQuotas

CLIENT_IP = "127.0.0.2"
QUOTA = 5


@pytest.fixture(scope="module")
def broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    return module_broker_factory({"quota.window.num": "2", "quota.window.size.seconds": "1"})


@pytest.fixture
def kp(broker: BrokerProcess) -> Iterator[KpQuotas]:
    c = KpQuotas(broker)
    try:
        yield c
    finally:
        for name in (CLIENT_IP, None):  # the module's other tests start without ip quotas
            c.alter((("ip", name),), {"connection_creation_rate": None})
        c.close()


def served(broker: BrokerProcess, keep: list[socket.socket]) -> bool:
    """Connect from CLIENT_IP and send ApiVersions: True when answered, False when the broker closes the
    connection unanswered.  Answered connections stay open (in ``keep``) until the test ends."""
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=10.0, source_address=(CLIENT_IP, 0))
    try:
        sock.sendall(request_frame(18, 0, {}, 1))
        head = b""
        for _ in range(8):  # bounded: each recv returns at least one byte or ends the loop
            chunk = sock.recv(4 - len(head))
            if not chunk:
                break
            head += chunk
            if len(head) == 4:
                break
    except (ConnectionError, TimeoutError):
        head = b""
    if len(head) == 4 and struct.unpack(">i", head)[0] > 0:
        keep.append(sock)
        return True
    sock.close()
    return False


def test_ip_connection_creation_rate_closes_connections_over_it(broker: BrokerProcess, kp: KpQuotas) -> None:
    keep: list[socket.socket] = []
    try:
        assert kp.alter((("ip", CLIENT_IP),), {"connection_creation_rate": float(QUOTA)}) == (0, None)
        started = time.monotonic()
        outcomes = [served(broker, keep) for _ in range(QUOTA + 2)]
        assert time.monotonic() - started < 1.0, "too slow to stay within one window"
        assert outcomes == [True] * QUOTA + [False, False]
        # Refused connections do not count: they were never accepted.
        assert len(keep) == QUOTA

        # A change applies to the next connection: raised, the address is within it again.
        assert kp.alter((("ip", CLIENT_IP),), {"connection_creation_rate": 1000.0}) == (0, None)
        assert served(broker, keep)

        # Without its own quota, the address gets the default entity's; the measurement is kept, so
        # the 6 connections of the last second are already over a default of 3.
        assert kp.alter((("ip", CLIENT_IP),), {"connection_creation_rate": None}) == (0, None)
        assert kp.alter((("ip", None),), {"connection_creation_rate": 3.0}) == (0, None)
        assert not served(broker, keep)

        # Once the rate has fallen back within the quota (the windows have passed), connections work again.
        time.sleep(2.5)
        assert served(broker, keep)
    finally:
        for sock in keep:
            sock.close()
    assert "above its connection_creation_rate quota" in broker.log()


def test_connections_are_not_limited_without_an_ip_quota(broker: BrokerProcess, kp: KpQuotas) -> None:
    keep: list[socket.socket] = []
    try:
        assert all(served(broker, keep) for _ in range(3 * QUOTA))
    finally:
        for sock in keep:
            sock.close()
