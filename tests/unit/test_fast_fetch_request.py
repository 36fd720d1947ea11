"""The FetchRequest pre-pass (pykbroker.protocol.fast_fetch_request) against the generic one and kio.

For random valid requests of every covered version it must accept what kio encoded (unless a
partition carries a tagged field, which it leaves to the generic pass), and on truncated or corrupted
bodies it must never accept what the generic pass rejects or rewrites, nor reject what it accepts.
"""

from __future__ import annotations

import datetime
import struct
import uuid
from dataclasses import fields
from importlib import import_module
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pykbroker.config import BrokerConfig
from pykbroker.protocol import codec
from pykbroker.protocol.bounds import BoundsError, check_request
from pykbroker.protocol.fast_fetch_request import FIRST_VERSION, LAST_VERSION, check_fetch_request
from pykbroker.protocol.framing import CloseConnection
from pykbroker.server.broker import Broker

VERSIONS = range(FIRST_VERSION, LAST_VERSION + 1)

i8 = st.integers(-(1 << 7), (1 << 7) - 1)
i32 = st.integers(-(1 << 31), (1 << 31) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
maybe_uuid = st.one_of(st.none(), st.uuids())
name = st.text(max_size=40)


def _module(version: int) -> Any:
    return import_module(f"kio.schema.fetch.v{version}.request")


def _entity(cls: type, nested: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """A kio entity with every field of its version drawn at random."""
    by_type: dict[str, st.SearchStrategy[Any]] = {
        "int8": i8, "int32": i32, "int64": i64, "uuid": maybe_uuid,
        "timedelta_i32": i32.map(lambda ms: datetime.timedelta(milliseconds=ms)),
    }
    kwargs: dict[str, st.SearchStrategy[Any]] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name in nested:
            kwargs[f.name] = nested[f.name]
        elif f.name == "cluster_id":
            kwargs[f.name] = st.one_of(st.none(), name)
        elif f.metadata.get("kafka_type") == "string":
            kwargs[f.name] = name
        else:
            kwargs[f.name] = by_type[f.metadata["kafka_type"]]
    return st.builds(cls, **kwargs)


def request_of(version: int) -> st.SearchStrategy[Any]:
    mod = _module(version)
    partition = _entity(mod.FetchPartition, {})
    if version == 17:  # a follower's directory id is a tagged field: mostly leave it unset
        partition = st.one_of(partition.map(lambda p: _without_directory(p)), partition)
    topic = _entity(mod.FetchTopic, {"partitions": st.lists(partition, max_size=5).map(tuple)})
    nested: dict[str, st.SearchStrategy[Any]] = {"topics": st.lists(topic, max_size=4).map(tuple)}
    if hasattr(mod, "ForgottenTopic"):
        forgotten = _entity(mod.ForgottenTopic, {"partitions": st.lists(i32, max_size=5).map(tuple)})
        nested["forgotten_topics_data"] = st.lists(forgotten, max_size=3).map(tuple)
    if hasattr(mod, "ReplicaState"):
        nested["replica_state"] = _entity(mod.ReplicaState, {})
    return _entity(mod.FetchRequest, nested)


def _without_directory(p: Any) -> Any:
    return type(p)(**{f.name: getattr(p, f.name) for f in fields(p) if f.name != "replica_directory_id"})


def _has_partition_tags(req: Any) -> bool:
    return any(getattr(p, "replica_directory_id", None) is not None for t in req.topics for p in t.partitions)


def _generic(version: int, buf: bytes, offset: int) -> str:
    try:
        return "same" if check_request(1, version, buf, offset) is buf else "rewritten"
    except BoundsError:
        return "rejected"


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), prefix=st.binary(max_size=8), trailer=st.binary(max_size=8))
def test_valid_requests_are_accepted_and_decode_as_kio_wrote_them(
        version: int, data: st.DataObject, prefix: bytes, trailer: bytes) -> None:
    req = data.draw(request_of(version))
    buf = prefix + codec.encode_entity(req) + trailer
    accepted = check_fetch_request(version, buf, len(prefix))
    assert accepted is not _has_partition_tags(req)
    assert _generic(version, buf, len(prefix)) == "same"
    assert codec.decode_request(1, version, buf, len(prefix)) == req


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_requests_get_the_generic_pass_verdict(version: int, data: st.DataObject) -> None:
    body = bytearray(codec.encode_entity(data.draw(request_of(version))))
    how = data.draw(st.sampled_from(["truncate", "overwrite", "insert"]))
    at = data.draw(st.integers(0, max(len(body) - 1, 0)))
    if how == "truncate":
        del body[at:]
    elif how == "overwrite":
        chunk = data.draw(st.binary(min_size=1, max_size=4))
        body[at:at + len(chunk)] = chunk
    else:
        body[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    buf = bytes(body)
    generic = _generic(version, buf, 0)
    try:
        accepted = check_fetch_request(version, buf, 0)
    except BoundsError:
        assert generic == "rejected"
        return
    if accepted:  # kio then decodes it (or refuses, e.g. bad UTF-8) exactly as after the generic pass
        assert generic == "same"


@pytest.mark.parametrize("version", [4, 12, 16])
def test_ten_thousand_partitions(version: int) -> None:
    mod = _module(version)
    parts = tuple(codec.build(mod.FetchPartition, {"partition": i, "fetch_offset": 20 * i,
                                                   "partition_max_bytes": 1 << 20}) for i in range(10_000))
    topic = codec.build(mod.FetchTopic, {"topic": "t1k", "topic_id": uuid.uuid4(), "partitions": parts})
    req = codec.build(mod.FetchRequest, {"max_wait": datetime.timedelta(milliseconds=500), "min_bytes": 1,
                                         "topics": (topic,), "forgotten_topics_data": ()})
    buf = codec.encode_entity(req)
    assert check_fetch_request(version, buf, 0) is True
    with pytest.raises(BoundsError):  # one byte short
        check_fetch_request(version, buf[:-2 if version >= 12 else -1], 0)


def test_a_huge_claimed_partition_count_is_rejected_without_allocating() -> None:
    head = struct.pack(">iiiibii", -1, 500, 1, 1 << 20, 0, 0, -1)
    topic = b"\x02" + b"\x01" * 16 + b"\xff\xff\xff\xff\x0f"  # one topic claiming 4,294,967,294 partitions
    with pytest.raises(BoundsError):
        check_fetch_request(13, head + topic, 0)


def test_unknown_tagged_fields_are_left_to_the_generic_pass() -> None:
    mod = _module(16)
    req = codec.build(mod.FetchRequest, {"max_wait": datetime.timedelta(milliseconds=5), "min_bytes": 1,
                                         "topics": (), "forgotten_topics_data": (), "cluster_id": "c"})
    body = codec.encode_entity(req)
    assert check_fetch_request(16, body, 0) is True
    # The top-level tagged fields: (tag 0: cluster_id "c"), then an unknown tag 7 Kafka would ignore.
    assert body.endswith(b"\x01\x00\x02\x02c")
    with_unknown = body[:-5] + b"\x02\x00\x02\x02c\x07\x01\xaa"
    assert check_fetch_request(16, with_unknown, 0) is False
    assert _generic(16, with_unknown, 0) == "rewritten"


def _fetch_frame(version: int, body: bytes) -> bytes:
    client = b"unit"
    header = struct.pack(">hhih", 1, version, 9, len(client)) + client + (b"\x00" if version >= 12 else b"")
    return header + body


def test_the_dispatcher_decodes_with_kio_and_closes_on_a_truncated_fetch(tmp_path: Path) -> None:
    b = Broker(BrokerConfig({"log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0"}))
    b.startup()
    try:
        mod = _module(16)
        part = codec.build(mod.FetchPartition, {"partition": 3, "fetch_offset": 7, "partition_max_bytes": 100})
        req = codec.build(mod.FetchRequest, {
            "max_wait": datetime.timedelta(milliseconds=0), "min_bytes": 1, "forgotten_topics_data": (),
            "topics": (codec.build(mod.FetchTopic, {"topic_id": uuid.uuid4(), "partitions": (part,)}),)})
        frame = _fetch_frame(16, codec.encode_entity(req))
        parsed = b.dispatcher.parse(frame)
        assert not isinstance(parsed, bytes)
        assert parsed[1] == req
        out = anyio.run(b.dispatcher.handle, frame)
        assert out  # answered (UNKNOWN_TOPIC_ID for the made-up topic)
        with pytest.raises(CloseConnection):
            anyio.run(b.dispatcher.handle, frame[:-3])
    finally:
        b.log_manager.shutdown()
