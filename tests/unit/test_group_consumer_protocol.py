"""KIP-848 consumer groups in the sans-I/O core: epochs, revoke-before-assign, assignors, errors."""

from __future__ import annotations

import datetime
import uuid
from types import SimpleNamespace
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.coordinator.group.assignors import range_assign, uniform_assign
from pykbroker.coordinator.group.consumer import ConsumerGroups
from pykbroker.coordinator.group.consumer_group import ConsumerMember
from pykbroker.coordinator.group.coordinator_state import GroupConfig
from pykbroker.coordinator.group.manager import CommitEntry, GroupManager

TID = uuid.UUID(int=7)
G = "cg"


def make(partitions: int = 6) -> GroupManager:
    now = [0]
    mgr = GroupManager(GroupConfig(num_partitions=1, consumer_session_timeout_ms=1000), lambda p, r: None,
                       lambda: now[0])
    mgr.begin_loading(0)
    mgr.finish_loading(0)
    cg = ConsumerGroups(mgr)
    cg.topic_ids = lambda t: TID if t == "t" else None
    cg.topic_names = lambda: ["t"]
    mgr.topic_partitions = lambda t: partitions if t == "t" else None
    mgr.consumer = cg
    mgr.now = now  # type: ignore[attr-defined]
    return mgr


def hb(mgr: GroupManager, member_id: str, epoch: int, owned: set[int] | None = None, **kw: Any) -> dict[str, Any]:
    req = SimpleNamespace(group_id=G, member_id=member_id, member_epoch=epoch, instance_id=kw.get("instance"),
                          rack_id=None, rebalance_timeout=datetime.timedelta(milliseconds=5000),
                          subscribed_topic_names=["t"] if epoch == 0 else None, subscribed_topic_regex=None,
                          server_assignor=kw.get("assignor"),
                          topic_partitions=None if owned is None else [SimpleNamespace(topic_id=TID,
                                                                                       partitions=sorted(owned))])
    resp: dict[str, Any] = mgr.consumer.heartbeat(req, "c", "/h")
    return resp


def parts(resp: dict[str, Any]) -> set[int]:
    a = resp["assignment"]
    return set() if a is None else {p for tp in a["topic_partitions"] for p in tp["partitions"]}


def test_join_assign_and_revoke_before_assign() -> None:
    mgr = make()
    r1 = hb(mgr, "a", 0, set())
    assert r1["error_code"] == ErrorCode.none and r1["member_epoch"] == 1 and parts(r1) == set(range(6))
    r2 = hb(mgr, "b", 0, set())
    assert r2["member_epoch"] == 2 or parts(r2) == set()  # b must wait for a to revoke
    assert parts(r2) == set()
    # a is told to keep only its share (revocation) without a new epoch yet.
    ra = hb(mgr, "a", 1, set(range(6)))
    assert ra["member_epoch"] == 1 and len(parts(ra)) == 3
    kept = parts(ra)
    # a acknowledges: it now gets the new epoch.
    ra = hb(mgr, "a", 1, kept)
    assert ra["member_epoch"] == 2
    rb = hb(mgr, "b", r2["member_epoch"], set())
    assert parts(rb) == set(range(6)) - kept and rb["member_epoch"] == 2


def test_epoch_errors_and_commit_validation() -> None:
    mgr = make()
    hb(mgr, "a", 0, set())
    assert hb(mgr, "a", 5, set())["error_code"] == ErrorCode.fenced_member_epoch
    assert hb(mgr, "zz", 1, set())["error_code"] == ErrorCode.unknown_member_id
    res = mgr.commit_offsets(G, 0, "a", None, [CommitEntry("t", 0, 1)])
    assert res[("t", 0)] == ErrorCode.stale_member_epoch
    res = mgr.commit_offsets(G, 9, "a", None, [CommitEntry("t", 0, 1)])
    assert res[("t", 0)] == ErrorCode.fenced_member_epoch
    assert mgr.commit_offsets(G, 1, "a", None, [CommitEntry("t", 0, 1)])[("t", 0)] == ErrorCode.none
    assert hb(mgr, "b", 0, set(), assignor="nope")["error_code"] == ErrorCode.unsupported_assignor


def test_session_timeout_and_leave() -> None:
    mgr = make()
    hb(mgr, "a", 0, set())
    hb(mgr, "b", 0, set())
    mgr.now[0] += 1500  # type: ignore[attr-defined]
    mgr.tick()
    assert not mgr.groups[G].members
    hb(mgr, "c", 0, set())
    assert hb(mgr, "c", -1)["member_epoch"] == -1
    assert mgr.groups[G].is_empty()


def test_static_member_takes_over_and_unreleased_instance() -> None:
    mgr = make()
    r = hb(mgr, "a", 0, set(), instance="i")
    assert hb(mgr, "a2", 0, set(), instance="i")["error_code"] == ErrorCode.unreleased_instance_id
    hb(mgr, "a", -2, instance="i")
    r2 = hb(mgr, "a2", 0, set(), instance="i")
    assert r2["error_code"] == ErrorCode.none and parts(r2) == parts(r)


def test_assignors_balance() -> None:
    topics = {"t": (TID, 7)}
    members = {m: ConsumerMember(m, subscribed_names=["t"]) for m in ("a", "b", "c")}
    for fn in (uniform_assign, range_assign):
        out = fn(members, topics, {})
        sizes = sorted(len(a.get(TID, set())) for a in out.values())
        assert sizes == [2, 2, 3]
        assert set().union(*(a.get(TID, set()) for a in out.values())) == set(range(7))
    # Uniform is sticky.
    before = uniform_assign(members, topics, {})
    members["d"] = ConsumerMember("d", subscribed_names=["t"])
    after = uniform_assign(members, topics, before)
    moved = sum(len(before[m][TID] - after[m].get(TID, set())) for m in before)
    assert moved <= 2
