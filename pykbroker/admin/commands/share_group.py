"""``pykbroker share-group list|describe``: share groups (KIP-932): ListGroups v5's type filter on every broker,
and ShareGroupDescribe and DescribeShareGroupOffsets at the group's coordinator, with each partition's lag."""

from __future__ import annotations

from typing import Any

import click

from ..connection import check
from ..session import Session, connection_options
from ..wire import GROUP, retriable
from .common import offsets_of

LIST_GROUPS, SHARE_GROUP_DESCRIBE, DESCRIBE_SHARE_GROUP_OFFSETS = 16, 77, 90
TYPES_FILTER_VERSION = 5  # the first ListGroups version with TypesFilter (KIP-848)


@click.group("share-group")
def share_group() -> None:
    """Share groups: list them, describe one (members, assignments, start offsets and lag)."""


@share_group.command("list")
@connection_options
def list_(session: Session) -> None:
    """Share groups of every coordinator, with their state."""
    wire = session.wire
    docs: list[dict[str, Any]] = []
    body = {"states_filter": [], "types_filter": ["share"]}
    for broker_id, address in sorted(wire.brokers().items()):
        def call(address: str = address) -> Any:
            _, response = wire.connect(address).request(LIST_GROUPS, body, minimum=TYPES_FILTER_VERSION)
            retriable(response.error_code)
            return response

        response = wire.retrying(f"ListGroups to broker {broker_id}", call)
        check(response.error_code, f"ListGroups to broker {broker_id}")
        docs += [{"group": str(g.group_id), "state": str(g.group_state), "coordinator": broker_id}
                 for g in response.groups]
    docs.sort(key=lambda d: d["group"])
    session.out.emit(docs, ["GROUP", "STATE", "COORDINATOR"],
                     [[d["group"], d["state"], d["coordinator"]] for d in docs])


def _start_offsets(conn: Any, group: str, assigned: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The group's share-partition start offsets (-1: none yet): v1 asks for every topic the group has state of,
    v0 for the partitions assigned to its members."""
    topics: dict[str, list[int]] = {}
    for t, i in assigned:
        topics.setdefault(t, []).append(i)
    body: dict[str, Any] = {"groups": [{"group_id": group, "topics": [
        {"topic_name": t, "partitions": ps}
        for t, ps in sorted(topics.items())]}]}
    if conn.version(DESCRIBE_SHARE_GROUP_OFFSETS) >= 1:
        body["groups"][0]["topics"] = None
    elif not topics:
        return {}
    _, response = conn.request(DESCRIBE_SHARE_GROUP_OFFSETS, body)
    out: dict[tuple[str, int], int] = {}
    for g in response.groups:
        retriable(g.error_code)
        check(g.error_code, f"DescribeShareGroupOffsets {group}", g.error_message)
        for t in g.topics:
            for p in t.partitions:
                check(p.error_code, f"DescribeShareGroupOffsets {group} {t.topic_name}/{p.partition_index}",
                      p.error_message)
                out[(str(t.topic_name), int(p.partition_index))] = int(p.start_offset)
    return out


@share_group.command("describe")
@click.argument("group")
@connection_options
def describe(group: str, session: Session) -> None:
    """A share group's state, members and their partitions, and each partition's start offset, end and lag."""
    wire = session.wire

    def call() -> tuple[int, Any, dict[tuple[str, int], int]]:
        node, conn = wire.coordinator(group, GROUP)
        _, response = conn.request(SHARE_GROUP_DESCRIBE, {"group_ids": [group],
                                                          "include_authorized_operations": False})
        described = response.groups[0]
        retriable(described.error_code)
        check(described.error_code, f"ShareGroupDescribe {group}", described.error_message)
        assigned = [(str(tp.topic_name), int(i)) for m in described.members
                    for tp in m.assignment.topic_partitions for i in tp.partitions]
        return node, described, _start_offsets(conn, group, assigned)

    node, g, starts = wire.retrying(f"describe share group {group}", call)
    owner: dict[tuple[str, int], str] = {}
    members: list[dict[str, Any]] = []
    for m in sorted(g.members, key=lambda m: str(m.member_id)):
        assigned = sorted((str(tp.topic_name), int(i)) for tp in m.assignment.topic_partitions for i in tp.partitions)
        owner.update({tp: str(m.member_id) for tp in assigned})
        members.append({"member_id": str(m.member_id), "client_id": str(m.client_id),
                        "client_host": str(m.client_host), "member_epoch": int(m.member_epoch),
                        "subscribed_topics": sorted(str(t) for t in m.subscribed_topic_names),
                        "assignment": [{"topic": t, "partition": i} for t, i in assigned]})
    partitions = sorted(set(starts) | set(owner))
    ends: dict[tuple[str, int], int] = {}
    for topic in sorted({t for t, _ in partitions}):
        ends.update({(topic, i): o for i, o in offsets_of(session, topic, [i for t, i in partitions if t == topic],
                                                          "latest").items()})
    offsets = []
    for tp in partitions:
        start, end = starts.get(tp, -1), ends.get(tp)
        offsets.append({"topic": tp[0], "partition": tp[1], "start_offset": start if start >= 0 else None,
                        "end_offset": end, "lag": end - start if end is not None and start >= 0 else None,
                        "member_id": owner.get(tp)})
    doc = {"group": group, "coordinator": node, "state": str(g.group_state), "group_epoch": int(g.group_epoch),
           "assignment_epoch": int(g.assignment_epoch), "members": members, "offsets": offsets}
    if session.out.json:
        session.out.emit(doc)
        return
    session.out.fields([("Group", group), ("Coordinator", node), ("State", doc["state"]),
                        ("GroupEpoch", doc["group_epoch"]), ("AssignmentEpoch", doc["assignment_epoch"]),
                        ("Members", len(members))])
    session.out.table(["MEMBER", "CLIENT-ID", "HOST", "EPOCH", "PARTITIONS"],
                      [[m["member_id"], m["client_id"], m["client_host"], m["member_epoch"],
                        [f"{a['topic']}/{a['partition']}" for a in m["assignment"]]] for m in members])
    session.out.table(["TOPIC", "PARTITION", "START", "END", "LAG", "MEMBER"],
                      [[o["topic"], o["partition"], o["start_offset"], o["end_offset"], o["lag"], o["member_id"]]
                       for o in offsets])


COMMANDS = (share_group,)
