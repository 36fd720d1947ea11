"""``pykbroker group``: list, describe (members, assignments, committed offsets and lag), delete, and seek (reset a
group's committed offsets, as ``kafka-consumer-groups --reset-offsets`` does: a dry run unless ``--execute``)."""

from __future__ import annotations

import datetime
from typing import Any

import click
from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaException, TopicPartition

from ..errors import EXIT_FAILED, EXIT_USAGE, AdminError, from_kafka
from ..session import Session, connection_options, partial_failure
from .common import existing_topic, node_id, offsets_of

# librdkafka's state enum names as Kafka spells the states (ListGroups' StatesFilter, DescribeGroups' GroupState).
_STATES = {"UNKNOWN": "Unknown", "PREPARING_REBALANCING": "PreparingRebalance",
           "COMPLETING_REBALANCING": "CompletingRebalance", "STABLE": "Stable", "DEAD": "Dead", "EMPTY": "Empty"}
_INACTIVE = frozenset({"Empty", "Dead"})


def _state(value: Any) -> str:
    name = getattr(value, "name", None)
    return _STATES.get(str(name), str(name).title()) if name is not None else "Unknown"


def _type(value: Any) -> str:
    name = getattr(value, "name", None)
    return str(name).lower() if name is not None else "unknown"


@click.group("group")
def group() -> None:
    """Consumer groups: list, describe, delete, seek."""


@group.command("list")
@click.option("--state", "states", multiple=True, type=click.Choice(sorted(set(_STATES.values()) - {"Unknown"}),
                                                                    case_sensitive=False),
              help="only groups in this state (repeatable)")
@connection_options
def list_(states: tuple[str, ...], session: Session) -> None:
    """List consumer groups: id, state, type, and whether it is a simple group (offsets only, no members)."""
    wanted = {s.lower() for s in states}
    kwargs: dict[str, Any] = {"request_timeout": session.admin.timeout}
    if wanted:
        kwargs["states"] = {ConsumerGroupState[k] for k, v in _STATES.items() if v.lower() in wanted}
    admin = session.admin
    result = admin.wait(admin.client.list_consumer_groups(**kwargs), "list groups")
    # One broker's ListGroups failing leaves the list incomplete: shown, but the command fails.
    errors = {f"list groups ({i})": from_kafka(e if isinstance(e, BaseException) else KafkaException(e),
                                               "list groups")
              for i, e in enumerate(result.errors or [])}
    if errors and not result.valid:
        raise next(iter(errors.values()))
    docs = [{"group": g.group_id, "state": _state(getattr(g, "state", None)),
             "type": _type(getattr(g, "type", None)), "simple": bool(g.is_simple_consumer_group)}
            for g in sorted(result.valid or [], key=lambda g: g.group_id)]
    session.out.emit(docs, ["GROUP", "STATE", "TYPE", "SIMPLE"],
                     [[d["group"], d["state"], d["type"], d["simple"]] for d in docs])
    partial_failure(session.out, errors)


