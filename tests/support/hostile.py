"""Valid and hostile request frames for every advertised (API, version), for the bounds and fuzz tests.

Valid requests are built from kio's generated classes with values drawn from a
``random.Random`` (so hypothesis can drive it through ``st.randoms()``), encoded by
kio's own writer.  Mutations are what a broken or hostile client sends: flipped bits,
truncation, inserted or dropped bytes, and length-sized windows overwritten with
huge or negative lengths in every encoding Kafka uses (int16, int32, unsigned varint).
"""

from __future__ import annotations

import datetime
import random
import struct
import uuid
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin

from pykbroker.protocol import codec
from pykbroker.protocol.records import build_batch
from pykbroker.server.dispatcher import API_TABLE

# 21 bytes, size prefix included: Metadata v12 whose topics array claims ~4 billion entries.
HUGE_ARRAY_FRAME = bytes.fromhex("000000110003000c0000000100017800818080800f")

_INT_RANGES: dict[str, tuple[int, int]] = {
    "int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1), "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1), "uint8": (0, 2**8 - 1), "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1), "uint64": (0, 2**64 - 1),
}

# Windows written over a frame: lengths and counts that lie, in each of Kafka's encodings.
HUGE_LENGTHS: tuple[bytes, ...] = (
    b"\x7f\xff", b"\xff\xfe", b"\x80\x00", b"\xff\xff",                      # int16
    b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe", b"\x80\x00\x00\x00",          # int32
    b"\x00\x10\x00\x00", b"\x01\x00\x00\x00", b"\xff\xff\xff\xff",
    b"\x81\x80\x80\x80\x0f", b"\xff\xff\xff\xff\x0f", b"\xff\xff\xff\xff\x07",  # unsigned varint
    b"\x80\x80\x80\x80\x10", b"\x80\x80\x04", b"\xff\xff\x7f", b"\xff\xff\xff\xff\xff\x01",
)


def advertised_pairs() -> list[tuple[int, int]]:
    return [(s.key, v) for s in API_TABLE.values() for v in range(s.min_version, s.max_version + 1)]


def _unwrap(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (UnionType, Union):
        return next(a for a in get_args(tp) if a is not NoneType), True
    return tp, False


def _primitive(kafka_type: str, rng: random.Random, nullable: bool) -> Any:
    if nullable and kafka_type != "uuid" and rng.random() < 0.15:
        return None
    if kafka_type in _INT_RANGES:
        lo, hi = _INT_RANGES[kafka_type]
        r = rng.random()
        if r < 0.6:
            return rng.randint(max(lo, -1), min(hi, 100))
        return rng.choice((lo, hi)) if r < 0.7 else rng.randint(lo, hi)
    if kafka_type == "bool":
        return rng.random() < 0.5
    if kafka_type == "string":
        return "".join(rng.choice("abcdefghij-._0123456789") for _ in range(rng.randint(0, 12)))
    if kafka_type == "bytes":
        return rng.randbytes(rng.randint(0, 24))
    if kafka_type == "records":
        if rng.random() < 0.3:
            return rng.randbytes(rng.randint(0, 40))
        recs: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]] = [
            (rng.randbytes(rng.randint(0, 4)) or None, rng.randbytes(rng.randint(0, 32)), [])
            for _ in range(rng.randint(1, 3))
        ]
        return build_batch(recs, timestamp_ms=1_700_000_000_000)
    if kafka_type == "uuid":
        return None if nullable and rng.random() < 0.3 else uuid.UUID(int=rng.getrandbits(128))
    if kafka_type == "float64":
        return rng.uniform(-1e6, 1e6)
    if kafka_type == "timedelta_i32":
        return datetime.timedelta(milliseconds=rng.randint(0, 2**31 - 1))
    if kafka_type == "timedelta_i64":
        return datetime.timedelta(milliseconds=rng.randint(0, 2**40))
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(rng.randint(0, 2**41) / 1000, datetime.UTC)
    raise TypeError(f"no generator for kafka_type {kafka_type!r}")


def random_entity(cls: type, rng: random.Random, depth: int = 0) -> Any:
    """An instance of kio class ``cls`` with random but encodable values."""
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        tp, nullable = _unwrap(f.type)
        if get_origin(tp) is tuple:
            if nullable and rng.random() < 0.15:
                kwargs[f.name] = None
                continue
            inner, elem_nullable = _unwrap(get_args(tp)[0])
            n = rng.randint(0, 3 if depth < 2 else 1)
            if is_dataclass(inner):
                kwargs[f.name] = tuple(random_entity(inner, rng, depth + 1) for _ in range(n))  # type: ignore[arg-type]
            else:
                kt = f.metadata["kafka_type"]
                kwargs[f.name] = tuple(_primitive(kt, rng, elem_nullable) for _ in range(n))
        elif is_dataclass(tp):
            kwargs[f.name] = random_entity(tp, rng, depth + 1)  # type: ignore[arg-type]
        else:
            kwargs[f.name] = _primitive(f.metadata["kafka_type"], rng, nullable)
    return cls(**kwargs)


def request_frame(api_key: int, version: int, body: bytes, correlation_id: int = 1,
                  client_id: bytes | None = b"fuzz") -> bytes:
    """A request frame without its size prefix, as ``Dispatcher.parse`` takes it."""
    client = struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id
    header = struct.pack(">hhi", api_key, version, correlation_id) + client
    if codec.is_flexible(api_key, version):
        header += b"\x00"
    return header + body


def random_request_frame(api_key: int, version: int, rng: random.Random) -> bytes:
    entity = random_entity(codec.request_class(api_key, version), rng)
    return request_frame(api_key, version, codec.encode_entity(entity), rng.randint(0, 2**31 - 1))


def mutate(frame: bytes, rng: random.Random, keep_prefix: int = 4) -> bytes:
    """One to three random mutations; the API key and version survive most of the time."""
    buf = bytearray(frame)
    lo = keep_prefix if rng.random() < 0.95 else 0
    for _ in range(rng.randint(1, 3)):
        span = max(len(buf) - lo, 1)
        at = lo + rng.randrange(span)
        op = rng.random()
        if op < 0.45:  # a length or count that lies
            window = rng.choice(HUGE_LENGTHS)
            buf[at:at + len(window)] = window
        elif op < 0.65:  # bit flips
            for _ in range(rng.randint(1, 4)):
                if len(buf) > lo:
                    i = lo + rng.randrange(len(buf) - lo)
                    buf[i] ^= 1 << rng.randrange(8)
        elif op < 0.75:  # truncation
            del buf[at:]
        elif op < 0.85:  # a random byte
            if at < len(buf):
                buf[at] = rng.randrange(256)
        elif op < 0.93:  # inserted bytes
            buf[at:at] = rng.randbytes(rng.randint(1, 8))
        else:  # dropped bytes
            del buf[at:at + rng.randint(1, 8)]
    return bytes(buf)


def mutated_frames(count: int, seed: int, seeds_per_pair: int = 4) -> Iterator[tuple[int, int, bytes]]:
    """``count`` mutated frames, round-robin over every advertised pair, from a few valid seeds each."""
    rng = random.Random(seed)
    pairs = advertised_pairs()
    bases = {p: [random_request_frame(*p, rng) for _ in range(seeds_per_pair)] for p in pairs}
    for i in range(count):
        pair = pairs[i % len(pairs)]
        yield pair[0], pair[1], mutate(rng.choice(bases[pair]), rng)
