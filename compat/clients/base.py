"""The interface every client driver implements, and the values that cross it.

Scenarios are written once against ``Client``; each driver maps the calls onto its own library
(or process).  Errors are normalised to Kafka's protocol error names (``TOPIC_ALREADY_EXISTS``,
``MESSAGE_TOO_LARGE``, ...) so a scenario can assert the documented code whatever the client.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
EMPTY_BYTES = "empty_bytes"        # an empty key or value reads back empty, apart from a null one
ACKS0 = "acks0"
DELIVERY_OFFSETS = "delivery_offsets"  # learns each record's offset from the produce response
GROUP_ADMIN = "group_admin"        # list and describe groups
OFFSET_DELETE = "offset_delete"    # delete a group's committed offsets (OffsetDelete)
TXN_ADMIN = "txn_admin"            # list/describe transactions, describe producers
MAX_MESSAGE_OVERRIDE = "max_message_override"  # can send a batch bigger than a topic's limit
ALTER_CONFIGS = "alter_configs"    # AlterConfigs (the whole set of a resource's dynamic configs)
INCREMENTAL_ALTER_CONFIGS = "incremental_alter_configs"  # IncrementalAlterConfigs: set/delete/append/subtract
CONFIG_SYNONYMS = "config_synonyms"  # DescribeConfigs with sources and synonyms
CLIENT_METRICS_CONFIGS = "client_metrics_configs"  # CLIENT_METRICS config resources (KIP-714 subscriptions)
BROKER_CONFIGS = "broker_configs"  # alter and describe a broker's dynamic configs
BROKER_DEFAULT_CONFIGS = "broker_default_configs"  # the cluster-wide default broker resource (name "")
DESCRIBE_CLUSTER = "describe_cluster"  # cluster id, controller, brokers (and the cluster's authorized operations)
CLUSTER_AUTHORIZED_OPS = "cluster_authorized_ops"
DESCRIBE_TOPIC_PARTITIONS = "describe_topic_partitions"  # topic description through DescribeTopicPartitions
TOPIC_AUTHORIZED_OPS = "topic_authorized_ops"
GROUP_AUTHORIZED_OPS = "group_authorized_ops"
LOG_DIRS = "log_dirs"              # DescribeLogDirs
ALTER_LOG_DIRS = "alter_log_dirs"  # AlterReplicaLogDirs
ELECT_LEADERS = "elect_leaders"
REASSIGNMENTS = "reassignments"    # Alter/ListPartitionReassignments
CLIENT_QUOTAS = "client_quotas"    # Describe/AlterClientQuotas
MAX_TIMESTAMP = "max_timestamp"    # ListOffsets with MAX_TIMESTAMP (-3)
EPOCH_VALIDATION = "epoch_validation"  # the consumer validates a position with OffsetForLeaderEpoch
CLIENT_INSTANCE_ID = "client_instance_id"  # KIP-714: the client asks GetTelemetrySubscriptions for its id
PUSH_TELEMETRY = "push_telemetry"  # KIP-714: the client pushes its metrics when a subscription matches it

# Every capability above: what a client with the whole of Kafka's Java client API can do (the Java
# client itself); a driver names what it lacks against this.
COMPLETE = frozenset({
    ADMIN, DESCRIBE_CONFIGS, DELETE_RECORDS, ASSIGN, GROUPS, GROUP_PROTOCOL_CONSUMER, COMMIT, TIMESTAMPS,
    LIST_OFFSETS, DESCRIBE_UNKNOWN, IDEMPOTENCE, TRANSACTIONS, TXN_OFFSETS, RESET_NONE, HEADERS, NULL_VALUES,
    NULL_HEADER_VALUES, BINARY, EMPTY_BYTES, ACKS0, MAX_MESSAGE_OVERRIDE, DELIVERY_OFFSETS, GROUP_ADMIN,
    OFFSET_DELETE, TXN_ADMIN, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS, CONFIG_SYNONYMS, BROKER_CONFIGS,
    BROKER_DEFAULT_CONFIGS, CLIENT_METRICS_CONFIGS, DESCRIBE_CLUSTER, CLUSTER_AUTHORIZED_OPS,
    DESCRIBE_TOPIC_PARTITIONS, TOPIC_AUTHORIZED_OPS, GROUP_AUTHORIZED_OPS, LOG_DIRS, ALTER_LOG_DIRS,
    ELECT_LEADERS, REASSIGNMENTS, CLIENT_QUOTAS, MAX_TIMESTAMP, EPOCH_VALIDATION, CLIENT_INSTANCE_ID,
    PUSH_TELEMETRY,
})

CAP_TEXT = {
    ADMIN: "an admin API (create/delete/describe topics)", DESCRIBE_CONFIGS: "describing configs",
    DELETE_RECORDS: "deleting records", ASSIGN: "consuming without a group", GROUPS: "consumer groups",
    GROUP_PROTOCOL_CONSUMER: "group.protocol=consumer (KIP-848)", COMMIT: "committing and fetching group offsets",
    TIMESTAMPS: "setting record timestamps", LIST_OFFSETS: "listing offsets",
    DESCRIBE_UNKNOWN: "asking about a topic without auto-creating it", IDEMPOTENCE: "the idempotent producer",
    TRANSACTIONS: "transactions", TXN_OFFSETS: "sending offsets to a transaction",
    RESET_NONE: "auto.offset.reset=none", HEADERS: "headers", NULL_VALUES: "null values",
    NULL_HEADER_VALUES: "null header values", BINARY: "binary keys and values",
    EMPTY_BYTES: "empty keys and values apart from null ones", ACKS0: "acks=0",
    DELIVERY_OFFSETS: "delivery offsets", GROUP_ADMIN: "listing and describing groups",
    OFFSET_DELETE: "deleting committed offsets", TXN_ADMIN: "describing transactions and producers",
    MAX_MESSAGE_OVERRIDE: "sending batches over the topic's limit",
    ALTER_CONFIGS: "AlterConfigs", INCREMENTAL_ALTER_CONFIGS: "IncrementalAlterConfigs",
    CONFIG_SYNONYMS: "config sources and synonyms", CLIENT_METRICS_CONFIGS: "CLIENT_METRICS configs",
    BROKER_CONFIGS: "broker configs", BROKER_DEFAULT_CONFIGS: "the cluster-wide default broker configs",
    DESCRIBE_CLUSTER: "describing the cluster", CLUSTER_AUTHORIZED_OPS: "cluster authorized operations",
    DESCRIBE_TOPIC_PARTITIONS: "DescribeTopicPartitions", TOPIC_AUTHORIZED_OPS: "topic authorized operations",
    GROUP_AUTHORIZED_OPS: "group authorized operations", LOG_DIRS: "describing log dirs",
    ALTER_LOG_DIRS: "moving replicas between log dirs", ELECT_LEADERS: "electing leaders",
    REASSIGNMENTS: "partition reassignments", CLIENT_QUOTAS: "client quotas",
    MAX_TIMESTAMP: "ListOffsets MAX_TIMESTAMP", EPOCH_VALIDATION: "validating positions by leader epoch",
    CLIENT_INSTANCE_ID: "client instance ids (KIP-714)", PUSH_TELEMETRY: "pushing its metrics (KIP-714)",
}

# DescribeConfigs' ConfigSource ids, by Kafka's names (clients that report numbers are mapped with this).
CONFIG_SOURCES = {0: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG",
                  3: "DYNAMIC_DEFAULT_BROKER_CONFIG", 4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG",
                  6: "DYNAMIC_BROKER_LOGGER_CONFIG", 7: "CLIENT_METRICS_CONFIG", 8: "GROUP_CONFIG"}

# AclOperation codes (authorized operations are a bit field of these).
ACL_OPERATIONS = {2: "ALL", 3: "READ", 4: "WRITE", 5: "CREATE", 6: "DELETE", 7: "ALTER", 8: "DESCRIBE",
                  9: "CLUSTER_ACTION", 10: "DESCRIBE_CONFIGS", 11: "ALTER_CONFIGS", 12: "IDEMPOTENT_WRITE",
                  13: "CREATE_TOKENS", 14: "DESCRIBE_TOKENS", 15: "TWO_PHASE_COMMIT"}


def norm_source(s: Any) -> str:
    """A config source as Kafka's name ("DYNAMIC_TOPIC_CONFIG", ...), whatever form the client gives it in."""
    if isinstance(s, int):
        return CONFIG_SOURCES.get(s, f"SOURCE_{s}")
    name = str(getattr(s, "name", s)).upper().removeprefix("CONFIGSOURCE.")
    return {"UNKNOWN_CONFIG": "UNKNOWN", "DYNAMIC_CLIENT_METRICS_CONFIG": "CLIENT_METRICS_CONFIG"}.get(name, name)


