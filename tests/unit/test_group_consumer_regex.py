"""KIP-848 regex subscriptions in the sans-I/O coordinator, as Kafka 4 handles them.

A heartbeat that brings a regex the group has not resolved is answered from the member's literal
topic names; the regex is resolved by a timer of the coordinator (fired by the I/O edge's next
tick), which bumps the group epoch, and a later heartbeat gets the regex's partitions.  Refreshes
are batched per group (at most one every 10 s), redone when topics were created and after the
refresh interval.  A member may change its subscription many times in a row and still converge.
"""

from __future__ import annotations

import datetime
import uuid
from types import SimpleNamespace
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.coordinator.group.consumer import REGEX_BATCH_REFRESH_MIN_INTERVAL_MS, ConsumerGroups
from pykbroker.coordinator.group.consumer_group import ConsumerGroup
from pykbroker.coordinator.group.coordinator_state import GroupConfig
from pykbroker.coordinator.group.manager import GroupManager

G = "rg"
INITIAL = {"lit": 2, "lit2": 3, "ra-1": 3, "ra-2": 1, "rb-1": 2}


class Cluster:
    """The topics the coordinator sees, and a clock; topics can be created and deleted."""

    def __init__(self, previous: Cluster | None = None) -> None:
        self.now: int = previous.now if previous is not None else 1_000_000
        self.parts: dict[str, int] = {}
        self.ids: dict[str, uuid.UUID] = {}
        self.names: dict[uuid.UUID, str] = {}
        self.log: list[tuple[bytes, bytes | None]] = list(previous.log) if previous is not None else []
        self.mgr = GroupManager(GroupConfig(num_partitions=1, consumer_session_timeout_ms=60_000),
                                lambda _p, recs: self.log.extend(recs), lambda: self.now)
        cg = ConsumerGroups(self.mgr)
        cg.topic_ids = self.ids.get
        cg.topic_names = lambda: sorted(self.parts)
        self.mgr.topic_partitions = self.parts.get
        self.mgr.consumer = cg
        self.cg = cg
        for t, n in (previous.parts if previous is not None else INITIAL).items():
            self.create(t, n)
        self.mgr.begin_loading(0)
        self.mgr.load_records(0, list(self.log))
        self.mgr.finish_loading(0)

    def restart(self) -> Cluster:
        """A new coordinator that loads what this one wrote to __consumer_offsets."""
        return Cluster(self)

    def create(self, name: str, partitions: int) -> None:
        tid = uuid.uuid5(uuid.NAMESPACE_OID, name)
        self.parts[name], self.ids[name], self.names[tid] = partitions, tid, name
        self.cg.on_topic_change(name, SimpleNamespace(name=name))  # type: ignore[arg-type]

    def delete(self, name: str) -> None:
        del self.parts[name]
        self.names.pop(self.ids.pop(name))
        self.cg.on_topic_change(name, None)

    @property
    def group(self) -> ConsumerGroup:
        g = self.mgr.groups[G]
        assert isinstance(g, ConsumerGroup)
        return g

    def tick(self, ms: int = 0) -> None:
        """The I/O edge's timer loop: time passes and due timers fire."""
        self.now += ms
        self.mgr.tick()

    def refresh_pending(self) -> bool:
        return self.mgr.timers.is_scheduled(("cregex", G))


class Member:
    """A KIP-848 client: sends its subscription when it changes, acknowledges what it is given."""

    def __init__(self, c: Cluster, member_id: str) -> None:
        self.c, self.member_id, self.epoch = c, member_id, 0
        self.owned: dict[uuid.UUID, set[int]] = {}
        self.pending_sub: tuple[list[str], str] | None = None

    def subscribe(self, names: list[str], regex: str = "") -> None:
        self.pending_sub = (names, regex)

    def heartbeat(self) -> dict[str, Any]:
        names, regex = self.pending_sub if self.pending_sub is not None else (None, None)
        req = SimpleNamespace(
            group_id=G, member_id=self.member_id, member_epoch=self.epoch, instance_id=None, rack_id=None,
            rebalance_timeout=datetime.timedelta(milliseconds=30_000), subscribed_topic_names=names,
            subscribed_topic_regex=regex, server_assignor=None,
            topic_partitions=[SimpleNamespace(topic_id=t, partitions=sorted(ps)) for t, ps in self.owned.items()])
        resp: dict[str, Any] = self.c.cg.heartbeat(req, "client", "/127.0.0.1")
        if resp["error_code"] != ErrorCode.none:
            return resp
        self.pending_sub = None
        self.epoch = resp["member_epoch"]
        if resp["assignment"] is not None:
            # Revoke and assign at once, as a client does before its next heartbeat.
            self.owned = {tp["topic_id"]: set(tp["partitions"]) for tp in resp["assignment"]["topic_partitions"]
                          if tp["partitions"]}
        return resp

    def topics(self) -> set[tuple[str, int]]:
        return {(self.c.names[t], p) for t, ps in self.owned.items() for p in ps}


