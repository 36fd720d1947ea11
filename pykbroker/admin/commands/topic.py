"""``pykbroker topic``: create, list, describe, alter-config, add-partitions, delete and trim (DeleteRecords)."""

from __future__ import annotations

from typing import Any

import click
from confluent_kafka import TopicCollection, TopicPartition
from confluent_kafka.admin import NewPartitions, NewTopic

from ..errors import AdminError
from ..session import Session, connection_options, partial_failure
from .common import existing_topic, key_values, node_id, offsets_of, parse_assignment
from .config import alter, current


@click.group("topic")
def topic() -> None:
    """Topics: create, list, describe, alter-config, add-partitions, delete, trim."""


@topic.command("create")
@click.argument("names", nargs=-1, required=True)
@click.option("-p", "--partitions", type=int, default=-1, help="partitions (default: the broker's num.partitions)")
@click.option("-r", "--replication-factor", type=int, default=-1,
              help="replicas of each partition (default: the broker's default.replication.factor)")
@click.option("-c", "--config", "configs", multiple=True, metavar="KEY=VALUE", help="a topic config (repeatable)")
@click.option("--replica-assignment", metavar="0:1,1:2,...",
              help="brokers of each partition, partitions separated by commas (instead of -p and -r)")
@click.option("--if-not-exists", is_flag=True, help="an existing topic is not an error")
@click.option("--validate-only", is_flag=True, help="ask the cluster to check the request without creating")
@connection_options
def create(names: tuple[str, ...], partitions: int, replication_factor: int, configs: tuple[str, ...],
           replica_assignment: str | None, if_not_exists: bool, validate_only: bool, session: Session) -> None:
    """Create topics."""
    assignment = parse_assignment(replica_assignment) if replica_assignment else None
    config = key_values(configs, "-c")
    # librdkafka takes the partition count with an assignment (-1 there means "the broker's default", refused).
    shape: dict[str, Any] = ({"num_partitions": len(assignment), "replica_assignment": assignment} if assignment else
                             {"num_partitions": partitions, "replication_factor": replication_factor})
    new = [NewTopic(n, config=config, **shape) for n in names]
    admin = session.admin
    futures = admin.client.create_topics(new, request_timeout=admin.timeout, operation_timeout=admin.timeout,
                                         validate_only=validate_only)
    results = admin.wait_each(futures, lambda n: f"create {n}")
    errors: dict[str, AdminError] = {}
    rows: list[list[Any]] = []
    for name, r in results.items():
        if isinstance(r, AdminError) and not (if_not_exists and r.error == "TOPIC_ALREADY_EXISTS"):
            errors[name] = r
            rows.append([name, "failed", r.error])
        else:
            state = "exists" if isinstance(r, AdminError) else ("valid" if validate_only else "created")
            rows.append([name, state, None])
    session.out.emit([{"topic": n, "result": s, "error": e} for n, s, e in rows], ["TOPIC", "RESULT", "ERROR"], rows)
    partial_failure(session.out, errors)


@topic.command("list")
@click.option("--internal/--no-internal", default=False, help="include internal topics (__consumer_offsets, ...)")
@click.argument("pattern", required=False)
@connection_options
def list_(internal: bool, pattern: str | None, session: Session) -> None:
    """List topics (optionally those whose name contains PATTERN)."""
    md = session.admin.metadata()
    docs = []
    for name in sorted(md.topics):
        t = md.topics[name]
        if t.error is not None:
            continue
        is_internal = name.startswith("__")
        if (is_internal and not internal) or (pattern and pattern not in name):
            continue
        rf = max((len(p.replicas) for p in t.partitions.values()), default=0)
        docs.append({"name": name, "partitions": len(t.partitions), "replication_factor": rf,
                     "internal": is_internal})
    session.out.emit(docs, ["TOPIC", "PARTITIONS", "REPLICATION", "INTERNAL"],
                     [[d["name"], d["partitions"], d["replication_factor"], d["internal"]] for d in docs])


