"""Group commit for ``log.flush.on.ack``, on the event loop: one fsync in flight per log.

``Log.flush_to`` already shares an fsync between the threads that wait for it, but every waiting produce
request used to take a worker thread of its own, and under CPU contention each of those threads had to be
scheduled (and win the GIL) twice to learn that someone else's fsync covered it.  Here the requests of a log
wait on the event loop instead: the first one starts an fsync covering everything appended so far, those
that arrive meanwhile wait for it and, if it did not cover them, for the next one, which one of them starts.
One worker thread and one wake-up per fsync, however many requests it acknowledges.
"""

from __future__ import annotations

from typing import Protocol
from weakref import WeakKeyDictionary

import anyio


class Flushable(Protocol):
    """What group commit needs of a log (pykbroker.storage.log.Log)."""

    @property
    def log_end_offset(self) -> int: ...

    def flush_to(self, offset: int) -> None: ...


class _Flush:
    __slots__ = ("done", "ok", "target")

    def __init__(self, target: int) -> None:
        self.target = target  # every offset below it was appended before this fsync started
        self.ok = False
        self.done = anyio.Event()


# The fsync in flight per log; weak, so a deleted partition's log is not kept alive by it.
_in_flight: WeakKeyDictionary[Flushable, _Flush] = WeakKeyDictionary()
MAX_ROUNDS = 1000  # each round waits for one fsync to end; no request waits for more than a few


async def flush_to(log: Flushable, offset: int) -> None:
    """Return once the log's data below ``offset`` is on disk; raises what ``Log.flush_to`` raises
    (KafkaStorageError when the log dir failed)."""
    for _ in range(MAX_ROUNDS):
        current = _in_flight.get(log)
        if current is not None:
            await current.done.wait()
            if current.ok and current.target >= offset:
                return
            continue  # it started before this append, or failed: the next fsync, led by one of the waiters
        flush = _in_flight[log] = _Flush(log.log_end_offset)
        try:
            await anyio.to_thread.run_sync(log.flush_to, flush.target)
            flush.ok = True
        finally:
            if _in_flight.get(log) is flush:
                del _in_flight[log]
            flush.done.set()
        if flush.target >= offset:
            return
    await anyio.to_thread.run_sync(log.flush_to, offset)  # not reached in practice: an fsync of its own
