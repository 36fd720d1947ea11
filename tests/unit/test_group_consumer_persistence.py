"""KIP-848 group state in __consumer_offsets: Kafka's record formats, replay on load, tombstones."""

from __future__ import annotations

import datetime
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from pykbroker.coordinator.group import consumer_records as cr
from pykbroker.coordinator.group.consumer import ConsumerGroups
from pykbroker.coordinator.group.consumer_group import ConsumerGroup
from pykbroker.coordinator.group.coordinator_state import GroupConfig
from pykbroker.coordinator.group.manager import CommitEntry, GroupManager

TID = uuid.UUID("12345678-1234-5678-1234-567812345678")
G = "cg"


class Env:
    """A manager whose writes go to an in-memory log that a new manager can replay."""

    def __init__(self, log: list[tuple[bytes, bytes | None]] | None = None, partitions: int = 6) -> None:
        self.now = [1_000_000]
        self.log: list[tuple[bytes, bytes | None]] = log if log is not None else []
        self.fail = False
        self.mgr = GroupManager(GroupConfig(num_partitions=1, consumer_session_timeout_ms=1000), self.write,
                                lambda: self.now[0])
        cg = ConsumerGroups(self.mgr)
        cg.topic_ids = lambda t: TID if t == "t" else None
        cg.topic_names = lambda: ["t"]
        self.mgr.topic_partitions = lambda t: partitions if t == "t" else None
        self.mgr.consumer = cg
        self.mgr.begin_loading(0)
        self.mgr.load_records(0, list(self.log))
        self.mgr.finish_loading(0)

    def write(self, partition: int, records: list[tuple[bytes, bytes | None]]) -> None:
        if self.fail:
            raise RuntimeError("disk full")
        self.log.extend(records)

    def restart(self) -> Env:
        return Env(self.log)

    def hb(self, member_id: str, epoch: int, owned: set[int] | None = None, **kw: Any) -> dict[str, Any]:
        req = SimpleNamespace(
            group_id=G, member_id=member_id, member_epoch=epoch, instance_id=kw.get("instance"), rack_id=None,
            rebalance_timeout=datetime.timedelta(milliseconds=5000),
            subscribed_topic_names=["t"] if epoch == 0 else None, subscribed_topic_regex=None,
            server_assignor=kw.get("assignor"),
            topic_partitions=None if owned is None else [SimpleNamespace(topic_id=TID, partitions=sorted(owned))])
        resp: dict[str, Any] = self.mgr.consumer.heartbeat(req, "client", "/127.0.0.1")
        return resp


def parts(resp: dict[str, Any]) -> set[int]:
    a = resp["assignment"]
    return set() if a is None else {p for tp in a["topic_partitions"] for p in tp["partitions"]}


def settle(env: Env, owned: dict[str, tuple[int, set[int]]]) -> dict[str, tuple[int, set[int]]]:
    """Heartbeat every member until epochs and assignments stop changing."""
    for _ in range(10):
        changed = False
        for mid, (epoch, have) in list(owned.items()):
            r = env.hb(mid, epoch, have)
            assert r["error_code"] == ErrorCode.none, r
            new = (r["member_epoch"], parts(r) if r["assignment"] is not None else have)
            if new != owned[mid]:
                owned[mid] = new
                changed = True
        if not changed:
            return owned
    raise AssertionError("did not settle")


def test_record_formats_match_kafka() -> None:
    # Keys: int16 type, then int16-length strings (Kafka's non-flexible coordinator keys).
    assert cr.encode_key(cr.GROUP_METADATA, "g") == b"\x00\x03\x00\x01g"
    assert cr.encode_key(cr.CURRENT_ASSIGNMENT, "g", "m") == b"\x00\x08\x00\x01g\x00\x01m"
    # ConsumerGroupMetadataValue v0: int16 version, int32 epoch, empty tagged fields.
    assert cr.encode_group_metadata(10) == b"\x00\x00\x00\x00\x00\x0a\x00"
    # TargetAssignmentMember: compact array of (uuid, compact int32 array, tags), tags.
    v = cr.encode_target_member({TID: {2, 0}})
    assert v == b"\x00\x00" + b"\x02" + TID.bytes + b"\x03\x00\x00\x00\x00\x00\x00\x00\x02\x00" + b"\x00"
    assert cr.decode_target_member(v) == {TID: {0, 2}}
    # CurrentMemberAssignment with Kafka's MemberState codes.
    ca = cr.CurrentAssignment(5, 4, "unrevoked_partitions", {TID: {1}}, {TID: {3}})
    enc = cr.encode_current_assignment(ca)
    assert enc[2:11] == b"\x00\x00\x00\x05\x00\x00\x00\x04\x01"
    assert cr.decode_current_assignment(enc) == ca
    md = cr.MemberMetadata("inst", None, "cid", "/h", ["a", "b"], None, 5000, "uniform",
                           cr.ClassicMetadata(10000, [("range", b"\x01\x02")]))
    assert cr.decode_member_metadata(cr.encode_member_metadata(md)) == md
    md.classic = None
    assert cr.decode_member_metadata(cr.encode_member_metadata(md)) == md
    pm = cr.encode_partition_metadata(3, [(TID, "t", 6)])
    assert cr.decode_partition_metadata(pm) == (3, [(TID, "t", 6)])
    # Unknown tagged fields written by newer Kafka versions are skipped.
    newer = b"\x00\x00\x00\x00\x00\x07" + b"\x01\x00\x08" + b"\x00" * 8
    assert cr.decode_group_metadata(newer) == 7
    assert cr.decode_consumer_key(cr.encode_key(cr.TARGET_MEMBER, "grp", "mem")) == cr.ConsumerKey(7, "grp", "mem")
    assert cr.decode_consumer_key(b"\x00\x01\x00\x01g") is None


