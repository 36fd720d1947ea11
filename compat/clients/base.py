"""The interface every client driver implements, and the values that cross it.

Scenarios are written once against ``Client``; each driver maps the calls onto its own library
(or process).  Errors are normalised to Kafka's protocol error names (``TOPIC_ALREADY_EXISTS``,
``MESSAGE_TOO_LARGE``, ...) so a scenario can assert the documented code whatever the client.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode


class ClientError(Exception):
    """A Kafka error as the client reported it; ``name`` is the protocol error name."""

    def __init__(self, name: str, message: str = "") -> None:
        super().__init__(f"{name}: {message}" if message else name)
        self.name = name
        self.message = message


class NotSupportedByClient(Exception):
    """The client library has no way to do this (reported as not supported, not as a failure)."""


def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"ERROR_{code}"


@dataclass
class Msg:
    value: bytes | None
    key: bytes | None = None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    partition: int | None = None
    timestamp: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "key": b64(self.key), "value": b64(self.value),
            "headers": [[k, b64(v)] for k, v in self.headers],
            "partition": self.partition, "timestamp": self.timestamp,
        }


@dataclass
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp: int = -1
    topic: str = ""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Record:
        return cls(d["partition"], d["offset"], unb64(d["key"]), unb64(d["value"]),
                   [(h[0], unb64(h[1])) for h in d.get("headers") or []], d.get("timestamp", -1), d.get("topic", ""))


@dataclass
class Delivery:
    partition: int
    offset: int  # -1 when the client does not learn it (acks=0)


def b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode()


def unb64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


# Capabilities a client may lack (as a library, independent of the broker).
ADMIN = "admin"                    # create/delete/describe topics, create partitions
DESCRIBE_CONFIGS = "describe_configs"
DELETE_RECORDS = "delete_records"
ASSIGN = "assign"                  # consume without a group (manual assignment)
GROUPS = "groups"                  # subscribe in a classic consumer group
GROUP_PROTOCOL_CONSUMER = "group_protocol_consumer"  # KIP-848 group.protocol=consumer
COMMIT = "commit"                  # commit and fetch group offsets
TIMESTAMPS = "timestamps"          # set a record's timestamp when producing
LIST_OFFSETS = "list_offsets"
DESCRIBE_UNKNOWN = "describe_unknown"  # ask about a topic without auto-creating it (Metadata v4+ or admin)
IDEMPOTENCE = "idempotence"
TRANSACTIONS = "transactions"
TXN_OFFSETS = "txn_offsets"        # send consumer offsets to a transaction
RESET_NONE = "reset_none"          # auto.offset.reset=none surfaces OFFSET_OUT_OF_RANGE
HEADERS = "headers"
NULL_VALUES = "null_values"
NULL_HEADER_VALUES = "null_header_values"
BINARY = "binary"                  # arbitrary bytes in keys and values
ACKS0 = "acks0"
DELIVERY_OFFSETS = "delivery_offsets"  # learns each record's offset from the produce response
GROUP_ADMIN = "group_admin"        # list and describe groups
OFFSET_DELETE = "offset_delete"    # delete a group's committed offsets (OffsetDelete)
TXN_ADMIN = "txn_admin"            # list/describe transactions, describe producers
MAX_MESSAGE_OVERRIDE = "max_message_override"  # can send a batch bigger than a topic's limit

CAP_TEXT = {
    ADMIN: "an admin API (create/delete/describe topics)", DESCRIBE_CONFIGS: "describing configs",
    DELETE_RECORDS: "deleting records", ASSIGN: "consuming without a group", GROUPS: "consumer groups",
    GROUP_PROTOCOL_CONSUMER: "group.protocol=consumer (KIP-848)", COMMIT: "committing and fetching group offsets",
    TIMESTAMPS: "setting record timestamps", LIST_OFFSETS: "listing offsets",
    DESCRIBE_UNKNOWN: "asking about a topic without auto-creating it", IDEMPOTENCE: "the idempotent producer",
    TRANSACTIONS: "transactions", TXN_OFFSETS: "sending offsets to a transaction",
    RESET_NONE: "auto.offset.reset=none", HEADERS: "headers", NULL_VALUES: "null values",
    NULL_HEADER_VALUES: "null header values", BINARY: "binary keys and values", ACKS0: "acks=0",
    DELIVERY_OFFSETS: "delivery offsets", GROUP_ADMIN: "listing and describing groups",
    OFFSET_DELETE: "deleting committed offsets", TXN_ADMIN: "describing transactions and producers",
    MAX_MESSAGE_OVERRIDE: "sending batches over the topic's limit",
}


class Member:
    """A consumer-group member that polls in the background and collects what it is given."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[Record] = []
        self._assignment: list[tuple[str, int]] = []
        self.error: str | None = None

    # driver side
    def _set_assignment(self, parts: list[tuple[str, int]]) -> None:
        with self._lock:
            self._assignment = sorted(parts)

    def _add(self, recs: list[Record]) -> None:
        with self._lock:
            self._records.extend(recs)

    # scenario side
    def assignment(self) -> list[tuple[str, int]]:
        with self._lock:
            return list(self._assignment)

    def records(self) -> list[Record]:
        with self._lock:
            return list(self._records)

    def close(self) -> None:
        raise NotImplementedError