def ops_from_bits(bits: int | None) -> set[str] | None:
    """Authorized operations from the protocol's bit field; None when the broker did not say
    (-2147483648, Kafka's "not requested")."""
    if bits is None or bits == -2147483648:
        return None
    return {name for code, name in ACL_OPERATIONS.items() if bits & (1 << code)}


@dataclass
class ConfigValue:
    """One entry of a DescribeConfigs answer: value, source and (when asked for) synonyms, each
    (name, value, source), most specific first."""

    value: str | None
    source: str
    synonyms: list[tuple[str, str | None, str]] = field(default_factory=list)
    read_only: bool | None = None


class Member:
    """A consumer-group member that polls in the background and collects what it is given."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[Record] = []
        self._assignment: list[tuple[str, int]] = []
        self.error: str | None = None
        # The member stopped for good (its client raised or reported a fatal error): waiting longer is pointless.
        self.failed = False

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


@dataclass(frozen=True)
class Sasl:
    """A client identity over SASL_PLAINTEXT: the mechanism ("PLAIN", "SCRAM-SHA-512") and credentials.
    Each driver spells it in its own library's config."""

    mechanism: str
    username: str
    password: str

    def python_kwargs(self) -> dict[str, str]:
        """The identity in kafka-python's and aiokafka's keyword spelling (the two share it)."""
        return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": self.mechanism,
                "sasl_plain_username": self.username, "sasl_plain_password": self.password}


