"""Client telemetry (KIP-714), sans-I/O: subscriptions, client instances and the metrics they push.

Subscriptions are CLIENT_METRICS config resources (``metrics``, ``interval.ms``, ``match``), set
with IncrementalAlterConfigs and read from the metadata store.  A client asks for its subscription
with GetTelemetrySubscriptions and then pushes OTLP ``MetricsData`` with PushTelemetry every push
interval; the broker keeps the latest (decompressed) payload per client instance, for the metrics
endpoint that comes with the operations work.  Rules follow Kafka's ClientMetricsManager: a request
before the push interval is throttled, a push with a stale subscription id is refused, nothing is
accepted after a terminating push, and payloads above ``telemetry.max.bytes`` are refused.
"""

from __future__ import annotations

import logging
import re
import uuid
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from pykbroker.logsetup import fields
from pykbroker.observability.otlp import OtlpError, walk
from pykbroker.protocol.record_validator import _decompress_bounded
from pykbroker.protocol.records import InvalidRecords
from pykbroker.protocol.responses.telemetry import GetTelemetrySubscriptionsResponse

log = logging.getLogger("pykbroker.telemetry")

# Kafka's CompressionType ids, in the order the broker prefers them (the client takes the first it has).
NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
ACCEPTED_COMPRESSION_TYPES = (ZSTD, LZ4, GZIP, SNAPPY)
DEFAULT_INTERVAL_MS = 300_000
MIN_INTERVAL_MS = 100
MAX_INTERVAL_MS = 3_600_000
ALL_METRICS = "*"
MATCH_KEYS = ("client_instance_id", "client_id", "client_software_name", "client_software_version",
              "client_source_address", "client_source_port")
# Instances not heard from within max(this, 3 push intervals) are forgotten, as in Kafka.
INSTANCE_EXPIRY_MS = 60_000
MAX_INSTANCES = 16_384
# Decompressed payloads are bounded too, so a small compressed push cannot inflate without limit.
DECOMPRESSED_FACTOR = 16


class InvalidSubscription(ValueError):
    """A CLIENT_METRICS config that Kafka would refuse (INVALID_CONFIG)."""


class MalformedMetrics(OtlpError):
    """A payload that is not OTLP MetricsData protobuf."""


