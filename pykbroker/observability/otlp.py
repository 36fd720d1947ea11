"""The number data points of OTLP ``MetricsData`` (KIP-714 client pushes), for the metrics endpoint.

Only what an exporter needs: gauge and sum points (a double or an int) with their string/number
attributes; histograms and summaries are skipped. A hand-rolled protobuf walk, so the broker does not
depend on opentelemetry-proto for the handful of fields involved.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

# Field numbers from opentelemetry/proto/metrics/v1/metrics.proto and common/v1/common.proto.
_RESOURCE_METRICS, _SCOPE_METRICS, _METRICS = 1, 2, 2
_NAME, _GAUGE, _SUM = 1, 5, 7
_DATA_POINTS = 1
_ATTRIBUTES, _AS_DOUBLE, _AS_INT = 7, 4, 6
_KV_KEY, _KV_VALUE = 1, 2
_ANY_STRING, _ANY_BOOL, _ANY_INT, _ANY_DOUBLE = 1, 2, 3, 4


class OtlpError(ValueError):
    """Bytes that are not the protobuf they should be."""


@dataclass(frozen=True)
class Point:
    name: str
    attributes: tuple[tuple[str, str], ...]
    value: float


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise OtlpError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def walk(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, start, end) of each field; for varints start is the value."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield number, wire, value, pos
            continue
        if wire == 1:
            size = 8
        elif wire == 5:
            size = 4
        elif wire == 2:
            size, pos = _varint(buf, pos, end)
        else:
            raise OtlpError(f"unsupported wire type {wire}")
        if pos + size > end:
            raise OtlpError("field runs past its message")
        yield number, wire, pos, pos + size
        pos += size


def _any_value(buf: bytes, start: int, end: int) -> str:
    for number, wire, a, b in walk(buf, start, end):
        if number == _ANY_STRING and wire == 2:
            return buf[a:b].decode("utf-8", "replace")
        if number in (_ANY_BOOL, _ANY_INT) and wire == 0:
            value = a - (1 << 64) if a >= 1 << 63 else a
            return ("true" if value else "false") if number == _ANY_BOOL else str(value)
        if number == _ANY_DOUBLE and wire == 1:
            return repr(struct.unpack_from("<d", buf, a)[0])
    return ""


def _point(buf: bytes, start: int, end: int) -> tuple[tuple[tuple[str, str], ...], float] | None:
    attrs: list[tuple[str, str]] = []
    value: float | None = None
    for number, wire, a, b in walk(buf, start, end):
        if number == _ATTRIBUTES and wire == 2:
            key = ""
            val = ""
            for n2, w2, a2, b2 in walk(buf, a, b):
                if n2 == _KV_KEY and w2 == 2:
                    key = buf[a2:b2].decode("utf-8", "replace")
                elif n2 == _KV_VALUE and w2 == 2:
                    val = _any_value(buf, a2, b2)
            attrs.append((key, val))
        elif number == _AS_DOUBLE and wire == 1:
            value = struct.unpack_from("<d", buf, a)[0]
        elif number == _AS_INT and wire == 1:
            value = float(struct.unpack_from("<q", buf, a)[0])
    return None if value is None else (tuple(sorted(attrs)), value)


def number_points(data: bytes) -> list[Point]:
    """Every gauge and sum data point in a MetricsData payload."""
    out: list[Point] = []
    for rm, w, rs, re_ in walk(data, 0, len(data)):
        if rm != _RESOURCE_METRICS or w != 2:
            continue
        for sm, w2, ss, se in walk(data, rs, re_):
            if sm != _SCOPE_METRICS or w2 != 2:
                continue
            for m, w3, ms, me in walk(data, ss, se):
                if m != _METRICS or w3 != 2:
                    continue
                name = ""
                bodies: list[tuple[int, int]] = []
                for f, w4, fs, fe in walk(data, ms, me):
                    if f == _NAME and w4 == 2:
                        name = data[fs:fe].decode("utf-8", "replace")
                    elif f in (_GAUGE, _SUM) and w4 == 2:
                        bodies.append((fs, fe))
                for bs, be in bodies:
                    for dp, w5, ds, de in walk(data, bs, be):
                        if dp == _DATA_POINTS and w5 == 2:
                            parsed = _point(data, ds, de)
                            if parsed is not None:
                                out.append(Point(name, parsed[0], parsed[1]))
    return out
