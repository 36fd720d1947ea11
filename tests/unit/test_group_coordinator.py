"""The sans-I/O group coordinator core: state machine, error codes, persistence, expiry."""

from __future__ import annotations

from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from pykbroker.coordinator.group.classic import GroupState
from pykbroker.coordinator.group.classic_protocol import JoinRequest
from pykbroker.coordinator.group.coordinator_state import GroupConfig
from pykbroker.coordinator.group.manager import CommitEntry, GroupManager
from pykbroker.coordinator.group.serde import (
    GroupValue,
    MemberRecord,
    OffsetValue,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_consumer_subscription,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
    subscribed_topics,
)
from pykbroker.coordinator.internal_topic import java_string_hash, partition_for

G = "group-a"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


class Harness:
    def __init__(self, **cfg: Any) -> None:
        self.clock = Clock()
        self.log: dict[int, list[tuple[bytes, bytes | None]]] = {}
        cfg.setdefault("initial_rebalance_delay_ms", 0)
        config = GroupConfig(num_partitions=4, min_session_timeout_ms=100, **cfg)
        self.mgr = GroupManager(config, self.write, self.clock)
        for p in range(4):
            self.mgr.begin_loading(p)
            self.mgr.finish_loading(p)

    def write(self, partition: int, records: list[tuple[bytes, bytes | None]]) -> None:
        self.log.setdefault(partition, []).extend(records)

    def advance(self, ms: int) -> None:
        self.clock.now += ms
        self.mgr.tick()

    def join(self, member_id: str = "", instance: str | None = None, protocols: list[tuple[str, bytes]] | None = None,
             group: str = G, session: int = 1000, rebalance: int = 2000, require_known: bool = True
             ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        self.mgr.join_group(JoinRequest(group, member_id, instance, "consumer",
                                        protocols or [("range", encode_consumer_subscription(["t"]))],
                                        session, rebalance, "client", "/127.0.0.1", require_known), out.append)
        return out

    def join_new(self, **kw: Any) -> list[dict[str, Any]]:
        first = self.join(**kw)
        if kw.get("instance") is None and kw.get("require_known", True):
            assert first[0]["error_code"] == ErrorCode.member_id_required
            kw = {**kw, "member_id": first[0]["member_id"]}
            return self.join(**kw)
        return first

    def sync(self, member_id: str, generation: int, assignments: dict[str, bytes] | None = None,
             instance: str | None = None, group: str = G) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        self.mgr.sync_group(group, generation, member_id, instance, None, None, assignments or {}, out.append)
        return out

    def stable_group(self, n: int) -> list[str]:
        """n members in a Stable group; returns member ids (leader first)."""
        pending = [self.join_new() for _ in range(n)]
        # With no initial delay the first join completes alone; later ones rebalance: rejoin everyone.
        ids = [p[0]["member_id"] if p else None for p in pending]
        g = self.mgr.groups[G]
        ids = list(g.members)
        if g.state != GroupState.COMPLETING_REBALANCE:
            for mid in ids:
                m = g.members[mid]
                if m.join_cb is None:
                    self.join(member_id=mid)
        assert g.state == GroupState.COMPLETING_REBALANCE, g.state
        gen = g.generation_id
        leader = g.leader_id
        assert leader is not None
        outs = {mid: self.sync(mid, gen, {m: m.encode() for m in ids} if mid == leader else None)
                for mid in ids}
        assert g.state == GroupState.STABLE
        for mid, o in outs.items():
            assert o and o[0]["error_code"] == ErrorCode.none and o[0]["assignment"] == mid.encode()
        return [leader] + [m for m in ids if m != leader]


def test_partition_for_matches_java_hash() -> None:
    assert java_string_hash("abc") == 96354
    assert java_string_hash("") == 0
    # A hash that overflows int32 and goes negative.
    assert java_string_hash("polygenelubricants") == -2147483648
    assert partition_for("polygenelubricants", 50) == 0
    assert partition_for("abc", 50) == 96354 % 50


def test_serde_roundtrip() -> None:
    v = OffsetValue(42, 3, "meta", 1234)
    assert decode_offset_value(encode_offset_value(v)) == v
    v1 = OffsetValue(42, -1, "", 1234, 9999)
    assert decode_offset_value(encode_offset_value(v1)) == v1
    gv = GroupValue("consumer", 7, "range", "m1", 555, [MemberRecord("m1", "i1", "c", "/h", 10, 20, b"s", b"a")])
    assert decode_group_value(encode_group_value(gv)) == gv
    k = decode_key(encode_offset_key("g", "t", 3))
    assert (k.group, k.topic, k.partition) == ("g", "t", 3)  # type: ignore[union-attr]
    assert decode_key(encode_group_key("g")).group == "g"  # type: ignore[union-attr]
    assert encode_offset_key("g", "t", 3)[:2] == b"\x00\x01"
    assert encode_group_key("g")[:2] == b"\x00\x02"
    assert subscribed_topics(encode_consumer_subscription(["a", "b"])) == {"a", "b"}


def test_member_id_required_round_trip_and_single_member_stable() -> None:
    h = Harness()
    first = h.join()
    assert first[0]["error_code"] == ErrorCode.member_id_required
    mid = first[0]["member_id"]
    assert mid.startswith("client-")
    second = h.join(member_id=mid)
    assert second[0]["error_code"] == ErrorCode.none
    assert second[0]["generation_id"] == 1
    assert second[0]["leader"] == mid
    assert [m["member_id"] for m in second[0]["members"]] == [mid]
    out = h.sync(mid, 1, {mid: b"A"})
    assert out[0]["error_code"] == ErrorCode.none and out[0]["assignment"] == b"A"
    assert h.mgr.groups[G].state == GroupState.STABLE
    # The assignment was persisted as a GroupMetadata record.
    p = h.mgr.partition_for(G)
    assert any(decode_key(k) is not None and v is not None for k, v in h.log[p])


def test_unknown_member_and_group_errors() -> None:
    h = Harness()
    assert h.join(member_id="nope")[0]["error_code"] == ErrorCode.unknown_member_id
    assert h.mgr.heartbeat(G, 1, "nope", None) == ErrorCode.unknown_member_id
    out = h.sync("nope", 1)
    assert out[0]["error_code"] == ErrorCode.unknown_member_id
    assert h.join(session=10)[0]["error_code"] == ErrorCode.invalid_session_timeout
    assert h.join(group="")[0]["error_code"] == ErrorCode.invalid_group_id


def test_not_coordinator_and_loading() -> None:
    h = Harness()
    p = h.mgr.partition_for(G)
    h.mgr.begin_loading(p)
    assert h.join()[0]["error_code"] == ErrorCode.coordinator_load_in_progress
    assert h.mgr.fetch_offsets(G, None)[0] == ErrorCode.coordinator_load_in_progress
    h.mgr.unload(p)
    assert h.join()[0]["error_code"] == ErrorCode.not_coordinator
    res = h.mgr.commit_offsets(G, -1, "", None, [CommitEntry("t", 0, 5)])
    assert res == {("t", 0): ErrorCode.not_coordinator}


def test_two_members_rebalance_and_error_codes() -> None:
    h = Harness()
    a, b = h.stable_group(2)
    g = h.mgr.groups[G]
    gen = g.generation_id
    assert h.mgr.heartbeat(G, gen, a, None) == ErrorCode.none
    assert h.mgr.heartbeat(G, gen - 1, a, None) == ErrorCode.illegal_generation
    # A third member triggers a rebalance; the others learn it from their heartbeats.
    c_join = h.join_new()
    assert c_join == []  # waits for the others
    assert g.state == GroupState.PREPARING_REBALANCE
    assert h.mgr.heartbeat(G, gen, b, None) == ErrorCode.rebalance_in_progress
    res = h.mgr.commit_offsets(G, gen, b, None, [CommitEntry("t", 0, 1)])
    assert res[("t", 0)] == ErrorCode.none  # commits of the current generation are allowed while preparing
    ja = h.join(member_id=a)
    jb = h.join(member_id=b)
    assert ja and jb and c_join
    assert ja[0]["generation_id"] == gen + 1
    assert len(ja[0]["members"]) == 3 and jb[0]["members"] == []
    assert g.state == GroupState.COMPLETING_REBALANCE
    # Commits and heartbeats while completing the rebalance.
    res = h.mgr.commit_offsets(G, gen + 1, b, None, [CommitEntry("t", 0, 1)])
    assert res[("t", 0)] == ErrorCode.rebalance_in_progress
    assert h.mgr.heartbeat(G, gen + 1, b, None) == ErrorCode.none
    # Followers wait for the leader's SyncGroup.
    sb = h.sync(b, gen + 1)
    assert sb == []
    sa = h.sync(a, gen + 1, {a: b"1", b: b"2"})
    assert sa[0]["assignment"] == b"1" and sb[0]["assignment"] == b"2"
    c_id = c_join[0]["member_id"]
    sc = h.sync(c_id, gen + 1)
    assert sc[0]["error_code"] == ErrorCode.none and sc[0]["assignment"] == b""
    res = h.mgr.commit_offsets(G, gen, b, None, [CommitEntry("t", 0, 1)])
    assert res[("t", 0)] == ErrorCode.illegal_generation
    res = h.mgr.commit_offsets(G, gen + 1, "stranger", None, [CommitEntry("t", 0, 1)])
    assert res[("t", 0)] == ErrorCode.unknown_member_id


def test_offset_commit_checks_member_and_generation_before_state() -> None:
    """Kafka's ClassicGroup.validateOffsetCommit order: a commit from the previous generation while the group
    completes a rebalance is ILLEGAL_GENERATION (the member must rejoin), an unknown member is
    UNKNOWN_MEMBER_ID; only a commit of the current generation gets REBALANCE_IN_PROGRESS."""
    h = Harness()
    (a,) = h.stable_group(1)
    g = h.mgr.groups[G]
    gen = g.generation_id
    assert h.mgr.commit_offsets(G, gen, a, None, [CommitEntry("t", 0, 1)]) == {("t", 0): ErrorCode.none}
    # The leader rejoins (e.g. after a metadata change): the join completes at once, awaiting its SyncGroup.
    assert h.join(member_id=a)[0]["generation_id"] == gen + 1
    assert g.state == GroupState.COMPLETING_REBALANCE
    entry = [CommitEntry("t", 0, 2)]
    assert h.mgr.commit_offsets(G, gen, a, None, entry) == {("t", 0): ErrorCode.illegal_generation}
    assert h.mgr.commit_offsets(G, gen + 1, "stranger", None, entry) == {("t", 0): ErrorCode.unknown_member_id}
    assert h.mgr.commit_offsets(G, gen + 1, a, "no-such-instance", entry) == \
        {("t", 0): ErrorCode.unknown_member_id}
    assert h.mgr.commit_offsets(G, -1, "", None, entry) == {("t", 0): ErrorCode.unknown_member_id}
    assert h.mgr.commit_offsets(G, gen + 1, a, None, entry) == {("t", 0): ErrorCode.rebalance_in_progress}
    assert h.mgr.fetch_offsets(G, [("t", 0)])[1][0][1].offset == 1  # nothing was written meanwhile
    assert h.sync(a, gen + 1, {a: b"x"})[0]["error_code"] == ErrorCode.none
    assert h.mgr.commit_offsets(G, gen + 1, a, None, entry) == {("t", 0): ErrorCode.none}


def test_session_timeout_removes_member_and_rebalances() -> None:
    h = Harness()
    a, b = h.stable_group(2)
    g = h.mgr.groups[G]
    gen = g.generation_id
    for _ in range(5):
        h.advance(400)
        assert h.mgr.heartbeat(G, gen, a, None) in (ErrorCode.none, ErrorCode.rebalance_in_progress)
    # b stopped heartbeating: it is gone and a must rejoin.
    assert b not in g.members
    assert g.state == GroupState.PREPARING_REBALANCE
    ja = h.join(member_id=a)
    assert ja[0]["generation_id"] == gen + 1 and len(ja[0]["members"]) == 1


def test_wall_clock_steps_move_no_session_timer() -> None:
    """Timers run on the timer clock (monotonic in the broker): a wall-clock step forward past every session
    timeout expires nobody, and a step back does not postpone the expiry of a member that went silent."""
    h = Harness()
    steady = Clock()
    h.mgr.timer_clock = steady
    a, b = h.stable_group(2)
    g = h.mgr.groups[G]
    gen = g.generation_id
    h.clock.now += 600_000
    h.mgr.tick()
    assert sorted(g.members) == sorted([a, b]) and g.state == GroupState.STABLE
    h.clock.now -= 1_200_000
    for _ in range(5):
        steady.now += 400
        h.mgr.tick()
        assert h.mgr.heartbeat(G, gen, a, None) in (ErrorCode.none, ErrorCode.rebalance_in_progress)
    assert b not in g.members and g.state == GroupState.PREPARING_REBALANCE


def test_rebalance_timeout_drops_members_that_do_not_rejoin() -> None:
    h = Harness()
    a, b = h.stable_group(2)
    g = h.mgr.groups[G]
    ja = h.join(member_id=a, protocols=[("range", b"changed")])
    assert ja == [] and g.state == GroupState.PREPARING_REBALANCE
    # b keeps heartbeating but never rejoins; the rebalance timeout (2000 ms) ends the join phase.
    for _ in range(5):
        h.advance(450)
        h.mgr.heartbeat(G, g.generation_id, b, None)
    assert ja and ja[0]["error_code"] == ErrorCode.none
    assert list(g.members) == [a]


def test_leave_group_batched_and_static() -> None:
    h = Harness()
    a, b = h.stable_group(2)
    top, errs = h.mgr.leave_group(G, [(b, None), ("ghost", None), ("", "no-such-instance")])
    assert top == ErrorCode.none
    assert errs == [ErrorCode.none, ErrorCode.unknown_member_id, ErrorCode.unknown_member_id]
    assert h.mgr.groups[G].state == GroupState.PREPARING_REBALANCE
    top, errs = h.mgr.leave_group("missing-group", [(a, None)])
    assert errs == [ErrorCode.unknown_member_id]


def test_static_member_rejoins_without_rebalance_and_fences_old_id() -> None:
    h = Harness()
    j = h.join(instance="i1")
    assert j[0]["error_code"] == ErrorCode.none
    old = j[0]["member_id"]
    g = h.mgr.groups[G]
    h.sync(old, 1, {old: b"A"})
    assert g.state == GroupState.STABLE
    # The instance restarts: same instance id, no member id.
    j2 = h.join(instance="i1")
    assert j2[0]["error_code"] == ErrorCode.none
    new = j2[0]["member_id"]
    assert new != old
    assert j2[0]["generation_id"] == 1 and g.state == GroupState.STABLE  # no rebalance
    assert h.sync(new, 1, instance="i1")[0]["assignment"] == b"A"
    # The old incarnation is fenced.
    assert h.mgr.heartbeat(G, 1, old, "i1") == ErrorCode.fenced_instance_id
    res = h.mgr.commit_offsets(G, 1, old, "i1", [CommitEntry("t", 0, 9)])
    assert res[("t", 0)] == ErrorCode.fenced_instance_id
    assert h.join(member_id=old, instance="i1")[0]["error_code"] == ErrorCode.fenced_instance_id
    _top, errs = h.mgr.leave_group(G, [(old, "i1")])
    assert errs == [ErrorCode.fenced_instance_id]


def test_static_member_survives_session_timeout_only_if_it_returns() -> None:
    h = Harness()
    j = h.join(instance="i1")
    mid = j[0]["member_id"]
    h.sync(mid, 1, {mid: b"A"})
    h.advance(1100)  # session timeout 1000 ms
    g = h.mgr.groups[G]
    assert mid not in g.members


def test_inconsistent_protocol() -> None:
    h = Harness()
    h.stable_group(1)
    out = h.join(protocols=[("roundrobin", b"")])
    assert out[0]["error_code"] == ErrorCode.inconsistent_group_protocol


def test_protocol_selection_prefers_common_choice() -> None:
    h = Harness(initial_rebalance_delay_ms=100)
    j1 = h.join(protocols=[("range", b""), ("roundrobin", b"")], require_known=False)
    j2 = h.join(protocols=[("roundrobin", b""), ("range", b"")], require_known=False)
    j3 = h.join(protocols=[("roundrobin", b"")], require_known=False)
    assert j1 == j2 == j3 == []
    h.advance(150)  # the delay is extended once because members joined during it
    assert j1 == []
    h.advance(150)
    assert j1[0]["protocol_name"] == "roundrobin"


def test_initial_rebalance_delay_collects_members() -> None:
    h = Harness(initial_rebalance_delay_ms=300)
    j1 = h.join(require_known=False)
    h.advance(200)
    j2 = h.join(require_known=False)
    h.advance(200)
    assert j1 == [] and j2 == []  # a new member extended the delay
    h.advance(400)
    assert j1 and j2 and j1[0]["generation_id"] == 1
    assert len([x for x in (j1[0], j2[0]) if x["members"]]) == 1


def test_group_max_size() -> None:
    h = Harness(max_size=1)
    h.stable_group(1)
    assert h.join(require_known=False)[0]["error_code"] == ErrorCode.group_max_size_reached


def test_simple_commits_fetch_and_persistence_reload() -> None:
    h = Harness()
    assert h.mgr.commit_offsets(G, 5, "m", None, [CommitEntry("t", 0, 5)]) == {("t", 0): ErrorCode.illegal_generation}
    res = h.mgr.commit_offsets(G, -1, "", None, [CommitEntry("t", 0, 5, 2, "md"), CommitEntry("t", 1, 7)])
    assert set(res.values()) == {ErrorCode.none}
    big = "x" * 5000
    assert h.mgr.commit_offsets(G, -1, "", None, [CommitEntry("t", 2, 1, -1, big)])[("t", 2)] == \
        ErrorCode.offset_metadata_too_large
    code, rows = h.mgr.fetch_offsets(G, [("t", 0), ("t", 9)])
    assert code == ErrorCode.none
    assert rows[0][1] is not None and rows[0][1].offset == 5 and rows[0][1].metadata == "md"
    assert rows[1][1] is None
    assert h.mgr.fetch_offsets("other", None) == (ErrorCode.none, [])
    # A consumer group with members, then a restart: replay the log into a fresh manager.
    h.stable_group(2)
    h.mgr.commit_offsets(G, -1, "", None, [CommitEntry("t", 0, 6)])  # rejected: the group is not empty
    h2 = Harness()
    for p in range(4):
        h2.mgr.begin_loading(p)
        h2.mgr.load_records(p, h.log.get(p, []))
        h2.mgr.finish_loading(p)
    g2 = h2.mgr.groups[G]
    g1 = h.mgr.groups[G]
    assert g2.state == GroupState.STABLE and g2.generation_id == g1.generation_id
    assert set(g2.members) == set(g1.members) and g2.leader_id == g1.leader_id
    assert {m: x.assignment for m, x in g2.members.items()} == {m: x.assignment for m, x in g1.members.items()}
    assert h2.mgr.fetch_offsets(G, [("t", 0)])[1][0][1].offset == 5  # type: ignore[union-attr]
    # Members that do not heartbeat after the restart expire.
    h2.advance(1100)
    assert g2.state == GroupState.EMPTY and not g2.members


def test_delete_groups_and_offsets() -> None:
    h = Harness()
    a, _b = h.stable_group(2)
    h.mgr.commit_offsets(G, h.mgr.groups[G].generation_id, a, None, [CommitEntry("t", 0, 3), CommitEntry("u", 0, 4)])
    assert h.mgr.delete_groups([G, "nope"]) == {G: ErrorCode.non_empty_group, "nope": ErrorCode.group_id_not_found}
    code, res = h.mgr.delete_offsets(G, [("t", 0), ("u", 0)])
    assert code == ErrorCode.none
    assert res == {("t", 0): ErrorCode.group_subscribed_to_topic, ("u", 0): ErrorCode.none}
    assert h.mgr.fetch_offsets(G, [("u", 0)])[1][0][1] is None
    for mid in list(h.mgr.groups[G].members):
        h.mgr.leave_group(G, [(mid, None)])
    assert h.mgr.groups[G].state == GroupState.EMPTY
    assert h.mgr.delete_groups([G]) == {G: ErrorCode.none}
    assert G not in h.mgr.groups
    assert h.mgr.delete_offsets(G, [("t", 0)])[0] == ErrorCode.group_id_not_found
    # Deletion left tombstones for the offsets and the group.
    p = h.mgr.partition_for(G)
    tail = h.log[p][-2:]
    assert all(v is None for _k, v in tail)


def test_list_and_describe() -> None:
    h = Harness()
    h.stable_group(2)
    h.mgr.commit_offsets("simple", -1, "", None, [CommitEntry("t", 0, 1)])
    listed = {g["group_id"]: g for g in h.mgr.list_groups()}
    assert listed[G]["group_state"] == "Stable" and listed[G]["protocol_type"] == "consumer"
    assert listed["simple"]["group_state"] == "Empty" and listed["simple"]["protocol_type"] == ""
    assert [g["group_id"] for g in h.mgr.list_groups({"empty"})] == ["simple"]
    d = h.mgr.describe_group(G)
    assert d["group_state"] == "Stable" and d["protocol_data"] == "range" and len(d["members"]) == 2
    assert d["members"][0]["member_assignment"]
    assert h.mgr.describe_group("zzz")["error_code"] == ErrorCode.group_id_not_found


def test_offset_expiration() -> None:
    h = Harness(offsets_retention_ms=10_000)
    h.mgr.commit_offsets("simple", -1, "", None, [CommitEntry("t", 0, 1)])
    h.advance(5000)
    h.mgr.commit_offsets("simple", -1, "", None, [CommitEntry("t", 1, 1)])
    h.advance(6000)
    assert h.mgr.expire_offsets() == 1
    assert [tp for tp, _ in h.mgr.fetch_offsets("simple", None)[1]] == [("t", 1)]
    h.advance(5000)
    assert h.mgr.expire_offsets() == 1
    assert "simple" not in h.mgr.groups


@pytest.mark.parametrize("n", [3])
def test_pending_sync_timeout_removes_silent_members(n: int) -> None:
    h = Harness()
    ids = h.stable_group(n)
    g = h.mgr.groups[G]
    # Force a rebalance; everyone rejoins but only the leader syncs.
    for mid in ids:
        h.join(member_id=mid, protocols=[("range", b"v2")])
    assert g.state == GroupState.COMPLETING_REBALANCE
    h.sync(ids[0], g.generation_id, {})
    assert g.state == GroupState.STABLE
    for _ in range(6):
        h.advance(400)
        h.mgr.heartbeat(G, g.generation_id, ids[0], None)
    assert set(g.members) == {ids[0]}


def test_a_commit_is_visible_only_once_completed() -> None:
    """Kafka keeps an offset commit pending until its append is durable: OffsetFetch does not see it before."""
    h = Harness()
    res, written = h.mgr.prepare_commit(G, -1, "", None, [CommitEntry("t", 0, 5)])
    assert res == {("t", 0): ErrorCode.none}
    assert len(h.log[h.mgr.partition_for(G)]) == 1, "the record is appended at once"
    assert h.mgr.fetch_offsets(G, None)[1] == [], "not visible before the append completes"
    h.mgr.complete_commit(G, written)
    assert [(t, p, v.offset) for t, p, v in _offsets(h)] == [("t", 0, 5)]
    # A failed append (not replicated) completes with nothing: the old value stays.
    _, written = h.mgr.prepare_commit(G, -1, "", None, [CommitEntry("t", 0, 9)])
    h.mgr.complete_commit(G, {})
    assert [v.offset for _, _, v in _offsets(h)] == [5]


def _offsets(h: Harness) -> list[tuple[str, int, OffsetValue]]:
    return [(t, p, v) for (t, p), v in sorted(h.mgr.offsets.get(G, {}).items())]
