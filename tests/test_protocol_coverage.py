"""Protocol coverage: every API version pykbroker advertises is exercised, and by whom.

Two sources count:

1. the compatibility suite (``compat/``): when it starts pykbroker itself, every request of every
   client passes through a recording proxy, and ``python -m compat.report`` writes what was sent to
   ``compat/protocol_coverage.json`` (committed with docs/compatibility.md; a newer local
   ``compat/results/*.json`` from such a run counts too);
2. the direct protocol tests below, which speak each advertised version themselves (requests built
   with kio, record batches with kafka-python's encoder) and check the broker's answer against
   Kafka's documented behaviour. A version counts only once its checks pass.

``test_every_advertised_version_is_exercised`` fails and names each (API, version) the broker
advertises in ApiVersions that neither source exercises: advertise nothing that is not tested.
"""

from __future__ import annotations

import datetime
import io
import json
import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin

import pytest
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_entity_module
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

import pykbroker.protocol.codec  # noqa: F401  (registers itself with legacy, as the broker does at start)
from compat.cluster import SINGLE_NODE_OVERRIDES
from compat.wire import api_name, api_versions
from pykbroker.protocol import legacy
from tests.support.broker import BrokerProcess

REPO = Path(__file__).resolve().parent.parent
COMPAT_COVERAGE = REPO / "compat" / "protocol_coverage.json"
COMPAT_RESULTS = REPO / "compat" / "results"

pytestmark = [pytest.mark.xdist_group("protocol-coverage"), pytest.mark.timeout(240)]


# --- a minimal client on kio's generated classes -------------------------------------------------

def _entity(api_key: int, version: int, kind: EntityType, suffix: str) -> type:
    if legacy.is_legacy(api_key, version):  # below kio's versions: pykbroker's own layouts of Kafka 3.9's
        return legacy.request_class(api_key, version) if kind == EntityType.request \
            else legacy.response_class(api_key, version)
    mod = load_entity_module(api_key_map[api_key], version, kind)
    for name in dir(mod):
        obj = getattr(mod, name)
        if isinstance(obj, type) and is_dataclass(obj) and name.endswith(suffix) and \
                getattr(obj, "__type__", None) == kind:
            return obj
    raise LookupError(f"{api_key} v{version} {suffix}")


def _unwrap(tp: Any) -> tuple[Any, bool, bool]:
    """(inner type, optional?, tuple?)"""
    optional = False
    if get_origin(tp) in (UnionType, Union):
        tp = next(a for a in get_args(tp) if a is not NoneType)
        optional = True
    if get_origin(tp) is tuple:
        return get_args(tp)[0], optional, True
    return tp, optional, False


_ZERO = {"string": "", "bytes": b"", "bool": False, "uuid": uuid.UUID(int=0), "records": None,
         "timedelta_i32": datetime.timedelta(0), "timedelta_i64": datetime.timedelta(0),
         "datetime_i64": datetime.datetime.fromtimestamp(0, datetime.UTC)}


def _prim(kt: str, v: Any) -> Any:
    if v is None:
        return None
    if kt.startswith("timedelta") and not isinstance(v, datetime.timedelta):
        return datetime.timedelta(milliseconds=v)
    if kt == "datetime_i64" and not isinstance(v, datetime.datetime):
        return datetime.datetime.fromtimestamp(v / 1000, datetime.UTC)
    return v


def build(cls: type, data: dict[str, Any]) -> Any:
    """An instance of this version's class from a dict with any version's fields (unknown keys dropped)."""
    kw: dict[str, Any] = {}
    for f in fields(cls):
        inner, optional, many = _unwrap(f.type)
        kt = f.metadata.get("kafka_type", "")
        if f.name in data:
            v = data[f.name]
            if v is None:
                kw[f.name] = None
            elif many:
                kw[f.name] = tuple(build(inner, x) if is_dataclass(inner) else _prim(kt, x) for x in v)
            elif is_dataclass(inner):
                kw[f.name] = build(inner, v)
            else:
                kw[f.name] = _prim(kt, v)
        elif f.default is not MISSING:
            kw[f.name] = f.default
        elif f.default_factory is not MISSING:
            kw[f.name] = f.default_factory()
        elif optional:
            kw[f.name] = None
        elif many:
            kw[f.name] = ()
        elif is_dataclass(inner):
            kw[f.name] = build(inner, {})
        else:
            kw[f.name] = _ZERO.get(kt, 0)
    return cls(**kw)


class KafkaError(AssertionError):
    pass


def ok(code: Any, what: str = "") -> None:
    if int(code) != 0:
        raise KafkaError(f"{what}: error code {int(code)}")


class Wire:
    """One connection; call(api_key, version, **fields) returns the decoded response."""

    def __init__(self, bootstrap: str) -> None:
        host, _, port = bootstrap.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=15)
        self.corr = 0

    def close(self) -> None:
        self.sock.close()

    def call(self, key: int, version: int, /, **data: Any) -> Any:
        req_cls = _entity(key, version, EntityType.request, "Request")
        resp_cls = _entity(key, version, EntityType.response, "Response")
        self.corr += 1
        header_cls = req_cls.__header_schema__  # type: ignore[attr-defined]
        header = build(header_cls, {"request_api_key": key, "request_api_version": version,
                                    "correlation_id": self.corr, "client_id": "protocol-coverage"})
        buf = io.BytesIO()
        entity_writer(header_cls)(buf, header)
        entity_writer(req_cls)(buf, build(req_cls, data))
        payload = buf.getvalue()
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        (size,) = struct.unpack(">i", self._recv(4))
        frame = self._recv(size)
        (corr,) = struct.unpack_from(">i", frame, 0)
        assert corr == self.corr, f"correlation id {corr}, expected {self.corr}"
        offset = 4
        if req_cls.__flexible__ and key != 18:  # type: ignore[attr-defined]
            offset += 1  # response header v1: an empty tagged-field section
            assert frame[4] == 0, "unexpected tagged fields in the response header"
        value, _ = entity_reader(resp_cls)(frame, offset)
        return value

    def _recv(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            out += chunk
        return bytes(out)


def batch(records: list[tuple[bytes | None, bytes | None]], base_ts: int, *, pid: int = -1, epoch: int = -1,
          seq: int = -1, transactional: bool = False) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=transactional, producer_id=pid,
                                  producer_epoch=epoch, base_sequence=seq, batch_size=1 << 20)
    for i, (k, v) in enumerate(records):
        b.append(i, timestamp=base_ts + i, key=k, value=v, headers=[("h", b"x")])
    return bytes(b.build())


def read_records(data: bytes | None) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of the data records in a fetch response's record set."""
    out: list[tuple[int, bytes | None, bytes | None]] = []
    if not data:
        return out
    mr = MemoryRecords(bytes(data))
    while mr.has_next():
        b = mr.next_batch()
        if b is None:
            break
        if getattr(b, "is_control_batch", False):  # message format v0/v1 (Fetch v0-3) has none
            continue
        for r in b:
            out.append((r.offset, r.key, r.value))
    return out


# --- the direct tests ------------------------------------------------------------------------------

