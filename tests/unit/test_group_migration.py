"""Mixed groups (Kafka 4.0): classic members in consumer groups, online upgrade and downgrade."""

from __future__ import annotations

from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from pykbroker.coordinator.group import consumer_records as cr
from pykbroker.coordinator.group.classic import ClassicGroup, GroupState
from pykbroker.coordinator.group.classic_protocol import JoinRequest
from pykbroker.coordinator.group.consumer_group import ConsumerGroup
from pykbroker.coordinator.group.manager import CommitEntry
from pykbroker.coordinator.group.serde import (
    GROUP_METADATA_KEY_TYPE,
    decode_consumer_assignment,
    encode_consumer_assignment,
    encode_consumer_subscription,
    encode_consumer_subscription_v1,
)
from tests.unit.test_group_consumer_persistence import Env, G, parts


def join_async(env: Env, member_id: str = "", owned: dict[str, list[int]] | None = None,
               instance: str | None = None, protocol: str = "range") -> list[dict[str, Any]]:
    md = encode_consumer_subscription(["t"]) if owned is None else encode_consumer_subscription_v1(["t"], owned)
    out: list[dict[str, Any]] = []
    env.mgr.join_group(JoinRequest(G, member_id, instance, "consumer", [(protocol, md)], 10000, 5000, "classic",
                                   "/127.0.0.1"), out.append)
    return out


def join(env: Env, **kw: Any) -> dict[str, Any]:
    out = join_async(env, **kw)
    assert len(out) == 1
    return out[0]


def join_new(env: Env, **kw: Any) -> dict[str, Any]:
    r = join(env, **kw)
    if r["error_code"] == ErrorCode.member_id_required:
        r = join(env, member_id=r["member_id"], **kw)
    return r


def sync(env: Env, member_id: str, generation: int, assignments: dict[str, bytes] | None = None
         ) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    env.mgr.sync_group(G, generation, member_id, None, "consumer", None, assignments or {}, out.append)
    assert len(out) == 1
    return out[0]


def synced_parts(resp: dict[str, Any]) -> set[int]:
    a = decode_consumer_assignment(resp["assignment"])
    assert a is not None
    return set(a.get("t", []))


def stable_classic_group(env: Env) -> list[tuple[str, int]]:
    """Two classic members, stable, 3 partitions each (the leader's assignment)."""
    env.mgr.config.initial_rebalance_delay_ms = 0
    a = join_new(env)  # completes alone: generation 1
    b_id = join(env)["member_id"]
    pending_b = join_async(env, member_id=b_id)  # waits for a to rejoin
    assert not pending_b
    join(env, member_id=a["member_id"])
    assert pending_b and pending_b[0]["error_code"] == ErrorCode.none
    g = env.mgr.groups[G]
    assert isinstance(g, ClassicGroup) and g.state == GroupState.COMPLETING_REBALANCE
    gen = g.generation_id
    leader = g.leader_id
    ids = list(g.members)
    asg = {ids[0]: encode_consumer_assignment({"t": [0, 1, 2]}), ids[1]: encode_consumer_assignment({"t": [3, 4, 5]})}
    pending = []
    for mid in ids:
        out: list[dict[str, Any]] = []
        env.mgr.sync_group(G, gen, mid, None, "consumer", None, asg if mid == leader else {}, out.append)
        pending.append(out)
    assert g.state == GroupState.STABLE and all(p and p[0]["error_code"] == ErrorCode.none for p in pending)
    return [(mid, gen) for mid in ids]


