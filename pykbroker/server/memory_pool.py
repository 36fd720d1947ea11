"""A pool bounding the bytes of requests being read (Kafka's ``queued.max.request.bytes``).

A connection reserves a request's size from the pool as soon as the request's four size
bytes have arrived, before it reads the body, and gives it back once the request has been
answered.  When the pool is exhausted the connection stops reading from its socket (TCP flow
control then stops the client) instead of letting memory grow with every slow or hostile
sender.

The accounting follows Kafka's non-strict ``SimpleMemoryPool``, which the socket server uses:
a reservation succeeds whenever *any* memory is left, so available memory may dip below zero
by at most one request (at most ``socket.request.max.bytes``).  A request larger than what
is left therefore never waits for memory that can never come, and since Kafka requires
``queued.max.request.bytes >= socket.request.max.bytes`` no request is larger than the pool.

The accounting (``try_reserve``/``release``) is plain and synchronous; ``reserve`` adds the
waiting, first come first served, for the connection tasks.
"""

from __future__ import annotations

from collections import deque

import anyio


class _Waiter:
    __slots__ = ("event", "granted", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.event = anyio.Event()
        self.granted = False


class MemoryPool:
    """Bytes of requests being read; ``size <= 0`` means unbounded (Kafka's default, -1)."""

    def __init__(self, size: int, max_single: int) -> None:
        if 0 < size < max_single:
            raise ValueError(f"a pool of {size} bytes cannot hold one request of up to {max_single} bytes")
        self.size = size
        self.max_single = max_single
        self._available = size
        self._waiters: deque[_Waiter] = deque()

    @property
    def bounded(self) -> bool:
        return self.size > 0

    @property
    def available(self) -> int:
        """Bytes left; below zero while the last reservation overdraws it (non-strict mode)."""
        return self._available if self.bounded else self.max_single

    @property
    def out_of_memory(self) -> bool:
        return self.bounded and self._available <= 0

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _check(self, size: int) -> None:
        if not 0 <= size <= self.max_single:
            raise ValueError(f"cannot reserve {size} bytes: must be between 0 and {self.max_single}")

    def try_reserve(self, size: int) -> bool:
        """Reserve ``size`` bytes now if any memory is left (and nobody is queued before us)."""
        self._check(size)
        if not self.bounded:
            return True
        if self._waiters or self._available < 1:
            return False
        self._available -= size
        return True

    def release(self, size: int) -> None:
        """Give back a reservation, then serve queued reservations in order while memory lasts."""
        if not self.bounded or size == 0:
            return
        self._available += size
        if self._available > self.size:
            raise RuntimeError(f"released more than was reserved: {self._available} > {self.size}")
        self._grant_waiters()

    async def reserve(self, size: int) -> None:
        """Reserve ``size`` bytes, waiting (first come, first served) until memory is left.

        Cancellation while waiting leaves the pool as it was, also when the reservation was granted
        in the same instant.
        """
        if self.try_reserve(size):
            return
        w = _Waiter(size)
        self._waiters.append(w)
        try:
            await w.event.wait()
        except BaseException:
            if w.granted:
                self.release(size)
            else:
                self._waiters.remove(w)
                self._grant_waiters()  # our place in the queue may have held later waiters back
            raise

    def _grant_waiters(self) -> None:
        while self._waiters and self._available >= 1:
            w = self._waiters.popleft()
            self._available -= w.size
            w.granted = True
            w.event.set()
