"""Request and response classes for the protocol versions below Kafka 4.0's floor.

kio is generated from Kafka 4's schemas, so it has no classes for the oldest versions
Kafka 3.9 still answers (Produce v0-2, Fetch v0-3, ListOffsets v0, ...), which clients
from before Kafka 2.1 send.  All of them are non-flexible, so their wire layout is fully
described by a field list: :data:`LAYOUTS` holds one per (API key, version), written
from the per-version comments of Kafka's schemas.  From each layout this module
synthesizes frozen dataclasses shaped exactly like kio's (``kafka_type`` metadata,
``__flexible__ = False``), so kio's own generic reader and writer, the bounds pre-pass
and :func:`codec.build` handle them unchanged.

Field names and semantic types (durations, error codes) are taken from the oldest kio
class of the same API when it has the field, so handlers read a legacy request exactly
as they read the oldest modern one.  Fields the old version lacks are class attributes
holding Kafka's default (Produce v0-2's ``transactional_id`` is None, Fetch v0-2's
``max_bytes`` is 2^31-1), so ``req.transactional_id`` works on both.  Fields only the
old version has (ListOffsets v0's ``max_num_offsets``, OffsetCommit v1's
``commit_timestamp``, DescribeConfigs v0's ``is_default``) are ordinary fields.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass, make_dataclass
from types import NoneType, UnionType
from typing import Any, Protocol, Union, get_args, get_origin

from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.static.constants import EntityType

__all__ = ["LAYOUTS", "is_legacy", "legacy_versions", "request_class", "response_class", "to_plain"]

# Layout notation: ``name:type`` separated by spaces; types are the wire types i8 i16 i32 i64
# bool str bytes rec (records), a trailing ``?`` for nullable, ``[fields]`` for an array of
# structs and ``[type]`` for an array of primitives.
_PRODUCE_REQ = "acks:i16 timeout:i32 topic_data:[name:str partition_data:[index:i32 records:rec?]]"
_PRODUCE_PART = "index:i32 error_code:i16 base_offset:i64"
_FETCH_PARTS = "topics:[topic:str partitions:[partition:i32 fetch_offset:i64 partition_max_bytes:i32]]"
_FETCH_RESP = "responses:[topic:str partitions:[partition_index:i32 error_code:i16 high_watermark:i64 records:rec?]]"
_COMMIT_RESP = "topics:[name:str partitions:[partition_index:i32 error_code:i16]]"
_CREATE_TOPICS = ("topics:[name:str num_partitions:i32 replication_factor:i16 "
                  "assignments:[partition_index:i32 broker_ids:[i32]] configs:[name:str value:str?]] timeout:i32")
_EPOCH_REQ = "topics:[topic:str partitions:[partition:i32 leader_epoch:i32]]"
_ALTER_LOG_DIRS = (
    "dirs:[path:str topics:[name:str partitions:[i32]]]",
    "throttle_time:i32 results:[topic_name:str partitions:[partition_index:i32 error_code:i16]]",
)
_DESCRIBE_LOG_DIRS = (
    "topics:[topic:str partitions:[i32]]?",
    "throttle_time:i32 results:[error_code:i16 log_dir:str topics:[name:str "
    "partitions:[partition_index:i32 partition_size:i64 offset_lag:i64 is_future_key:bool]]]",
)

LAYOUTS: Mapping[tuple[int, int], tuple[str, str]] = {
    # Produce: v0-1 carry message format v0, v2 format v1; v1 added throttle time, v2 the log append time.
    (0, 0): (_PRODUCE_REQ, f"responses:[name:str partition_responses:[{_PRODUCE_PART}]]"),
    (0, 1): (_PRODUCE_REQ, f"responses:[name:str partition_responses:[{_PRODUCE_PART}]] throttle_time:i32"),
    (0, 2): (_PRODUCE_REQ,
             f"responses:[name:str partition_responses:[{_PRODUCE_PART} log_append_time:i64]] throttle_time:i32"),
    # Fetch: v0 message format v0, v1 adds throttle time, v2 format v1, v3 the request-wide max_bytes.
    (1, 0): (f"replica_id:i32 max_wait:i32 min_bytes:i32 {_FETCH_PARTS}", _FETCH_RESP),
    (1, 1): (f"replica_id:i32 max_wait:i32 min_bytes:i32 {_FETCH_PARTS}", f"throttle_time:i32 {_FETCH_RESP}"),
    (1, 2): (f"replica_id:i32 max_wait:i32 min_bytes:i32 {_FETCH_PARTS}", f"throttle_time:i32 {_FETCH_RESP}"),
    (1, 3): (f"replica_id:i32 max_wait:i32 min_bytes:i32 max_bytes:i32 {_FETCH_PARTS}",
             f"throttle_time:i32 {_FETCH_RESP}"),
    # ListOffsets v0: up to max_num_offsets segment offsets per partition instead of one (timestamp, offset).
    (2, 0): ("replica_id:i32 topics:[name:str partitions:[partition_index:i32 timestamp:i64 max_num_offsets:i32]]",
             "topics:[name:str partitions:[partition_index:i32 error_code:i16 old_style_offsets:[i64]]]"),
    # OffsetCommit: v0 has no group membership, v1 adds it and a per-partition commit timestamp.
    (8, 0): ("group_id:str topics:[name:str partitions:[partition_index:i32 committed_offset:i64 "
             "committed_metadata:str?]]", _COMMIT_RESP),
    (8, 1): ("group_id:str generation_id_or_member_epoch:i32 member_id:str topics:[name:str "
             "partitions:[partition_index:i32 committed_offset:i64 commit_timestamp:i64 committed_metadata:str?]]",
             _COMMIT_RESP),
    # OffsetFetch v0: the layout of v1 (v0 read ZooKeeper in old Kafka).
    (9, 0): ("group_id:str topics:[name:str partition_indexes:[i32]]",
             "topics:[name:str partitions:[partition_index:i32 committed_offset:i64 metadata:str? error_code:i16]]"),
    # CreateTopics: v1 adds validate_only and the error message.
    (19, 0): (_CREATE_TOPICS, "topics:[name:str error_code:i16]"),
    (19, 1): (f"{_CREATE_TOPICS} validate_only:bool", "topics:[name:str error_code:i16 error_message:str?]"),
    # DeleteTopics v0: no throttle time.
    (20, 0): ("topic_names:[str] timeout:i32", "responses:[name:str error_code:i16]"),
    # OffsetForLeaderEpoch: v1 adds the leader epoch to the response, v2 the current epoch and throttle time.
    (23, 0): (_EPOCH_REQ, "topics:[topic:str partitions:[error_code:i16 partition:i32 end_offset:i64]]"),
    (23, 1): (_EPOCH_REQ,
              "topics:[topic:str partitions:[error_code:i16 partition:i32 leader_epoch:i32 end_offset:i64]]"),
    # DescribeConfigs v0: is_default instead of config_source, no synonyms.
    (32, 0): ("resources:[resource_type:i8 resource_name:str configuration_keys:[str]?]",
              "throttle_time:i32 results:[error_code:i16 error_message:str? resource_type:i8 resource_name:str "
              "configs:[name:str value:str? read_only:bool is_default:bool is_sensitive:bool]]"),
    # AlterReplicaLogDirs and DescribeLogDirs v0: the layouts of v1 (v1 only changed throttling).
    (34, 0): _ALTER_LOG_DIRS,
    (35, 0): _DESCRIBE_LOG_DIRS,
    # WriteTxnMarkers v0: the layout of v1, before flexible versions.
    (27, 0): ("markers:[producer_id:i64 producer_epoch:i16 transaction_result:bool "
              "topics:[name:str partition_indexes:[i32]] coordinator_epoch:i32]",
              "markers:[producer_id:i64 topics:[name:str partitions:[partition_index:i32 error_code:i16]]]"),
}

# Kafka's defaults for fields an old version lacks, where kio's oldest class has none of its own.
_ABSENT_DEFAULTS: Mapping[tuple[int, str], Any] = {
    (0, "transactional_id"): None,
    (8, "member_id"): "",
}

_WIRE: Mapping[str, str] = {
    "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "bool": "bool",
    "str": "string", "bytes": "bytes", "rec": "records",
}
# kio's semantic kafka_types and the wire type each is encoded as.
_SAME_WIRE: Mapping[str, str] = {
    "error_code": "int16", "timedelta_i32": "int32", "timedelta_i64": "int64", "datetime_i64": "int64",
}
_PY_TYPE: Mapping[str, type] = {
    "int8": int, "int16": int, "int32": int, "int64": int, "bool": bool, "string": str, "bytes": bytes,
    "records": bytes,
}


# --- the layout notation -------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One field of a layout: a primitive (``kafka_type``), or an array of ``struct`` or of a primitive."""

    name: str
    kafka_type: str | None
    nullable: bool
    array: bool = False
    struct: tuple[Spec, ...] | None = None


