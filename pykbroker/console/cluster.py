"""What the console's pages show, read through Kafka's Admin API as a client of this broker (confluent-kafka): the
calls block, so the app runs them in worker threads. Each logged-in user has their own clients, so the broker's
ACLs decide what each one sees and may change."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, ConsumerGroupTopicPartitions, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic, OffsetSpec, ResourceType

from pykbroker.admin.client import Admin, librdkafka_config
from pykbroker.admin.describe import describe_acls, describe_scram_users
from pykbroker.admin.errors import AdminError, from_kafka, kafka_error
from pykbroker.admin.share_groups import describe_share_group, list_share_groups
from pykbroker.admin.wire import Wire

# librdkafka's own log lines (retries, a refused login) would repeat what the page already says.
rdkafka_log = logging.getLogger("pykbroker.console.rdkafka")
log = logging.getLogger("pykbroker.console")
rdkafka_log.propagate = False
rdkafka_log.addHandler(logging.NullHandler())

MAX_MESSAGES = 100  # the message browser's cap per request
DESCRIBE_LOG_DIRS = 35
SEARCH_SCAN = 10_000  # the records a search looks at, at most, from where it starts
COUNTED_PARTITIONS = 2000  # the topics page reads offsets of at most this many partitions
SENSITIVE = "[hidden]"


class LoginFailed(Exception):
    """The broker refused the SASL login (or could not be reached to try it)."""


def login(props: dict[str, str], timeout: float) -> None:
    """One Metadata round trip as the user; LoginFailed if the SASL handshake or authentication fails.

    librdkafka reports a refused login to its error callback and retries until the request's timeout, so the
    callback ends the wait at once rather than after the whole timeout."""
    refused: list[str] = []
    conf = librdkafka_config(props, timeout)
    conf["logger"] = rdkafka_log
    conf["error_cb"] = lambda err: refused.append(str(err.str())) if err.name() == "_AUTHENTICATION" else None
    client = AdminClient(conf)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.list_topics(timeout=0.25)
            return
        except Exception:
            client.poll(0)
            if refused:
                raise LoginFailed(refused[0]) from None
    raise LoginFailed(f"no answer from the broker within {timeout:g} s")


@dataclass
class BrokerRow:
    node_id: int
    host: str
    port: int
    controller: bool


@dataclass
class Overview:
    cluster_id: str
    controller_id: int
    brokers: list[BrokerRow]
    topics: int
    partitions: int
    under_replicated: int
    offline: int


@dataclass
class TopicRow:
    name: str
    partitions: int
    replication_factor: int
    internal: bool
    messages: int | None = None  # end - start offsets summed, when read
    size: int | None = None  # bytes of one copy (each partition's largest replica), when the user may see it
    error: str | None = None


@dataclass
class PartitionRow:
    partition: int
    leader: int
    replicas: list[int]
    isr: list[int]
    start: int | None = None
    end: int | None = None

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)


@dataclass
class ConfigRow:
    name: str
    value: str
    source: str
    sensitive: bool
    read_only: bool


@dataclass
class Record:
    partition: int
    offset: int
    timestamp: int
    key: Rendered
    value: Rendered
    headers: list[tuple[str, Rendered]]


@dataclass
class Rendered:
    """Bytes as people read them: JSON pretty-printed, else UTF-8 text, else hex."""

    kind: str  # json, text, hex or null
    text: str


@dataclass
class GroupRow:
    group_id: str
    state: str
    type: str
    simple: bool


@dataclass
class GroupPartition:
    topic: str
    partition: int
    committed: int | None
    end: int | None
    member: str | None

    @property
    def lag(self) -> int | None:
        if self.end is None:
            return None
        return self.end - (self.committed if self.committed is not None and self.committed >= 0 else 0)


@dataclass
class GroupMemberRow:
    member_id: str
    client_id: str
    host: str
    assignment: list[str]


@dataclass
class GroupDetail:
    group_id: str
    state: str
    protocol: str
    coordinator: int | None
    members: list[GroupMemberRow]
    partitions: list[GroupPartition] = field(default_factory=list)


@dataclass
class AclRow:
    resource_type: str
    name: str
    pattern: str
    principal: str
    host: str
    operation: str
    permission: str


@dataclass
class UserRow:
    user: str
    credentials: list[str]


def render(data: bytes | str | None) -> Rendered:
    if data is None:
        return Rendered("null", "null")
    raw = data.encode() if isinstance(data, str) else bytes(data)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Rendered("hex", raw.hex(" "))
    if (text and text.lstrip()[:1] in "{[\"") or text.strip() in ("true", "false", "null") or _is_number(text):
        try:
            return Rendered("json", json.dumps(json.loads(text), indent=2, ensure_ascii=False))
        except ValueError:
            pass
    if any(ord(c) < 32 and c not in "\t\r\n" for c in text):
        return Rendered("hex", raw.hex(" "))
    return Rendered("text", text)


def _source(entry: Any) -> str:
    try:
        return str(ConfigSource(int(entry.source)).name)
    except ValueError:
        return str(entry.source)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _holds(needle: bytes, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]) -> bool:
    """The record's key, value or a header value contains ``needle`` (bytes, so that hex and text both match)."""
    return any(needle in part for part in (key, value, *(v for _, v in headers)) if part is not None)