class Client:
    name: str = "?"
    caps: frozenset[str] = frozenset()
    codecs: frozenset[str] = frozenset({"none", "gzip", "snappy", "lz4", "zstd"})

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def close(self) -> None:
        pass

    # --- admin -------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     configs: dict[str, str] | None = None) -> None:
        raise NotSupportedByClient("create topics")

    def delete_topic(self, name: str) -> None:
        raise NotSupportedByClient("delete topics")

    def create_partitions(self, name: str, total: int) -> None:
        raise NotSupportedByClient("create partitions")

    def describe_topic(self, name: str) -> int:
        """Number of partitions per the client's admin/metadata API; raises ClientError for unknown."""
        raise NotSupportedByClient("describe topics")

    def topic_configs(self, name: str) -> dict[str, str]:
        raise NotSupportedByClient("describe configs")

    def delete_records(self, topic: str, partition: int, before: int) -> int:
        """Delete records before an offset; returns the new low watermark."""
        raise NotSupportedByClient("delete records")

    def metadata(self) -> dict[str, Any]:
        """{"brokers": [ids], "topics": {name: partitions}} from a Metadata request for all topics."""
        raise NotSupportedByClient("metadata")

    # --- produce -----------------------------------------------------------------------------
    def produce(self, topic: str, msgs: list[Msg], *, acks: str = "all", compression: str = "none",
                idempotent: bool = False, timeout: float = 30.0) -> list[Delivery]:
        raise NotSupportedByClient("produce")

    def produce_transactions(self, topic: str, txns: list[tuple[list[Msg], bool]], transactional_id: str,
                             timeout: float = 60.0) -> None:
        """Run one transaction per (messages, commit?) with a single transactional producer."""
        raise NotSupportedByClient("transactions")

    def transactional_offsets(self, topic: str, msgs: list[Msg], transactional_id: str, group: str,
                              offsets_topic: str, offsets: dict[int, int], commit: bool,
                              timeout: float = 60.0) -> None:
        """Produce msgs and send group offsets in one transaction, then commit or abort it."""
        raise NotSupportedByClient("send offsets to a transaction")

    # --- consume -----------------------------------------------------------------------------
    def consume(self, topic: str, partitions: list[int], *, start: int | str = "earliest", count: int,
                timeout: float = 20.0, isolation: str = "read_uncommitted", reset: str = "earliest",
                idle: float | None = None) -> list[Record]:
        """Assign the partitions (no group), start at an offset or "earliest"/"latest", and return the
        first ``count`` records (fewer if ``idle`` seconds pass without any, or at ``timeout``)."""
        raise NotSupportedByClient("consume without a group")

    def list_offset(self, topic: str, partition: int, spec: int | str) -> int:
        """ListOffsets: "earliest", "latest" or a timestamp in ms; -1 when no record qualifies."""
        raise NotSupportedByClient("list offsets")

    # --- groups ------------------------------------------------------------------------------
    def start_member(self, group: str, topics: list[str], *, protocol: str = "classic",
                     assignor: str = "roundrobin", reset: str = "earliest", auto_commit: bool = True,
                     session_timeout_ms: int = 10000) -> Member:
        raise NotSupportedByClient("consumer groups")

    def commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        raise NotSupportedByClient("commit offsets")

    def committed_offsets(self, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
        """Committed offset per partition, -1 where none."""
        raise NotSupportedByClient("fetch committed offsets")

    def list_groups(self) -> set[str]:
        raise NotSupportedByClient("list groups")

    def describe_group(self, group: str) -> dict[str, Any]:
        """{"state": norm_state(...), "members": count}."""
        raise NotSupportedByClient("describe groups")

    def delete_group(self, group: str) -> None:
        raise NotSupportedByClient("delete groups")

    def delete_committed_offsets(self, group: str, topic: str, partitions: list[int]) -> None:
        raise NotSupportedByClient("delete committed offsets")

    # --- transactions admin --------------------------------------------------------------------
    def list_transactions(self) -> dict[str, str]:
        """{transactional id: norm_state(state)}."""
        raise NotSupportedByClient("list transactions")

    def describe_transaction(self, transactional_id: str) -> str:
        raise NotSupportedByClient("describe transactions")

    def describe_producers(self, topic: str, partition: int) -> list[int]:
        raise NotSupportedByClient("describe producers")


def norm_state(s: str) -> str:
    """Group and transaction states as one spelling: "Stable", "STABLE", "COMPLETE_COMMIT" -> "stable", ..."""
    return str(s).lower().replace("_", "").replace(" ", "")


def wait_until(cond: Callable[[], bool], timeout: float, interval: float = 0.1, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(interval)
    if not cond():
        raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
