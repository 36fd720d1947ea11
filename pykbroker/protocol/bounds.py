"""A bounds pre-pass over a request body, run before kio decodes it.

kio's native decoder sizes its buffers from the lengths a frame claims: a compact
array that claims four billion elements makes it allocate tens of gigabytes and the
process aborts.  This pass walks the body exactly as the version's schema lays it
out, reading only length prefixes and tag headers, and rejects the frame when any
array, string, bytes or records length cannot fit in the bytes left, or when a
field the schema does not allow to be null is sent as null (Kafka's parser refuses
both).  Nothing is allocated in proportion to a claimed length, so the cost is a
few integer operations per field.

The walk is driven by the field metadata of kio's generated classes (``kafka_type``,
the ``tag`` of tagged fields, ``__flexible__``, ``Optional`` for nullable fields),
the same schemas kio's decoder follows, and compiled once per (API key, version)
into closures.  It accepts only encodings that kio reads the same way (varints of
at most five bytes, ``-1`` as the only legacy null length, a known tagged field's
value filling exactly its declared size), so when the pass accepts a body, every
length kio reads has already been checked.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import Field, dataclass, fields, is_dataclass
from functools import cache
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin

from pykbroker.protocol import codec

__all__ = ["BoundsError", "check_request", "request_walker"]

Walker = Callable[[bytes, int, int], int]
"""``walk(buf, pos, end) -> pos after the value``; raises :class:`BoundsError`."""

_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from

# Encoded width of every fixed-size kafka_type kio uses.
_FIXED_WIDTH: dict[str, int] = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "timedelta_i64": 8, "datetime_i64": 8,
    "uuid": 16,
}
_LENGTH_PREFIXED = frozenset({"string", "bytes", "records"})


class BoundsError(ValueError):
    """The body claims more than the frame holds, or is malformed in a way kio might misread."""


def truncated(what: str, pos: int, end: int) -> BoundsError:
    return BoundsError(f"{what}: truncated at byte {pos} of {end}")


def read_uvarint(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    """An unsigned varint of at most five bytes (Kafka's int-sized varint)."""
    if pos >= end:
        raise truncated(what, pos, end)
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    value = b & 0x7F
    shift = 7
    for i in range(pos + 1, min(pos + 5, end)):
        b = buf[i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i + 1
        shift += 7
    if pos + 5 > end:
        raise truncated(what, end, end)
    raise BoundsError(f"{what}: varint longer than five bytes at byte {pos}")


@dataclass(frozen=True, slots=True)
class _Node:
    """A compiled field type: how to walk it and the least it can take on the wire."""

    walk: Walker
    min_size: int
    fixed: int | None = None  # the exact encoded size when it never varies
    flex_fixed: int | None = None  # flexible entity: this many fixed bytes, then a tagged-fields section


# --- strings, bytes, records ---------------------------------------------------------------------


def _legacy_length_prefixed(what: str, width: int, nullable: bool) -> Walker:
    unpack = _I16 if width == 2 else _I32

    def walk(buf: bytes, pos: int, end: int) -> int:
        if pos + width > end:
            raise truncated(what, pos, end)
        (n,) = unpack(buf, pos)
        pos += width
        if n < 0:
            if n == -1 and nullable:
                return pos
            raise BoundsError(f"{what}: length {n}" + ("" if nullable else " (the field is not nullable)"))
        pos += n
        if pos > end:
            raise BoundsError(f"{what}: length {n} exceeds the {end - pos + n} bytes remaining")
        return pos

    return walk


def _compact_length_prefixed(what: str, nullable: bool) -> Walker:
    def walk(buf: bytes, pos: int, end: int) -> int:
        if pos < end and buf[pos] < 0x80:  # the usual one-byte length, read inline
            n = buf[pos]
            pos += 1
        else:
            n, pos = read_uvarint(buf, pos, end, what)
        if n == 0:
            if nullable:
                return pos
            raise BoundsError(f"{what}: null, but the field is not nullable")
        n -= 1
        if pos + n > end:
            raise BoundsError(f"{what}: length {n} exceeds the {end - pos} bytes remaining")
        return pos + n

    return walk


def _length_prefixed(kafka_type: str, flexible: bool, nullable: bool, what: str) -> _Node:
    if flexible:
        return _Node(_compact_length_prefixed(what, nullable), 1)
    width = 2 if kafka_type == "string" else 4
    return _Node(_legacy_length_prefixed(what, width, nullable), width)


# --- arrays --------------------------------------------------------------------------------------


def _array(elem: _Node, flexible: bool, nullable: bool, what: str) -> _Node:
    least = max(elem.min_size, 1)
    fixed = elem.fixed
    flex_fixed = elem.flex_fixed
    elem_walk = elem.walk
    prefix = 1 if flexible else 4

    def count(buf: bytes, pos: int, end: int) -> tuple[int, int]:
        if flexible:
            if pos < end and buf[pos] < 0x80:
                n = buf[pos] - 1
                pos += 1
            else:
                n, pos = read_uvarint(buf, pos, end, what)
                n -= 1
        else:
            if pos + 4 > end:
                raise truncated(what, pos, end)
            (n,) = _I32(buf, pos)
            pos += 4
        if n < 0:
            if n == -1 and nullable:
                return -1, pos
            raise BoundsError(f"{what}: array count {n}" + ("" if nullable else " (the field is not nullable)"))
        if n * least > end - pos:
            raise BoundsError(
                f"{what}: array of {n} elements (at least {least} bytes each) "
                f"exceeds the {end - pos} bytes remaining"
            )
        return n, pos

    if fixed is not None:

        def walk(buf: bytes, pos: int, end: int) -> int:
            n, pos = count(buf, pos, end)
            return pos if n < 0 else pos + n * fixed

    elif flex_fixed is not None:
        tagged = elem_walk

        def walk(buf: bytes, pos: int, end: int) -> int:
            n, pos = count(buf, pos, end)
            for _ in range(n):
                pos += flex_fixed
                if pos < end and buf[pos] == 0:  # the usual empty tagged-fields section
                    pos += 1
                else:
                    pos = tagged(buf, pos - flex_fixed, end)
            return pos

    else:

        def walk(buf: bytes, pos: int, end: int) -> int:
            n, pos = count(buf, pos, end)
            for _ in range(n):
                pos = elem_walk(buf, pos, end)
            return pos

    return _Node(walk, prefix)


# --- entities ------------------------------------------------------------------------------------


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (UnionType, Union):
        args = [a for a in get_args(tp) if a is not NoneType]
        if len(args) != 1:
            raise TypeError(f"unsupported union {tp}")
        return args[0], True
    return tp, False


def _field_node(f: Field[Any], flexible: bool, owner: str) -> _Node:
    what = f"{owner}.{f.name}"
    tp, nullable = _unwrap_optional(f.type)
    if get_origin(tp) is tuple:
        inner, elem_nullable = _unwrap_optional(get_args(tp)[0])
        if is_dataclass(inner):
            elem = _entity_node(inner, what)  # type: ignore[arg-type]
        else:
            elem = _primitive_node(f.metadata["kafka_type"], flexible, elem_nullable, f"{what}[]")
        return _array(elem, flexible, nullable, what)
    if is_dataclass(tp):
        node = _entity_node(tp, what)  # type: ignore[arg-type]
        return _nullable_struct(node, what) if nullable else node
    return _primitive_node(f.metadata["kafka_type"], flexible, nullable, what)


def _nullable_struct(inner: _Node, what: str) -> _Node:
    """A nullable struct (e.g. DescribeTopicPartitions' cursor): an int8, negative for null, then the struct."""
    inner_walk = inner.walk

    def walk(buf: bytes, pos: int, end: int) -> int:
        if pos >= end:
            raise truncated(what, pos, end)
        if buf[pos] >= 0x80:  # a negative marker: null
            return pos + 1
        return inner_walk(buf, pos + 1, end)

    return _Node(walk, 1)


def _primitive_node(kafka_type: str, flexible: bool, nullable: bool, what: str) -> _Node:
    width = _FIXED_WIDTH.get(kafka_type)
    if width is not None:
        return _Node(_fixed_walker(width, what), width, fixed=width)
    if kafka_type in _LENGTH_PREFIXED:
        return _length_prefixed(kafka_type, flexible, nullable or kafka_type == "records", what)
    raise TypeError(f"{what}: kafka_type {kafka_type!r} has no bounds rule")


def _fixed_walker(width: int, what: str) -> Walker:
    def walk(buf: bytes, pos: int, end: int) -> int:
        pos += width
        if pos > end:
            raise truncated(what, pos - width, end)
        return pos

    return walk


# Unknown tagged fields the walk in progress met: (section start, section end, the section without them).
# Kafka skips tags it does not know (a newer client may send them); kio raises on them, so
# check_request hands the decoder a frame with those entries cut out.
_edits: list[tuple[int, int, bytes]] = []
_known_depth = 0  # > 0 while walking a known tagged field's value (whose size an edit would change)


def _encode_uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tagged_fields(known: dict[int, Walker], what: str) -> Walker:
    """A tagged-fields section; a known tag's value must fill exactly its declared size."""

    def walk(buf: bytes, pos: int, end: int) -> int:
        global _known_depth
        start = pos
        n, pos = read_uvarint(buf, pos, end, what)
        if n == 0:
            return pos
        if n * 2 > end - pos:
            raise BoundsError(f"{what}: {n} tagged fields exceed the {end - pos} bytes remaining")
        kept: list[tuple[int, int]] = []
        for _ in range(n):
            entry = pos
            tag, pos = read_uvarint(buf, pos, end, what)
            size, pos = read_uvarint(buf, pos, end, what)
            stop = pos + size
            if stop > end:
                raise BoundsError(f"{what}: tagged field {tag} of {size} bytes exceeds the {end - pos} remaining")
            value = known.get(tag)
            if value is not None:
                _known_depth += 1
                try:
                    filled = value(buf, pos, stop) == stop
                finally:
                    _known_depth -= 1
                if not filled:
                    raise BoundsError(f"{what}: tagged field {tag} does not fill its {size} bytes")
                kept.append((entry, stop))
            pos = stop
        if len(kept) < n:
            if _known_depth:
                raise BoundsError(f"{what}: an unknown tagged field inside a known tagged field")
            _edits.append((start, pos, _encode_uvarint(len(kept)) + b"".join(buf[a:b] for a, b in kept)))
        return pos

    return walk


@cache
def _entity_node(cls: type, what: str = "") -> _Node:
    name = what or cls.__name__
    flexible = bool(cls.__flexible__)  # type: ignore[attr-defined]
    # Steps: (fixed bytes to skip first, then a walker); runs of fixed-size fields merge into one skip.
    steps: list[tuple[int, Walker]] = []
    skip = 0
    min_size = 0
    known_tags: dict[int, Walker] = {}
    for f in fields(cls):
        node = _field_node(f, flexible, name)
        if "tag" in f.metadata:
            known_tags[int(f.metadata["tag"])] = node.walk
            continue
        min_size += node.min_size
        if node.fixed is not None:
            skip += node.fixed
        else:
            steps.append((skip, node.walk))
            skip = 0
    tagged = _tagged_fields(known_tags, f"{name} tagged fields")
    if flexible:
        min_size += 1
        if not steps:
            return _Node(_fixed_then(skip, tagged, name), min_size, flex_fixed=skip)
    elif not steps:
        return _Node(_fixed_walker(skip, name), skip, fixed=skip)
    frozen = tuple(steps)
    trailing = skip

    def walk(buf: bytes, pos: int, end: int) -> int:
        for before, step in frozen:
            pos = step(buf, pos + before, end)
        pos += trailing
        if flexible:
            if pos < end and buf[pos] == 0:  # the usual empty tagged-fields section
                return pos + 1
            return tagged(buf, pos, end)
        if pos > end:
            raise truncated(name, pos, end)
        return pos

    return _Node(walk, min_size)


def _fixed_then(before: int, tagged: Walker, what: str) -> Walker:
    """A flexible struct of fixed-size fields only: skip them, then walk its tagged fields."""

    def walk(buf: bytes, pos: int, end: int) -> int:
        pos += before
        if pos > end:
            raise truncated(what, pos, end)
        return tagged(buf, pos, end)

    return walk


_WALKERS: dict[tuple[int, int], Walker] = {}


def request_walker(api_key: int, version: int) -> Walker:
    """The compiled walk of this request version's body (built once, then cached)."""
    walker = _WALKERS.get((api_key, version))
    if walker is None:
        walker = _WALKERS[(api_key, version)] = _entity_node(codec.request_class(api_key, version)).walk
    return walker


def check_request(api_key: int, version: int, frame: bytes, offset: int) -> bytes:
    """Raise :class:`BoundsError` unless the body at ``offset`` fits in ``frame`` as the schema says.

    Returns the frame to decode: ``frame`` itself, or a copy without the tagged fields the schema
    does not know (Kafka ignores them; kio would refuse them).  Bytes after the body are allowed,
    as in :func:`codec.decode_request`.
    """
    global _known_depth
    walker = _WALKERS.get((api_key, version)) or request_walker(api_key, version)
    _edits.clear()
    _known_depth = 0
    walker(frame, offset, len(frame))
    if not _edits:
        return frame
    out = bytearray()
    prev = 0
    for start, stop, section in sorted(_edits):
        out += frame[prev:start]
        out += section
        prev = stop
    out += frame[prev:]
    _edits.clear()
    return bytes(out)