@dataclass
class Ctx:
    broker: BrokerProcess
    advertised: dict[int, tuple[int, int]]
    verified: set[tuple[int, int]] = field(default_factory=set)
    outcomes: dict[str, BaseException | None] = field(default_factory=dict)
    topic_ids: dict[str, uuid.UUID] = field(default_factory=dict)
    node_id: int = 0

    def versions(self, key: int) -> range:
        lo, hi = self.advertised.get(key, (0, -1))
        return range(lo, hi + 1)

    def latest(self, key: int) -> int:
        return self.advertised[key][1]

    def wire(self) -> Wire:
        return Wire(self.broker.bootstrap)

    def run(self, name: str) -> None:
        if name not in self.outcomes:
            try:
                SWEEPS[name](self)
                self.outcomes[name] = None
            except BaseException as e:  # kept, and raised again by the test that owns it
                self.outcomes[name] = e
        err = self.outcomes[name]
        if err is not None:
            raise err


SWEEPS: dict[str, Callable[[Ctx], None]] = {}


def sweep(name: str) -> Callable[[Callable[[Ctx], None]], Callable[[Ctx], None]]:
    def deco(fn: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
        SWEEPS[name] = fn
        return fn
    return deco


def _name(tag: str) -> str:
    return f"cov-{tag}-{uuid.uuid4().hex[:8]}"


def create_topic(ctx: Ctx, w: Wire, name: str, partitions: int = 1, configs: dict[str, str] | None = None) -> None:
    r = w.call(19, ctx.latest(19), topics=[{"name": name, "num_partitions": partitions, "replication_factor": 1,
                                             "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()]}],
               timeout=30000)
    ok(r.topics[0].error_code, f"create {name}")
    if getattr(r.topics[0], "topic_id", None):
        ctx.topic_ids[name] = r.topics[0].topic_id


def metadata(ctx: Ctx, w: Wire, name: str, version: int | None = None) -> Any:
    v = ctx.latest(3) if version is None else version
    r = w.call(3, v, topics=[{"name": name}], allow_auto_topic_creation=False)
    (t,) = r.topics
    return r, t


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@sweep("ApiVersions")
def sweep_api_versions(ctx: Ctx) -> None:
    w = ctx.wire()
    try:
        for v in ctx.versions(18):
            r = w.call(18, v, client_software_name="protocol-coverage", client_software_version="1.0")
            ok(r.error_code, f"ApiVersions v{v}")
            got = {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in r.api_keys}
            assert got == ctx.advertised, f"ApiVersions v{v} disagrees with v0"
            ctx.verified.add((18, v))
    finally:
        w.close()


@sweep("Metadata")
def sweep_metadata(ctx: Ctx) -> None:
    w = ctx.wire()
    try:
        name = _name("md")
        create_topic(ctx, w, name, partitions=3)
        for v in ctx.versions(3):
            r, t = metadata(ctx, w, name, v)
            ok(t.error_code, f"Metadata v{v} {name}")
            brokers = {b.node_id: (b.host, b.port) for b in r.brokers}
            assert brokers.get(ctx.node_id) == ("127.0.0.1", ctx.broker.port), brokers
            assert sorted(p.partition_index for p in t.partitions) == [0, 1, 2]
            assert all(p.leader_id in brokers for p in t.partitions)
            if v >= 4:  # allow_auto_topic_creation=false: an unknown topic stays unknown
                _, u = metadata(ctx, w, _name("unknown"), v)
                assert int(u.error_code) == 3, f"Metadata v{v}: unknown topic error {int(u.error_code)}"
            ctx.verified.add((3, v))
    finally:
        w.close()


@sweep("CreateTopics+DeleteTopics")
def sweep_create_delete_topics(ctx: Ctx) -> None:
    w = ctx.wire()
    try:
        made = []
        for v in ctx.versions(19):
            name = _name(f"ct{v}")
            r = w.call(19, v, topics=[{"name": name, "num_partitions": 2, "replication_factor": 1,
                                       "configs": [{"name": "retention.ms", "value": "3600000"}]}], timeout=30000)
            ok(r.topics[0].error_code, f"CreateTopics v{v}")
            wait_for(lambda n=name: len(metadata(ctx, w, n)[1].partitions) == 2, f"{name} in metadata")
            dup = w.call(19, v, topics=[{"name": name, "num_partitions": 1, "replication_factor": 1}], timeout=30000)
            assert int(dup.topics[0].error_code) == 36, "a duplicate must be TOPIC_ALREADY_EXISTS"
            made.append(name)
            ctx.verified.add((19, v))
        for v in ctx.versions(20):
            name = made.pop() if made else _name(f"dt{v}")
            if name.startswith("cov-dt"):
                create_topic(ctx, w, name)
            r = w.call(20, v, topic_names=[name], topics=[{"name": name}], timeout=30000)
            results = getattr(r, "responses", None)
            ok(results[0].error_code, f"DeleteTopics v{v}")
            wait_for(lambda n=name: int(metadata(ctx, w, n)[1].error_code) == 3, f"{name} gone")
            again = w.call(20, v, topic_names=[name], topics=[{"name": name}], timeout=30000)
            assert int(again.responses[0].error_code) == 3, "deleting it again must be UNKNOWN_TOPIC_OR_PARTITION"
            ctx.verified.add((20, v))
    finally:
        w.close()


@sweep("Produce+Fetch+ListOffsets")
def sweep_produce_fetch_list_offsets(ctx: Ctx) -> None:
    w = ctx.wire()
    try:
        name = _name("pf")
        create_topic(ctx, w, name)
        _, t = metadata(ctx, w, name)
        topic_id = getattr(t, "topic_id", None)
        base_ts = (int(time.time()) - 3600) * 1000
        sent: list[tuple[bytes, bytes]] = []
        stamps: list[int] = []
        for v in ctx.versions(0):
            recs = [(f"k{v}-{i}".encode(), f"v{v}-{i}".encode()) for i in range(2)]
            ts = base_ts + len(sent) * 1000
            r = w.call(0, v, acks=-1, timeout=30000,
                       topic_data=[{"name": name, "partition_data": [{"index": 0, "records": batch(recs, ts)}]}])
            p = r.responses[0].partition_responses[0]
            ok(p.error_code, f"Produce v{v}")
            assert p.base_offset == len(sent), f"Produce v{v}: base offset {p.base_offset}, expected {len(sent)}"
            stamps += [ts, ts + 1]
            sent += recs
            ctx.verified.add((0, v))
        want = [(i, k, v) for i, (k, v) in enumerate(sent)]
        for v in ctx.versions(1):
            topic = {"topic": name, "topic_id": topic_id,
                     "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                                     "current_leader_epoch": -1, "last_fetched_epoch": -1, "log_start_offset": -1}]}
            r = w.call(1, v, replica_id=-1, replica_state={"replica_id": -1, "replica_epoch": -1}, max_wait=100,
                       min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                       topics=[topic], forgotten_topics_data=[], rack_id="")
            if v >= 7:
                ok(r.error_code, f"Fetch v{v}")
            p = r.responses[0].partitions[0]
            ok(p.error_code, f"Fetch v{v} partition")
            assert p.high_watermark == len(sent)
            assert read_records(p.records) == want, f"Fetch v{v} returned other records"
            ctx.verified.add((1, v))
        for v in ctx.versions(2):
            if v == 0:  # v0: segment offsets, newest first, up to max_num_offsets
                def old(ts: int) -> list[int]:
                    r = w.call(2, 0, replica_id=-1, topics=[{"name": name, "partitions": [
                        {"partition_index": 0, "timestamp": ts, "max_num_offsets": 5}]}])
                    p = r.topics[0].partitions[0]
                    ok(p.error_code, f"ListOffsets v0 ts={ts}")
                    return list(p.old_style_offsets)
                assert old(-1) == [len(sent), 0] and old(-2) == [0], "ListOffsets v0: latest, earliest"
                assert old(base_ts) == [], "ListOffsets v0: no segment was last modified an hour ago"
                ctx.verified.add((2, v))
                continue

            def lo(ts: int, version: int = v) -> int:
                r = w.call(2, version, replica_id=-1, isolation_level=0,
                           topics=[{"name": name, "partitions": [{"partition_index": 0, "timestamp": ts,
                                                                 "current_leader_epoch": -1}]}])
                p = r.topics[0].partitions[0]
                ok(p.error_code, f"ListOffsets v{version} ts={ts}")
                return int(p.offset)
            assert lo(-1) == len(sent), f"ListOffsets v{v}: latest"
            assert lo(-2) == 0, f"ListOffsets v{v}: earliest"
            assert lo(stamps[2] + 1) == 3 and lo(stamps[-1] + 10_000) == -1, f"ListOffsets v{v}: by timestamp"
            if v >= 8:  # no tiered storage: the local log starts where the log does (KIP-405)
                assert lo(-4) == 0, f"ListOffsets v{v}: earliest local"
            if v >= 9:  # KIP-1005: nothing was tiered, so no offset (and no error)
                assert lo(-5) == -1, f"ListOffsets v{v}: latest tiered"
            ctx.verified.add((2, v))
    finally:
        w.close()


def _pick(ctx: Ctx, key: int, i: int) -> int | None:
    r = ctx.versions(key)
    return None if not r else r[min(i, len(r) - 1)]


def find_coordinator(ctx: Ctx, w: Wire, key: str, key_type: int, v: int) -> None:
    r = w.call(10, v, key=key, key_type=key_type, coordinator_keys=[key])
    if v >= 4:
        (c,) = r.coordinators
        ok(c.error_code, f"FindCoordinator v{v}")
        node, host, port = c.node_id, c.host, c.port
    else:
        ok(r.error_code, f"FindCoordinator v{v}")
        node, host, port = r.node_id, r.host, r.port
    assert (node, host, port) == (ctx.node_id, "127.0.0.1", ctx.broker.port)


def offset_fetch(ctx: Ctx, w: Wire, group: str, topic: str, v: int | None = None) -> int:
    v = ctx.latest(9) if v is None else v
    topics = [{"name": topic, "partition_indexes": [0]}]
    r = w.call(9, v, group_id=group, topics=topics, groups=[{"group_id": group, "topics": topics,
                                                            "member_id": None, "member_epoch": -1}],
               require_stable=False)
    if v >= 8:
        (g,) = r.groups
        ok(g.error_code, f"OffsetFetch v{v}")
        p = g.topics[0].partitions[0]
    else:
        p = r.topics[0].partitions[0]
    ok(p.error_code, f"OffsetFetch v{v} partition")
    return int(p.committed_offset)


@sweep("consumer group (classic)")
def sweep_groups(ctx: Ctx) -> None:
    keys = (10, 11, 14, 12, 8, 9, 15, 16, 13, 47, 42)
    w = ctx.wire()
    try:
        topic = _name("grp")
        create_topic(ctx, w, topic)
        rounds = max(len(ctx.versions(k)) for k in keys)
        for i in range(rounds):
            v = {k: _pick(ctx, k, i) for k in keys}
            group = _name(f"g{i}")
            find_coordinator(ctx, w, group, 0, v[10])
            ctx.verified.add((10, v[10]))
            join = {"group_id": group, "session_timeout": 10000, "rebalance_timeout": 10000, "member_id": "",
                    "group_instance_id": None, "protocol_type": "consumer", "reason": "coverage",
                    "protocols": [{"name": "range", "metadata": b"\x00\x00\x00\x00\x00\x01\x00\x00"}]}
            r = w.call(11, v[11], **join)
            if int(r.error_code) == 79:  # MEMBER_ID_REQUIRED (v4+): join again with the id given
                join["member_id"] = r.member_id
                r = w.call(11, v[11], **join)
            ok(r.error_code, f"JoinGroup v{v[11]}")
            member, gen = r.member_id, r.generation_id
            assert r.leader == member and gen >= 1 and [m.member_id for m in r.members] == [member]
            ctx.verified.add((11, v[11]))
            assignment = b"\x00\x00coverage"
            r = w.call(14, v[14], group_id=group, generation_id=gen, member_id=member, group_instance_id=None,
                       protocol_type="consumer", protocol_name="range",
                       assignments=[{"member_id": member, "assignment": assignment}])
            ok(r.error_code, f"SyncGroup v{v[14]}")
            assert r.assignment == assignment
            ctx.verified.add((14, v[14]))
            r = w.call(12, v[12], group_id=group, generation_id=gen, member_id=member, group_instance_id=None)
            ok(r.error_code, f"Heartbeat v{v[12]}")
            ctx.verified.add((12, v[12]))
            if v[8] == 0:  # v0 carries no membership: Kafka refuses it for a group with members ...
                r = w.call(8, 0, group_id=group, topics=[{"name": topic, "partitions": [
                    {"partition_index": 0, "committed_offset": 1, "committed_metadata": "m"}]}])
                assert int(r.topics[0].partitions[0].error_code) == 25, "OffsetCommit v0: UNKNOWN_MEMBER_ID"
                simple = _name("simple")  # ... and stores it for a group nobody joined (simple consumers)
                r = w.call(8, 0, group_id=simple, topics=[{"name": topic, "partitions": [
                    {"partition_index": 0, "committed_offset": 7, "committed_metadata": None}]}])
                ok(r.topics[0].partitions[0].error_code, "OffsetCommit v0 (simple group)")
                assert offset_fetch(ctx, w, simple, topic, v[9]) == 7, f"OffsetFetch v{v[9]} (simple group)"
                ctx.verified.add((8, 0))
                v[8] = ctx.versions(8)[1]  # the member's own commit below needs membership
            r = w.call(8, v[8], group_id=group, generation_id_or_member_epoch=gen, member_id=member,
                       group_instance_id=None, retention_time=-1,
                       topics=[{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 5 + i,
                                                               "committed_leader_epoch": -1,
                                                               "committed_metadata": "m"}]}])
            ok(r.topics[0].partitions[0].error_code, f"OffsetCommit v{v[8]}")
            ctx.verified.add((8, v[8]))
            assert offset_fetch(ctx, w, group, topic, v[9]) == 5 + i, f"OffsetFetch v{v[9]}"
            ctx.verified.add((9, v[9]))
            r = w.call(15, v[15], groups=[group], include_authorized_operations=False)
            (g,) = r.groups
            ok(g.error_code, f"DescribeGroups v{v[15]}")
            assert (g.group_state, g.protocol_type, g.protocol_data) == ("Stable", "consumer", "range")
            assert [m.member_id for m in g.members] == [member]
            ctx.verified.add((15, v[15]))
            r = w.call(16, v[16], states_filter=[], types_filter=[])
            ok(r.error_code, f"ListGroups v{v[16]}")
            assert group in {x.group_id for x in r.groups}
            ctx.verified.add((16, v[16]))
            r = w.call(13, v[13], group_id=group, member_id=member,
                       members=[{"member_id": member, "group_instance_id": None, "reason": "done"}])
            ok(r.error_code, f"LeaveGroup v{v[13]}")
            ctx.verified.add((13, v[13]))
            r = w.call(15, ctx.latest(15), groups=[group])
            assert r.groups[0].group_state == "Empty", "a group whose only member left is Empty"
            r = w.call(47, v[47], group_id=group, topics=[{"name": topic, "partitions": [{"partition_index": 0}]}])
            ok(r.error_code, f"OffsetDelete v{v[47]}")
            ok(r.topics[0].partitions[0].error_code, f"OffsetDelete v{v[47]} partition")
            assert offset_fetch(ctx, w, group, topic) == -1, "the offset is gone after OffsetDelete"
            ctx.verified.add((47, v[47]))
            r = w.call(42, v[42], groups_names=[group])
            ok(r.results[0].error_code, f"DeleteGroups v{v[42]}")
            r = w.call(16, ctx.latest(16))
            assert group not in {x.group_id for x in r.groups}, "a deleted group is not listed"
            ctx.verified.add((42, v[42]))
    finally:
        w.close()


@sweep("DescribeConfigs")
def sweep_describe_configs(ctx: Ctx) -> None:
    w = ctx.wire()
    try:
        name = _name("cfg")
        create_topic(ctx, w, name, configs={"retention.ms": "123456789", "cleanup.policy": "compact"})
        for v in ctx.versions(32):
            r = w.call(32, v, resources=[{"resource_type": 2, "resource_name": name, "configuration_keys": None}],
                       include_synonyms=False, include_documentation=False)
            (res,) = r.results
            ok(res.error_code, f"DescribeConfigs v{v}")
            got = {c.name: c.value for c in res.configs}
            assert got["retention.ms"] == "123456789" and got["cleanup.policy"] == "compact", f"v{v}"
            r = w.call(32, v, resources=[{"resource_type": 2, "resource_name": name,
                                          "configuration_keys": ["retention.ms"]}])
            assert [c.name for c in r.results[0].configs] == ["retention.ms"], "configuration_keys filters"
            ctx.verified.add((32, v))
    finally:
        w.close()


@sweep("AlterConfigs+IncrementalAlterConfigs")
def sweep_alter_configs(ctx: Ctx) -> None:
    w = ctx.wire()

    def described(name: str) -> dict[str, tuple[str, int]]:
        r = w.call(32, ctx.latest(32), resources=[{"resource_type": 2, "resource_name": name,
                                                   "configuration_keys": None}],
                   include_synonyms=False, include_documentation=False)
        return {c.name: (c.value, int(c.config_source)) for c in r.results[0].configs}

    try:
        name = _name("alter")
        create_topic(ctx, w, name)
        for v in ctx.versions(33):  # legacy AlterConfigs: the topic's configs become exactly those given
            r = w.call(33, v, resources=[{"resource_type": 2, "resource_name": name, "configs": [
                {"name": "retention.ms", "value": str(1000 + v)}]}], validate_only=False)
            ok(r.responses[0].error_code, f"AlterConfigs v{v}")
            assert described(name)["retention.ms"] == (str(1000 + v), 1), f"AlterConfigs v{v}"
            r = w.call(33, v, resources=[{"resource_type": 2, "resource_name": name, "configs": [
                {"name": "retention.ms", "value": "never"}]}], validate_only=False)
            assert int(r.responses[0].error_code) == 40, "a bad value must be INVALID_CONFIG"
            ctx.verified.add((33, v))
        for v in ctx.versions(44):
            r = w.call(44, v, resources=[{"resource_type": 2, "resource_name": name, "configs": [
                {"name": "cleanup.policy", "config_operation": 2, "value": "compact"},
                {"name": "retention.ms", "config_operation": 1, "value": None}]}], validate_only=False)
            ok(r.responses[0].error_code, f"IncrementalAlterConfigs v{v}")
            got = described(name)
            assert got["cleanup.policy"] == ("delete,compact", 1) and got["retention.ms"][1] == 5, f"v{v}"
            r = w.call(44, v, resources=[{"resource_type": 2, "resource_name": name, "configs": [
                {"name": "cleanup.policy", "config_operation": 3, "value": "compact"}]}], validate_only=False)
            ok(r.responses[0].error_code, f"IncrementalAlterConfigs v{v} SUBTRACT")
            assert described(name)["cleanup.policy"] == ("delete", 1), f"v{v}"
            ctx.verified.add((44, v))
    finally:
        w.close()


@sweep("CreatePartitions")
def sweep_create_partitions(ctx: Ctx) -> None:
    w = ctx.wire()
    try:
        name = _name("cp")
        create_topic(ctx, w, name, partitions=1)
        count = 1
        for v in ctx.versions(37):
            count += 1
            r = w.call(37, v, topics=[{"name": name, "count": count, "assignments": None}], timeout=30000,
                       validate_only=False)
            ok(r.results[0].error_code, f"CreatePartitions v{v}")
            wait_for(lambda c=count: len(metadata(ctx, w, name)[1].partitions) == c, f"{count} partitions")
            r = w.call(37, v, topics=[{"name": name, "count": 1, "assignments": None}], timeout=30000)
            assert int(r.results[0].error_code) == 37, "shrinking must be INVALID_PARTITIONS"
            ctx.verified.add((37, v))
    finally:
        w.close()


@sweep("DeleteRecords")
def sweep_delete_records(ctx: Ctx) -> None:
    w = ctx.wire()
    try:
        name = _name("dr")
        create_topic(ctx, w, name)
        recs = [(None, f"r{i}".encode()) for i in range(10)]
        r = w.call(0, ctx.latest(0), acks=-1, timeout=30000,
                   topic_data=[{"name": name, "partition_data": [{"index": 0, "records": batch(recs, 0)}]}])
        ok(r.responses[0].partition_responses[0].error_code, "Produce")
        before = 0
        for v in ctx.versions(21):
            before += 2
            r = w.call(21, v, topics=[{"name": name, "partitions": [{"partition_index": 0, "offset": before}]}],
                       timeout=30000)
            p = r.topics[0].partitions[0]
            ok(p.error_code, f"DeleteRecords v{v}")
            assert p.low_watermark == before
            r = w.call(2, ctx.latest(2), replica_id=-1,
                       topics=[{"name": name, "partitions": [{"partition_index": 0, "timestamp": -2,
                                                             "current_leader_epoch": -1}]}])
            assert r.topics[0].partitions[0].offset == before, "earliest follows the low watermark"
            ctx.verified.add((21, v))
    finally:
        w.close()


@sweep("InitProducerId (idempotent)")
def sweep_init_producer_id(ctx: Ctx) -> None:
    w = ctx.wire()
    try:
        name = _name("idem")
        create_topic(ctx, w, name)
        for v in ctx.versions(22):
            r = w.call(22, v, transactional_id=None, transaction_timeout=60000, producer_id=-1, producer_epoch=-1)
            ok(r.error_code, f"InitProducerId v{v}")
            assert r.producer_id >= 0 and r.producer_epoch >= 0
            # The id is usable: a sequenced batch is accepted, and the same batch again is a duplicate
            # that is not written twice.
            data = batch([(b"k", f"idem{v}".encode())], 0, pid=r.producer_id, epoch=r.producer_epoch, seq=0)
            offs = []
            for _ in range(2):
                p = w.call(0, ctx.latest(0), acks=-1, timeout=30000, topic_data=[
                    {"name": name, "partition_data": [{"index": 0, "records": data}]}]).responses[0]
                ok(p.partition_responses[0].error_code, "idempotent Produce")
                offs.append(p.partition_responses[0].base_offset)
            assert offs[0] == offs[1], f"a retried idempotent batch was written twice at {offs}"
            ctx.verified.add((22, v))
    finally:
        w.close()


def _fetch_committed(ctx: Ctx, w: Wire, name: str) -> list[bytes | None]:
    """What a read_committed consumer reads from partition 0: fetches from offset 0 up to the last
    stable offset (a broker may answer each fetch with less than max_bytes allows), dropping the
    records of the aborted transactions the broker lists."""
    topic_id = ctx.topic_ids.get(name) or metadata(ctx, w, name)[1].topic_id
    values: list[bytes | None] = []
    aborted: set[tuple[int, int]] = set()
    skip: set[int] = set()
    offset, lso = 0, None
    for _ in range(100):
        r = w.call(1, ctx.latest(1), replica_id=-1, replica_state={"replica_id": -1, "replica_epoch": -1},
                   max_wait=100, min_bytes=1, max_bytes=1 << 20, isolation_level=1, session_id=0, session_epoch=-1,
                   topics=[{"topic": name, "topic_id": topic_id,
                            "partitions": [{"partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 20,
                                            "current_leader_epoch": -1, "last_fetched_epoch": -1,
                                            "log_start_offset": -1}]}])
        p = r.responses[0].partitions[0]
        ok(p.error_code, "read_committed Fetch")
        lso = p.last_stable_offset
        aborted |= {(a.producer_id, a.first_offset) for a in (p.aborted_transactions or ())}
        mr = MemoryRecords(bytes(p.records or b""))
        progressed = False
        while mr.has_next():
            b = mr.next_batch()
            if b is None:
                break
            progressed = True
            offset = b.next_offset
            if getattr(b, "is_control_batch", False):  # message format v0/v1 (Fetch v0-3) has none
                skip.discard(b.producer_id)
                continue
            if any(pid == b.producer_id and first <= b.base_offset for pid, first in aborted):
                skip.add(b.producer_id)
            if b.producer_id not in skip:
                values += [rec.value for rec in b]
        if not progressed or offset >= lso:
            break
    return values


@sweep("transactions")
def sweep_transactions(ctx: Ctx) -> None:
    keys = (22, 24, 25, 26, 28)
    w = ctx.wire()
    try:
        topic = _name("txn")
        create_topic(ctx, w, topic)
        rounds = max(len(ctx.versions(k)) for k in keys)
        expected: list[bytes | None] = []
        for i in range(rounds):
            v = {k: _pick(ctx, k, i) for k in keys}
            tid, group = _name(f"tid{i}"), _name(f"tg{i}")
            commit = i % 2 == 0
            find_coordinator(ctx, w, tid, 1, ctx.latest(10))
            r = w.call(22, v[22], transactional_id=tid, transaction_timeout=60000, producer_id=-1, producer_epoch=-1)
            ok(r.error_code, f"InitProducerId v{v[22]} (transactional)")
            pid, epoch = r.producer_id, r.producer_epoch
            if v[24] >= 4:  # KIP-890's batched form, as partition leaders send it; Kafka answers any sender
                r = w.call(24, v[24], transactions=[{"transactional_id": tid, "producer_id": pid,
                                                     "producer_epoch": epoch, "verify_only": False,
                                                     "topics": [{"name": topic, "partitions": [0]}]}])
                ok(r.error_code, f"AddPartitionsToTxn v{v[24]}")
                (res,) = r.results_by_transaction
                assert res.transactional_id == tid
                ok(res.topic_results[0].results_by_partition[0].partition_error_code, f"AddPartitionsToTxn v{v[24]}")
            else:
                r = w.call(24, v[24], v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid,
                           v3_and_below_producer_epoch=epoch,
                           v3_and_below_topics=[{"name": topic, "partitions": [0]}])
                ok(r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code,
                   f"AddPartitionsToTxn v{v[24]}")
            values = [f"txn{i}-{j}".encode() for j in range(3)]
            r = w.call(0, ctx.latest(0), transactional_id=tid, acks=-1, timeout=30000, topic_data=[
                {"name": topic, "partition_data": [{"index": 0, "records": batch(
                    [(None, x) for x in values], 0, pid=pid, epoch=epoch, seq=0, transactional=True)}]}])
            ok(r.responses[0].partition_responses[0].error_code, "transactional Produce")
            r = w.call(25, v[25], transactional_id=tid, producer_id=pid, producer_epoch=epoch, group_id=group)
            ok(r.error_code, f"AddOffsetsToTxn v{v[25]}")
            find_coordinator(ctx, w, group, 0, ctx.latest(10))
            r = w.call(28, v[28], transactional_id=tid, group_id=group, producer_id=pid, producer_epoch=epoch,
                       generation_id=-1, member_id="", group_instance_id=None,
                       topics=[{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 7,
                                                               "committed_leader_epoch": -1,
                                                               "committed_metadata": ""}]}])
            ok(r.topics[0].partitions[0].error_code, f"TxnOffsetCommit v{v[28]}")
            r = w.call(26, v[26], transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=commit)
            ok(r.error_code, f"EndTxn v{v[26]}")
            if commit:
                expected += values
            wait_for(lambda want=list(expected): _fetch_committed(ctx, w, topic) == want,
                     f"read_committed to see the committed records only (round {i}, {'commit' if commit else 'abort'})")
            want = 7 if commit else -1
            wait_for(lambda g=group, x=want: offset_fetch(ctx, w, g, topic) == x,
                     f"the transaction's offset commit to be {'visible' if commit else 'dropped'}")
            for k in keys:
                ctx.verified.add((k, v[k]))
            # The admin views of it (KIP-664): ListTransactions, DescribeTransactions, DescribeProducers.
            state = "CompleteCommit" if commit else "CompleteAbort"
            for lv in ctx.versions(66):
                r = w.call(66, lv, state_filters=[], producer_id_filters=[], duration_filter=-1)
                ok(r.error_code, f"ListTransactions v{lv}")
                assert {x.transactional_id: x.transaction_state for x in r.transaction_states}.get(tid) == state
                ctx.verified.add((66, lv))
            for dv in ctx.versions(65):
                r = w.call(65, dv, transactional_ids=[tid])
                (s,) = r.transaction_states
                ok(s.error_code, f"DescribeTransactions v{dv}")
                assert (s.transaction_state, s.producer_id) == (state, pid)
                ctx.verified.add((65, dv))
            for pv in ctx.versions(61):
                r = w.call(61, pv, topics=[{"name": topic, "partition_indexes": [0]}])
                p = r.topics[0].partitions[0]
                ok(p.error_code, f"DescribeProducers v{pv}")
                assert pid in {x.producer_id for x in p.active_producers}
                ctx.verified.add((61, pv))
    finally:
        w.close()


