"""Hand-written encoders for the hot responses: Produce (v3-v11), Fetch (v4-v17) and Metadata (v9-v12),
and a memo of ApiVersions answers.

A steady trickle of small produce and fetch requests (librdkafka with a small
linger) spends much of its per-request time turning the handler's dict into a
kio dataclass (:func:`codec.build`) and serialising it with kio's generic
writer.  These encoders write the same bytes straight from the handler dicts.
They cover exactly the shape the produce and fetch handlers return; anything
else (record errors in a produce response, tagged fields) returns None and the
caller falls back to kio.  ``tests/unit/test_fast_codec.py`` checks them byte
for byte against kio for every version, so the two cannot drift.

Tagged fields are written only when non-default, as Kafka does; the handlers
never set any, so every tagged-field section here is empty.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

from pykbroker.protocol import codec
from pykbroker.protocol.file_range import FileRange

# One piece of an encoded response: bytes, or a fetched record set left in its segment file.
Part = bytes | FileRange

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I32I16I32 = struct.Struct(">ihi")
_PRODUCE_PART = {  # index, error_code, base_offset, log_append_time[, log_start_offset]
    False: struct.Struct(">ihqq"),
    True: struct.Struct(">ihqqq"),
}
_FETCH_PART = {  # partition_index, error_code, high_watermark, last_stable_offset[, log_start_offset]
    False: struct.Struct(">ihqq"),
    True: struct.Struct(">ihqqq"),
}
_ABORTED = struct.Struct(">qq")
_ZERO_UUID_BYTES = bytes(16)

_UVARINT_SMALL = [bytes([i]) for i in range(128)]


_DIVERGING = struct.Struct(">iq")  # EpochEndOffset: epoch, end offset


def _uvarint(n: int) -> bytes:
    if n < 128:
        return _UVARINT_SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _array_len(n: int, flexible: bool) -> bytes:
    return _uvarint(n + 1) if flexible else _I32.pack(n)


def _string(s: str, flexible: bool) -> bytes:
    b = s.encode()
    return (_uvarint(len(b) + 1) if flexible else _I16.pack(len(b))) + b


def _nullable_string(s: str | None, flexible: bool) -> bytes:
    if s is None:
        return b"\x00" if flexible else b"\xff\xff"
    return _string(s, flexible)


def encode_produce_response(version: int, body: Mapping[str, Any]) -> bytes | None:
    """ProduceResponse v3-v11 from the produce handler's dict; None when kio must do it."""
    if not 3 <= version <= 11:
        return None
    flexible = version >= 9
    v8 = version >= 8
    part_struct = _PRODUCE_PART[version >= 5]
    with_start = version >= 5
    out: list[bytes] = []
    append = out.append
    responses = body["responses"]
    append(_array_len(len(responses), flexible))
    for topic in responses:
        append(_string(topic["name"], flexible))
        parts = topic["partition_responses"]
        append(_array_len(len(parts), flexible))
        for p in parts:
            if with_start:
                append(part_struct.pack(p["index"], p["error_code"], p["base_offset"],
                                        p["log_append_time"], p["log_start_offset"]))
            else:
                append(part_struct.pack(p["index"], p["error_code"], p["base_offset"], p["log_append_time"]))
            if v8:
                if p.get("record_errors"):
                    return None
                append(b"\x01" if flexible else b"\x00\x00\x00\x00")  # empty record_errors
                append(_nullable_string(p.get("error_message"), flexible))
            if flexible:
                append(b"\x00")
        if flexible:
            append(b"\x00")
    append(_I32.pack(body.get("throttle_time", 0)))
    if flexible:
        append(b"\x00")
    return b"".join(out)


def encode_fetch_response(version: int, body: Mapping[str, Any]) -> bytes | None:
    """FetchResponse v4-v17 from the fetch handler's dict; None when kio must do it."""
    parts = fetch_response_parts(version, body)
    if parts is None:
        return None
    return b"".join(p.read() if isinstance(p, FileRange) else p for p in parts)