class ClusterClient:
    """One user's clients (an AdminClient, and a Producer once needed), all on the broker's listener."""

    def __init__(self, props: dict[str, str], timeout: float) -> None:
        # Looking at a topic must not create it: librdkafka's Metadata request for one topic asks the broker to
        # create it when auto.create.topics.enable is on, unless told not to.
        self.props = {**props, "allow.auto.create.topics": "false"}
        self.timeout = timeout
        self.admin = Admin({**self.props}, timeout)
        # DescribeAcls and DescribeUserScramCredentials go over pykbroker's own client (pykbroker.admin.describe):
        # librdkafka mishandles their refusals, one of them by crashing the process, which here is the broker's.
        self._wire = Wire(self.props, timeout)
        self._wire_lock = threading.Lock()
        self._producer: Any = None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._wire_lock:
            self._wire.close()
        with self._lock:
            if self._producer is not None:
                self._producer.flush(self.timeout)
                self._producer = None

    # --- reads ---

    def overview(self) -> Overview:
        md = self.admin.metadata()
        partitions = under = offline = 0
        for t in md.topics.values():
            for p in t.partitions.values():
                partitions += 1
                if len(p.isrs) < len(p.replicas):
                    under += 1
                if p.leader < 0:
                    offline += 1
        brokers = [BrokerRow(b.id, b.host, b.port, b.id == md.controller_id)
                   for b in sorted(md.brokers.values(), key=lambda b: b.id)]
        return Overview(md.cluster_id, md.controller_id, brokers, len(md.topics), partitions, under, offline)

    def topic_names(self) -> tuple[list[TopicRow], Any]:
        """Every topic as a row, and the metadata they came from (for count_messages)."""
        md = self.admin.metadata()
        rows = []
        for name in sorted(md.topics):
            t = md.topics[name]
            parts = list(t.partitions.values())
            rf = max((len(p.replicas) for p in parts), default=0)
            error = t.error.name() if t.error is not None else None
            rows.append(TopicRow(name, len(parts), rf, name.startswith("__"), error=error))
        return rows, md

    def count_messages(self, rows: Iterable[TopicRow], md: Any = None) -> None:
        """Each row's message count: end minus start offset over its partitions (one ListOffsets pair), for at
        most COUNTED_PARTITIONS partitions a page: a topic beyond that is left uncounted (its page has the
        offsets of each partition), so that a page of wide topics stays quick."""
        md = md if md is not None else self.admin.metadata()
        wanted: list[tuple[str, int]] = []
        counted: list[TopicRow] = []
        for row in rows:
            t = md.topics.get(row.name)
            if t is None or len(wanted) + len(t.partitions) > COUNTED_PARTITIONS:
                continue
            wanted += [(row.name, p) for p in t.partitions]
            counted.append(row)
        offsets = self.offsets(wanted)
        totals = {row.name: 0 for row in counted}
        for (topic, _), (start, end) in offsets.items():
            if start is not None and end is not None:
                totals[topic] += end - start
        for row in counted:
            row.messages = totals[row.name]

    def measure_sizes(self, rows: Iterable[TopicRow], md: Any = None) -> None:
        """Each counted row's size: per partition the largest of its replicas' sizes (DescribeLogDirs of the
        page's topics, asked of every broker), summed. Left unknown where DescribeLogDirs is refused (it needs
        DESCRIBE on the cluster) or a broker does not answer."""
        md = md if md is not None else self.admin.metadata()
        topics = [{"topic": r.name, "partitions": sorted(md.topics[r.name].partitions)}
                  for r in rows if r.messages is not None and r.name in md.topics]
        if not topics:
            return
        largest: dict[tuple[str, int], int] = {}
        try:
            with self._wire_lock:
                for _, address in sorted(self._wire.brokers().items()):
                    _, response = self._wire.connect(address).request(DESCRIBE_LOG_DIRS, {"topics": topics},
                                                                      minimum=1)
                    for d in response.results:
                        for t in d.topics if int(d.error_code) == 0 else []:
                            for p in t.partitions:
                                if not p.is_future_key:
                                    tp = (str(t.name), int(p.partition_index))
                                    largest[tp] = max(largest.get(tp, 0), int(p.partition_size))
        except AdminError as e:
            log.debug("no topic sizes: %s", e)
            return
        sizes: dict[str, int] = {}
        for (topic, _), size in largest.items():
            sizes[topic] = sizes.get(topic, 0) + size
        for r in rows:
            if r.name in sizes:
                r.size = sizes[r.name]

    def topic(self, name: str) -> list[PartitionRow]:
        md = self.admin.metadata(name)
        t = md.topics.get(name)
        if t is None:
            raise AdminError(f"topic {name}: UNKNOWN_TOPIC_OR_PARTITION", error="UNKNOWN_TOPIC_OR_PARTITION")
        if t.error is not None:
            raise kafka_error(t.error, f"topic {name}")
        return [PartitionRow(p.id, p.leader, list(p.replicas), list(p.isrs))
                for p in sorted(t.partitions.values(), key=lambda p: p.id)]

    def offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int | None, int | None]]:
        """(start, end) per partition, None where the broker refused (an ACL, a moved leader)."""
        out: dict[tuple[str, int], tuple[int | None, int | None]] = {}
        if not partitions:
            return out
        found: dict[str, dict[tuple[str, int], int | None]] = {}
        for label, spec in (("start", OffsetSpec.earliest()), ("end", OffsetSpec.latest())):
            futures = self.admin.client.list_offsets({TopicPartition(t, p): spec for t, p in partitions},
                                                     request_timeout=self.timeout)
            got: dict[tuple[str, int], int | None] = {}
            for tp, future in futures.items():
                try:
                    got[(tp.topic, tp.partition)] = self.admin.wait(future, "ListOffsets").offset
                except AdminError:
                    got[(tp.topic, tp.partition)] = None
            found[label] = got
        for key in partitions:
            out[key] = (found["start"].get(key), found["end"].get(key))
        return out

    def configs(self, resource_type: str, name: str) -> list[ConfigRow]:
        resource = ConfigResource(ResourceType[resource_type], name)
        result = self.admin.wait(self.admin.client.describe_configs([resource], request_timeout=self.timeout)
                                 [resource], f"DescribeConfigs {resource_type.lower()} {name}")
        rows = []
        for entry in sorted(result.values(), key=lambda e: e.name):
            sensitive = bool(entry.is_sensitive)
            value = SENSITIVE if sensitive else ("" if entry.value is None else str(entry.value))
            rows.append(ConfigRow(entry.name, value, _source(entry), sensitive, bool(entry.is_read_only)))
        return rows

    def browse(self, topic: str, partition: int, *, offset: int | None = None, timestamp_ms: int | None = None,
               limit: int = 20, wait_s: float = 3.0, contains: bytes | None = None,
               scan: int = SEARCH_SCAN) -> tuple[list[Record], int | None]:
        """At most ``limit`` records of one partition from an offset (negative: that many before the end) or
        from the first record at or after a timestamp; the offset it started at. Never commits. With
        ``contains``, only records whose key, value or a header value holds those bytes, looking at no more
        than ``scan`` records (the search is bounded, like the page)."""
        try:
            return self._browse(topic, partition, offset, timestamp_ms, limit, wait_s, contains, scan)
        except KafkaException as e:
            raise from_kafka(e, f"fetch {topic}-{partition}") from e

    def _browse(self, topic: str, partition: int, offset: int | None, timestamp_ms: int | None, limit: int,
                wait_s: float, contains: bytes | None = None,
                scan: int = SEARCH_SCAN) -> tuple[list[Record], int | None]:
        limit = max(1, min(limit, MAX_MESSAGES))
        conf = librdkafka_config(self.props, self.timeout)
        conf.update({"group.id": f"pykbroker-console-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                     "enable.auto.offset.store": False, "auto.offset.reset": "earliest", "logger": rdkafka_log,
                     "enable.partition.eof": True})
        consumer = Consumer(conf)
        try:
            start_offset: int | None
            if timestamp_ms is not None:
                found = consumer.offsets_for_times([TopicPartition(topic, partition, timestamp_ms)],
                                                   timeout=self.timeout)
                start_offset = found[0].offset
                if found[0].error is not None:
                    raise AdminError(f"offsets for time: {found[0].error}")
                if start_offset < 0:
                    return [], None  # no record at or after that time
            else:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=self.timeout)
                start_offset = offset if offset is not None else low
                if start_offset < 0:
                    start_offset = max(low, high + start_offset)
                if start_offset >= high:
                    return [], start_offset
            consumer.assign([TopicPartition(topic, partition, start_offset if start_offset >= 0 else OFFSET_END)])
            records: list[Record] = []
            scanned = 0
            deadline = time.monotonic() + wait_s
            while len(records) < limit and scanned < scan and time.monotonic() < deadline:
                want = limit - len(records) if contains is None else min(500, scan - scanned)
                batch: list[Any] = consumer.consume(want, timeout=0.2)
                eof = False
                for m in batch:
                    if m.error() is not None:
                        if m.error().name() == "_PARTITION_EOF":
                            eof = True
                            continue
                        raise AdminError(f"fetch {topic}-{partition}: {m.error().name()}: {m.error().str()}",
                                         error=m.error().name())
                    scanned += 1
                    raw_headers = m.headers() or []
                    if contains is not None and not _holds(contains, m.key(), m.value(), raw_headers):
                        continue
                    headers = [(k, render(v)) for k, v in raw_headers]
                    records.append(Record(m.partition(), m.offset(), m.timestamp()[1], render(m.key()),
                                          render(m.value()), headers))
                    if len(records) >= limit:
                        break
                if eof:
                    break
            return records[:limit], start_offset
        finally:
            consumer.close()

    def groups(self) -> list[GroupRow]:
        result = self.admin.wait(self.admin.client.list_consumer_groups(request_timeout=self.timeout),
                                 "ListGroups")
        rows = [GroupRow(g.group_id, str(g.state).rsplit(".", 1)[-1], str(getattr(g, "type", "")).rsplit(".", 1)[-1],
                         bool(g.is_simple_consumer_group)) for g in result.valid]
        return sorted(rows, key=lambda r: r.group_id)

    def group(self, group_id: str) -> GroupDetail:
        desc = self.admin.wait(self.admin.client.describe_consumer_groups(
            [group_id], request_timeout=self.timeout)[group_id], f"DescribeGroups {group_id}")
        owner: dict[tuple[str, int], str] = {}
        members = []
        for m in desc.members:
            tps = list(m.assignment.topic_partitions) if m.assignment is not None else []
            for tp in tps:
                owner[(tp.topic, tp.partition)] = m.member_id
            members.append(GroupMemberRow(m.member_id, m.client_id, m.host,
                                          [f"{tp.topic}-{tp.partition}" for tp in tps]))
        committed = self.admin.wait(self.admin.client.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group_id)], request_timeout=self.timeout)[group_id],
            f"OffsetFetch {group_id}")
        offsets: dict[tuple[str, int], int | None] = {(tp.topic, tp.partition): tp.offset
                                                       for tp in committed.topic_partitions}
        keys = sorted(set(offsets) | set(owner))
        ends = self.offsets(keys)
        coordinator = desc.coordinator.id if desc.coordinator is not None else None
        detail = GroupDetail(group_id, str(desc.state).rsplit(".", 1)[-1], desc.partition_assignor or "",
                             coordinator, members)
        detail.partitions = [GroupPartition(t, p, offsets.get((t, p)), ends[(t, p)][1], owner.get((t, p)))
                             for t, p in keys]
        return detail

    def share_groups(self) -> list[dict[str, Any]]:
        """Every share group (KIP-932): ``{"group", "state", "coordinator"}``."""
        with self._wire_lock:
            return list_share_groups(self._wire)

    def share_group(self, group: str) -> dict[str, Any]:
        """Members, assignments and, per partition, start offset, end offset and lag (pykbroker.admin's shape)."""

        def ends(partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
            return {tp: end for tp, (_, end) in self.offsets(partitions).items()}

        with self._wire_lock:
            return describe_share_group(self._wire, group, ends)

    def acls(self) -> list[AclRow]:
        """Every ACL binding this user may see; none where the broker has no authorizer (SECURITY_DISABLED)."""
        try:
            with self._wire_lock:
                bindings = describe_acls(self._wire)
        except AdminError as e:
            if e.error == "SECURITY_DISABLED":
                return []
            raise
        return sorted((AclRow(b["resource_type"].upper().replace("-", "_"), b["resource_name"], b["pattern"].upper(),
                              b["principal"], b["host"], b["operation"].upper().replace("-", "_"),
                              b["permission"].upper()) for b in bindings),
                      key=lambda r: (r.resource_type, r.name, r.principal, r.operation))

    def users(self) -> list[UserRow]:
        with self._wire_lock:
            described = describe_scram_users(self._wire, None)
        rows = []
        for user, creds in sorted(described.items()):
            if isinstance(creds, AdminError):
                raise creds
            rows.append(UserRow(user, [f"{c['mechanism']} ({c['iterations']} iterations)" for c in creds]))
        return rows

    # --- writes (only offered when the console is not read-only) ---

    def create_topic(self, name: str, partitions: int, replication_factor: int) -> None:
        futures = self.admin.client.create_topics([NewTopic(name, partitions, replication_factor)],
                                                  request_timeout=self.timeout)
        self.admin.wait(futures[name], f"CreateTopics {name}")

    def delete_topic(self, name: str) -> None:
        futures = self.admin.client.delete_topics([name], request_timeout=self.timeout)
        self.admin.wait(futures[name], f"DeleteTopics {name}")

    def produce(self, topic: str, partition: int | None, key: bytes | None, value: bytes,
                headers: list[tuple[str, bytes]]) -> tuple[int, int]:
        """One record, acknowledged by the broker; its partition and offset."""
        with self._lock:
            if self._producer is None:
                conf = librdkafka_config(self.props, self.timeout)
                conf.update({"logger": rdkafka_log, "linger.ms": 0, "acks": "all"})
                self._producer = Producer(conf)
            producer = self._producer
        outcome: list[Any] = []
        kwargs: dict[str, Any] = {"key": key, "value": value, "headers": headers or None,
                                  "on_delivery": lambda err, msg: outcome.append((err, msg))}
        if partition is not None:
            kwargs["partition"] = partition
        try:
            producer.produce(topic, **kwargs)
        except Exception as e:
            raise AdminError(f"Produce {topic}: {e}") from e
        deadline = time.monotonic() + self.timeout
        while not outcome and time.monotonic() < deadline:
            producer.poll(0.1)
        if not outcome:
            raise AdminError(f"Produce {topic}: no acknowledgement within {self.timeout:g} s")
        err, msg = outcome[0]
        if err is not None:
            raise AdminError(f"Produce {topic}: {err.name()}: {err.str()}", error=err.name())
        return msg.partition(), msg.offset()

    def reset_offsets(self, group_id: str, to: str) -> int:
        """Every committed partition of an empty group to its earliest or latest offset; refused while the
        group has members (their commits would overwrite it). The number of partitions reset."""
        detail = self.group(group_id)
        if detail.members:
            raise AdminError(f"group {group_id} has {len(detail.members)} member(s): stop its consumers first "
                             "(their commits would overwrite the reset)", error="NON_EMPTY_GROUP")
        keys = [(p.topic, p.partition) for p in detail.partitions]
        if not keys:
            return 0
        offsets = self.offsets(keys)
        tps = []
        for key in keys:
            start, end = offsets[key]
            target = start if to == "earliest" else end
            if target is None:
                raise AdminError(f"the {to} offset of {key[0]}-{key[1]} could not be read")
            tps.append(TopicPartition(key[0], key[1], target))
        futures = self.admin.client.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group_id, tps)],
                                                                 request_timeout=self.timeout)
        self.admin.wait(futures[group_id], f"OffsetCommit {group_id}")
        return len(tps)
