"""Connection limits as Kafka applies them (KIP-402, KIP-612), without sockets.

- ``max.connections`` (broker-wide) and ``listener.name.X.max.connections``: when either is
  reached the listener stops accepting until a connection closes; further clients wait in the
  kernel's accept backlog.  The inter-broker listener (``inter.broker.listener.name``, by
  default the one named PLAINTEXT) is exempt from the broker-wide limit when there is more
  than one listener; a connection accepted there while the broker is at its limit makes the
  least recently used connection of another listener close.
- ``max.connections.per.ip`` and ``max.connections.per.ip.overrides``: a connection above its
  address's limit is accepted and closed at once.
- ``max.connection.creation.rate`` (broker-wide, and per listener): the accepted connection
  waits, and with it the listener, long enough to bring the observed rate back to the limit.
  The rate is measured as Kafka measures a quota: over ``quota.window.num`` sampled windows of
  ``quota.window.size.seconds`` (by default eleven of one second), so a burst of up to ten
  seconds' worth passes before throttling starts, and one delay is at most one window.
- ``connection_creation_rate`` quotas of ``ip`` entities (KIP-612, AlterClientQuotas): an address's
  own quota, else the default entity's, measured the same way per address.  A connection over it
  is not accepted: it is held for the throttle time, then closed, and taken back out of every
  rate (it never counted).  The quotas are read from the metadata store at each connection, so a
  change applies to the next one.

Clocks are passed in (seconds, monotonic), so tests drive this with plain numbers.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pykbroker.config import parse_ip_overrides

if TYPE_CHECKING:
    from pykbroker.config import BrokerConfig
    from pykbroker.metadata.store import QuotaEntity

INT_MAX = 2147483647
QUOTA_WINDOW_S = 1.0  # Kafka's quota.window.size.seconds
QUOTA_SAMPLES = 11  # Kafka's quota.window.num
IP_ENTITY = "ip"
IP_CONNECTION_RATE = "connection_creation_rate"
_IP_RATE_EXPIRY_CHECK_S = 60.0


class WindowedRate:
    """Events per second over sampled windows, with the delay that brings it back to a quota."""

    __slots__ = ("_samples", "quota", "samples", "window_s")

    def __init__(self, quota: float, window_s: float = QUOTA_WINDOW_S, samples: int = QUOTA_SAMPLES) -> None:
        self.quota = quota
        self.window_s = window_s
        self.samples = samples
        self._samples: deque[list[float]] = deque()  # [window start, count]

    @property
    def unlimited(self) -> bool:
        return self.quota >= INT_MAX

    def _purge(self, now: float) -> None:
        horizon = now - self.samples * self.window_s
        while self._samples and self._samples[0][0] + self.window_s <= horizon:
            self._samples.popleft()

    def rate(self, now: float) -> float:
        self._purge(now)
        if not self._samples:
            return 0.0
        total = sum(c for _, c in self._samples)
        elapsed = now - self._samples[0][0]
        # Like Kafka, count at least (samples - 1) whole windows, so a fresh sensor is not a spike.
        elapsed = max(elapsed, (self.samples - 1) * self.window_s)
        return total / elapsed

    def record(self, now: float, count: float = 1.0) -> float:
        """Count one event; the seconds to wait for the rate to be back within the quota (0 if it is)."""
        if self.unlimited:
            return 0.0
        self._purge(now)
        if not self._samples or now >= self._samples[-1][0] + self.window_s:
            self._samples.append([now, 0.0])
        self._samples[-1][1] += count
        if self.quota <= 0:
            return self.window_s
        rate = self.rate(now)
        if rate <= self.quota:
            return 0.0
        elapsed = max(now - self._samples[0][0], (self.samples - 1) * self.window_s)
        return min((rate - self.quota) / self.quota * elapsed, self.window_s)

    def unrecord(self, now: float) -> None:
        """Take back the event just recorded (a connection refused after all)."""
        if not self.unlimited and self._samples:
            self._samples[-1][1] -= 1.0

    def idle(self, now: float) -> bool:
        """Nothing recorded within the measured span: the rate is 0, as a new one's would be."""
        self._purge(now)
        return not self._samples