def parts(c: Cluster, *topics: str) -> set[tuple[str, int]]:
    return {(t, p) for t in topics for p in range(c.parts[t])}


def assigned_in(c: Cluster, resp: dict[str, Any]) -> set[tuple[str, int]]:
    a = resp["assignment"]
    assert a is not None
    return {(c.names[tp["topic_id"]], p) for tp in a["topic_partitions"] for p in tp["partitions"]}


def joined(c: Cluster, member_id: str, names: list[str], regex: str = "") -> Member:
    m = Member(c, member_id)
    m.subscribe(names, regex)
    m.heartbeat()
    return m


# --- literal topics first, the regex later -------------------------------------------------------

def test_switch_to_regex_is_answered_from_literal_topics_then_resolved_off_the_heartbeat() -> None:
    c = Cluster()
    a = joined(c, "a", ["lit"])
    a.heartbeat()
    assert a.topics() == parts(c, "lit")
    epoch = c.group.group_epoch

    a.subscribe([], "ra-.*")
    resp = a.heartbeat()
    # Kafka: an unresolved regex does not count yet; the member subscribes to no literal topic, so
    # this heartbeat takes everything away and gives nothing from the regex.
    assert resp["error_code"] == ErrorCode.none
    assert assigned_in(c, resp) == set()
    assert "ra-.*" not in c.group.resolved and c.refresh_pending()
    # More heartbeats on the same tick change nothing: the resolution is not on the heartbeat path.
    for _ in range(3):
        a.heartbeat()
        assert a.topics() == set()

    c.tick()  # the coordinator's timer runs the resolution
    assert not c.refresh_pending()
    assert c.group.resolved["ra-.*"].topics == {"ra-1", "ra-2"}
    assert c.group.group_epoch > epoch + 1  # the names change, then the resolution
    resp = a.heartbeat()
    assert assigned_in(c, resp) == parts(c, "ra-1", "ra-2")
    assert resp["member_epoch"] == c.group.group_epoch


def test_mixed_names_and_regex_get_the_names_first() -> None:
    c = Cluster()
    a = joined(c, "a", ["lit"], "rb-.*")
    # The first heartbeat already has the literal topic; the regex comes after the tick.
    assert a.topics() == parts(c, "lit")
    a.heartbeat()
    assert a.topics() == parts(c, "lit")
    c.tick()
    a.heartbeat()
    assert a.topics() == parts(c, "lit", "rb-1")
    desc = c.cg.describe(G, c.names.get)
    assert desc["members"][0]["subscribed_topic_regex"] == "rb-.*"
    assert desc["members"][0]["subscribed_topic_names"] == ["lit"]


def test_a_regex_already_resolved_in_the_group_is_assigned_in_the_same_heartbeat() -> None:
    c = Cluster()
    a = joined(c, "a", [], "ra-.*")
    c.tick()
    a.heartbeat()
    assert a.topics() == parts(c, "ra-1", "ra-2")
    b = joined(c, "b", ["lit"])
    a.heartbeat()
    b.heartbeat()
    epoch = c.group.group_epoch
    b.subscribe([], "ra-.*")  # Kafka's REGEX_UPDATED_AND_RESOLVED: bump now, no new resolution
    b.heartbeat()
    assert c.group.group_epoch == epoch + 1 and not c.refresh_pending()
    for _ in range(4):
        a.heartbeat()
        b.heartbeat()
    assert a.topics() | b.topics() == parts(c, "ra-1", "ra-2")
    assert a.topics() and b.topics() and not a.topics() & b.topics()


def test_leaving_a_regex_gives_its_partitions_up_before_the_new_one_is_resolved() -> None:
    """The group still subscribes to ra-1 (through b's names), so the target is not recomputed when a
    moves from ra-.* to an unresolved regex; a must still give ra-1 and ra-2 up at once."""
    c = Cluster()
    a = joined(c, "a", ["lit"], "ra-.*")
    b = joined(c, "b", ["ra-1", "ra-2"])
    c.tick()
    for _ in range(4):
        a.heartbeat()
        b.heartbeat()
    assert a.topics() | b.topics() == parts(c, "lit", "ra-1", "ra-2")
    a.subscribe(["lit"], "rb-.*")
    resp = a.heartbeat()
    assert {t for t, _p in assigned_in(c, resp)} <= {"lit"}
    # ra-.* was resolved on this very tick: the new regex is resolved after the next heartbeat (Kafka
    # evaluates the batching with the group's resolutions as they stood before this heartbeat).
    assert not c.refresh_pending()
    for _ in range(4):
        a.heartbeat()
        b.heartbeat()
        c.tick(100)
    assert a.topics() == parts(c, "lit", "rb-1") and b.topics() == parts(c, "ra-1", "ra-2")