_TOKEN = re.compile(r"\w+|[\[\]:?]")


def parse_layout(text: str) -> tuple[Spec, ...]:
    """Parse the layout notation; raises ValueError on a malformed layout."""
    tokens = _TOKEN.findall(text)
    specs, pos = _parse_fields(tokens, 0)
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos]!r} in layout {text!r}")
    return specs


def _parse_fields(tokens: list[str], pos: int) -> tuple[tuple[Spec, ...], int]:
    out: list[Spec] = []
    while pos < len(tokens) and tokens[pos] != "]":
        name = tokens[pos]
        if pos + 1 >= len(tokens) or tokens[pos + 1] != ":":
            raise ValueError(f"field {name!r} has no type")
        pos += 2
        if tokens[pos] == "[":
            if pos + 2 < len(tokens) and tokens[pos + 2] == ":":
                struct, pos = _parse_fields(tokens, pos + 1)
                spec = Spec(name, None, False, True, struct)
            else:
                spec = Spec(name, _WIRE[tokens[pos + 1]], False, True)
                pos += 2
            if tokens[pos] != "]":
                raise ValueError(f"array {name!r} is not closed")
            pos += 1
        else:
            spec = Spec(name, _WIRE[tokens[pos]], False)
            pos += 1
        if pos < len(tokens) and tokens[pos] == "?":
            spec = Spec(spec.name, spec.kafka_type, True, spec.array, spec.struct)
            pos += 1
        out.append(spec)
    return tuple(out), pos