def test_classic_member_joins_a_consumer_group() -> None:
    env = Env()
    a = env.hb("a", 0, set())
    assert parts(a) == set(range(6))
    r = join(env)
    assert r["error_code"] == ErrorCode.member_id_required and r["member_id"]
    r = join(env, member_id=r["member_id"])
    mid = r["member_id"]
    g = env.mgr.groups[G]
    assert isinstance(g, ConsumerGroup) and g.members[mid].classic is not None
    assert r["error_code"] == ErrorCode.none and r["protocol_name"] == "range" and r["members"] == []
    # Nothing is free yet: a still owns everything.
    s = sync(env, mid, r["generation_id"])
    assert s["error_code"] == ErrorCode.none and synced_parts(s) == set()
    assert sync(env, mid, r["generation_id"] + 7)["error_code"] == ErrorCode.illegal_generation
    # a revokes its half; then b's heartbeat asks it to rejoin for the freed partitions.
    ra = env.hb("a", a["member_epoch"], set(range(6)))
    env.hb("a", ra["member_epoch"], parts(ra))
    assert env.mgr.heartbeat(G, r["generation_id"], mid, None) == ErrorCode.rebalance_in_progress
    r2 = join(env, member_id=mid)
    s2 = sync(env, mid, r2["generation_id"])
    assert synced_parts(s2) == set(range(6)) - parts(ra)
    assert env.mgr.heartbeat(G, r2["generation_id"], mid, None) == ErrorCode.none
    # Classic members commit with their generation (= member epoch).
    assert env.mgr.commit_offsets(G, r2["generation_id"], mid, None, [CommitEntry("t", 3, 5)])[("t", 3)] == \
        ErrorCode.none
    assert env.mgr.commit_offsets(G, 99, mid, None, [CommitEntry("t", 3, 5)])[("t", 3)] == \
        ErrorCode.illegal_generation
    # The classic metadata is persisted: after a restart the member carries on.
    env2 = env.restart()
    assert env2.mgr.groups[G].members[mid].classic.session_timeout_ms == 10000
    assert env2.mgr.heartbeat(G, r2["generation_id"], mid, None) == ErrorCode.none
    # LeaveGroup removes it and bumps the epoch.
    epoch = env2.mgr.groups[G].group_epoch
    assert env2.mgr.leave_group(G, [(mid, None)]) == (ErrorCode.none, [ErrorCode.none])
    assert mid not in env2.mgr.groups[G].members and env2.mgr.groups[G].group_epoch == epoch + 1


def test_classic_member_session_and_sync_timeouts() -> None:
    env = Env()
    a = env.hb("a", 0, set())
    r = join_new(env)
    mid = r["member_id"]
    for _ in range(6):  # the rebalance timeout (5 s) passes without a SyncGroup; a keeps heartbeating
        env.now[0] += 900
        a = env.hb("a", a["member_epoch"], parts(a) if a["assignment"] else None)
        env.mgr.tick()
    g = env.mgr.groups[G]
    assert isinstance(g, ConsumerGroup) and mid not in g.members
    # A classic member that syncs but then stops heartbeating expires after its own session timeout (10 s).
    r = join_new(env)
    sync(env, r["member_id"], r["generation_id"])
    for _ in range(8):
        env.now[0] += 900
        a = env.hb("a", a["member_epoch"], parts(a) if a["assignment"] else None)
        env.mgr.tick()
    assert r["member_id"] in g.members
    for _ in range(4):
        env.now[0] += 900
        a = env.hb("a", a["member_epoch"], parts(a) if a["assignment"] else None)
        env.mgr.tick()
    assert r["member_id"] not in g.members


def test_consumer_member_expiry_downgrades_to_classic() -> None:
    env = Env()
    env.hb("a", 0, set())
    r = join_new(env)
    env.now[0] += 1001  # a's session (1 s) expires; only the classic member remains
    env.mgr.tick()
    g = env.mgr.groups[G]
    assert isinstance(g, ClassicGroup) and set(g.members) == {r["member_id"]}
    assert isinstance(env.restart().mgr.groups[G], ClassicGroup)