def fetch_response_parts(version: int, body: Mapping[str, Any]) -> list[Part] | None:
    """The encoded response as pieces, the record sets among them uncopied (bytes or file ranges, whose
    lengths are fixed here): the network edge sends them (pykbroker.server.transmit)."""
    if not 4 <= version <= 17:
        return None
    flexible = version >= 12
    by_id = version >= 13
    with_start = version >= 5
    with_replica = version >= 11
    part_struct = _FETCH_PART[with_start]
    out: list[Part] = []
    append = out.append
    if version >= 7:
        append(_I32I16I32.pack(body["throttle_time"], body["error_code"], body["session_id"]))
    else:
        append(_I32.pack(body["throttle_time"]))
    responses = body["responses"]
    append(_array_len(len(responses), flexible))
    for topic in responses:
        if by_id:
            topic_id = topic["topic_id"]  # kio reads the zero UUID as None
            append(_ZERO_UUID_BYTES if topic_id is None else topic_id.bytes)
        else:
            append(_string(topic["topic"], flexible))
        parts = topic["partitions"]
        append(_array_len(len(parts), flexible))
        for p in parts:
            if with_start:
                append(part_struct.pack(p["partition_index"], p["error_code"], p["high_watermark"],
                                        p["last_stable_offset"], p["log_start_offset"]))
            else:
                append(part_struct.pack(p["partition_index"], p["error_code"], p["high_watermark"],
                                        p["last_stable_offset"]))
            aborted = p["aborted_transactions"]
            if aborted is None:
                append(b"\x00" if flexible else b"\xff\xff\xff\xff")
            else:
                append(_array_len(len(aborted), flexible))
                for a in aborted:
                    append(_ABORTED.pack(a["producer_id"], a["first_offset"]))
                    if flexible:
                        append(b"\x00")
            if with_replica:
                append(_I32.pack(p["preferred_read_replica"]))
            records = p["records"]
            if records is None:
                append(b"\x00" if flexible else b"\xff\xff\xff\xff")
            else:
                append(_uvarint(len(records) + 1) if flexible else _I32.pack(len(records)))
                append(records)
            if flexible:
                diverging = p.get("diverging_epoch")  # tag 0 (v12+), set only on a follower's fetch
                if diverging is None:
                    append(b"\x00")
                else:
                    append(b"\x01\x00\x0d" + _DIVERGING.pack(diverging["epoch"], diverging["end_offset"]) + b"\x00")
        if flexible:
            append(b"\x00")
    if flexible:
        append(b"\x00")
    return out


_METADATA_PARTITION = struct.Struct(">hiii")  # error_code, partition_index, leader_id, leader_epoch
_NO_OPERATIONS = -(1 << 31)  # Kafka's "authorized operations omitted"


def _int32_array(nodes: Any) -> bytes:
    """A compact array of int32 (replica lists): cached, as a topic's partitions mostly share a few."""
    key = tuple(nodes)
    encoded = _INT32_ARRAYS.get(key)
    if encoded is None:
        encoded = _uvarint(len(key) + 1) + struct.pack(f">{len(key)}i", *key)
        if len(_INT32_ARRAYS) < 4096:
            _INT32_ARRAYS[key] = encoded
    return encoded


_INT32_ARRAYS: dict[tuple[int, ...], bytes] = {}