def test_dropping_a_regex_another_member_keeps_moves_its_partitions() -> None:
    c = Cluster()
    a = joined(c, "a", ["lit"], "ra-.*")
    b = joined(c, "b", [], "ra-.*")
    c.tick()
    for _ in range(4):
        a.heartbeat()
        b.heartbeat()
    assert a.topics() | b.topics() == parts(c, "lit", "ra-1", "ra-2") and a.topics() & parts(c, "ra-1", "ra-2")
    a.subscribe(["lit"], "")
    for _ in range(4):
        a.heartbeat()
        b.heartbeat()
    assert a.topics() == parts(c, "lit") and b.topics() == parts(c, "ra-1", "ra-2")


def test_new_member_with_an_unresolved_regex_waits_for_the_resolution() -> None:
    c = Cluster()
    a = joined(c, "a", ["lit"])
    a.heartbeat()
    epoch = c.group.group_epoch
    b = joined(c, "b", [], "rb-.*")
    # Kafka bumps the group epoch for a new member's topic names, not for an unresolved regex.
    assert c.group.group_epoch == epoch and b.topics() == set() and b.epoch == epoch
    c.tick()
    assert c.group.group_epoch == epoch + 1
    b.heartbeat()
    a.heartbeat()
    assert b.topics() == parts(c, "rb-1") and a.topics() == parts(c, "lit")


def test_invalid_regex_is_refused_and_changes_nothing() -> None:
    c = Cluster()
    a = joined(c, "a", ["lit"])
    a.heartbeat()
    before = (c.group.group_epoch, list(c.group.members["a"].subscribed_names), c.group.members["a"].subscribed_regex)
    a.subscribe([], "ra-(")
    resp = a.heartbeat()
    assert resp["error_code"] == ErrorCode.invalid_regular_expression
    assert "ra-(" in (resp["error_message"] or "")
    assert (c.group.group_epoch, c.group.members["a"].subscribed_names, c.group.members["a"].subscribed_regex) \
        == before
    assert not c.refresh_pending()
    # A new member with an invalid regex is not created.
    m = Member(c, "x")
    m.subscribe([], "[z-a]")
    assert m.heartbeat()["error_code"] == ErrorCode.invalid_regular_expression
    assert "x" not in c.group.members


# --- when the regexes are resolved again ---------------------------------------------------------

