"""What a request is charged and how long its client is throttled for (Kafka's ``KafkaApis`` rules).

- Produce: the request's size against ``producer_byte_rate``.
- Fetch from a consumer: the response's size against ``consumer_byte_rate``; a fetch that would be
  throttled is answered with no data and its size is taken back (the consumer fetches it again
  after the throttle), and a fetch never asks for more than the quota can let through.
- Every request but the brokers' own (follower fetches, WriteTxnMarkers): its handler time
  against ``request_percentage``.

The longest of the throttle times applies.  Since Kafka 2.0 (KIP-219) the broker answers at once
with the throttle time in the response and then reads nothing more from the connection until the
time has passed; clients that know the field also hold back their requests.  Kafka does the same for
every API version (design.html "Enforcement": older clients are held back by the muted channel), and
so does pykbroker.
"""

from __future__ import annotations

import time
import types
from collections.abc import Awaitable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from pykbroker.quotas.manager import QuotaManager

T = TypeVar("T")

PRODUCE_API = 0
FETCH_API = 1
# Requests brokers send each other (Kafka's CLUSTER_ACTION ones): never throttled.
BROKER_APIS = frozenset({27})  # WriteTxnMarkers


@dataclass(slots=True)
class Usage:
    """What one request used, as the dispatcher saw it."""

    api_key: int
    user: str  # the principal's name ("ANONYMOUS" on an unauthenticated connection)
    client_id: str
    request_bytes: int
    handler_seconds: float
    follower_fetch: bool = False


@dataclass(slots=True)
class Throttle:
    ms: int
    # The response must carry no data (a throttled consumer fetch).
    drop_fetch_data: bool = False


NO_THROTTLE = Throttle(0)


def exempt(api_key: int, follower_fetch: bool) -> bool:
    return follower_fetch or api_key in BROKER_APIS


def charge(quotas: QuotaManager, usage: Usage, response_bytes: int | None, now_ms: float) -> Throttle:
    """Record the request's usage and return its throttle (``response_bytes``: the encoded response,
    None when there is none: acks=0 produce)."""
    if exempt(usage.api_key, usage.follower_fetch):
        return NO_THROTTLE
    user, client_id = usage.user, usage.client_id
    request_ms = quotas.record_request_time(user, client_id, usage.handler_seconds, now_ms)
    if usage.api_key == PRODUCE_API:
        return Throttle(max(request_ms, quotas.record_produce(user, client_id, usage.request_bytes, now_ms)))
    if usage.api_key == FETCH_API and response_bytes is not None:
        fetch_ms = quotas.record_fetch(user, client_id, response_bytes, now_ms)
        ms = max(fetch_ms, request_ms)
        if ms > 0:
            quotas.unrecord_fetch(user, client_id, response_bytes, now_ms)
            return Throttle(ms, drop_fetch_data=True)
        return NO_THROTTLE
    return Throttle(request_ms) if request_ms else NO_THROTTLE


@types.coroutine
def _timed_steps(awaitable: Awaitable[T], spent: list[float]) -> Generator[Any, Any, T]:
    """Drive ``awaitable`` step by step, adding to ``spent[0]`` the time of each step: the time the
    request itself ran, not the time it waited (a long-poll fetch, an acks=all produce)."""
    inner = awaitable.__await__()
    clock = time.perf_counter
    value: Any = None
    error: BaseException | None = None
    while True:
        started = clock()
        try:
            yielded = inner.send(value) if error is None else inner.throw(error)
        except StopIteration as stop:
            spent[0] += clock() - started
            result: T = stop.value
            return result
        finally:
            value, error = None, None
        spent[0] += clock() - started
        try:
            value = yield yielded
        except GeneratorExit:
            inner.close()
            raise
        except BaseException as e:  # cancellation and the like go to the request, as without us
            error = e


async def run_timed(awaitable: Awaitable[T]) -> tuple[T, float]:
    """Await ``awaitable``; its result and the seconds it ran (excluding the time it was suspended)."""
    spent = [0.0]
    result = await _timed_steps(awaitable, spent)
    return result, spent[0]