# --- synthesized classes -------------------------------------------------------------------------


def _unwrap(tp: Any) -> Any:
    if get_origin(tp) in (UnionType, Union):
        return next(a for a in get_args(tp) if a is not NoneType)
    return tp


def _nested_class(model: type | None, name: str) -> type | None:
    """The kio class of field ``name``'s elements in ``model``, if it has such a struct field."""
    if model is None:
        return None
    for f in fields(model):
        if f.name == name:
            tp = _unwrap(f.type)
            if get_origin(tp) is tuple:
                inner = _unwrap(get_args(tp)[0])
                return inner if is_dataclass(inner) else None  # type: ignore[return-value]
    return None


def _absent_default(api_key: int, f: Field[Any]) -> Any:
    if (api_key, f.name) in _ABSENT_DEFAULTS:
        return _ABSENT_DEFAULTS[(api_key, f.name)]
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    tp = _unwrap(f.type)
    if get_origin(tp) is tuple:
        return ()
    codec = _codec()
    if is_dataclass(tp):
        return codec.build(tp, {})  # type: ignore[arg-type]
    return codec.default_primitive(f.metadata.get("kafka_type", ""))


def _synthesize(
    specs: tuple[Spec, ...], model: type | None, cls_name: str, kind: EntityType, api_key: int, version: int,
) -> type:
    model_fields = {f.name: f for f in fields(model)} if model is not None else {}
    definitions: list[tuple[str, Any, Any]] = []
    for s in specs:
        mf = model_fields.get(s.name)
        if s.struct is not None:
            inner = _synthesize(s.struct, _nested_class(model, s.name), _struct_name(model, s.name),
                                EntityType.nested, api_key, version)
            tp: Any = tuple[inner, ...]  # type: ignore[valid-type]
            definitions.append((s.name, tp | None if s.nullable else tp, field()))
            continue
        assert s.kafka_type is not None
        kafka_type = s.kafka_type
        py: Any = _PY_TYPE[kafka_type]
        if mf is not None and "kafka_type" in mf.metadata:
            model_type = mf.metadata["kafka_type"]
            if _SAME_WIRE.get(model_type, model_type) != kafka_type:
                raise TypeError(f"{cls_name}.{s.name}: {kafka_type} on the wire, {model_type} in kio")
            if model_type != "error_code":  # written as int16, so handlers may give ints or ErrorCodes
                kafka_type = model_type
                py = _unwrap(mf.type)
            if s.array:
                py = _unwrap(get_args(py)[0])
        if s.array:
            py = tuple[py, ...]
        # kio's own optionality too: a nullable datetime_i64 reads -1 as None (Produce's log_append_time).
        optional = s.nullable or (mf is not None and not s.array and kafka_type == mf.metadata.get("kafka_type")
                                  and _unwrap(mf.type) is not mf.type)
        definitions.append((s.name, py | None if optional else py, field(metadata={"kafka_type": kafka_type})))
    namespace: dict[str, Any] = {
        "__type__": kind, "__version__": version, "__flexible__": False, "__api_key__": api_key,
        "__legacy__": True,
    }
    # Every legacy version is non-flexible: request header v1, response header v0.
    namespace["__header_schema__"] = RequestHeaderV1 if kind != EntityType.response else ResponseHeaderV0
    if model is not None:
        present = {s.name for s in specs}
        for name, mf in model_fields.items():
            if name not in present:
                namespace[name] = _absent_default(api_key, mf)
    cls = make_dataclass(cls_name, definitions, frozen=True, slots=True, kw_only=True, namespace=namespace)
    cls.__module__ = __name__
    cls.__qualname__ = f"{cls_name}V{version}"
    return cls


