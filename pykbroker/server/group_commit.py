"""Group commit for ``log.flush.on.ack``, on the event loop: one fsync in flight per log.

``Log.flush_to`` already shares an fsync between the threads that wait for it, but every waiting produce
request used to take a worker thread of its own, and under CPU contention each of those threads had to be
scheduled (and win the GIL) twice to learn that someone else's fsync covered it.  Here the requests of a log
wait on the event loop instead: the first one starts an fsync covering everything appended so far, those
that arrive meanwhile wait for it and, if it did not cover them, for the next one, which one of them starts.
One worker thread and one wake-up per fsync, however many requests it acknowledges.

The fsyncs run in a few long-lived threads of this module's own (``_Flushers``) rather than through
``anyio.to_thread``: at ~1,000 acknowledged requests a second anyio's per-call machinery (capacity limiter,
cancel scopes, a ``queue.Queue`` whose Condition allocates a lock per wait) cost more broker CPU than the
fsync's own system call; here a hand-off is one ``SimpleQueue.put`` and one ``call_soon_threadsafe``.

Where the C extension ``pykbroker._native.syncer`` is built, a log's data sync goes there instead: the
loop duplicates the descriptors (``Log.begin_data_flush``), native threads fdatasync and close them without
ever taking the GIL and signal an eventfd, and the loop settles the request (``Log.end_data_flush``).  A
Python flusher thread had to win the GIL back from the busy event loop after every fsync; under CPU
contention that hand-off cost more broker CPU per acknowledged request than the request itself
(docs/performance.md, "What starved").
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import logging
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, Protocol
from weakref import WeakKeyDictionary

import anyio

_log = logging.getLogger("pykbroker.group_commit")

try:  # optional C extension (setup.py); without it the fsyncs run in the Python threads below
    _Syncer: Any = importlib.import_module("pykbroker._native.syncer").Syncer
except ImportError:
    _Syncer = None


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


_Job = tuple[Callable[[int], None], int, asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class _Flushers:
    """Daemon threads running ``log.flush_to`` calls handed over from event loops.

    Threads start on demand, one more whenever every existing one is busy, up to ``max_threads`` (fsyncs
    of different logs proceed in parallel, as they did in anyio's pool); they then stay, blocked on the
    queue, for the life of the process."""

    def __init__(self, max_threads: int) -> None:
        self.max_threads = max_threads
        self._jobs: SimpleQueue[_Job] = SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._busy = 0

    async def run(self, fn: Callable[[int], None], offset: int) -> None:
        """``fn(offset)`` in a flusher thread.  A cancelled caller stops waiting (its connection or the
        broker is closing); the fsync itself runs to its end, and ``Log.flush_to`` is safe to call again
        meanwhile, so a request that starts the next one never acknowledges before its data is durable."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._busy += 1
            start = self._busy > self._threads and self._threads < self.max_threads
            if start:
                self._threads += 1
        if start:
            threading.Thread(target=self._work, name="pykbroker-flush", daemon=True).start()
        self._jobs.put((fn, offset, loop, future))
        await future

    def _work(self) -> None:
        while True:
            fn, offset, loop, future = self._jobs.get()
            error: BaseException | None = None
            try:
                fn(offset)
            except BaseException as e:  # handed to the waiting request (KafkaStorageError and the like)
                error = e
            with self._lock:
                self._busy -= 1
            try:
                loop.call_soon_threadsafe(_settle, future, error)
            except RuntimeError:  # that event loop has closed meanwhile: nobody is waiting
                pass
            del fn, loop, future, error


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


_flushers = _Flushers(max_threads=8)
MAX_SYNC_THREADS = 8


class _NativeSyncs:
    """One event loop's jobs in ``pykbroker._native.syncer``: native threads fdatasync descriptors that
    ``Log.begin_data_flush`` duplicated, without the GIL, and signal an eventfd this loop watches; one
    reader callback then settles every finished job.  Holds no reference to the loop (the registry is
    keyed weakly by it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, syncer: Any) -> None:
        self._syncer = syncer
        self._pending: dict[int, asyncio.Future[int]] = {}
        self._tokens = itertools.count()
        loop.add_reader(syncer.fileno(), self._collect)

    def _collect(self) -> None:
        for token, error in self._syncer.completed():
            future = self._pending.pop(token, None)
            if future is not None and not future.done():  # a cancelled waiter's sync ended anyway
                future.set_result(error)

    async def run(self, fds: tuple[int, ...], dir_fd: int) -> int:
        """Sync and close the descriptors; the errno of the first failure, or 0."""
        token = next(self._tokens)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._syncer.submit(token, fds, dir_fd)  # OSError (no thread could start): the fds are still ours
        self._pending[token] = future
        try:
            return await future
        finally:
            self._pending.pop(token, None)


_native: WeakKeyDictionary[asyncio.AbstractEventLoop, _NativeSyncs | None] = WeakKeyDictionary()


def _native_syncs(loop: asyncio.AbstractEventLoop) -> _NativeSyncs | None:
    """This loop's native syncer, or None where it is not built or the loop cannot watch a descriptor."""
    if loop in _native:
        return _native[loop]
    syncs: _NativeSyncs | None = None
    if _Syncer is not None:
        try:
            syncs = _NativeSyncs(loop, _Syncer(MAX_SYNC_THREADS))
        except (OSError, NotImplementedError, RuntimeError) as e:
            _log.warning("native fsync threads unavailable (%s): log.flush.on.ack uses Python threads", e)
    _native[loop] = syncs
    return syncs


async def _run_flush(log: Flushable, offset: int) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not on asyncio (anyio on trio): its thread pool
        await anyio.to_thread.run_sync(log.flush_to, offset)
        return
    split: Any = log if hasattr(log, "begin_data_flush") else None  # a Log; test doubles have flush_to alone
    if split is not None and (syncs := _native_syncs(loop)) is not None:
        flush = split.begin_data_flush(offset)  # KafkaStorageError if the dir is offline
        if flush is None:  # durable already
            return
        try:
            error = await syncs.run(flush.fds, flush.dir_fd)
        except OSError:  # not submitted (no thread could start): give it back and sync the ordinary way
            split.abandon_data_flush(flush)
            await _flushers.run(log.flush_to, offset)
            return
        split.end_data_flush(flush, error)  # KafkaStorageError for a failed sync
        return
    await _flushers.run(log.flush_to, offset)


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
            await _run_flush(log, flush.target)
            flush.ok = True
        finally:
            if _in_flight.get(log) is flush:
                del _in_flight[log]
            flush.done.set()
        if flush.target >= offset:
            return
    await _run_flush(log, offset)  # not reached in practice: an fsync of its own