def ip_connection_rate(quotas: Mapping[QuotaEntity, Mapping[str, float]], ip: str) -> float | None:
    """An address's connection_creation_rate: its own ``ip`` entity's, else the default entity's (None
    when neither sets one).  Names are compared as addresses (``0:0::1`` is ``::1``), as Kafka
    resolves them."""
    own = quotas.get(((IP_ENTITY, ip),))
    if own is not None and IP_CONNECTION_RATE in own:
        return own[IP_CONNECTION_RATE]
    default = None
    for entity, values in quotas.items():
        if len(entity) != 1 or entity[0][0] != IP_ENTITY or IP_CONNECTION_RATE not in values:
            continue
        name = entity[0][1]
        if name is None:
            default = values[IP_CONNECTION_RATE]
        elif _canonical_ip(name) == _canonical_ip(ip):
            return values[IP_CONNECTION_RATE]
    return default


@functools.lru_cache(maxsize=4096)
def _canonical_ip(name: str) -> str:
    try:
        return ipaddress.ip_address(name).compressed
    except ValueError:
        return name


@dataclass
class ListenerLimits:
    max_connections: int = INT_MAX
    max_creation_rate: int = INT_MAX


@dataclass
class _ListenerState:
    limits: ListenerLimits
    rate: WindowedRate
    count: int = 0


@dataclass
class ConnectionQuotas:
    """Connection counts per listener and per address, and the limits that apply to them."""

    listeners: Iterable[str]
    max_connections: int = INT_MAX
    max_creation_rate: int = INT_MAX
    max_per_ip: int = INT_MAX
    per_ip_overrides: Mapping[str, int] = field(default_factory=dict)
    listener_limits: Mapping[str, ListenerLimits] = field(default_factory=dict)
    inter_broker_listener: str = "PLAINTEXT"
    # The stored client quotas (the metadata store's ``client_quotas``), for the ``ip`` entities.
    client_quotas: Callable[[], Mapping[QuotaEntity, Mapping[str, float]]] | None = None
    window_s: float = QUOTA_WINDOW_S  # quota.window.size.seconds
    samples: int = QUOTA_SAMPLES  # quota.window.num

    def __post_init__(self) -> None:
        names = list(self.listeners)
        self._listeners = {
            n: _ListenerState(lim, self._rate(lim.max_creation_rate))
            for n in names
            for lim in [self.listener_limits.get(n, ListenerLimits())]
        }
        self._broker_rate = self._rate(self.max_creation_rate)
        self._per_ip: dict[str, int] = {}
        self._ip_rates: dict[str, WindowedRate] = {}
        self._next_ip_expiry = 0.0
        self.total = 0

    def _rate(self, quota: float) -> WindowedRate:
        return WindowedRate(quota, self.window_s, self.samples)

    def _state(self, listener: str) -> _ListenerState:
        st = self._listeners.get(listener)
        if st is None:
            st = self._listeners[listener] = _ListenerState(ListenerLimits(), WindowedRate(INT_MAX))
        return st

    def protected(self, listener: str) -> bool:
        """The inter-broker listener, exempt from the broker-wide limits when there are several."""
        return listener == self.inter_broker_listener and len(self._listeners) > 1

    def slot_available(self, listener: str) -> bool:
        st = self._state(listener)
        if st.count >= st.limits.max_connections:
            return False
        return self.protected(listener) or self.total < self.max_connections

    def listener_max_connections(self, listener: str) -> int:
        return self._state(listener).limits.max_connections

    def listener_count(self, listener: str) -> int:
        return self._state(listener).count

    def ip_count(self, ip: str) -> int:
        return self._per_ip.get(ip, 0)

    def ip_limit(self, ip: str) -> int:
        return self.per_ip_overrides.get(ip, self.max_per_ip)

    def record_creation(self, listener: str, now: float) -> float:
        """Count a new connection against the creation rates; seconds it must wait before being served."""
        st = self._state(listener)
        delay = 0.0 if self.protected(listener) else self._broker_rate.record(now)
        return max(delay, st.rate.record(now))

    def ip_creation_rate(self, ip: str) -> float | None:
        """The connection_creation_rate quota that applies to ``ip`` now; None when none does."""
        if self.client_quotas is None:
            return None
        rate = ip_connection_rate(self.client_quotas(), ip)
        return None if rate is None or rate >= INT_MAX else rate

    def record_ip_creation(self, listener: str, ip: str, now: float) -> float:
        """Count a new connection from ``ip`` against its connection_creation_rate (Kafka's
        ``recordIpConnectionMaybeThrottle``); the seconds to hold it before closing it when over the
        quota, 0 to accept it.  A refused connection is taken back out of the address's, the
        listener's and the broker's rates: it was never accepted."""
        if now >= self._next_ip_expiry:
            self._next_ip_expiry = now + _IP_RATE_EXPIRY_CHECK_S
            for idle in [a for a, r in self._ip_rates.items() if r.idle(now)]:
                del self._ip_rates[idle]
        quota = self.ip_creation_rate(ip)
        if quota is None:
            self._ip_rates.pop(ip, None)
            return 0.0
        rate = self._ip_rates.get(ip)
        if rate is None:
            rate = self._ip_rates[ip] = self._rate(quota)
        rate.quota = quota  # a changed quota keeps the measurement, as Kafka's sensor does
        delay = rate.record(now)
        if delay > 0:
            rate.unrecord(now)
            if not self.protected(listener):
                self._broker_rate.unrecord(now)
            self._state(listener).rate.unrecord(now)
        return delay

    def try_add(self, listener: str, ip: str) -> bool:
        """Count an accepted connection; False (and nothing counted) if its address is at its limit."""
        if self._per_ip.get(ip, 0) >= self.ip_limit(ip):
            return False
        self._per_ip[ip] = self._per_ip.get(ip, 0) + 1
        self._state(listener).count += 1
        self.total += 1
        return True

    def remove(self, listener: str, ip: str) -> None:
        n = self._per_ip.get(ip, 0)
        if n <= 0:
            raise ValueError(f"no connection counted for {ip}")
        if n == 1:
            del self._per_ip[ip]
        else:
            self._per_ip[ip] = n - 1
        self._state(listener).count -= 1
        self.total -= 1

    def over_broker_limit(self) -> bool:
        """More connections than max.connections (possible only through the inter-broker listener)."""
        return self.total > self.max_connections