@sweep("WriteTxnMarkers")
def sweep_write_txn_markers(ctx: Ctx) -> None:
    """The marker a transaction coordinator writes, sent directly: it completes an open transaction on
    the partition, so read_committed readers see its records."""
    w = ctx.wire()
    try:
        topic = _name("wtm")
        create_topic(ctx, w, topic)
        committed: list[bytes] = []  # by the earlier versions' rounds
        for v in ctx.versions(27):
            tid = _name("wtm-tid")
            find_coordinator(ctx, w, tid, 1, ctx.latest(10))
            r = w.call(22, ctx.latest(22), transactional_id=tid, transaction_timeout=60000, producer_id=-1,
                       producer_epoch=-1)
            pid, epoch = r.producer_id, r.producer_epoch
            r = w.call(24, 3, v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid,
                       v3_and_below_producer_epoch=epoch, v3_and_below_topics=[{"name": topic, "partitions": [0]}])
            ok(r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code, "AddPartitionsToTxn")
            values = [f"wtm{v}".encode()]
            r = w.call(0, ctx.latest(0), transactional_id=tid, acks=-1, timeout=30000, topic_data=[
                {"name": topic, "partition_data": [{"index": 0, "records": batch(
                    [(None, x) for x in values], 0, pid=pid, epoch=epoch, seq=0, transactional=True)}]}])
            ok(r.responses[0].partition_responses[0].error_code, "transactional Produce")
            assert _fetch_committed(ctx, w, topic) == committed, "an open transaction is invisible to read_committed"
            r = w.call(27, v, markers=[{"producer_id": pid, "producer_epoch": epoch, "transaction_result": True,
                                        "topics": [{"name": topic, "partition_indexes": [0]}],
                                        "coordinator_epoch": 0}])
            ok(r.markers[0].topics[0].partitions[0].error_code, f"WriteTxnMarkers v{v}")
            committed += values
            wait_for(lambda x=list(committed): _fetch_committed(ctx, w, topic) == x,
                     "the commit marker to expose the records")
            ctx.verified.add((27, v))
    finally:
        w.close()


