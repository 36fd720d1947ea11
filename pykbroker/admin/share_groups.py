"""Share groups (KIP-932) as the CLI and the console show them: ListGroups v5's type filter on every broker, and
ShareGroupDescribe and DescribeShareGroupOffsets at the group's coordinator, with each partition's lag (its log end
offset, which the caller supplies, minus the share-partition start offset)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .connection import check
from .wire import GROUP, Wire, retriable

LIST_GROUPS, SHARE_GROUP_DESCRIBE, DESCRIBE_SHARE_GROUP_OFFSETS = 16, 77, 90
TYPES_FILTER_VERSION = 5  # the first ListGroups version with TypesFilter (KIP-848)

EndOffsets = Callable[[list[tuple[str, int]]], dict[tuple[str, int], int | None]]


def list_share_groups(wire: Wire) -> list[dict[str, Any]]:
    """Every coordinator's share groups: ``{"group", "state", "coordinator"}``, by name."""
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
    return sorted(docs, key=lambda d: d["group"])


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


def describe_share_group(wire: Wire, group: str, end_offsets: EndOffsets) -> dict[str, Any]:
    """A share group's state, epochs, members with their partitions, and per partition the start offset, the end
    offset and the lag (None where unknown)."""

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
    ends = end_offsets(partitions) if partitions else {}
    offsets = []
    for tp in partitions:
        start, end = starts.get(tp, -1), ends.get(tp)
        offsets.append({"topic": tp[0], "partition": tp[1], "start_offset": start if start >= 0 else None,
                        "end_offset": end, "lag": end - start if end is not None and start >= 0 else None,
                        "member_id": owner.get(tp)})
    return {"group": group, "coordinator": node, "state": str(g.group_state), "group_epoch": int(g.group_epoch),
            "assignment_epoch": int(g.assignment_epoch), "members": members, "offsets": offsets}
