"""``pykbroker share-group list|describe``: share groups (KIP-932): ListGroups v5's type filter on every broker,
and ShareGroupDescribe and DescribeShareGroupOffsets at the group's coordinator, with each partition's lag."""

from __future__ import annotations

import click

from ..session import Session, connection_options
from ..share_groups import describe_share_group, list_share_groups
from .common import offsets_of


@click.group("share-group")
def share_group() -> None:
    """Share groups: list them, describe one (members, assignments, start offsets and lag)."""


@share_group.command("list")
@connection_options
def list_(session: Session) -> None:
    """Share groups of every coordinator, with their state."""
    docs = list_share_groups(session.wire)
    session.out.emit(docs, ["GROUP", "STATE", "COORDINATOR"],
                     [[d["group"], d["state"], d["coordinator"]] for d in docs])


@share_group.command("describe")
@click.argument("group")
@connection_options
def describe(group: str, session: Session) -> None:
    """A share group's state, members and their partitions, and each partition's start offset, end and lag."""

    def end_offsets(partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        ends: dict[tuple[str, int], int | None] = {}
        for topic in sorted({t for t, _ in partitions}):
            latest = offsets_of(session, topic, [i for t, i in partitions if t == topic], "latest")
            ends.update({(topic, i): o for i, o in latest.items()})
        return ends

    doc = describe_share_group(session.wire, group, end_offsets)
    members, offsets, node = doc["members"], doc["offsets"], doc["coordinator"]
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
