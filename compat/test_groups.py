"""Consumer groups: join, commit, resume, rebalance on join and leave, lag; classic and KIP-848."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from compat import scenario as s
from compat import wire
from compat.check import text_msgs
from compat.clients import base
from compat.clients.base import Client, Member, wait_until
from compat.cluster import ClusterInfo

JOIN_TIMEOUT = 45.0
UNSUPPORTED_VERSION = 35


class MemberFailed(AssertionError):
    """A member stopped for good with its client's own error; no wait can succeed any more."""


def wait_members(members: list[Member], cond: Callable[[], bool], timeout: float, what: str) -> None:
    """wait_until, ended at once by a member that failed (its own error is the failure)."""
    def check() -> bool:
        for i, m in enumerate(members):
            if m.failed:
                raise MemberFailed(f"member {i} stopped while waiting for {what}: {m.error}")
        return cond()

    wait_until(check, timeout, what=what)


def group_name(tag: str) -> str:
    return f"compat-{tag}-{uuid.uuid4().hex[:10]}"


def _stable(members: list[Member], partitions: int, topic: str) -> bool:
    sets = [set(m.assignment()) for m in members]
    if any(not x for x in sets):
        return False
    union = set().union(*sets)
    return sum(len(x) for x in sets) == len(union) and union == {(topic, p) for p in range(partitions)}


def _describe(members: list[Member]) -> str:
    return "; ".join(f"member {i}: {m.assignment()}{' error ' + m.error if m.error else ''}"
                     for i, m in enumerate(members))


@s.scenario("group.consume-commit-resume", "consumer groups", needs=(base.GROUPS,), apis=s.GROUPS)
def test_consume_commit_resume(client: Client, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=2)
    group = group_name("resume")
    first = [m for p in range(2) for m in text_msgs(10, prefix=f"a{p}", partition=p)]
    client.produce(topic, first) if base.ASSIGN in client.caps else helper.produce(topic, first)
    m1 = client.start_member(group, [topic], auto_commit=False)
    try:
        wait_members([m1], lambda: len(m1.records()) >= 20, JOIN_TIMEOUT, what=f"20 records ({_describe([m1])})")
    finally:
        m1.close()
    assert sorted((r.partition, r.offset) for r in m1.records()) == [(p, o) for p in range(2) for o in range(10)]
    # Committed: the next offset to read, per partition (checked with the helper's admin API).
    wait_until(lambda: helper.committed_offsets(group, topic, [0, 1]) == {0: 10, 1: 10}, 15,
               what="committed offsets 10/10")
    helper.produce(topic, text_msgs(3, prefix="b", partition=0))
    m2 = client.start_member(group, [topic], auto_commit=True)
    try:
        wait_members([m2], lambda: len(m2.records()) >= 3, JOIN_TIMEOUT, what=f"3 new records ({_describe([m2])})")
    finally:
        m2.close()
    assert [(r.partition, r.offset) for r in m2.records()] == [(0, 10), (0, 11), (0, 12)], \
        "a new member must resume from the committed offsets"


def _rebalance(client: Client, new_topic, protocol: str) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=4)
    group = group_name("rebalance")
    a = client.start_member(group, [topic], protocol=protocol)
    b: Member | None = None
    try:
        wait_members([a], lambda: _stable([a], 4, topic), JOIN_TIMEOUT,
                     what=f"first member to own 4 partitions ({_describe([a])})")
        b = client.start_member(group, [topic], protocol=protocol)
        wait_members([a, b], lambda: _stable([a, b], 4, topic), JOIN_TIMEOUT,
                     what=f"a rebalance sharing 4 partitions between 2 members ({_describe([a, b])})")
        if base.GROUP_ADMIN in client.caps:
            # DescribeGroups (classic) or ConsumerGroupDescribe (KIP-848) through the client's admin API.
            wait_until(lambda: client.describe_group(group) == {"state": "stable", "members": 2}, 20,
                       what=f"the group described as stable with 2 members (got {client.describe_group(group)})")
        b.close()
        members = [a]
        wait_members(members, lambda: _stable(members, 4, topic), JOIN_TIMEOUT,
                     what=f"the remaining member to own 4 partitions after the other left ({_describe([a])})")
    finally:
        a.close()
        if b is not None:
            b.close()


