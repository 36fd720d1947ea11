"""``pykbroker partition move|status|elect``: replica reassignment (AlterPartitionReassignments,
ListPartitionReassignments) and leader elections (ElectLeaders), sent to the controller."""

from __future__ import annotations

import time
from typing import Any

import click

from ..connection import check
from ..errors import EXIT_FAILED, EXIT_UNREACHABLE, EXIT_USAGE, AdminError, error_name
from ..session import Session, connection_options, partial_failure
from ..wire import retriable

ELECT_LEADERS, ALTER_REASSIGNMENTS, LIST_REASSIGNMENTS = 43, 45, 46
ELECTION_TYPES = {"preferred": 0, "unclean": 1}
ELECTION_NOT_NEEDED = 84


@click.group("partition")
def partition() -> None:
    """Partitions: move replicas, show moves in progress, elect leaders."""


def _replicas(text: str) -> list[int]:
    try:
        ids = [int(b) for b in text.split(",") if b.strip()]
    except ValueError as e:
        raise AdminError(f"--replicas takes broker ids like 1,2,3, not {text!r}", EXIT_USAGE) from e
    if not ids or len(set(ids)) != len(ids):
        raise AdminError(f"--replicas takes distinct broker ids like 1,2,3, not {text!r}", EXIT_USAGE)
    return ids


def _at_controller(session: Session, api_key: int, body: dict[str, Any], what: str, minimum: int = 0) -> Any:
    """One request to the controller, again (to the new one) while it answers NOT_CONTROLLER or is busy, until
    the command's timeout; then the top-level error, if any, as an AdminError."""
    wire = session.wire

    def call() -> Any:
        _, response = wire.controller().request(api_key, body, minimum=minimum)
        retriable(response.error_code)
        return response

    response = wire.retrying(what, call)
    check(response.error_code, what, getattr(response, "error_message", None))
    return response


def _ongoing(session: Session, topics: list[tuple[str, list[int]]] | None) -> list[dict[str, Any]]:
    """The reassignments in progress (of ``topics``' partitions; None: all of them)."""
    body = {"timeout": int(session.timeout * 1000),
            "topics": None if topics is None else [{"name": t, "partition_indexes": ps} for t, ps in topics]}
    response = _at_controller(session, LIST_REASSIGNMENTS, body, "ListPartitionReassignments")
    return sorted(({"topic": t.name, "partition": int(p.partition_index), "replicas": list(p.replicas),
                    "adding": list(p.adding_replicas), "removing": list(p.removing_replicas)}
                   for t in response.topics for p in t.partitions), key=lambda d: (d["topic"], d["partition"]))


@partition.command("move")
@click.argument("topic")
@click.argument("partition_index", metavar="PARTITION", type=int)
@click.option("--replicas", required=True, metavar="ID,ID,...", help="the brokers the partition is to live on, "
                                                                      "the preferred leader first")
@click.option("--wait", is_flag=True, help="wait (at most --timeout) until the move is done")
@connection_options
def move(topic: str, partition_index: int, replicas: str, wait: bool, session: Session) -> None:
    """Move a partition's replicas to other brokers (AlterPartitionReassignments)."""
    target = _replicas(replicas)
    body = {"timeout": int(session.timeout * 1000), "allow_replication_factor_change": True,
            "topics": [{"name": topic, "partitions": [{"partition_index": partition_index, "replicas": target}]}]}
    response = _at_controller(session, ALTER_REASSIGNMENTS, body, "AlterPartitionReassignments")
    for t in response.responses:
        for p in t.partitions:
            check(p.error_code, f"move {t.name}/{p.partition_index}", p.error_message)
    state = "started"
    if wait:
        _wait_done(session, topic, partition_index, target)
        state = "done"
    doc = {"topic": topic, "partition": partition_index, "replicas": target, "state": state}
    session.out.emit(doc, ["TOPIC", "PARTITION", "REPLICAS", "STATE"], [[topic, partition_index, target, state]])


def _replicas_now(session: Session, topic: str, index: int) -> list[int] | None:
    """The partition's replicas in a broker's Metadata answer (None: not shown)."""
    md = session.wire.metadata([topic])
    for t in md.topics:
        for p in t.partitions if t.name == topic else []:
            if int(p.partition_index) == index:
                return [int(r) for r in p.replica_nodes]
    return None


