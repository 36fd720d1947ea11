"""Kafka's sampled statistics (``SampledStat``, ``Rate``), the measurement behind client quotas.

A rate is the sum of values in the last ``samples`` windows of ``window_ms`` each, divided by the time
those windows span.  Kafka's details are kept because they decide how bursty a throttled client may
be: one spare sample slot for the window overlapping the oldest edge, samples expire by their last
event, and the elapsed time is never taken as less than ``samples - 1`` full windows, so a client's
first second does not look like an enormous rate.  Times are milliseconds on any monotonic clock.
"""

from __future__ import annotations


class _Sample:
    __slots__ = ("events", "last_event_ms", "start_ms", "value")

    def __init__(self, now_ms: float) -> None:
        self.value = 0.0
        self.events = 0
        self.start_ms = now_ms
        self.last_event_ms = now_ms

    def reset(self, now_ms: float) -> None:
        self.value = 0.0
        self.events = 0
        self.start_ms = now_ms
        self.last_event_ms = now_ms


class SampledStat:
    """A windowed sum and count (Kafka's ``SampledStat`` with ``WindowedSum``)."""

    __slots__ = ("_current", "_samples", "samples", "window_ms")

    def __init__(self, samples: int, window_ms: float) -> None:
        if samples < 1 or window_ms <= 0:
            raise ValueError("a sampled stat needs at least one sample of a positive window")
        self.samples = samples
        self.window_ms = window_ms
        self._samples: list[_Sample] = []
        self._current = 0

    def record(self, value: float, now_ms: float) -> None:
        sample = self._current_sample(now_ms)
        if now_ms - sample.start_ms >= self.window_ms:
            sample = self._advance(now_ms)
        sample.value += value
        sample.events += 1
        sample.last_event_ms = now_ms

    def _current_sample(self, now_ms: float) -> _Sample:
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        return self._samples[self._current]

    def _advance(self, now_ms: float) -> _Sample:
        # One slot more than the configured samples: the window overlapping the oldest edge.
        self._current = (self._current + 1) % (self.samples + 1)
        if self._current >= len(self._samples):
            sample = _Sample(now_ms)
            self._samples.append(sample)
            return sample
        sample = self._samples[self._current]
        sample.reset(now_ms)
        return sample

    def purge(self, now_ms: float) -> None:
        """Forget samples with no event within the monitored span (samples x window)."""
        expire = self.samples * self.window_ms
        for s in self._samples:
            if now_ms - s.last_event_ms >= expire:
                s.reset(now_ms)

    def total(self, now_ms: float) -> float:
        self.purge(now_ms)
        return sum(s.value for s in self._samples)

    def count(self, now_ms: float) -> int:
        self.purge(now_ms)
        return sum(s.events for s in self._samples)

    def oldest_start_ms(self, now_ms: float) -> float:
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        return min(s.start_ms for s in self._samples)

    def last_event_ms(self) -> float:
        return max((s.last_event_ms for s in self._samples), default=0.0)


class Rate:
    """Value per second over a ``SampledStat`` (Kafka's ``Rate`` in seconds)."""

    __slots__ = ("stat",)

    def __init__(self, samples: int, window_ms: float) -> None:
        self.stat = SampledStat(samples, window_ms)

    def record(self, value: float, now_ms: float) -> None:
        self.stat.record(value, now_ms)

    def window_size_ms(self, now_ms: float) -> float:
        """The time the rate is computed over: at least ``samples - 1`` full windows, never below 1 ms."""
        stat = self.stat
        stat.purge(now_ms)
        elapsed = now_ms - stat.oldest_start_ms(now_ms)
        full_windows = int(elapsed // stat.window_ms)
        min_full_windows = stat.samples - 1
        if full_windows < min_full_windows:
            elapsed += (min_full_windows - full_windows) * stat.window_ms
        return max(elapsed, 1.0)

    def measure(self, now_ms: float) -> float:
        total = self.stat.total(now_ms)
        return total / (self.window_size_ms(now_ms) / 1000.0)


def throttle_time_ms(observed: float, bound: float, window_ms: float, cap_ms: float) -> int:
    """Kafka's ``QuotaUtils.throttleTime``: how long the client must stay silent for the rate measured
    over ``window_ms`` to fall back to ``bound``: (observed - bound) / bound x window, rounded, at most
    ``cap_ms`` (a zero quota, which Kafka turns into an overflow, gets the cap)."""
    if bound <= 0:
        return int(cap_ms) if observed > 0 else 0
    delay = (observed - bound) / bound * window_ms
    return int(min(max(delay, 0.0), cap_ms) + 0.5)


class TokenBucket:
    """Kafka's ``TokenBucket`` (KIP-599), the measurement behind controller mutation quotas.

    Credits refill continuously at ``quota`` per second up to a burst of ``samples x window x quota``;
    a mutation takes its count of credits, and the quota is exhausted once they are below zero.  Unlike
    a sampled rate, one large burst is paid back in exactly the time its debt takes to refill.  A new
    bucket is full, as Kafka's is (its first refill spans the whole epoch).
    """

    __slots__ = ("_last_ms", "tokens")

    def __init__(self) -> None:
        self.tokens: float | None = None  # None: never used, so full
        self._last_ms = 0.0

    def _refill(self, quota: float, burst: float, now_ms: float) -> float:
        if self.tokens is None:
            tokens = burst
        else:
            tokens = min(burst, self.tokens + quota * max(now_ms - self._last_ms, 0.0) / 1000.0)
        self.tokens = tokens
        self._last_ms = now_ms
        return tokens

    def measure(self, quota: float, burst: float, now_ms: float) -> float:
        """The credits left now (negative: the quota is exhausted)."""
        return self._refill(quota, burst, now_ms)

    def record(self, value: float, quota: float, burst: float, now_ms: float) -> float:
        """Take ``value`` credits; the credits left."""
        tokens = self.tokens = min(burst, self._refill(quota, burst, now_ms) - value)
        return tokens