@topic.command("describe")
@click.argument("names", nargs=-1, required=True)
@click.option("--all-configs", is_flag=True, help="every config, not only those set on the topic")
@connection_options
def describe(names: tuple[str, ...], all_configs: bool, session: Session) -> None:
    """Partitions (leader, replicas, ISR, offsets) and configs of topics."""
    admin = session.admin
    described = admin.wait_each(admin.client.describe_topics(TopicCollection(list(names)),
                                                              request_timeout=admin.timeout),
                                lambda n: f"describe {n}")
    docs: list[dict[str, Any]] = []
    errors: dict[str, AdminError] = {}
    for name in names:
        d = described[name]
        if isinstance(d, AdminError):
            errors[name] = d
            continue
        pids = [p.id for p in d.partitions]
        earliest, latest = offsets_of(session, name, pids, "earliest"), offsets_of(session, name, pids, "latest")
        configs = current(session, "topic", name, all_configs)
        parts = [{"partition": p.id, "leader": node_id(p.leader), "replicas": [node_id(r) for r in p.replicas],
                  "isr": [node_id(r) for r in p.isr],
                  "offline_replicas": sorted({node_id(r) for r in p.replicas} - {node_id(r) for r in p.isr}
                                             if p.leader is None else []),
                  "start_offset": earliest.get(p.id), "end_offset": latest.get(p.id)}
                 for p in sorted(d.partitions, key=lambda p: p.id)]
        docs.append({"name": name, "topic_id": str(d.topic_id), "internal": bool(d.is_internal),
                     "partitions": parts, "configs": {c["name"]: c["value"] for c in configs}})
    if session.out.json:
        session.out.emit(docs)
    for doc in [] if session.out.json else docs:
        messages = sum((p["end_offset"] or 0) - (p["start_offset"] or 0) for p in doc["partitions"])
        session.out.fields([("Topic", doc["name"]), ("TopicId", doc["topic_id"]),
                            ("Partitions", len(doc["partitions"])), ("Messages", messages),
                            ("Configs", ", ".join(f"{k}={v}" for k, v in doc["configs"].items()) or None)])
        session.out.table(["PARTITION", "LEADER", "REPLICAS", "ISR", "START", "END"],
                          [[p["partition"], p["leader"], p["replicas"], p["isr"], p["start_offset"],
                            p["end_offset"]] for p in doc["partitions"]])
    partial_failure(session.out, errors)


@topic.command("alter-config")
@click.argument("name")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="set a config (repeatable)")
@click.option("--delete", "deletes", multiple=True, metavar="KEY", help="back to the default (repeatable)")
@connection_options
def alter_config(name: str, sets: tuple[str, ...], deletes: tuple[str, ...], session: Session) -> None:
    """Set or delete configs of a topic (IncrementalAlterConfigs)."""
    alter(session, "topic", name, key_values(sets, "--set"), list(deletes))


@topic.command("add-partitions")
@click.argument("name")
@click.option("--total", type=int, required=True, help="the partition count after the change")
@connection_options
def add_partitions(name: str, total: int, session: Session) -> None:
    """Grow a topic to --total partitions."""
    admin = session.admin
    futures = admin.client.create_partitions([NewPartitions(name, total)], request_timeout=admin.timeout,
                                             operation_timeout=admin.timeout)
    admin.wait(futures[name], f"add partitions to {name}")
    session.out.emit({"topic": name, "partitions": total}, ["TOPIC", "PARTITIONS"], [[name, total]])


@topic.command("delete")
@click.argument("names", nargs=-1, required=True)
@click.option("--if-exists", is_flag=True, help="a topic that does not exist is not an error")
@connection_options
def delete(names: tuple[str, ...], if_exists: bool, session: Session) -> None:
    """Delete topics."""
    admin = session.admin
    futures = admin.client.delete_topics(list(names), request_timeout=admin.timeout,
                                         operation_timeout=admin.timeout)
    results = admin.wait_each(futures, lambda n: f"delete {n}")
    errors: dict[str, AdminError] = {}
    rows: list[list[Any]] = []
    for name, r in results.items():
        if isinstance(r, AdminError) and not (if_exists and r.error == "UNKNOWN_TOPIC_OR_PARTITION"):
            errors[name] = r
            rows.append([name, "failed", r.error])
        else:
            rows.append([name, "absent" if isinstance(r, AdminError) else "deleted", None])
    session.out.emit([{"topic": n, "result": s, "error": e} for n, s, e in rows], ["TOPIC", "RESULT", "ERROR"], rows)
    partial_failure(session.out, errors)


@topic.command("trim")
@click.argument("name")
@click.option("-p", "--partition", "partitions", type=int, multiple=True,
              help="a partition (repeatable; default: every partition)")
@click.option("--before", "offset", type=int, default=-1,
              help="delete the records before this offset (default: all of them, up to the high watermark)")
@connection_options
def trim(name: str, partitions: tuple[int, ...], offset: int, session: Session) -> None:
    """Delete the records before an offset (DeleteRecords); the log start offset moves there."""
    admin = session.admin
    pids = list(partitions) or sorted(existing_topic(session, name).partitions)
    futures = admin.client.delete_records([TopicPartition(name, p, offset) for p in pids],
                                          request_timeout=admin.timeout, operation_timeout=admin.timeout)
    results = admin.wait_each(futures, lambda tp: f"trim {tp.topic}/{tp.partition}")
    errors = {f"{name}/{tp.partition}": r for tp, r in results.items() if isinstance(r, AdminError)}
    docs = [{"partition": tp.partition, "start_offset": r.low_watermark}
            for tp, r in sorted(results.items(), key=lambda kv: kv[0].partition) if not isinstance(r, AdminError)]
    session.out.emit({"topic": name, "partitions": docs}, ["PARTITION", "START"],
                     [[d["partition"], d["start_offset"]] for d in docs])
    partial_failure(session.out, errors)


COMMANDS = (topic,)
