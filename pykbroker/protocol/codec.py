"""Version-agnostic access to kio's generated request and response classes.

kio generates one set of classes per API version.  Handlers build responses as
plain dicts holding the union of every version's fields; :func:`build` turns a
dict into the class of the negotiated version, keeping the fields that version
has and giving the others Kafka's defaults.  That keeps handlers free of
per-version branches except where behaviour really differs.
"""

from __future__ import annotations

import datetime
import io
import sys
import uuid
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields, is_dataclass
from functools import cache
from types import NoneType, UnionType
from typing import Any, Union, cast, get_args, get_origin

from kio.index import load_entity_module
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from pykbroker.protocol import legacy

_PRIMITIVE_ZERO: dict[str, Any] = {
    "int8": 0, "int16": 0, "int32": 0, "int64": 0, "uint8": 0, "uint16": 0, "uint32": 0, "uint64": 0,
    "float64": 0.0, "string": "", "bool": False, "bytes": b"", "records": None, "error_code": 0,
    "uuid": uuid.UUID(int=0), "timedelta_i32": datetime.timedelta(0), "timedelta_i64": datetime.timedelta(0),
    "datetime_i64": datetime.datetime.fromtimestamp(0, datetime.UTC),
}


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (UnionType, Union):
        args = [a for a in get_args(tp) if a is not NoneType]
        return args[0], True
    return tp, False


def _convert_primitive(kafka_type: str, value: Any) -> Any:
    if value is None:
        return None
    if kafka_type == "timedelta_i32" or kafka_type == "timedelta_i64":
        return value if isinstance(value, datetime.timedelta) else datetime.timedelta(milliseconds=value)
    if kafka_type == "datetime_i64":
        if isinstance(value, datetime.datetime):
            return value
        return datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
    return value


Plan = list[tuple[str, Callable[[Any], Any], Any]]

_NO_DEFAULT = object()


@cache
def _plan(cls: type) -> Plan:
    plan: Plan = []
    for f in fields(cls):
        tp, optional = _unwrap_optional(f.type)
        default: Any
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = _NO_DEFAULT
        conv: Callable[[Any], Any]
        if get_origin(tp) is tuple:
            inner = get_args(tp)[0]
            if is_dataclass(inner):
                conv = _tuple_entity_conv(cast(type, inner))
            else:
                kt = f.metadata.get("kafka_type", "")
                conv = _tuple_prim_conv(kt)
            if default is _NO_DEFAULT:
                default = None if optional else ()
        elif is_dataclass(tp):
            conv = _entity_conv(cast(type, tp))
            if default is _NO_DEFAULT:
                default = None if optional else _LazyDefault(cast(type, tp))
        else:
            kt = f.metadata.get("kafka_type", "")
            conv = _prim_conv(kt)
            if default is _NO_DEFAULT:
                default = None if optional else _PRIMITIVE_ZERO.get(kt, 0)
        plan.append((f.name, conv, default))
    return plan


class _LazyDefault:
    __slots__ = ("cls",)

    def __init__(self, cls: type) -> None:
        self.cls = cls


def _entity_conv(cls: type) -> Callable[[Any], Any]:
    def conv(v: Any) -> Any:
        if v is None or is_dataclass(v):
            return v
        return build(cls, v)

    return conv


def _tuple_entity_conv(cls: type) -> Callable[[Any], Any]:
    def conv(v: Any) -> Any:
        if v is None:
            return None
        return tuple(x if is_dataclass(x) else build(cls, x) for x in v)

    return conv


def _prim_conv(kt: str) -> Callable[[Any], Any]:
    if kt in ("timedelta_i32", "timedelta_i64", "datetime_i64"):
        return lambda v: _convert_primitive(kt, v)
    return _identity


def _tuple_prim_conv(kt: str) -> Callable[[Any], Any]:
    if kt in ("timedelta_i32", "timedelta_i64", "datetime_i64"):
        return lambda v: None if v is None else tuple(_convert_primitive(kt, x) for x in v)
    return lambda v: v if v is None or isinstance(v, tuple) else tuple(v)