class Client:
    name: str = "?"
    caps: frozenset[str] = frozenset()
    # SASL mechanisms the library can authenticate with (drivers narrow this).
    sasl_mechanisms: frozenset[str] = frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"})
    codecs: frozenset[str] = frozenset({"none", "gzip", "snappy", "lz4", "zstd"})
    # Whether the members of other clients can read this client's classic group subscription (the
    # ConsumerProtocolSubscription in JoinGroup), so that it can share a group with them.
    shares_groups: bool = True
    # {API key: the lowest version this library can use}, where that is above 0: a broker advertising
    # only older versions cannot serve the scenario ("not supported by the broker", not a timeout).
    api_versions_needed: dict[int, int] = {}

    def __init__(self, bootstrap: str, sasl: Sasl | None = None) -> None:
        self.bootstrap = bootstrap
        self.sasl = sasl
        if sasl is not None and sasl.mechanism not in self.sasl_mechanisms:
            raise NotSupportedByClient(f"SASL mechanism {sasl.mechanism}")

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

    def partition_leaders(self, name: str) -> dict[int, int]:
        """{partition: leader broker id, -1 when it has none} from the cluster's metadata."""
        raise NotSupportedByClient("describe partition leaders")

    def topic_configs(self, name: str) -> dict[str, str]:
        raise NotSupportedByClient("describe configs")

    def delete_records(self, topic: str, partition: int, before: int) -> int:
        """Delete records before an offset; returns the new low watermark."""
        raise NotSupportedByClient("delete records")

    def metadata(self) -> dict[str, Any]:
        """{"brokers": [ids], "topics": {name: partitions}} from a Metadata request for all topics."""
        raise NotSupportedByClient("metadata")

    def authenticate(self, timeout: float = 30.0) -> None:
        """Connect and ask for the metadata, raising the client's own error when the broker refuses the
        authentication (drivers whose metadata call hides that error override this)."""
        self.metadata()

    # --- configs and cluster admin ---------------------------------------------------------------
    def alter_configs(self, rtype: str, name: str, ops: list[tuple[str, str, str | None]], *,
                      incremental: bool = True, validate_only: bool = False) -> None:
        """Change a resource's configs. rtype: "topic", "broker" (name: a broker id, or "" for the cluster
        default), "client_metrics"; ops: (op, key, value) with op "set", "delete", "append" or "subtract".
        incremental=False sends AlterConfigs, which replaces the resource's whole set of dynamic configs
        with the given ones (only "set")."""
        raise NotSupportedByClient("IncrementalAlterConfigs" if incremental else "AlterConfigs")

    def describe_configs(self, rtype: str, name: str, *, synonyms: bool = False) -> dict[str, ConfigValue]:
        raise NotSupportedByClient("describe configs with sources")

    def describe_cluster(self, authorized_operations: bool = False) -> dict[str, Any]:
        """{"cluster_id", "controller" (-1 if none), "brokers": [ids], "authorized_operations": set | None}."""
        raise NotSupportedByClient("describe cluster")

    def describe_topic_detail(self, name: str, authorized_operations: bool = False) -> dict[str, Any]:
        """{"topic_id": str | None, "partitions": {p: {"leader", "replicas", "isr"}},
        "authorized_operations": set | None} through DescribeTopicPartitions where the client uses it."""
        raise NotSupportedByClient("DescribeTopicPartitions")

    def topic_authorized_operations(self, name: str) -> set[str] | None:
        """The operations the client may perform on a topic, as the client's topic description reports
        them when asked (Metadata, or DescribeTopicPartitions where the client uses it)."""
        raise NotSupportedByClient("topic authorized operations")

    def group_authorized_operations(self, group: str) -> set[str] | None:
        raise NotSupportedByClient("group authorized operations")

    def describe_log_dirs(self, broker: int) -> dict[str, dict[str, Any]]:
        """{path: {"error": name | None, "replicas": {(topic, partition): {"size", "future"}}}}."""
        raise NotSupportedByClient("describe log dirs")

    def alter_replica_log_dir(self, topic: str, partition: int, broker: int, path: str) -> None:
        raise NotSupportedByClient("alter replica log dirs")

    def elect_leaders(self, topic: str, partitions: list[int]) -> dict[int, str | None]:
        """Preferred leader election; {partition: error name, or None when a leader was elected}."""
        raise NotSupportedByClient("elect leaders")

    def alter_reassignments(self, topic: str, targets: dict[int, list[int] | None]) -> dict[int, str | None]:
        """{partition: new replicas, or None to cancel} -> {partition: error name or None}."""
        raise NotSupportedByClient("alter partition reassignments")

    def list_reassignments(self, topic: str, partitions: list[int]) -> dict[int, dict[str, list[int]]]:
        raise NotSupportedByClient("list partition reassignments")

    def describe_client_quotas(self, entity: dict[str, str]) -> dict[str, float]:
        """The quotas set on exactly this entity ({"client-id": ...}); {} when none."""
        raise NotSupportedByClient("describe client quotas")

    def alter_client_quotas(self, entity: dict[str, str], quotas: dict[str, float | None],
                            validate_only: bool = False) -> None:
        """Set (a number) or remove (None) quotas of one entity."""
        raise NotSupportedByClient("alter client quotas")

    def max_timestamp_offset(self, topic: str, partition: int) -> tuple[int, int]:
        """ListOffsets MAX_TIMESTAMP: (offset, timestamp) of the record with the largest timestamp."""
        raise NotSupportedByClient("ListOffsets MAX_TIMESTAMP")

    def consume_validated(self, topic: str, partition: int, offset: int, count: int,
                          timeout: float = 30.0) -> list[Record]:
        """Read the record at ``offset`` to learn its leader epoch, then seek to it again *with* that
        epoch, which makes the consumer validate the position (OffsetForLeaderEpoch) before fetching;
        auto.offset.reset=none, so a wrong answer surfaces as an error. Returns ``count`` records from
        there."""
        raise NotSupportedByClient("validate positions by leader epoch")

    def client_instance_id(self, client_id: str | None = None, hold: float = 0.0) -> str:
        """KIP-714: a producer's client instance id, which it learns from GetTelemetrySubscriptions; the
        producer then stays up ``hold`` seconds (pushing metrics if a subscription matches it)."""
        raise NotSupportedByClient("client instance id")

    def push_telemetry(self, client_id: str, hold: float) -> str | None:
        """KIP-714: run a producer with this client id for ``hold`` seconds, so that a metrics subscription
        matching it makes it push (PushTelemetry), then close it; its instance id where the client tells."""
        raise NotSupportedByClient("pushing client metrics")

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


