"""Share group membership, the simple assignor and share sessions, sans-I/O with a fake clock."""

from __future__ import annotations

import uuid

from kio.schema.errors import ErrorCode

from pykbroker.coordinator.share.group import ShareGroups, ShareMember, simple_assign
from pykbroker.coordinator.share.session import FINAL_EPOCH, ShareSessions

T1, T2 = uuid.uuid4(), uuid.uuid4()
TOPICS = {"one": (T1, 1), "four": (T2, 4)}


class Clock:
    def __init__(self) -> None:
        self.t = 0

    def __call__(self) -> int:
        return self.t


def groups(clock: Clock, max_size: int = 200) -> ShareGroups:
    return ShareGroups(lambda name: TOPICS.get(name), clock, max_size)


def test_simple_assign_shares_partitions_when_members_outnumber_them() -> None:
    members = [ShareMember(f"m{i}", subscribed=("one",)) for i in range(3)]
    assert simple_assign(members, TOPICS.get) == {f"m{i}": {T1: [0]} for i in range(3)}
    members = [ShareMember(f"m{i}", subscribed=("four",)) for i in range(2)]
    assert simple_assign(members, TOPICS.get) == {"m0": {T2: [0, 2]}, "m1": {T2: [1, 3]}}
    members = [ShareMember("a", subscribed=("four", "missing"))]
    assert simple_assign(members, TOPICS.get) == {"a": {T2: [0, 1, 2, 3]}}


def test_join_heartbeat_leave_and_epochs() -> None:
    clock = Clock()
    g = groups(clock)
    r = g.heartbeat("g", "a", 0, None, ("one",), 1000)
    assert r.error == ErrorCode.none and r.member_epoch == 1 and r.assignment == {T1: [0]}
    r = g.heartbeat("g", "a", 1, None, None, 1000)
    assert r.error == ErrorCode.none and r.member_epoch == 1 and r.assignment is None  # unchanged: not resent
    r = g.heartbeat("g", "b", 0, None, ("one",), 1000)
    assert r.member_epoch == 2 and r.assignment == {T1: [0]}
    r = g.heartbeat("g", "a", 1, None, None, 1000)
    assert r.error == ErrorCode.none and r.member_epoch == 2 and r.assignment == {T1: [0]}
    assert g.heartbeat("g", "a", 7, None, None, 1000).error == ErrorCode.fenced_member_epoch
    assert g.heartbeat("g", "zz", 3, None, None, 1000).error == ErrorCode.unknown_member_id
    assert g.heartbeat("g", "", 0, None, ("one",), 1000).error == ErrorCode.invalid_request
    assert g.heartbeat("g", "c", 0, None, None, 1000).error == ErrorCode.invalid_request
    removed: list[tuple[str, str]] = []
    g.on_member_removed = lambda gid, mid: removed.append((gid, mid))
    assert g.heartbeat("g", "b", -1, None, None, 1000).member_epoch == -1
    assert removed == [("g", "b")] and g.groups["g"].group_epoch == 3


def test_session_timeout_removes_member() -> None:
    clock = Clock()
    g = groups(clock)
    g.heartbeat("g", "a", 0, None, ("four",), 1000)
    g.heartbeat("g", "b", 0, None, ("four",), 5000)
    clock.t = 1000
    assert g.expire() == [("g", "a")]
    assert g.groups["g"].members["b"].assignment == {T2: [0, 1, 2, 3]}
    assert g.groups["g"].state == "Stable"
    clock.t = 5000
    g.expire()
    assert g.groups["g"].state == "Empty"
    assert g.delete("g") == ErrorCode.none and g.delete("g") == ErrorCode.group_id_not_found


def test_max_size() -> None:
    g = groups(Clock(), max_size=1)
    g.heartbeat("g", "a", 0, None, ("one",), 1000)
    assert g.heartbeat("g", "b", 0, None, ("one",), 1000).error == ErrorCode.group_max_size_reached


def test_share_session_epochs() -> None:
    s = ShareSessions(max_sessions=1)
    assert s.check("g", "a", 1) == ErrorCode.share_session_not_found
    assert s.check("g", "a", 0) == ErrorCode.none
    sess = s.open("g", "a")
    s.advance(sess)
    assert s.check("g", "a", 1) == ErrorCode.none
    assert s.check("g", "a", 2) == ErrorCode.invalid_share_session_epoch
    s.advance(sess)
    assert s.check("g", "a", 2) == ErrorCode.none
    assert s.check("g", "a", FINAL_EPOCH) == ErrorCode.none
    assert s.check("g", "b", 0) == ErrorCode.share_session_limit_reached
    s.close("g", "a")
    assert s.check("g", "a", 2) == ErrorCode.share_session_not_found


def test_share_groups_are_accepted_in_a_zookeeper_cluster() -> None:
    import pytest

    from pykbroker.config import BrokerConfig, ConfigError

    assert BrokerConfig({"group.share.enable": "true"})["group.share.enable"] is True
    cfg = BrokerConfig({"zookeeper.connect": "127.0.0.1:2181", "broker.id": "1", "group.share.enable": "true",
                        "listeners": "PLAINTEXT://127.0.0.1:9092"})
    assert cfg["group.share.enable"] is True
    assert cfg["share.coordinator.state.topic.min.isr"] == 2 and cfg["share.coordinator.write.timeout.ms"] == 5000
    with pytest.raises(ConfigError, match="share.coordinator.state.topic.min.isr"):
        BrokerConfig({"share.coordinator.state.topic.min.isr": "0"})