@sweep("KIP-890 transaction verification")
def sweep_txn_verification(ctx: Ctx) -> None:
    """AddPartitionsToTxn v4+ with verify_only (what a partition leader asks the coordinator), and the
    leader's own check on Produce: a transactional batch for a partition not in the transaction is
    refused, with TRANSACTION_ABORTABLE only for versions that know it."""
    w = ctx.wire()
    try:
        topic = _name("kip890")
        create_topic(ctx, w, topic)
        tid = _name("kip890-tid")
        find_coordinator(ctx, w, tid, 1, ctx.latest(10))
        r = w.call(22, ctx.latest(22), transactional_id=tid, transaction_timeout=60000, producer_id=-1,
                   producer_epoch=-1)
        ok(r.error_code, "InitProducerId")
        pid, epoch = r.producer_id, r.producer_epoch

        def verify(v: int) -> int:
            r = w.call(24, v, transactions=[{"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch,
                                             "verify_only": True, "topics": [{"name": topic, "partitions": [0]}]}])
            ok(r.error_code, f"AddPartitionsToTxn v{v} verify_only")
            return int(r.results_by_transaction[0].topic_results[0].results_by_partition[0].partition_error_code)

        def produce(v: int) -> int:
            r = w.call(0, v, transactional_id=tid, acks=-1, timeout=30000, topic_data=[
                {"name": topic, "partition_data": [{"index": 0, "records": batch(
                    [(None, b"x")], 0, pid=pid, epoch=epoch, seq=0, transactional=True)}]}])
            return int(r.responses[0].partition_responses[0].error_code)

        batched = [v for v in ctx.versions(24) if v >= 4]
        for v in batched:
            want = 120 if v >= 5 else 48  # TRANSACTION_ABORTABLE from v5; INVALID_TXN_STATE before
            assert verify(v) == want, f"AddPartitionsToTxn v{v}: a partition not in the transaction"
        assert produce(ctx.latest(0)) == (120 if ctx.latest(0) >= 11 else 48), "Produce outside the transaction"
        assert produce(min(10, ctx.latest(0))) == 48, "Produce v10 and older get INVALID_TXN_STATE"
        r = w.call(24, 3, v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid,
                   v3_and_below_producer_epoch=epoch, v3_and_below_topics=[{"name": topic, "partitions": [0]}])
        ok(r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code, "AddPartitionsToTxn")
        for v in batched:
            assert verify(v) == 0, f"AddPartitionsToTxn v{v}: the partition is in the transaction now"
            ctx.verified.add((24, v))
        ok(produce(ctx.latest(0)), "Produce inside the transaction")
        r = w.call(26, ctx.latest(26), transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=False)
        ok(r.error_code, "EndTxn")
    finally:
        w.close()