def authenticate_via_log(logger: str, call: Callable[[], Any], timeout: float) -> None:
    """Run ``call`` (a metadata request) while listening to the library's ``logger``: kafka-python and
    aiokafka report a refused SASL authentication (SaslAuthenticationFailed, error 58) only in their log
    and then fail to bootstrap, or time out. Raises SASL_AUTHENTICATION_FAILED as soon as it is logged."""
    import logging

    seen: list[str] = []

    class _Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if "SaslAuthenticationFailed" in text:
                seen.append(text)

    handler = _Catch(logging.ERROR)
    log = logging.getLogger(logger)
    log.addHandler(handler)
    done: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            done.append(None)
        except BaseException as e:  # reported below, unless the log said why first
            done.append(e)

    t = threading.Thread(target=run, daemon=True)
    try:
        t.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not seen and not done:
            time.sleep(0.05)
    finally:
        log.removeHandler(handler)
    if seen:
        raise ClientError("SASL_AUTHENTICATION_FAILED", seen[0][:500])
    if done and done[0] is not None:
        raise done[0]
    if not done:
        raise ClientError("REQUEST_TIMED_OUT", f"neither metadata nor an authentication error in {timeout}s")


def authenticate_isolated(client: Client, logger: str, timeout: float) -> None:
    """authenticate_via_log in a child process with a fresh client: a client with a wrong password goes on
    retrying (and logging) in the background after the call gave up, which would mislead a later check in
    this process."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    assert client.sasl is not None
    arg = json.dumps({"name": client.name, "bootstrap": client.bootstrap, "logger": logger, "timeout": timeout,
                      "sasl": [client.sasl.mechanism, client.sasl.username, client.sasl.password]})
    try:
        p = subprocess.run([sys.executable, "-m", "compat.clients.base", arg], capture_output=True, text=True,
                           timeout=timeout + 30, cwd=Path(__file__).resolve().parents[2])
    except subprocess.TimeoutExpired:
        raise ClientError("REQUEST_TIMED_OUT", f"the authentication check did not end in {timeout + 30}s") from None
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if not lines:
        raise ClientError("CLIENT_ERROR", f"the authentication check exited {p.returncode}: {p.stderr[-1500:]}")
    res = json.loads(lines[-1])
    if not res["ok"]:
        raise ClientError(res["name"], res["message"])


def _authenticate_child(arg: str) -> None:
    import json
    import os

    from compat.clients import make_client

    a = json.loads(arg)
    c = make_client(a["name"], a["bootstrap"], Sasl(*a["sasl"]))
    try:
        authenticate_via_log(a["logger"], c.metadata, a["timeout"])
        out = {"ok": True}
    except ClientError as e:
        out = {"ok": False, "name": e.name, "message": e.message}
    except Exception as e:
        out = {"ok": False, "name": type(e).__name__, "message": str(e)[:1000]}
    print(json.dumps(out), flush=True)
    os._exit(0)  # without waiting for the client's background threads


def norm_state(s: str) -> str:
    """Group and transaction states as one spelling: "Stable", "STABLE", "COMPLETE_COMMIT" -> "stable", ..."""
    return str(s).lower().replace("_", "").replace(" ", "")


T = TypeVar("T")


def retry_on(names: Collection[str], fn: Callable[[], T], timeout: float, interval: float = 0.2,
             attempts: int = 100) -> T:
    """``fn()``, called again while it raises a ClientError named in ``names`` (errors Kafka documents as
    transient), for at most ``timeout`` seconds and ``attempts`` calls; then the last error stands."""
    deadline = time.monotonic() + timeout
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except ClientError as e:
            if e.name not in names or attempt == attempts or time.monotonic() > deadline:
                raise
        time.sleep(interval)
    raise ValueError(f"attempts must be at least 1, not {attempts}")


def wait_until(cond: Callable[[], T], timeout: float, interval: float = 0.1, what: str = "condition") -> T:
    """``cond()`` until it returns something true (bounded in time); that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := cond():
            return got
        time.sleep(interval)
    if not (got := cond()):
        raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
    return got


if __name__ == "__main__":
    import sys

    _authenticate_child(sys.argv[1])
