"""Reading values back with a subscribed consumer, bounded in polls and time (the tests' common loop)."""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import Consumer


def poll_values(consumer: Consumer, done: Callable[[list[bytes]], bool], timeout: float,
                poll_s: float = 0.2) -> list[bytes]:
    """Values polled until ``done(values)`` holds or ``timeout`` passes; errors in between are skipped."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / poll_s) + 1):
        if done(got) or time.monotonic() > deadline:
            break
        m = consumer.poll(poll_s)
        if m is not None and m.error() is None:
            got.append(bytes(m.value() or b""))
    return got