def encode_metadata_response(version: int, body: Mapping[str, Any]) -> bytes | None:
    """MetadataResponse v9-v12 (the flexible versions librdkafka and the Java client use) from the
    metadata handler's dict; None when kio must do it.  A consumer's Metadata for a topic of
    10,000 partitions spent most of its time in kio's generic writer."""
    if not 9 <= version <= 12:
        return None
    out: list[bytes] = []
    append = out.append
    append(_I32.pack(body.get("throttle_time", 0)))
    brokers = body["brokers"]
    append(_uvarint(len(brokers) + 1))
    for b in brokers:
        append(_I32.pack(b["node_id"]))
        append(_string(b["host"], True))
        append(_I32.pack(b["port"]))
        append(_nullable_string(b.get("rack"), True))
        append(b"\x00")
    append(_nullable_string(body.get("cluster_id"), True))
    append(_I32.pack(body.get("controller_id", -1)))
    topics = body["topics"]
    append(_uvarint(len(topics) + 1))
    pack_partition = _METADATA_PARTITION.pack
    for t in topics:
        append(_I16.pack(t["error_code"]))
        name = t["name"]
        if name is None and version < 12:
            return None  # not nullable before v12: kio's error, not ours
        append(_nullable_string(name, True))
        if version >= 10:
            topic_id = t.get("topic_id")
            append(_ZERO_UUID_BYTES if topic_id is None else topic_id.bytes)
        append(b"\x01" if t.get("is_internal", False) else b"\x00")
        partitions = t["partitions"]
        append(_uvarint(len(partitions) + 1))
        for p in partitions:
            append(pack_partition(p["error_code"], p["partition_index"], p["leader_id"], p.get("leader_epoch", -1)))
            append(_int32_array(p["replica_nodes"]))
            append(_int32_array(p["isr_nodes"]))
            append(_int32_array(p.get("offline_replicas", ())))
            append(b"\x00")
        append(_I32.pack(t.get("topic_authorized_operations", _NO_OPERATIONS)))
        append(b"\x00")
    if version <= 10:
        append(_I32.pack(body.get("cluster_authorized_operations", _NO_OPERATIONS)))
    append(b"\x00")
    return b"".join(out)


def _metadata_response_parts(version: int, body: Mapping[str, Any]) -> list[Part] | None:
    encoded = encode_metadata_response(version, body)
    return None if encoded is None else [encoded]


def _produce_response_parts(version: int, body: Mapping[str, Any]) -> list[Part] | None:
    encoded = encode_produce_response(version, body)
    return None if encoded is None else [encoded]


_API_VERSIONS_FIELDS = frozenset({"error_code", "api_keys", "throttle_time", "supported_features",
                                  "finalized_features_epoch", "finalized_features", "zk_migration_ready"})
_API_VERSIONS_MEMO: dict[tuple[Any, ...], bytes] = {}
_API_VERSIONS_MEMO_MAX = 64


def _api_versions_response_parts(version: int, body: Mapping[str, Any]) -> list[Part] | None:
    """ApiVersions: the answer is the same for every connection of a broker, and kio took about 130 µs
    to encode its ~70 API ranges, most of what a new connection cost.  Each distinct answer (keyed by
    every field of the body) is encoded once by kio, then reused."""
    if not body.keys() <= _API_VERSIONS_FIELDS:
        return None
    try:
        key = (
            version, int(body["error_code"]), body.get("throttle_time", 0),
            tuple((k["api_key"], k["min_version"], k["max_version"]) for k in body["api_keys"]),
            tuple((f["name"], f["min_version"], f["max_version"]) for f in body.get("supported_features", ())),
            body.get("finalized_features_epoch", -1),
            tuple((f["name"], f["min_version_level"], f["max_version_level"])
                  for f in body.get("finalized_features", ())),
            body.get("zk_migration_ready", False),
        )
    except (KeyError, TypeError):
        return None
    encoded = _API_VERSIONS_MEMO.get(key)
    if encoded is None:
        encoded = codec.encode_response(18, version, body)
        if len(_API_VERSIONS_MEMO) >= _API_VERSIONS_MEMO_MAX:  # bounded: throttle times vary under quotas
            _API_VERSIONS_MEMO.clear()
        _API_VERSIONS_MEMO[key] = encoded
    return [encoded]


# API key -> encoder of a response body as pieces (None: the version is kio's to encode).
FAST_ENCODERS: dict[int, Callable[[int, Mapping[str, Any]], list[Part] | None]] = {
    0: _produce_response_parts,
    1: fetch_response_parts,
    3: _metadata_response_parts,
    18: _api_versions_response_parts,
}
