"""Controller mutation quotas (KIP-599): topic and partition creations and deletions per client.

A client's ``controller_mutation_rate`` is a token bucket (``stats.TokenBucket``): CreateTopics,
CreatePartitions and DeleteTopics take one credit per partition they create or delete.  Kafka's two
policies, chosen by the request's version:

- strict (CreateTopics v6+, CreatePartitions v3+, DeleteTopics v5+, the versions whose clients know
  THROTTLING_QUOTA_EXCEEDED): while the bucket is in debt every topic is refused with that error and
  the time the debt takes to refill; a bucket with any credit left accepts a topic of any size, which
  may put it in debt (so one request is never refused as a whole for being large);
- permissive (older versions): every mutation is accepted and recorded, and the client is throttled
  once the bucket is in debt.

Either way the response carries the throttle time and the connection is muted for it (KIP-219).
Sans-I/O: times are milliseconds passed in by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from pykbroker.quotas.entities import MetricTags
from pykbroker.quotas.stats import Rate, SampledStat, TokenBucket

# Kafka's Errors.THROTTLING_QUOTA_EXCEEDED message, which its controller puts in each refused topic.
THROTTLING_QUOTA_EXCEEDED_MESSAGE = "The throttling quota has been exceeded."
INT32_MAX = 2**31 - 1
# The first versions that answer THROTTLING_QUOTA_EXCEEDED (KIP-599): api key -> version.
STRICT_SINCE = {19: 6, 20: 5, 37: 3}  # CreateTopics, DeleteTopics, CreatePartitions
# Kafka's controller.quota.window.num and controller.quota.window.size.seconds defaults.
CONTROLLER_QUOTA_SAMPLES = 11
CONTROLLER_QUOTA_WINDOW_MS = 1000.0
_THROTTLE_SAMPLES, _THROTTLE_WINDOW_MS = 2, 30_000.0


class ThrottlingQuotaExceeded(Exception):
    """A strict quota refused a mutation; ``throttle_ms`` is how long until the bucket is out of debt."""

    def __init__(self, throttle_ms: int) -> None:
        super().__init__(THROTTLING_QUOTA_EXCEEDED_MESSAGE)
        self.throttle_ms = throttle_ms


class MutationSensor:
    """One client's bucket (shared by the clients its quota's metric tags group together)."""

    __slots__ = ("bound", "bucket", "last_throttle_ms", "last_used_ms", "rate", "samples", "throttles",
                 "window_ms")

    def __init__(self, bound: float, now_ms: float, samples: int = CONTROLLER_QUOTA_SAMPLES,
                 window_ms: float = CONTROLLER_QUOTA_WINDOW_MS) -> None:
        self.samples = samples  # controller.quota.window.num
        self.window_ms = window_ms  # controller.quota.window.size.seconds
        self.bucket = TokenBucket()
        self.rate = Rate(samples, window_ms)  # Kafka's mutation-rate metric
        self.throttles = SampledStat(_THROTTLE_SAMPLES, _THROTTLE_WINDOW_MS)
        self.bound = bound
        self.last_throttle_ms = 0
        self.last_used_ms = now_ms

    @property
    def burst(self) -> float:
        return self.samples * self.window_ms / 1000.0 * self.bound

    def tokens(self, now_ms: float) -> float:
        return self.bucket.measure(self.bound, self.burst, now_ms)

    def take(self, permits: float, now_ms: float) -> float:
        self.last_used_ms = now_ms
        self.rate.record(permits, now_ms)
        return self.bucket.record(permits, self.bound, self.burst, now_ms)

    def throttle_ms(self, tokens: float, now_ms: float) -> int:
        """Kafka's ``ControllerMutationQuotaManager.throttleTimeMs``: the time the debt takes to refill.
        A zero quota never refills (Kafka's division overflows): the client is told to retry after a window."""
        never = self.bound <= 0
        ms = int(self.window_ms) if never else int(min(round(-tokens / self.bound * 1000.0), INT32_MAX))
        if ms > 0:
            self.throttles.record(ms, now_ms)
            self.last_throttle_ms = ms
        return ms


@dataclass(slots=True)
class MutationQuota:
    """One request's view of its client's quota (Kafka's Strict/PermissiveControllerMutationQuota)."""

    sensor: MutationSensor
    strict: bool
    _throttle_ms: int = 0
    _throttled_at_ms: float = 0.0

    def record(self, permits: int, now_ms: float) -> None:
        """Charge ``permits`` partitions; raises ThrottlingQuotaExceeded when a strict quota refuses them."""
        sensor = self.sensor
        sensor.last_used_ms = now_ms
        if self.strict:
            tokens = sensor.tokens(now_ms)
            if tokens < 0:
                self._throttled(sensor.throttle_ms(tokens, now_ms), now_ms)
                raise ThrottlingQuotaExceeded(self._throttle_ms)
            sensor.take(permits, now_ms)
            return
        tokens = sensor.take(permits, now_ms)
        if tokens < 0:
            self._throttled(sensor.throttle_ms(tokens, now_ms), now_ms)

    def _throttled(self, ms: int, now_ms: float) -> None:
        self._throttle_ms, self._throttled_at_ms = ms, now_ms

    def throttle_time_ms(self, now_ms: float) -> int:
        """The throttle to answer with: the last one given, less the time since (the request may have
        waited for the metadata to spread after it was recorded, as Kafka's does in its purgatory)."""
        return max(0, int(self._throttle_ms - (now_ms - self._throttled_at_ms)))


def expire(sensors: dict[MetricTags, MutationSensor], now_ms: float, idle_ms: float) -> None:
    """Drop the sensors unused for ``idle_ms`` (Kafka's inactive sensor expiry)."""
    for tags in [t for t, s in sensors.items() if now_ms - s.last_used_ms >= idle_ms]:
        del sensors[tags]