def _fields(buf: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    """The length-delimited fields of one protobuf message: (field number, start, end)."""
    try:
        return [(number, a, b) for number, wire, a, b in walk(buf, start, end) if wire == 2]
    except OtlpError as e:
        raise MalformedMetrics(str(e)) from None


def metric_names(data: bytes) -> list[str]:
    """Names of the metrics in OTLP MetricsData (resource_metrics=1 > scope_metrics=2 > metrics=2 > name=1)."""
    names = []
    for rm_no, rm_start, rm_end in _fields(data, 0, len(data)):
        if rm_no != 1:
            continue
        for sm_no, sm_start, sm_end in _fields(data, rm_start, rm_end):
            if sm_no != 2:
                continue
            for m_no, m_start, m_end in _fields(data, sm_start, sm_end):
                if m_no != 2:
                    continue
                for f_no, f_start, f_end in _fields(data, m_start, m_end):
                    if f_no == 1:
                        try:
                            names.append(data[f_start:f_end].decode("utf-8"))
                        except UnicodeDecodeError:
                            raise MalformedMetrics("metric name is not UTF-8") from None
    return names


@dataclass(frozen=True)
class Subscription:
    name: str
    metrics: tuple[str, ...]
    interval_ms: int
    match: tuple[tuple[str, re.Pattern[str]], ...]


def parse_subscription(name: str, configs: dict[str, str]) -> Subscription:
    """A CLIENT_METRICS resource's configs as a subscription; raises InvalidSubscription."""
    unknown = set(configs) - {"metrics", "interval.ms", "match"}
    if unknown:
        raise InvalidSubscription(f"Unknown client metrics configuration: {sorted(unknown)}")
    metrics = tuple(m.strip() for m in configs.get("metrics", "").split(",") if m.strip())
    raw_interval = configs.get("interval.ms", str(DEFAULT_INTERVAL_MS))
    try:
        interval = int(raw_interval)
    except ValueError:
        raise InvalidSubscription(f"Invalid value {raw_interval} for configuration interval.ms") from None
    if not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
        raise InvalidSubscription(f"Invalid value {interval} for interval.ms, interval must be between "
                                  f"{MIN_INTERVAL_MS} and {MAX_INTERVAL_MS}")
    match = []
    for item in (m.strip() for m in configs.get("match", "").split(",") if m.strip()):
        key, sep, pattern = item.partition("=")
        key = key.strip()
        if not sep or not pattern.strip():
            raise InvalidSubscription(f"Illegal client matching pattern: {item}")
        if key not in MATCH_KEYS:
            raise InvalidSubscription(f"Illegal client matching pattern: {item}")
        try:
            match.append((key, re.compile(pattern.strip())))
        except re.error:
            raise InvalidSubscription(f"Illegal regex pattern: {pattern.strip()}") from None
    return Subscription(name, metrics, interval, tuple(match))


@dataclass(frozen=True)
class ClientSelector:
    """What a subscription's ``match`` patterns are tested against."""

    client_id: str = ""
    software_name: str = ""
    software_version: str = ""
    source_address: str = ""
    source_port: str = ""

    def values(self, instance_id: uuid.UUID) -> dict[str, str]:
        return {"client_instance_id": str(instance_id), "client_id": self.client_id,
                "client_software_name": self.software_name, "client_software_version": self.software_version,
                "client_source_address": self.source_address, "client_source_port": self.source_port}


@dataclass
class PushedMetrics:
    """The latest push of one client instance: OTLP MetricsData, decompressed."""

    received_ms: int
    compression_type: int
    data: bytes
    metric_names: list[str]


@dataclass
class ClientInstance:
    instance_id: uuid.UUID
    selector: ClientSelector
    subscription_id: int
    metrics: tuple[str, ...]
    push_interval_ms: int
    subscriptions_version: int
    last_get_ms: int = -(1 << 62)
    last_push_ms: int = -(1 << 62)
    terminating: bool = False
    last_error: ErrorCode = ErrorCode.none
    last_seen_ms: int = 0
    latest: PushedMetrics | None = None
    pushes: int = 0


def subscription_id(metrics: tuple[str, ...], interval_ms: int, instance_id: uuid.UUID) -> int:
    """A 32-bit id that changes whenever the metrics or the interval of the subscription do."""
    digest = zlib.crc32(("\n".join(sorted(metrics)) + f"|{interval_ms}|").encode() + instance_id.bytes)
    return digest - (1 << 32) if digest >= 1 << 31 else digest


@dataclass
class ClientTelemetry:
    max_bytes: int = 1_048_576
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    instances: OrderedDict[uuid.UUID, ClientInstance] = field(default_factory=OrderedDict)
    version: int = 0
    _source: dict[str, dict[str, str]] = field(default_factory=dict)

    # -- subscriptions ------------------------------------------------------------------------

    def update_subscriptions(self, configs: dict[str, dict[str, str]]) -> None:
        """Take the CLIENT_METRICS resources as stored; instances re-evaluate on their next request."""
        if configs == self._source:
            return
        subs = {}
        for name, cfg in configs.items():
            if not cfg:
                continue
            try:
                subs[name] = parse_subscription(name, cfg)
            except InvalidSubscription as e:  # validated when set; a bad stored one is skipped, loudly
                log.warning("ignoring client metrics subscription %(name)s: %(error)s", {"name": name, "error": e})
        self._source = {k: dict(v) for k, v in configs.items()}
        self.subscriptions = subs
        self.version += 1

    def _evaluate(self, instance_id: uuid.UUID, selector: ClientSelector, now_ms: int) -> ClientInstance:
        values = selector.values(instance_id)
        interval = DEFAULT_INTERVAL_MS
        metrics: set[str] = set()
        every = False
        for sub in self.subscriptions.values():
            if all(p.fullmatch(values[k]) for k, p in sub.match):
                metrics.update(sub.metrics)
                every = every or ALL_METRICS in sub.metrics
                interval = min(interval, sub.interval_ms)
        chosen = (ALL_METRICS,) if every else tuple(sorted(metrics))
        return ClientInstance(instance_id, selector, subscription_id(chosen, interval, instance_id), chosen,
                              interval, self.version, last_seen_ms=now_ms)

    def _instance(self, instance_id: uuid.UUID, selector: ClientSelector, now_ms: int) -> ClientInstance:
        self._expire(now_ms)
        inst = self.instances.get(instance_id)
        if inst is None:
            inst = self._evaluate(instance_id, selector, now_ms)
            self.instances[instance_id] = inst
            while len(self.instances) > MAX_INSTANCES:
                self.instances.popitem(last=False)
        elif inst.subscriptions_version < self.version:
            fresh = self._evaluate(instance_id, inst.selector, now_ms)
            # The new subscription is answered at once; the push clock carries over.
            fresh.last_push_ms, fresh.terminating, fresh.latest, fresh.pushes = (
                inst.last_push_ms, inst.terminating, inst.latest, inst.pushes)
            inst = self.instances[instance_id] = fresh
        inst.last_seen_ms = now_ms
        self.instances.move_to_end(instance_id)
        return inst

    def _expire(self, now_ms: int) -> None:
        while self.instances:
            inst = next(iter(self.instances.values()))
            if now_ms - inst.last_seen_ms < max(INSTANCE_EXPIRY_MS, 3 * inst.push_interval_ms):
                break
            self.instances.popitem(last=False)

    # -- the two requests ------------------------------------------------------------------------

    def get_subscriptions(self, instance_id: uuid.UUID | None, selector: ClientSelector,
                          now_ms: int) -> GetTelemetrySubscriptionsResponse:
        """GetTelemetrySubscriptions: a new instance id for a zero one, then the matching subscription."""
        if instance_id is None or instance_id.int == 0:
            instance_id = uuid.uuid4()
            while instance_id in self.instances:
                instance_id = uuid.uuid4()
        inst = self._instance(instance_id, selector, now_ms)
        body: GetTelemetrySubscriptionsResponse = {
            "throttle_time": 0, "error_code": ErrorCode.none, "client_instance_id": instance_id, "subscription_id": 0,
            "accepted_compression_types": (), "push_interval": 0, "telemetry_max_bytes": 0,
            "delta_temporality": False, "requested_metrics": ()}
        # Too early, unless the last push failed on a stale subscription or codec (the client must re-fetch).
        allowed = now_ms - max(inst.last_get_ms, inst.last_push_ms) >= inst.push_interval_ms
        if not allowed and inst.last_error not in (ErrorCode.unknown_subscription_id,
                                                   ErrorCode.unsupported_compression_type):
            body["error_code"] = ErrorCode.throttling_quota_exceeded
            return body
        if allowed:
            inst.last_get_ms = now_ms
        inst.last_error = ErrorCode.none
        body.update({"subscription_id": inst.subscription_id, "accepted_compression_types": ACCEPTED_COMPRESSION_TYPES,
                     "push_interval": inst.push_interval_ms, "telemetry_max_bytes": self.max_bytes,
                     "delta_temporality": True, "requested_metrics": inst.metrics})
        return body

    def push(self, instance_id: uuid.UUID | None, subscription: int, terminating: bool, compression_type: int,
             metrics: bytes, selector: ClientSelector, now_ms: int) -> ErrorCode:
        """PushTelemetry: validate, then keep the decompressed payload as the instance's latest."""
        if instance_id is None or instance_id.int in (0, 1):  # Kafka's reserved ids (zero, metadata topic)
            return ErrorCode.invalid_request
        inst = self._instance(instance_id, selector, now_ms)
        error = self._check_push(inst, subscription, terminating, compression_type, metrics, now_ms)
        inst.terminating = terminating or inst.terminating
        if error is not ErrorCode.none:
            if error is not ErrorCode.invalid_request or not inst.terminating:
                inst.last_error = error
            return error
        if metrics:
            limit = max(self.max_bytes * DECOMPRESSED_FACTOR, self.max_bytes)
            try:
                data = bytes(metrics) if compression_type == NONE else \
                    bytes(_decompress_bounded(compression_type, memoryview(metrics), limit, "telemetry"))
                names = metric_names(data)
            except InvalidRecords as e:
                too_large = "decompresses to more than" in str(e)
                inst.last_error = ErrorCode.telemetry_too_large if too_large else ErrorCode.invalid_record
                return inst.last_error
            except MalformedMetrics as e:
                # Kafka's exporter fails on a payload it cannot read, and the client stops pushing.
                log.info("client telemetry: unreadable metrics from client instance %(client_instance_id)s: %(error)s",
                         {"client_instance_id": instance_id, "error": e})
                inst.last_error = ErrorCode.invalid_record
                return inst.last_error
            if inst.latest is None:
                log.info("client telemetry: first metrics from a client instance", extra=fields(
                    client_instance_id=str(instance_id), client_id=inst.selector.client_id,
                    software=f"{inst.selector.software_name}/{inst.selector.software_version}",
                    metrics=len(names), examples=",".join(sorted(names)[:3])))
            inst.latest = PushedMetrics(now_ms, compression_type, data, names)
            inst.pushes += 1
        inst.last_error = ErrorCode.none
        return ErrorCode.none

    def _check_push(self, inst: ClientInstance, subscription: int, terminating: bool, compression_type: int,
                    metrics: bytes, now_ms: int) -> ErrorCode:
        if inst.terminating:
            return ErrorCode.invalid_request
        # A push right after fetching the subscription is fine; otherwise one per push interval.
        can_push = inst.last_get_ms > inst.last_push_ms or \
            now_ms - max(inst.last_get_ms, inst.last_push_ms) >= inst.push_interval_ms
        if can_push:
            inst.last_push_ms = now_ms
        elif not terminating:
            return ErrorCode.throttling_quota_exceeded
        if subscription != inst.subscription_id:
            return ErrorCode.unknown_subscription_id
        if compression_type not in (NONE, *ACCEPTED_COMPRESSION_TYPES):
            return ErrorCode.unsupported_compression_type
        if len(metrics) > self.max_bytes:
            return ErrorCode.telemetry_too_large
        return ErrorCode.none

    # -- the client software a connection named in ApiVersions (a match key) ---------------------

    _software: OrderedDict[str, tuple[str, str]] = field(default_factory=OrderedDict)

    def note_client_software(self, peer: str, name: str, version: str) -> None:
        """Remember what ApiVersions v3+ said on this connection (bounded; oldest forgotten first)."""
        self._software[peer] = (name, version)
        self._software.move_to_end(peer)
        while len(self._software) > MAX_INSTANCES:
            self._software.popitem(last=False)

    def selector(self, client_id: str | None, peer: str) -> ClientSelector:
        address, _, port = peer.rpartition(":")
        name, version = self._software.get(peer, ("", ""))
        return ClientSelector(client_id or "", name, version, address.strip("[]"), port)

    # -- for the metrics endpoint and tests ------------------------------------------------------

    def latest_metrics(self, instance_id: uuid.UUID) -> PushedMetrics | None:
        inst = self.instances.get(instance_id)
        return None if inst is None else inst.latest

    def subscription_names(self) -> list[str]:
        return sorted(self.subscriptions)