def _wait_done(session: Session, topic: str, index: int, target: list[int]) -> None:
    """Until the partition is no longer being reassigned and has the target replicas (as
    kafka-reassign-partitions --verify checks), showing how many new replicas have caught up. Both, because a
    reassignment not yet listed is not a finished one."""
    deadline = time.monotonic() + session.timeout
    total: int | None = None
    with session.out.progress(f"moving {topic}/{index}", None) as bar:
        for _ in range(int(session.timeout / 0.1) + 2):
            ongoing = [d for d in _ongoing(session, [(topic, [index])])
                       if d["topic"] == topic and d["partition"] == index]
            if not ongoing and sorted(_replicas_now(session, topic, index) or []) == sorted(target):
                if total is not None:
                    bar.update(total, total)
                return
            if ongoing:
                adding = len(ongoing[0]["adding"])
                total = max(total or 0, adding)
                bar.update(total - adding, total)
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
    raise AdminError(f"the move of {topic}/{index} was not done within {session.timeout:g} s (it goes on; "
                     f"see: pykbroker partition status {topic})", EXIT_UNREACHABLE, error="REQUEST_TIMED_OUT")


@partition.command("status")
@click.argument("topic", required=False)
@connection_options
def status(topic: str | None, session: Session) -> None:
    """Reassignments in progress: each partition's replicas, those being added and those being removed."""
    topics: list[tuple[str, list[int]]] | None = None
    if topic is not None:
        md = session.wire.metadata([topic])
        for t in md.topics:
            check(t.error_code, f"Metadata {topic}")
        topics = [(topic, sorted(int(p.partition_index) for t in md.topics for p in t.partitions))]
    docs = _ongoing(session, topics)
    session.out.emit(docs, ["TOPIC", "PARTITION", "REPLICAS", "ADDING", "REMOVING"],
                     [[d["topic"], d["partition"], d["replicas"], d["adding"], d["removing"]] for d in docs])


@partition.command("elect")
@click.option("--type", "election", type=click.Choice(list(ELECTION_TYPES)), default="preferred",
              show_default=True, help="the preferred replica, or any replica even if out of sync (unclean)")
@click.argument("topic", required=False)
@click.argument("partitions", nargs=-1, type=int)
@connection_options
def elect(election: str, topic: str | None, partitions: tuple[int, ...], session: Session) -> None:
    """Elect leaders (ElectLeaders) of a topic's partitions, of a whole topic, or of every partition."""
    wire = session.wire
    topic_partitions: list[dict[str, Any]] | None = None
    if topic is not None:
        pids = list(partitions)
        if not pids:
            md = wire.metadata([topic])
            for t in md.topics:
                check(t.error_code, f"Metadata {topic}")
            pids = sorted(int(p.partition_index) for t in md.topics for p in t.partitions)
        topic_partitions = [{"topic": topic, "partitions": pids}]
    body = {"election_type": ELECTION_TYPES[election], "topic_partitions": topic_partitions,
            "timeout": int(session.timeout * 1000)}
    response = _at_controller(session, ELECT_LEADERS, body, "ElectLeaders", minimum=1)
    docs: list[dict[str, Any]] = []
    errors: dict[str, AdminError] = {}
    for t in response.replica_election_results:
        for p in t.partition_result:
            code = int(p.error_code)
            name = f"{t.topic}/{p.partition_id}"
            if code == 0:
                result, error = "elected", None
            elif code == ELECTION_NOT_NEEDED:
                result, error = "already-elected", None
            else:
                result, error = "failed", error_name(code)
                errors[name] = AdminError(f"elect {name}: {error}" + (f": {p.error_message}" if p.error_message
                                                                       else ""), EXIT_FAILED, error=error)
            docs.append({"topic": str(t.topic), "partition": int(p.partition_id), "result": result, "error": error})
    docs.sort(key=lambda d: (d["topic"], d["partition"]))
    session.out.emit(docs, ["TOPIC", "PARTITION", "RESULT", "ERROR"],
                     [[d["topic"], d["partition"], d["result"], d["error"]] for d in docs])
    partial_failure(session.out, errors)


COMMANDS = (partition,)