@sweep("consumer group (KIP-848)")
def sweep_consumer_group_protocol(ctx: Ctx) -> None:
    w = ctx.wire()
    try:
        topic = _name("cgp")
        create_topic(ctx, w, topic, partitions=2)
        topic_id = ctx.topic_ids.get(topic) or metadata(ctx, w, topic)[1].topic_id
        rounds = max(len(ctx.versions(68)), len(ctx.versions(69)))
        for i in range(rounds):
            hv, dv = _pick(ctx, 68, i), _pick(ctx, 69, i)
            group = _name(f"cg{i}")
            member = str(uuid.uuid4()) if hv is not None and hv >= 1 else ""
            find_coordinator(ctx, w, group, 0, ctx.latest(10))
            epoch, owned = 0, []
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                r = w.call(68, hv, group_id=group, member_id=member, member_epoch=epoch, instance_id=None,
                           rack_id=None, rebalance_timeout=10000 if epoch == 0 else -1,
                           subscribed_topic_names=[topic] if epoch == 0 else None, subscribed_topic_regex=None,
                           server_assignor=None, topic_partitions=[] if epoch == 0 else
                           [{"topic_id": topic_id, "partitions": owned}])
                if int(r.error_code) == ErrorCode.coordinator_load_in_progress:  # retriable, as clients treat it:
                    time.sleep(0.1)  # the offsets partitions load right after the broker starts listening
                    continue
                ok(r.error_code, f"ConsumerGroupHeartbeat v{hv}: {r.error_message}")
                member, epoch = r.member_id, r.member_epoch
                if r.assignment is not None:
                    owned = sorted(p for tp in r.assignment.topic_partitions for p in tp.partitions)
                if owned == [0, 1]:
                    break
                time.sleep(0.2)
            assert member and epoch >= 1 and owned == [0, 1], f"member {member!r} epoch {epoch} owns {owned}"
            ctx.verified.add((68, hv))
            r = w.call(69, dv, group_ids=[group], include_authorized_operations=False)
            (g,) = r.groups
            ok(g.error_code, f"ConsumerGroupDescribe v{dv}")
            assert g.group_state in ("stable", "Stable", "STABLE"), g.group_state
            (m,) = g.members
            assert m.member_id == member and m.subscribed_topic_names == (topic,)
            assert sorted(p for tp in m.assignment.topic_partitions for p in tp.partitions) == [0, 1]
            ctx.verified.add((69, dv))
            r = w.call(68, hv, group_id=group, member_id=member, member_epoch=-1)  # leave
            ok(r.error_code, "ConsumerGroupHeartbeat leave")
    finally:
        w.close()