def _identity(v: Any) -> Any:
    return v


def build(cls: type, data: Mapping[str, Any]) -> Any:
    """Instantiate kio class ``cls`` from a dict, ignoring keys the version lacks."""
    kwargs: dict[str, Any] = {}
    for name, conv, default in _plan(cls):
        if name in data:
            kwargs[name] = conv(data[name])
        elif isinstance(default, _LazyDefault):
            kwargs[name] = build(default.cls, {})
        else:
            kwargs[name] = default
    return cls(**kwargs)


# --- the API table -------------------------------------------------------------------------------

API_NAMES: Mapping[int, str] = api_key_map


def kio_versions(api_key: int) -> range:
    """The versions kio can encode for this API."""
    versions = sorted(schema_name_map[api_key_map[api_key]])
    return range(versions[0], versions[-1] + 1)


def supported_versions(api_key: int) -> range:
    """kio's versions plus the older ones :mod:`legacy` lays out (those Kafka 3.9 still answers)."""
    kio = kio_versions(api_key)
    old = legacy.legacy_versions(api_key)
    return range(min(old[0], kio.start) if old else kio.start, kio.stop)


def default_primitive(kafka_type: str) -> Any:
    """Kafka's zero value for a primitive kafka_type (what :func:`build` gives a missing field)."""
    return _PRIMITIVE_ZERO.get(kafka_type, 0)


@cache
def request_class(api_key: int, version: int) -> type:
    if legacy.is_legacy(api_key, version):
        return legacy.request_class(api_key, version)
    mod = load_entity_module(api_key_map[api_key], version, EntityType.request)
    return _entity_in(mod, "Request")


@cache
def response_class(api_key: int, version: int) -> type:
    if legacy.is_legacy(api_key, version):
        return legacy.response_class(api_key, version)
    mod = load_entity_module(api_key_map[api_key], version, EntityType.response)
    return _entity_in(mod, "Response")


def _entity_in(mod: Any, suffix: str) -> type:
    for name in dir(mod):
        obj = getattr(mod, name)
        if (
            isinstance(obj, type)
            and is_dataclass(obj)
            and name.endswith(suffix)
            and getattr(obj, "__type__", None) in (EntityType.request, EntityType.response)
        ):
            return obj
    raise LookupError(f"no {suffix} entity in {mod.__name__}")


@cache
def is_flexible(api_key: int, version: int) -> bool:
    return bool(request_class(api_key, version).__flexible__)  # type: ignore[attr-defined]


@cache
def _reader(cls: type) -> Callable[..., Any]:
    return entity_reader(cls)


@cache
def _writer(cls: type) -> Callable[..., Any]:
    return entity_writer(cls)


def decode_request(api_key: int, version: int, frame: bytes | memoryview, offset: int) -> Any:
    """Decode a request body; raises on malformed input (the caller closes the connection).

    Bytes after the body are ignored, as Kafka's own parser does: some clients send them
    (librdkafka's Metadata v12 with null topics, for one).
    """
    cls = request_class(api_key, version)
    value, _size = _reader(cls)(frame, offset)
    return value


def encode_entity(entity: Any) -> bytes:
    buf = io.BytesIO()
    cls: Any = type(entity)
    _writer(cls)(buf, entity)
    return buf.getvalue()


def encode_response(api_key: int, version: int, data: Mapping[str, Any]) -> bytes:
    if legacy.is_legacy(api_key, version):
        # Off the modern path: nested kio entities of newer versions become dicts for the old layout.
        plain = legacy.to_plain(data)
        fixup = legacy.RESPONSE_FIXUPS.get((api_key, version))
        return encode_entity(build(response_class(api_key, version), fixup(plain) if fixup else plain))
    return encode_entity(build(response_class(api_key, version), data))


def decode_response(api_key: int, version: int, payload: bytes, offset: int) -> Any:
    """Used by the healthcheck client and the tests."""
    value, _size = _reader(response_class(api_key, version))(payload, offset)
    return value


legacy.use_codec(sys.modules[__name__])  # the layouts below build on this module
