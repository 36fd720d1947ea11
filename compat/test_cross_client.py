"""Cross-client: what one implementation writes, another reads (every codec); one group, many clients."""

from __future__ import annotations

import pytest

from compat import scenario as s
from compat.check import assert_same, text_msgs
from compat.clients import base
from compat.clients.base import Client, Member, wait_until
from compat.conftest import CROSS_CLIENTS, get_client
from compat.test_groups import JOIN_TIMEOUT, _describe, _stable, group_name

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


@s.scenario("cross.produce-consume", "cross-client", needs=(base.HEADERS,), apis=(0, 1))
def test_cross_produce_consume(pair: tuple[Client, Client], new_topic) -> None:  # type: ignore[no-untyped-def]
    producer, consumer = pair
    topic = new_topic(partitions=len(CODECS))
    sent = []
    for p, codec in enumerate(CODECS):
        null_every = 4 if base.NULL_VALUES in producer.caps and base.NULL_VALUES in consumer.caps else 0
        batch = text_msgs(12, prefix=f"{producer.name}-{codec}", partition=p, null_every=null_every)
        producer.produce(topic, batch, compression=codec)
        sent += batch
    got = consumer.consume(topic, list(range(len(CODECS))), count=len(sent), timeout=30)
    assert_same(sent, got)


@s.scenario("group.mixed-clients", "cross-client", apis=s.GROUPS)
@pytest.mark.timeout(240)
def test_mixed_group(request: pytest.FixtureRequest, cluster, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    from compat.conftest import _check_supported, _selected_clients

    names = [n for n in CROSS_CLIENTS if n in _selected_clients(request.config)]
    clients = [get_client(n, cluster) for n in names]
    _check_supported(request, cluster, clients)
    # A client whose subscription the others cannot parse would never be given partitions.
    clients = [c for c in clients if base.GROUPS in c.caps and c.shares_groups]
    if len(clients) < 2:
        pytest.skip("NOT SUPPORTED by client: fewer than two clients with consumer groups selected")
    topic = new_topic(partitions=12)
    group = group_name("mixed")
    members: list[Member] = []
    try:
        # Every client offers the standard "roundrobin" assignor, the one protocol they all share.
        for c in clients:
            members.append(c.start_member(group, [topic], assignor="roundrobin"))
            # Let each join settle before the next arrives: fewer overlapping rebalances.
            wait_until(lambda: _stable(members, 12, topic), JOIN_TIMEOUT,
                       what=f"{len(members)} members sharing 12 partitions ({_describe(members)})")
        sent = [m for p in range(12) for m in text_msgs(5, prefix=f"mix{p}", partition=p)]
        helper.produce(topic, sent)

        def consumed() -> set[tuple[int, int]]:
            return {(r.partition, r.offset) for m in members for r in m.records()}

        wait_until(lambda: len(consumed()) >= len(sent), 60,
                   what=f"{len(sent)} records across the group (got {len(consumed())}; {_describe(members)})")
        assert consumed() == {(p, o) for p in range(12) for o in range(5)}
        for c, m in zip(clients, members, strict=True):
            mine = {p for _, p in m.assignment()}
            assert {r.partition for r in m.records()} <= mine, f"{c.name} read partitions it does not own"
    finally:
        for m in members:
            m.close()