def test_online_upgrade_when_a_consumer_member_joins() -> None:
    env = Env()
    members = stable_classic_group(env)
    gen = members[0][1]
    n = len(env.log)
    r = env.hb("c", 0, set())
    assert r["error_code"] == ErrorCode.none
    g = env.mgr.groups[G]
    assert isinstance(g, ConsumerGroup)
    assert g.group_epoch == gen + 1 and all(g.members[m].classic is not None for m, _ in members)
    # The classic group's record was tombstoned along with the conversion.
    new = env.log[n:]
    assert any(k[:2] == GROUP_METADATA_KEY_TYPE.to_bytes(2, "big") and v is None for k, v in new)
    # The classic members kept their partitions at epoch = generation; they are asked to rejoin.
    assert {p for m, _ in members for p in g.members[m].assigned.get(next(iter(g.target[m])), set())} == \
        set(range(6))
    for mid, _ in members:
        assert env.mgr.heartbeat(G, gen, mid, None) == ErrorCode.rebalance_in_progress
    # Eager members rejoin owning nothing and get their share right away.
    got = {}
    for mid, _ in members:
        rj = join(env, member_id=mid)
        assert rj["error_code"] == ErrorCode.none
        got[mid] = synced_parts(sync(env, mid, rj["generation_id"]))
    # c gets what nobody holds any more.
    rc = env.hb("c", r["member_epoch"], set())
    all_parts = set().union(*got.values()) | parts(rc)
    assert all_parts == set(range(6)) and len(parts(rc)) == 2
    # The conversion survives a restart.
    g2 = env.restart().mgr.groups[G]
    assert isinstance(g2, ConsumerGroup) and set(g2.members) == {m for m, _ in members} | {"c"}


def test_upgrade_refused_by_policy() -> None:
    env = Env()
    env.mgr.config.consumer_migration_policy = "downgrade"
    stable_classic_group(env)
    r = env.hb("c", 0, set())
    assert r["error_code"] == ErrorCode.group_id_not_found
    assert isinstance(env.mgr.groups[G], ClassicGroup)


@pytest.mark.parametrize("policy", ["bidirectional", "upgrade"])
def test_downgrade_when_the_last_consumer_member_leaves(policy: str) -> None:
    env = Env()
    env.mgr.config.consumer_migration_policy = policy
    members = stable_classic_group(env)
    r = env.hb("c", 0, set())
    for mid, _ in members:
        rj = join(env, member_id=mid)
        sync(env, mid, rj["generation_id"])
    env.hb("c", r["member_epoch"], set())
    n = len(env.log)
    epoch = env.mgr.groups[G].group_epoch
    assert env.hb("c", -1)["error_code"] == ErrorCode.none
    g = env.mgr.groups[G]
    if policy == "upgrade":
        assert isinstance(g, ConsumerGroup)
        return
    assert isinstance(g, ClassicGroup) and g.state == GroupState.PREPARING_REBALANCE
    assert set(g.members) == {m for m, _ in members} and g.protocol_type == "consumer"
    # Consumer records tombstoned, a GroupMetadata record written.
    new = env.log[n:]
    assert any(cr.decode_consumer_key(k) is not None and v is None for k, v in new)
    assert any(k[:2] == b"\x00\x02" and v is not None for k, v in new)
    # The members rejoin through the classic protocol and the group stabilizes.
    outs = [join_async(env, member_id=mid) for mid, _ in members]
    assert g.state == GroupState.COMPLETING_REBALANCE
    assert all(o and o[0]["error_code"] == ErrorCode.none for o in outs)
    assert g.generation_id == epoch + 2  # the leave bumps the epoch; the classic rebalance the generation
    assert isinstance(env.restart().mgr.groups[G], ClassicGroup)


def test_offset_fetch_require_stable_reports_pending_transactional_commits() -> None:
    from pykbroker.coordinator.group.handlers import _fetch_group
    from pykbroker.coordinator.group.manager import CommitEntry as CE
    env = Env()
    env.mgr.commit_offsets(G, -1, "", None, [CE("t", 0, 5), CE("t", 1, 6)])
    env.mgr.pending_txn_offsets = lambda gid: [("t", 0)] if gid == G else []
    topics = [type("T", (), {"name": "t", "partition_indexes": [0, 1]})()]
    code, out = _fetch_group(env.mgr, G, topics, None, -1, 8, require_stable=True)
    rows = {p["partition_index"]: p for p in out[0]["partitions"]}
    assert code == ErrorCode.none
    assert rows[0]["error_code"] == ErrorCode.unstable_offset_commit and rows[0]["committed_offset"] == -1
    assert rows[1]["error_code"] == ErrorCode.none and rows[1]["committed_offset"] == 6
    # Without require_stable the last committed offset is returned.
    _code, out = _fetch_group(env.mgr, G, topics, None, -1, 8, require_stable=False)
    assert {p["partition_index"]: p["committed_offset"] for p in out[0]["partitions"]} == {0: 5, 1: 6}