def test_topics_created_later_are_picked_up_at_most_every_ten_seconds() -> None:
    c = Cluster()
    a = joined(c, "a", [], "ra-.*")
    c.tick()
    a.heartbeat()
    assert a.topics() == parts(c, "ra-1", "ra-2")
    c.create("ra-3", 2)
    c.create("other", 1)
    # Within 10 s of the last resolution no refresh is asked for (Kafka batches them per group).
    c.tick(REGEX_BATCH_REFRESH_MIN_INTERVAL_MS // 2)
    a.heartbeat()
    assert not c.refresh_pending() and a.topics() == parts(c, "ra-1", "ra-2")
    c.tick(REGEX_BATCH_REFRESH_MIN_INTERVAL_MS // 2 + 1)
    a.heartbeat()  # new topics since the last resolution: this heartbeat asks for one
    assert c.refresh_pending()
    c.tick()
    assert c.group.resolved["ra-.*"].topics == {"ra-1", "ra-2", "ra-3"}
    a.heartbeat()
    assert a.topics() == parts(c, "ra-1", "ra-2", "ra-3")
    # Nothing new: later heartbeats resolve nothing again.
    c.tick(REGEX_BATCH_REFRESH_MIN_INTERVAL_MS * 2)
    a.heartbeat()
    assert not c.refresh_pending()


def test_deleted_topic_leaves_the_assignment() -> None:
    c = Cluster()
    a = joined(c, "a", [], "ra-.*")
    c.tick()
    a.heartbeat()
    c.delete("ra-2")
    for _ in range(3):
        a.heartbeat()
    assert a.topics() == parts(c, "ra-1")


def test_refresh_interval_resolves_again() -> None:
    c = Cluster()
    c.cg.regex_refresh_interval_ms = 60_000
    a = joined(c, "a", [], "ra-.*")
    c.tick()
    first = c.group.resolved["ra-.*"].timestamp
    c.tick(30_000)
    a.heartbeat()
    assert not c.refresh_pending()
    c.tick(30_001)
    a.heartbeat()
    assert c.refresh_pending()
    c.tick()
    assert c.group.resolved["ra-.*"].timestamp > first


def test_new_regex_within_the_batch_interval_waits_for_it() -> None:
    """Kafka resolves a group's regexes together: a second regex brought within 10 s of the last
    resolution waits for the interval to pass (and is then resolved by the next heartbeat)."""
    c = Cluster()
    a = joined(c, "a", [], "ra-.*")
    c.tick()
    b = joined(c, "b", [], "rb-.*")
    assert not c.refresh_pending()
    c.tick(REGEX_BATCH_REFRESH_MIN_INTERVAL_MS + 1)
    b.heartbeat()
    assert c.refresh_pending()
    c.tick()
    for _ in range(4):
        a.heartbeat()
        b.heartbeat()
    assert a.topics() == parts(c, "ra-1", "ra-2") and b.topics() == parts(c, "rb-1")


def test_last_subscriber_leaving_drops_the_resolution() -> None:
    c = Cluster()
    a = joined(c, "a", [], "ra-.*")
    joined(c, "b", ["lit"])
    c.tick()
    assert set(c.group.resolved) == {"ra-.*"}
    a.subscribe(["lit"], "")
    a.heartbeat()
    assert c.group.resolved == {}
    a.subscribe([], "rb-.*")
    a.heartbeat()
    a.epoch = -1
    a.heartbeat()  # leaves
    assert c.group.resolved == {} and set(c.group.members) == {"b"}
    c.tick()
    assert c.group.resolved == {}


def test_resolutions_are_redone_when_the_coordinator_loads_the_group() -> None:
    """pykbroker does not write Kafka's ConsumerGroupRegularExpression records: it resolves again at load,
    so a restarted coordinator neither bumps the epoch nor takes the regex's partitions away."""
    c = Cluster()
    a = joined(c, "a", ["lit"], "ra-.*")
    c.tick()
    a.heartbeat()
    assert a.topics() == parts(c, "lit", "ra-1", "ra-2")
    epoch = c.group.group_epoch
    c2 = c.restart()
    assert c2.group.resolved["ra-.*"].topics == {"ra-1", "ra-2"}
    a.c = c2
    resp = a.heartbeat()
    assert resp["error_code"] == ErrorCode.none and resp["member_epoch"] == epoch
    assert c2.group.group_epoch == epoch and not c2.refresh_pending()
    assert a.topics() == parts(c, "lit", "ra-1", "ra-2")


# --- many changes in a row -----------------------------------------------------------------------

def test_many_subscription_changes_in_a_row_converge_within_a_few_heartbeats() -> None:
    c = Cluster()
    a = joined(c, "a", ["lit"])
    b = joined(c, "b", ["lit", "lit2"])
    for _ in range(3):
        a.heartbeat()
        b.heartbeat()
    subs: list[tuple[list[str], str, set[tuple[str, int]]]] = [
        ([], "ra-.*", parts(c, "ra-1", "ra-2")),
        ([], "rb-.*", parts(c, "rb-1")),
        (["lit2"], "", parts(c, "lit2")),
        ([], "ra-.*", parts(c, "ra-1", "ra-2")),
        (["lit", "lit2"], "", parts(c, "lit", "lit2")),
        (["lit"], "r[ab]-1", parts(c, "lit", "ra-1", "rb-1")),
        ([], "rb-.*", parts(c, "rb-1")),
    ]
    sequence = (subs * 3)[:18]
    for i, (names, regex, _want) in enumerate(sequence):
        a.subscribe(names, regex)
        # From back-to-back changes to a few heartbeats (with ticks of the coordinator) between them.
        for _ in range(i % 4):
            a.heartbeat()
            b.heartbeat()
            c.tick(100)
    a.heartbeat()
    final = sequence[-1][2]
    # Each heartbeat is followed by the coordinator's next tick; 0.5 s apart, as a client would.
    beats = 0
    while not (a.topics() == final - b.topics() and a.topics() | b.topics() == final | parts(c, "lit", "lit2")
               and c.group.state_name() == "Stable"):
        beats += 1
        # Kafka's batching may hold the last regex up to 10 s after the previous resolution: 20 beats of 0.5 s.
        assert beats <= 24, f"not converged: a={sorted(a.topics())} b={sorted(b.topics())}"
        c.tick(500)
        a.heartbeat()
        b.heartbeat()
    assert not a.topics() & b.topics()