@sweep("client quotas and telemetry")
def sweep_quotas_and_telemetry(ctx: Ctx) -> None:
    """Alter/DescribeClientQuotas (stored), a CLIENT_METRICS subscription, then GetTelemetrySubscriptions,
    PushTelemetry and ListClientMetricsResources as KIP-714 describes them."""
    w = ctx.wire()
    try:
        for v in ctx.versions(49):  # AlterClientQuotas, then DescribeClientQuotas reads it back
            client = _name(f"quota{v}")
            entity = [{"entity_type": "client-id", "entity_name": client}]
            r = w.call(49, v, entries=[{"entity": entity, "ops": [
                {"key": "producer_byte_rate", "value": 1024.0 * (v + 1), "remove": False}]}], validate_only=False)
            (e,) = r.entries
            ok(e.error_code, f"AlterClientQuotas v{v}: {e.error_message}")
            ctx.verified.add((49, v))
            for dv in ctx.versions(48):
                r = w.call(48, dv, components=[{"entity_type": "client-id", "match_type": 0, "match": client}],
                           strict=True)
                ok(r.error_code, f"DescribeClientQuotas v{dv}: {r.error_message}")
                (d,) = r.entries
                assert [(x.entity_type, x.entity_name) for x in d.entity] == [("client-id", client)]
                assert [(x.key, x.value) for x in d.values] == [("producer_byte_rate", 1024.0 * (v + 1))]
                ctx.verified.add((48, dv))
            r = w.call(49, v, entries=[{"entity": entity, "ops": [
                {"key": "producer_byte_rate", "value": 0.0, "remove": True}]}], validate_only=False)
            ok(r.entries[0].error_code, f"AlterClientQuotas v{v} remove")
        sub = _name("metrics")
        r = w.call(44, ctx.latest(44), resources=[{"resource_type": 16, "resource_name": sub, "configs": [
            {"name": "metrics", "config_operation": 0, "value": "org.apache.kafka.producer."},
            {"name": "interval.ms", "config_operation": 0, "value": "60000"}]}], validate_only=False)
        ok(r.responses[0].error_code, f"IncrementalAlterConfigs CLIENT_METRICS: {r.responses[0].error_message}")
        for v in ctx.versions(74):
            r = w.call(74, v)
            ok(r.error_code, f"ListClientMetricsResources v{v}")
            assert sub in [c.resource_name for c in r.config_resources]
            ctx.verified.add((74, v))
        for v in ctx.versions(71):
            r = w.call(71, v, client_instance_id=uuid.UUID(int=0))
            ok(r.error_code, f"GetTelemetrySubscriptions v{v}")
            instance, subscription = r.client_instance_id, r.subscription_id
            assert instance != uuid.UUID(int=0) and "org.apache.kafka.producer." in r.requested_metrics
            assert int(r.push_interval.total_seconds() * 1000) == 60000
            ctx.verified.add((71, v))
            for pv in ctx.versions(72):
                r = w.call(72, pv, client_instance_id=instance, subscription_id=subscription, terminating=False,
                           compression_type=0, metrics=b"")
                ok(r.error_code, f"PushTelemetry v{pv}")
                r = w.call(72, pv, client_instance_id=instance, subscription_id=subscription + 1, terminating=True,
                           compression_type=0, metrics=b"")
                assert int(r.error_code) == 117, f"PushTelemetry with a stale subscription id: {int(r.error_code)}"
                ctx.verified.add((72, pv))
        r = w.call(44, ctx.latest(44), resources=[{"resource_type": 16, "resource_name": sub, "configs": [
            {"name": "metrics", "config_operation": 1, "value": None},
            {"name": "interval.ms", "config_operation": 1, "value": None}]}], validate_only=False)
        ok(r.responses[0].error_code, "IncrementalAlterConfigs CLIENT_METRICS delete")
    finally:
        w.close()