def _struct_name(model: type | None, name: str) -> str:
    nested = _nested_class(model, name)
    return nested.__name__ if nested is not None else "".join(p.title() for p in name.split("_"))


# Filled lazily: the kio model classes come from the codec.
_CLASSES: dict[tuple[int, int], tuple[type, type]] = {}


class Codec(Protocol):
    """What the layouts need of the codec above them: kio's classes and their zero values.  The codec
    imports this module and registers itself (:func:`use_codec`), so this module never imports it."""

    def build(self, cls: type, data: Mapping[str, Any]) -> Any: ...

    def default_primitive(self, kafka_type: str) -> Any: ...

    def kio_versions(self, api_key: int) -> range: ...

    def request_class(self, api_key: int, version: int) -> type: ...

    def response_class(self, api_key: int, version: int) -> type: ...


_CODEC: list[Codec] = []


def use_codec(codec: Codec) -> None:
    _CODEC[:] = [codec]


def _codec() -> Codec:
    if not _CODEC:
        raise RuntimeError("pykbroker.protocol.codec registers itself on import; import it first")
    return _CODEC[0]


def is_legacy(api_key: int, version: int) -> bool:
    return (api_key, version) in LAYOUTS


def legacy_versions(api_key: int) -> list[int]:
    return sorted(v for k, v in LAYOUTS if k == api_key)


def _classes(api_key: int, version: int) -> tuple[type, type]:
    pair = _CLASSES.get((api_key, version))
    if pair is None:
        codec = _codec()
        oldest = codec.kio_versions(api_key).start
        req_model = codec.request_class(api_key, oldest)
        resp_model = codec.response_class(api_key, oldest)
        req_text, resp_text = LAYOUTS[(api_key, version)]
        pair = (
            _synthesize(parse_layout(req_text), req_model, req_model.__name__, EntityType.request, api_key, version),
            _synthesize(parse_layout(resp_text), resp_model, resp_model.__name__, EntityType.response, api_key,
                        version),
        )
        _CLASSES[(api_key, version)] = pair
    return pair


def request_class(api_key: int, version: int) -> type:
    return _classes(api_key, version)[0]


def response_class(api_key: int, version: int) -> type:
    return _classes(api_key, version)[1]


# --- response bodies -----------------------------------------------------------------------------


def to_plain(value: Any) -> Any:
    """Handler bodies may hold kio entities of the oldest version: turn them into dicts for a legacy class."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def _describe_configs_v0(body: dict[str, Any]) -> dict[str, Any]:
    """v0 says is_default where later versions give the source (DEFAULT_CONFIG is 5)."""
    for result in body.get("results") or ():
        for entry in result.get("configs") or ():
            entry.setdefault("is_default", int(entry.get("config_source", -1)) == 5)
    return body


RESPONSE_FIXUPS: Mapping[tuple[int, int], Callable[[dict[str, Any]], dict[str, Any]]] = {
    (32, 0): _describe_configs_v0,
}
