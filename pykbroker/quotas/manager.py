"""Per-client quota accounting: rates measured per Kafka's sensors, throttle times per its formula.

Sans-I/O: the caller passes the current time and the amount used; nothing here sleeps or touches
a socket.  The quotas themselves are read from the metadata store (a callable returning
``store.client_quotas()``), so a change made through AlterClientQuotas, on this broker or, in a
cluster, on another one, applies to the next request without a restart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pykbroker.metadata.store import QuotaEntity
from pykbroker.quotas.entities import CONTROLLER_MUTATION, FETCH, PRODUCE, REQUEST, MetricTags, resolve
from pykbroker.quotas.mutation import MutationQuota, MutationSensor, expire
from pykbroker.quotas.stats import Rate, SampledStat, throttle_time_ms

QuotaSource = Callable[[], Mapping[QuotaEntity, Mapping[str, float]]]

# Kafka's names for the quota types (the "quota type" of its metrics and logs).
QUOTA_TYPE_NAMES = {PRODUCE: "Produce", FETCH: "Fetch", REQUEST: "Request"}
INT32_MAX = 2**31 - 1
# Kafka drops a client's sensors after an hour without use (ClientQuotaManager.InactiveSensorExpirationTimeSeconds).
INACTIVE_SENSOR_MS = 3_600_000.0
_EXPIRY_CHECK_MS = 60_000.0
# The throttle-time metric is an average over Kafka's default metric config: 2 samples of 30 s.
_THROTTLE_SAMPLES, _THROTTLE_WINDOW_MS = 2, 30_000.0
# The resolution cache is dropped when a quota changes; this bounds it against endless new client ids.
_MAX_RESOLVED = 10_000
# Percent of one thread per second of handler time: a quota of n means n% of one thread (KIP-124).
_PERCENT_PER_SECOND = 100.0


@dataclass(frozen=True, slots=True)
class QuotaSnapshot:
    """One measurement, for metrics (kafka_server_<Type>_throttle_time and friends)."""

    quota_type: str  # "Produce", "Fetch", "Request" or "ControllerMutation"
    user: str  # "" when the quota is shared by every user of the client id
    client_id: str  # "" when the quota is shared by every client id of the user
    quota: float  # bytes per second, percent of one thread, or partition mutations per second
    rate: float  # the measured rate, same unit
    throttle_time_ms: float  # average throttle time given over the last minute, 0 when none
    last_throttle_ms: int  # the most recent non-zero throttle given


class _Sensor:
    __slots__ = ("bound", "last_throttle_ms", "last_used_ms", "rate", "throttles")

    def __init__(self, samples: int, window_ms: float, bound: float, now_ms: float) -> None:
        self.rate = Rate(samples, window_ms)
        self.throttles = SampledStat(_THROTTLE_SAMPLES, _THROTTLE_WINDOW_MS)
        self.bound = bound
        self.last_throttle_ms = 0
        self.last_used_ms = now_ms


class _QuotaType:
    """The sensors of one quota key, one per set of metric tags."""

    def __init__(self, key: str, samples: int, window_ms: float, cap_ms: float) -> None:
        self.key = key
        self.name = QUOTA_TYPE_NAMES[key]
        self.samples = samples
        self.window_ms = window_ms
        self.cap_ms = cap_ms
        self.sensors: dict[MetricTags, _Sensor] = {}
        self._next_expiry_ms = 0.0

    def record(self, tags: MetricTags, bound: float, value: float, now_ms: float, check: bool = True) -> int:
        """Record ``value`` and return the throttle time in ms (0 when within the quota), as Kafka's
        ``Sensor.record`` followed by ``QuotaUtils.throttleTime`` on a violation."""
        if now_ms >= self._next_expiry_ms:
            self._expire(now_ms)
        sensor = self.sensors.get(tags)
        if sensor is None:
            sensor = self.sensors[tags] = _Sensor(self.samples, self.window_ms, bound, now_ms)
        sensor.bound = bound
        sensor.last_used_ms = now_ms
        rate = sensor.rate
        rate.record(value, now_ms)
        if not check:
            return 0
        observed = rate.measure(now_ms)
        if observed <= bound:
            return 0
        ms = throttle_time_ms(observed, bound, rate.window_size_ms(now_ms), self.cap_ms)
        if ms > 0:
            sensor.throttles.record(ms, now_ms)
            sensor.last_throttle_ms = ms
        return ms

    def _expire(self, now_ms: float) -> None:
        self._next_expiry_ms = now_ms + _EXPIRY_CHECK_MS
        stale = [t for t, s in self.sensors.items() if now_ms - s.last_used_ms >= INACTIVE_SENSOR_MS]
        for tags in stale:
            del self.sensors[tags]

    def snapshot(self, now_ms: float) -> list[QuotaSnapshot]:
        out = []
        for (user, client_id), s in sorted(self.sensors.items()):
            count = s.throttles.count(now_ms)
            average = s.throttles.total(now_ms) / count if count else 0.0
            out.append(QuotaSnapshot(self.name, user, client_id, s.bound, s.rate.measure(now_ms), average,
                                     s.last_throttle_ms))
        return out


class QuotaManager:
    """Client quotas of one broker: produce and fetch byte rates (KIP-13/KIP-55) and request time
    (KIP-124), each measured over ``quota.window.num`` windows of ``quota.window.size.seconds``, and
    controller mutations (KIP-599), a token bucket per client (``mutation``)."""

    def __init__(self, quotas: QuotaSource, *, samples: int = 11, window_seconds: int = 1,
                 mutation_samples: int = 11, mutation_window_seconds: int = 1) -> None:
        self._source = quotas
        self.mutation_samples = mutation_samples  # controller.quota.window.num
        self.mutation_window_ms = mutation_window_seconds * 1000.0  # controller.quota.window.size.seconds
        self._seen: object = None
        self.samples = samples
        self.window_ms = window_seconds * 1000.0
        # Kafka bounds only request-time throttles (to one window); byte-rate throttles are whatever
        # brings the rate back, within the response field's int32.
        self.produce = _QuotaType(PRODUCE, samples, self.window_ms, INT32_MAX)
        self.fetch = _QuotaType(FETCH, samples, self.window_ms, INT32_MAX)
        self.request = _QuotaType(REQUEST, samples, self.window_ms, self.window_ms)
        self._resolved: dict[tuple[str, str, str], tuple[MetricTags, float] | None] = {}
        self._mutations: dict[MetricTags, MutationSensor] = {}
        self._next_mutation_expiry_ms = 0.0

    def active(self) -> bool:
        """Whether any client quota is stored: the one check a request pays when none is."""
        quotas = self._source()
        if quotas is not self._seen:  # a store that replaces its map on change (ZooKeeper's watches)
            self._seen = quotas
            self._resolved.clear()
        return bool(quotas)

    def invalidate(self) -> None:
        """Quotas changed in place (the embedded store): resolve every client again."""
        self._resolved.clear()

    def _bound(self, key: str, user: str, client_id: str) -> tuple[MetricTags, float] | None:
        k = (key, user, client_id)
        try:
            return self._resolved[k]
        except KeyError:
            pass
        if len(self._resolved) >= _MAX_RESOLVED:
            self._resolved.clear()
        hit = self._resolved[k] = resolve(self._source(), key, user, client_id)
        return hit

    def _record(self, kind: _QuotaType, user: str, client_id: str, value: float, now_ms: float,
                check: bool = True) -> int:
        hit = self._bound(kind.key, user, client_id)
        if hit is None:
            return 0
        tags, bound = hit
        return kind.record(tags, bound, value, now_ms, check)

    def record_produce(self, user: str, client_id: str, request_bytes: int, now_ms: float) -> int:
        """A produce request's size; the throttle time in ms."""
        return self._record(self.produce, user, client_id, request_bytes, now_ms)

    def record_fetch(self, user: str, client_id: str, response_bytes: int, now_ms: float) -> int:
        """A fetch response's size; the throttle time in ms."""
        return self._record(self.fetch, user, client_id, response_bytes, now_ms)

    def unrecord_fetch(self, user: str, client_id: str, response_bytes: int, now_ms: float) -> None:
        """Take back a fetch response that will not be sent (a throttled fetch is answered empty)."""
        self._record(self.fetch, user, client_id, -response_bytes, now_ms, check=False)

    def record_request_time(self, user: str, client_id: str, seconds: float, now_ms: float) -> int:
        """Time spent handling one request; the throttle time in ms (at most one window)."""
        return self._record(self.request, user, client_id, seconds * _PERCENT_PER_SECOND, now_ms)

    def controller_mutation(self, user: str, client_id: str, strict: bool, now_ms: float) -> MutationQuota | None:
        """The controller mutation quota (KIP-599) one admin request is charged against; None when no
        ``controller_mutation_rate`` applies to the client (Kafka's unbounded quota)."""
        hit = self._bound(CONTROLLER_MUTATION, user, client_id)
        if hit is None:
            return None
        if now_ms >= self._next_mutation_expiry_ms:
            self._next_mutation_expiry_ms = now_ms + _EXPIRY_CHECK_MS
            expire(self._mutations, now_ms, INACTIVE_SENSOR_MS)
        tags, bound = hit
        sensor = self._mutations.get(tags)
        if sensor is None:
            sensor = self._mutations[tags] = MutationSensor(bound, now_ms, self.mutation_samples,
                                                            self.mutation_window_ms)
        sensor.bound = bound  # a changed quota keeps the bucket's credits, as Kafka's sensor does
        return MutationQuota(sensor, strict)

    def fetch_max_bytes(self, user: str, client_id: str) -> int | None:
        """The most a fetch response may carry and still be sent: what the quota allows over the
        windows (Kafka's ``getMaxValueInQuotaWindow``); None when no fetch quota applies."""
        hit = self._bound(FETCH, user, client_id)
        if hit is None:
            return None
        return int(hit[1] * (self.samples - 1) * self.window_ms / 1000.0)

    def snapshot(self, now_ms: float) -> list[QuotaSnapshot]:
        """Every live measurement with its quota, rate and throttle times (read-only)."""
        rows = [row for kind in (self.produce, self.fetch, self.request) for row in kind.snapshot(now_ms)]
        for (user, client_id), s in sorted(self._mutations.items()):
            count = s.throttles.count(now_ms)
            average = s.throttles.total(now_ms) / count if count else 0.0
            rows.append(QuotaSnapshot("ControllerMutation", user, client_id, s.bound, s.rate.measure(now_ms),
                                      average, s.last_throttle_ms))
        return rows