def test_state_survives_restart_and_members_continue() -> None:
    env = Env()
    a = env.hb("a", 0, set())
    b = env.hb("b", 0, set())
    owned = settle(env, {"a": (a["member_epoch"], parts(a)), "b": (b["member_epoch"], parts(b))})
    assert owned["a"][1] | owned["b"][1] == set(range(6)) and not owned["a"][1] & owned["b"][1]
    assert env.mgr.commit_offsets(G, owned["a"][0], "a", None, [CommitEntry("t", 0, 42)])[("t", 0)] == \
        ErrorCode.none
    g0: ConsumerGroup = env.mgr.groups[G]
    env2 = env.restart()
    g = env2.mgr.groups[G]
    assert isinstance(g, ConsumerGroup)
    assert (g.group_epoch, g.assignment_epoch) == (g0.group_epoch, g0.assignment_epoch)
    assert {m: (x.member_epoch, x.assigned) for m, x in g.members.items()} == \
        {m: (x.member_epoch, x.assigned) for m, x in g0.members.items()}
    assert g.target == g0.target and g.topic_snapshot == {"t": 6}
    # Members heartbeat with their epochs: no fencing, same assignment, no epoch bump.
    for mid, (epoch, have) in owned.items():
        r = env2.hb(mid, epoch, have)
        assert r["error_code"] == ErrorCode.none and r["member_epoch"] == epoch
        assert parts(r) == have  # the first heartbeat after a restart repeats the assignment
    assert env2.mgr.fetch_offsets(G, [("t", 0)])[1][0][1].offset == 42  # type: ignore[union-attr]
    # Session timers were re-armed on load: silent members expire.
    env2.now[0] += 1500
    env2.mgr.tick()
    assert not env2.mgr.groups[G].members
    # ... and their removal was persisted.
    assert not env2.restart().mgr.groups[G].members


def test_revocation_in_progress_survives_restart() -> None:
    env = Env()
    a = env.hb("a", 0, set())
    assert parts(a) == set(range(6))
    env.hb("b", 0, set())
    ra = env.hb("a", a["member_epoch"], set(range(6)))  # told to revoke half
    kept = parts(ra)
    assert len(kept) == 3
    env2 = env.restart()
    m = env2.mgr.groups[G].members["a"]
    assert m.state == "unrevoked_partitions" and m.pending_revocation
    r = env2.hb("a", ra["member_epoch"], kept)  # acknowledges the revocation after the restart
    assert r["error_code"] == ErrorCode.none and r["member_epoch"] > ra["member_epoch"]


def test_leave_and_delete_write_tombstones() -> None:
    env = Env()
    a = env.hb("a", 0, set())
    env.hb("b", 0, set())
    env.hb("b", -1)
    member_keys = {k for k, _ in env.log if cr.decode_consumer_key(k) and cr.decode_consumer_key(k).member == "b"}
    assert member_keys and all(any(k == kk and v is None for kk, v in env.log) for k in member_keys)
    env.hb("a", a["member_epoch"], parts(a))
    env.hb("a", -1)
    assert env.mgr.delete_groups([G]) == {G: ErrorCode.none}
    env2 = env.restart()
    assert G not in env2.mgr.groups
    live: dict[bytes, bytes | None] = {}
    for k, v in env.log:
        live[k] = v
    assert all(v is None for v in live.values())


def test_failed_write_rolls_back_heartbeat() -> None:
    env = Env()
    a = env.hb("a", 0, set())
    env.fail = True
    r = env.hb("b", 0, set())
    assert r["error_code"] == ErrorCode.coordinator_not_available
    assert set(env.mgr.groups[G].members) == {"a"}
    env.fail = False
    assert env.hb("a", a["member_epoch"], parts(a))["error_code"] == ErrorCode.none


def test_only_changes_are_written() -> None:
    env = Env()
    a = env.hb("a", 0, set())
    n = len(env.log)
    for _ in range(5):
        env.hb("a", a["member_epoch"], parts(a))
    assert len(env.log) == n  # steady heartbeats write nothing


@pytest.mark.parametrize("static", [False, True])
def test_static_member_state_survives(static: bool) -> None:
    env = Env()
    r = env.hb("a", 0, set(), instance="i" if static else None)
    env2 = env.restart()
    g = env2.mgr.groups[G]
    assert g.members["a"].instance_id == ("i" if static else None)
    if static:
        assert g.static_members == {"i": "a"}
    assert env2.hb("a", r["member_epoch"], parts(r))["error_code"] == ErrorCode.none