@s.scenario("group.rebalance-join-leave", "consumer groups", needs=(base.GROUPS,), apis=s.GROUPS, consumes=False)
def test_rebalance(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    _rebalance(client, new_topic, "classic")


@s.scenario("group.rebalance-consumer-protocol", "consumer groups", needs=(base.GROUP_PROTOCOL_CONSUMER,),
            apis=s.CONSUMER_PROTOCOL, consumes=False)
def test_rebalance_consumer_protocol(client: Client, cluster: ClusterInfo, new_topic) -> None:  # type: ignore[no-untyped-def]
    """The versions the client needs were checked against ApiVersions before this runs; a broker may still
    advertise ConsumerGroupHeartbeat with the protocol switched off (Kafka 3.8 unless KIP-848 is enabled).
    The member then fails with its own error; the broker's answer to a direct probe says whether that is
    the broker not supporting the protocol."""
    try:
        _rebalance(client, new_topic, "consumer")
    except MemberFailed as e:
        if wire.consumer_group_heartbeat_error(cluster.bootstrap) == UNSUPPORTED_VERSION:
            pytest.skip(f"{s.NS_BROKER}: ConsumerGroupHeartbeat(68) is advertised but answered UNSUPPORTED_VERSION "
                        f"(the consumer group protocol is not enabled); the member reported: {e}")
        raise


@s.scenario("group.admin-list-describe-delete", "consumer groups", needs=(base.GROUPS, base.GROUP_ADMIN),
            apis=(*s.GROUPS, 15, 16), consumes=False)
def test_group_admin(client: Client, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    """List and describe a group while it has a member and after; where the client can, delete one
    partition's committed offset (OffsetDelete) and then the group (DeleteGroups)."""
    topic = new_topic(partitions=2)
    group = group_name("admin")
    helper.produce(topic, text_msgs(4, partition=0) + text_msgs(2, partition=1))
    m = client.start_member(group, [topic], auto_commit=False)
    try:
        wait_members([m], lambda: len(m.records()) >= 6, JOIN_TIMEOUT, what=f"6 records ({_describe([m])})")
        assert client.describe_group(group) == {"state": "stable", "members": 1}
        assert group in client.list_groups()
    finally:
        m.close()
    wait_until(lambda: client.describe_group(group) == {"state": "empty", "members": 0}, 20,
               what=f"the group to be empty after its member left (got {client.describe_group(group)})")
    assert helper.committed_offsets(group, topic, [0, 1]) == {0: 4, 1: 2}
    if base.OFFSET_DELETE in client.caps:
        client.delete_committed_offsets(group, topic, [0])
        assert helper.committed_offsets(group, topic, [0, 1]) == {0: -1, 1: 2}
    try:
        client.delete_group(group)
    except base.NotSupportedByClient:
        return
    assert group not in client.list_groups()
    assert helper.committed_offsets(group, topic, [0, 1]) == {0: -1, 1: -1}


@s.scenario("group.commit-and-lag", "consumer groups", needs=(base.COMMIT, base.LIST_OFFSETS),
            apis=(*s.COMMITS, 2), consumes=False)
def test_commit_and_lag(client: Client, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=3)
    helper.produce(topic, text_msgs(10, partition=0) + text_msgs(4, partition=1))
    group = group_name("lag")
    assert client.committed_offsets(group, topic, [0, 1, 2]) == {0: -1, 1: -1, 2: -1}
    client.commit_offsets(group, topic, {0: 6, 1: 4})
    committed = client.committed_offsets(group, topic, [0, 1, 2])
    assert committed == {0: 6, 1: 4, 2: -1}
    lag = {p: client.list_offset(topic, p, "latest") - max(committed[p], 0) for p in range(3)}
    assert lag == {0: 4, 1: 0, 2: 0}
    # A later commit moves the position; offsets may go backwards too (a reset).
    client.commit_offsets(group, topic, {0: 2})
    assert client.committed_offsets(group, topic, [0])[0] == 2


pytestmark = pytest.mark.timeout(180)