def normalise_ip(ip: str) -> str:
    """The address as counted: IPv4-mapped IPv6 addresses count as their IPv4 address, as in Kafka."""
    if ip.startswith("::ffff:") and "." in ip:
        return ip[len("::ffff:"):]
    return ip


def resolve_ip_overrides(overrides: Mapping[str, int]) -> dict[str, int]:
    """Host names in ``max.connections.per.ip.overrides`` to addresses, once at start (as Kafka does)."""
    out: dict[str, int] = {}
    for host, count in overrides.items():
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError as e:
            raise ValueError(f"max.connections.per.ip.overrides: cannot resolve {host!r}: {e}") from None
        for info in infos:
            out.setdefault(normalise_ip(str(info[4][0])), count)
    return out


def quotas_from_config(config: BrokerConfig,
                       client_quotas: Callable[[], Mapping[QuotaEntity, Mapping[str, float]]] | None = None,
                       ) -> ConnectionQuotas:
    names = [lst.name for lst in config.listeners]
    limits = {}
    for name in names:
        max_conn = config.listener_value(name, "max.connections")
        rate = config.listener_value(name, "max.connection.creation.rate")
        limits[name] = ListenerLimits(INT_MAX if max_conn is None else int(max_conn),
                                      INT_MAX if rate is None else int(rate))
    return ConnectionQuotas(
        listeners=names,
        max_connections=config["max.connections"],
        max_creation_rate=config["max.connection.creation.rate"],
        max_per_ip=config["max.connections.per.ip"],
        per_ip_overrides=resolve_ip_overrides(parse_ip_overrides(config["max.connections.per.ip.overrides"])),
        listener_limits=limits,
        inter_broker_listener=config.inter_broker_listener,
        client_quotas=client_quotas,
        window_s=float(config["quota.window.size.seconds"]),
        samples=config["quota.window.num"],
    )