@sweep("cluster-shaped APIs")
def sweep_cluster_apis(ctx: Ctx) -> None:
    """DescribeCluster, DescribeTopicPartitions, DescribeLogDirs, AlterReplicaLogDirs, ElectLeaders,
    Alter/ListPartitionReassignments, OffsetForLeaderEpoch: Kafka's single-node answers."""
    w = ctx.wire()
    try:
        name = _name("cluster")
        create_topic(ctx, w, name, partitions=3)
        for v in ctx.versions(60):  # DescribeCluster
            r = w.call(60, v, include_cluster_authorized_operations=True, endpoint_type=1)
            ok(r.error_code, f"DescribeCluster v{v}")
            assert [(b.broker_id, b.port) for b in r.brokers] == [(ctx.node_id, ctx.broker.port)]
            assert r.controller_id == ctx.node_id and r.cluster_authorized_operations == 8096
            ctx.verified.add((60, v))
        for v in ctx.versions(75):  # DescribeTopicPartitions: pages follow the cursor
            r = w.call(75, v, topics=[{"name": name}], response_partition_limit=2, cursor=None)
            (t,) = r.topics
            ok(t.error_code, f"DescribeTopicPartitions v{v}")
            assert [p.partition_index for p in t.partitions] == [0, 1] and t.topic_authorized_operations == 3576
            assert (r.next_cursor.topic_name, r.next_cursor.partition_index) == (name, 2)
            r = w.call(75, v, topics=[{"name": name}], response_partition_limit=2,
                       cursor={"topic_name": name, "partition_index": 2})
            assert [p.partition_index for p in r.topics[0].partitions] == [2] and r.next_cursor is None
            ctx.verified.add((75, v))
        r = w.call(0, ctx.latest(0), transactional_id=None, acks=-1, timeout=30000, topic_data=[
            {"name": name, "partition_data": [{"index": 0, "records": batch([(None, b"x")] * 3, 0)}]}])
        ok(r.responses[0].partition_responses[0].error_code, "Produce")
        log_dir = ""
        for v in ctx.versions(35):  # DescribeLogDirs
            r = w.call(35, v, topics=[{"topic": name, "partitions": [0]}])
            parts = [(x.log_dir, p) for x in r.results for t in x.topics if t.name == name for p in t.partitions]
            ((log_dir, p),) = parts
            assert p.partition_index == 0 and p.partition_size > 0 and p.offset_lag == 0 and not p.is_future_key
            if v >= 4:
                assert all(x.total_bytes > 0 for x in r.results)
            ctx.verified.add((35, v))
        for v in ctx.versions(34):  # AlterReplicaLogDirs: where it is already, and to no log dir
            r = w.call(34, v, dirs=[{"path": log_dir, "topics": [{"name": name, "partitions": [0]}]},
                                    {"path": "/no/such/log/dir", "topics": [{"name": name, "partitions": [1]}]}])
            got = {p.partition_index: int(p.error_code) for t in r.results for p in t.partitions}
            assert got == {0: 0, 1: 57}, got
            ctx.verified.add((34, v))
        for v in ctx.versions(43):  # ElectLeaders: the preferred leader already leads
            r = w.call(43, v, election_type=0, topic_partitions=[{"topic": name, "partitions": [0]}], timeout=30000)
            assert int(r.replica_election_results[0].partition_result[0].error_code) == 84, f"ElectLeaders v{v}"
            ctx.verified.add((43, v))
        for v in ctx.versions(45):  # AlterPartitionReassignments: to the same broker is a no-op
            r = w.call(45, v, timeout=30000, topics=[{"name": name, "partitions": [
                {"partition_index": 0, "replicas": [ctx.node_id]}, {"partition_index": 1, "replicas": None}]}])
            ok(r.error_code, f"AlterPartitionReassignments v{v}")
            assert [int(p.error_code) for p in r.responses[0].partitions] == [0, 85]
            ctx.verified.add((45, v))
        for v in ctx.versions(46):  # ListPartitionReassignments: none in progress
            r = w.call(46, v, timeout=30000, topics=None)
            ok(r.error_code, f"ListPartitionReassignments v{v}")
            assert r.topics == ()
            ctx.verified.add((46, v))
        for v in ctx.versions(23):  # OffsetForLeaderEpoch: the latest epoch ends at the log end
            r = w.call(23, v, replica_id=-1, topics=[{"topic": name, "partitions": [
                {"partition": 0, "current_leader_epoch": 0, "leader_epoch": 0},
                {"partition": 1, "current_leader_epoch": -1, "leader_epoch": -1}]}])
            p0, p1 = r.topics[0].partitions
            ok(p0.error_code, f"OffsetForLeaderEpoch v{v}")
            assert p0.end_offset == 3 and p1.end_offset == -1
            if v >= 1:  # v0 answers the end offset only
                assert p0.leader_epoch == 0 and p1.leader_epoch == -1
            ctx.verified.add((23, v))
    finally:
        w.close()