def committed_offsets(session: Session, group_id: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets (OffsetFetch of every partition it has one for)."""
    admin = session.admin
    futures = admin.client.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group_id)],
                                                       request_timeout=admin.timeout)
    result = admin.wait(futures[group_id], f"offsets of group {group_id}")
    out: dict[tuple[str, int], int] = {}
    for tp in result.topic_partitions or []:
        if tp.error is None and tp.offset >= 0:
            out[(tp.topic, tp.partition)] = int(tp.offset)
    return out


def _describe_one(session: Session, description: Any) -> dict[str, Any]:
    gid = description.group_id
    committed = committed_offsets(session, gid)
    members = []
    owner: dict[tuple[str, int], str] = {}
    for m in sorted(description.members, key=lambda m: (m.client_id, m.member_id)):
        assigned = sorted((tp.topic, tp.partition) for tp in (m.assignment.topic_partitions or []))
        for tp in assigned:
            owner[tp] = m.member_id
        members.append({"member_id": m.member_id, "client_id": m.client_id, "host": m.host,
                        "group_instance_id": m.group_instance_id,
                        "assignment": [{"topic": t, "partition": p} for t, p in assigned]})
    keys = sorted(set(committed) | set(owner))
    ends: dict[tuple[str, int], int] = {}
    for topic in sorted({t for t, _ in keys}):
        for p, off in offsets_of(session, topic, [p for t, p in keys if t == topic], "latest").items():
            ends[(topic, p)] = off
    partitions = []
    for t, p in keys:
        c, end = committed.get((t, p)), ends.get((t, p))
        lag = max(end - c, 0) if c is not None and end is not None else None
        partitions.append({"topic": t, "partition": p, "committed_offset": c, "log_end_offset": end, "lag": lag,
                           "member_id": owner.get((t, p))})
    return {"group": gid, "state": _state(getattr(description, "state", None)),
            "type": _type(getattr(description, "type", None)),
            "coordinator": node_id(description.coordinator),
            "assignor": description.partition_assignor or None,
            "simple": bool(description.is_simple_consumer_group),
            "members": members, "partitions": partitions,
            "total_lag": sum(p["lag"] or 0 for p in partitions)}


@group.command("describe")
@click.argument("groups", nargs=-1, required=True)
@connection_options
def describe(groups: tuple[str, ...], session: Session) -> None:
    """State, coordinator, assignor, members with their partitions, and each partition's committed offset, log end
    offset and lag."""
    admin = session.admin
    described = admin.wait_each(admin.client.describe_consumer_groups(list(groups), request_timeout=admin.timeout),
                                lambda g: f"describe group {g}")
    docs: list[dict[str, Any]] = []
    errors: dict[str, AdminError] = {}
    for gid in groups:
        d = described[gid]
        if isinstance(d, AdminError):
            errors[gid] = d
            continue
        try:
            doc = _describe_one(session, d)
        except AdminError as e:
            errors[gid] = e
            continue
        if doc["state"] == "Dead" and not doc["members"] and not doc["partitions"]:
            errors[gid] = AdminError(f"describe group {gid}: GROUP_ID_NOT_FOUND: the group does not exist",
                                     EXIT_FAILED, error="GROUP_ID_NOT_FOUND")
            continue
        docs.append(doc)
    if session.out.json:
        session.out.emit(docs)
    for doc in [] if session.out.json else docs:
        session.out.fields([("Group", doc["group"]), ("State", doc["state"]), ("Type", doc["type"]),
                            ("Coordinator", doc["coordinator"]), ("Assignor", doc["assignor"]),
                            ("Members", len(doc["members"])), ("TotalLag", doc["total_lag"])])
        clients = {m["member_id"]: m for m in doc["members"]}
        session.out.table(["TOPIC", "PARTITION", "COMMITTED", "LOG-END", "LAG", "CLIENT-ID", "HOST", "MEMBER-ID"],
                          [[p["topic"], p["partition"], p["committed_offset"], p["log_end_offset"], p["lag"],
                            clients.get(p["member_id"] or "", {}).get("client_id"),
                            clients.get(p["member_id"] or "", {}).get("host"), p["member_id"]]
                           for p in doc["partitions"]])
        idle = [m for m in doc["members"] if not m["assignment"]]
        if idle:
            session.out.table(["MEMBER-ID", "CLIENT-ID", "HOST", "ASSIGNMENT"],
                              [[m["member_id"], m["client_id"], m["host"], None] for m in idle])
    partial_failure(session.out, errors)


@group.command("delete")
@click.argument("groups", nargs=-1, required=True)
@connection_options
def delete(groups: tuple[str, ...], session: Session) -> None:
    """Delete consumer groups (their committed offsets); a group with members is refused (NON_EMPTY_GROUP)."""
    admin = session.admin
    results = admin.wait_each(admin.client.delete_consumer_groups(list(groups), request_timeout=admin.timeout),
                              lambda g: f"delete group {g}")
    errors: dict[str, AdminError] = {}
    rows: list[list[Any]] = []
    for gid in groups:
        r = results[gid]
        if isinstance(r, AdminError):
            errors[gid] = r
            rows.append([gid, "failed", r.error])
        else:
            rows.append([gid, "deleted", None])
    session.out.emit([{"group": g, "result": s, "error": e} for g, s, e in rows], ["GROUP", "RESULT", "ERROR"], rows)
    partial_failure(session.out, errors)


def _timestamp_ms(text: str) -> int:
    """An ISO 8601 date-time in ms since the epoch; without a zone it is UTC (a script's result must not depend on
    the machine's zone)."""
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as e:
        raise AdminError(f"--to-datetime takes an ISO 8601 date-time like 2024-05-01T12:00:00Z, not {text!r}",
                         EXIT_USAGE) from e
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


@group.command("seek")
@click.argument("group_id", metavar="GROUP")
@click.option("--topic", required=True, help="the topic whose offsets move")
@click.option("-p", "--partition", "partitions", type=int, multiple=True,
              help="a partition (repeatable; default: every partition of the topic)")
@click.option("--to-earliest", is_flag=True, help="to the log start offset")
@click.option("--to-latest", is_flag=True, help="to the log end offset")
@click.option("--to-datetime", metavar="ISO8601", help="to the first record at or after this time (UTC if no zone)")
@click.option("--to-timestamp", type=int, metavar="MS", help="to the first record at or after this timestamp")
@click.option("--to-offset", type=int, metavar="N", help="to this offset")
@click.option("--shift-by", type=int, metavar="N", help="move the committed offset by N (negative: back)")
@click.option("--execute", is_flag=True, help="commit the new offsets (without it, only show them)")
@connection_options
def seek(group_id: str, topic: str, partitions: tuple[int, ...], to_earliest: bool, to_latest: bool,
         to_datetime: str | None, to_timestamp: int | None, to_offset: int | None, shift_by: int | None,
         execute: bool, session: Session) -> None:
    """Reset a group's committed offsets of a topic. The group must have no members (state Empty), as Kafka
    requires; each new offset is kept within [log start, log end]. A dry run unless --execute."""
    chosen = [n for n, v in (("--to-earliest", to_earliest), ("--to-latest", to_latest),
                             ("--to-datetime", to_datetime is not None), ("--to-timestamp", to_timestamp is not None),
                             ("--to-offset", to_offset is not None), ("--shift-by", shift_by is not None)) if v]
    if len(chosen) != 1:
        raise AdminError("give exactly one of --to-earliest, --to-latest, --to-datetime, --to-timestamp, "
                         f"--to-offset, --shift-by (got {', '.join(chosen) or 'none'})", EXIT_USAGE)
    admin = session.admin
    described = admin.wait(admin.client.describe_consumer_groups([group_id], request_timeout=admin.timeout)[group_id],
                           f"describe group {group_id}")
    state = _state(getattr(described, "state", None))
    if state not in _INACTIVE:
        raise AdminError(f"the offsets of group {group_id} can be reset only while it is inactive, but its state is "
                         f"{state} with {len(described.members)} member(s): stop its consumers first", EXIT_FAILED,
                         error="NON_EMPTY_GROUP")
    md = existing_topic(session, topic)
    pids = sorted(partitions) if partitions else sorted(md.partitions)
    unknown = [p for p in pids if p not in md.partitions]
    if unknown:
        raise AdminError(f"topic {topic} has no partition {unknown[0]}", EXIT_USAGE)
    start, end = offsets_of(session, topic, pids, "earliest"), offsets_of(session, topic, pids, "latest")
    missing = [p for p in pids if p not in start or p not in end]
    if missing:
        raise AdminError(f"no offsets for {topic}/{missing[0]}: its leader did not answer", EXIT_FAILED)
    current = {p: o for (t, p), o in committed_offsets(session, group_id).items() if t == topic}
    if to_earliest:
        target = dict(start)
    elif to_latest:
        target = dict(end)
    elif to_datetime is not None or to_timestamp is not None:
        ts = _timestamp_ms(to_datetime) if to_datetime is not None else int(to_timestamp or 0)
        found = offsets_of(session, topic, pids, ts)
        # No record at or after the time: the log end, as kafka-consumer-groups does.
        target = {p: found[p] if found.get(p, -1) >= 0 else end[p] for p in pids}
    elif to_offset is not None:
        target = {p: to_offset for p in pids}
    else:
        without = [p for p in pids if p not in current]
        if without:
            raise AdminError(f"--shift-by needs a committed offset, and group {group_id} has none for "
                             f"{topic}/{without[0]}", EXIT_USAGE)
        target = {p: current[p] + int(shift_by or 0) for p in pids}
    new = {p: min(max(target[p], start[p]), end[p]) for p in pids}
    if execute:
        _alter(session, group_id, topic, new)
    docs = [{"partition": p, "current_offset": current.get(p), "new_offset": new[p]} for p in pids]
    doc = {"group": group_id, "topic": topic, "executed": execute, "partitions": docs}
    if session.out.json:
        session.out.emit(doc)
        return
    session.out.table(["TOPIC", "PARTITION", "CURRENT", "NEW"],
                      [[topic, d["partition"], d["current_offset"], d["new_offset"]] for d in docs])
    session.out.note("offsets committed" if execute else "dry run: nothing changed (add --execute to commit)")


def _alter(session: Session, group_id: str, topic: str, new: dict[int, int]) -> None:
    admin = session.admin
    request = ConsumerGroupTopicPartitions(group_id, [TopicPartition(topic, p, o) for p, o in sorted(new.items())])
    futures = admin.client.alter_consumer_group_offsets([request], request_timeout=admin.timeout)
    try:
        result = admin.wait(futures[group_id], f"reset offsets of group {group_id}")
    except AdminError as e:
        if e.error in ("UNKNOWN_MEMBER_ID", "REBALANCE_IN_PROGRESS"):
            raise AdminError(f"group {group_id} got members while its offsets were being reset ({e.error}): "
                             "stop its consumers first", EXIT_FAILED, error=e.error) from e
        raise
    failed = [tp for tp in result.topic_partitions or [] if tp.error is not None]
    if failed:
        tp = failed[0]
        raise AdminError(f"reset offset of {tp.topic}/{tp.partition} in group {group_id}: {tp.error.str()}",
                         EXIT_FAILED, error=str(tp.error.name()))


COMMANDS = (group,)