@sweep("security APIs on a PLAINTEXT listener without an authorizer")
def sweep_security(ctx: Ctx) -> None:
    """What Kafka answers when these reach a broker with no SASL on the listener and no authorizer:
    ILLEGAL_SASL_STATE for the SASL exchange (KafkaApis), SECURITY_DISABLED for the ACL APIs. Logins and
    ACL management themselves are the compat suite's security scenarios (SASL listener, authorizer)."""
    w = ctx.wire()
    try:
        for v in ctx.versions(17):
            r = w.call(17, v, mechanism="PLAIN")
            assert int(r.error_code) == 34, f"SaslHandshake v{v}: {r.error_code}"  # ILLEGAL_SASL_STATE
            ctx.verified.add((17, v))
        for v in ctx.versions(36):
            r = w.call(36, v, auth_bytes=b"\x00user\x00pass")
            assert int(r.error_code) == 34, f"SaslAuthenticate v{v}: {r.error_code}"
            ctx.verified.add((36, v))
        for v in ctx.versions(29):
            r = w.call(29, v, resource_type_filter=2, resource_name_filter=None, pattern_type_filter=1,
                       principal_filter=None, host_filter=None, operation=1, permission_type=1)
            assert int(r.error_code) == 54 and r.resources == (), f"DescribeAcls v{v}"  # SECURITY_DISABLED
            ctx.verified.add((29, v))
        for v in ctx.versions(30):
            r = w.call(30, v, creations=[{"resource_type": 2, "resource_name": "t", "resource_pattern_type": 3,
                                          "principal": "User:alice", "host": "*", "operation": 3,
                                          "permission_type": 3}])
            assert [int(x.error_code) for x in r.results] == [54], f"CreateAcls v{v}"
            ctx.verified.add((30, v))
        for v in ctx.versions(31):
            r = w.call(31, v, filters=[{"resource_type_filter": 2, "resource_name_filter": None,
                                        "pattern_type_filter": 1, "principal_filter": None, "host_filter": None,
                                        "operation": 1, "permission_type": 1}])
            assert [int(x.error_code) for x in r.filter_results] == [54], f"DeleteAcls v{v}"
            ctx.verified.add((31, v))
    finally:
        w.close()


# --- fixtures and tests ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ctx]:
    b = BrokerProcess(tmp_path_factory.mktemp("coverage"), overrides=dict(SINGLE_NODE_OVERRIDES))
    b.start()
    try:
        c = Ctx(b, api_versions(b.bootstrap))
        w = c.wire()
        try:
            node = w.call(3, c.latest(3), topics=[]).brokers[0].node_id
        finally:
            w.close()
        c.node_id = node
        yield c
    finally:
        b.kill()


@pytest.mark.parametrize("name", list(SWEEPS))
def test_direct_protocol(ctx: Ctx, name: str) -> None:
    """Each advertised version of these APIs, spoken directly and checked against Kafka's behaviour."""
    ctx.run(name)


def _compat_coverage() -> tuple[set[tuple[int, int]], list[str]]:
    """(api_key, version) pairs the compat suite's clients sent, and which files said so."""
    seen: set[tuple[int, int]] = set()
    sources = []
    if COMPAT_COVERAGE.exists():
        doc = json.loads(COMPAT_COVERAGE.read_text())
        for k, vs in doc["exercised"].items():
            seen |= {(int(k), int(v)) for v in vs}
        sources.append(f"{COMPAT_COVERAGE.relative_to(REPO)} (from {doc.get('generated_from')})")
    runs = sorted(COMPAT_RESULTS.glob("*.json")) if COMPAT_RESULTS.is_dir() else []
    for path in reversed(runs):  # the newest local run against a suite-started pykbroker
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            continue
        if doc.get("broker", {}).get("managed") and doc.get("requests"):
            seen |= {(r["api_key"], r["api_version"]) for r in doc["requests"]
                     if not r["client_id"].startswith("compat-probe")}
            sources.append(str(path.relative_to(REPO)))
            break
    return seen, sources


def test_every_advertised_version_is_exercised(ctx: Ctx) -> None:
    for name in SWEEPS:  # runs any sweep not run yet (e.g. under -k); failures count as not exercised
        try:
            ctx.run(name)
        except BaseException:
            pass
    compat, sources = _compat_coverage()
    advertised = {(k, v) for k, (lo, hi) in ctx.advertised.items() for v in range(lo, hi + 1)}
    untested = sorted(advertised - compat - ctx.verified)
    if untested:
        by_key: dict[int, list[int]] = {}
        for k, v in untested:
            by_key.setdefault(k, []).append(v)
        lines = [f"  {api_name(k)} ({k}): v{', v'.join(map(str, vs))}" for k, vs in sorted(by_key.items())]
        failed = [n for n, e in ctx.outcomes.items() if e is not None]
        pytest.fail(
            "advertised in ApiVersions but exercised neither by the compat suite's clients "
            f"({', '.join(sources) or 'no compat coverage found: run pytest compat and python -m compat.report'}) "
            "nor by a passing direct protocol test:\n" + "\n".join(lines)
            + (f"\n(direct tests that failed: {', '.join(failed)})" if failed else ""),
            pytrace=False)
