"""Group commit for ``log.flush.on.ack``, on the event loop: one fsync in flight per log.

``Log.flush_to`` shares an fsync between the threads that wait for it, but a worker thread per waiting
produce request would, under CPU contention, have to be scheduled (and win the GIL) twice to learn that
someone else's fsync covered it.  So the requests of a log wait on the event loop instead: the first one
starts an fsync covering everything appended so far, those that arrive meanwhile wait for it and, if it
did not cover them, for the next one, which starts as soon as the one in flight ends.  One worker thread
and one wake-up per fsync, however many requests it acknowledges.

Waiting is a callback (``flush_then``), not a task: the fsync's end calls each covered request's callback,
which writes its acknowledgement in the same pass of the event loop.  A task per produce request, woken by
a future, would cost two more loop passes and the task's own setup per acknowledgement, a sizeable part of
the broker's CPU per request (docs/performance.md, "CPU per request").  ``flush_to`` is the awaitable
form, for callers that wait in a task anyway.

The fsyncs run in a few long-lived threads of this module's own (``_Flushers``) rather than through
``anyio.to_thread``: at ~1,000 acknowledged requests a second anyio's per-call machinery (capacity limiter,
cancel scopes, a ``queue.Queue`` whose Condition allocates a lock per wait) costs more broker CPU than the
fsync's own system call; here a hand-off is one ``SimpleQueue.put`` and one ``call_soon_threadsafe``.

Where the C extension ``pykbroker._native.syncer`` is built, a log's data sync goes there instead: the
loop duplicates the descriptors (``Log.begin_data_flush``), native threads fdatasync and close them without
ever taking the GIL and signal an eventfd, and the loop settles the request (``Log.end_data_flush``).  A
Python flusher thread has to win the GIL back from the busy event loop after every fsync; under CPU
contention that hand-off costs more broker CPU per acknowledged request than the request itself
(docs/performance.md, "Sharing the CPU").
"""

from __future__ import annotations

import asyncio
import functools
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


_Job = tuple[Callable[[int], None], int, asyncio.AbstractEventLoop, Callable[[BaseException | None], None]]
FlushCallback = Callable[[BaseException | None], None]


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

    def submit(self, fn: Callable[[int], None], offset: int, loop: asyncio.AbstractEventLoop,
               done: FlushCallback) -> None:
        """``fn(offset)`` in a flusher thread, then ``done(None or the exception)`` on ``loop``."""
        with self._lock:
            self._busy += 1
            start = self._busy > self._threads and self._threads < self.max_threads
            if start:
                self._threads += 1
        if start:
            threading.Thread(target=self._work, name="pykbroker-flush", daemon=True).start()
        self._jobs.put((fn, offset, loop, done))

    def _work(self) -> None:
        while True:
            fn, offset, loop, done = self._jobs.get()
            error: BaseException | None = None
            try:
                fn(offset)
            except BaseException as e:  # handed to the waiting requests (KafkaStorageError and the like)
                error = e
            with self._lock:
                self._busy -= 1
            try:
                loop.call_soon_threadsafe(done, error)
            except RuntimeError:  # that event loop has closed meanwhile: nobody is waiting
                pass
            del fn, loop, done, error


def settle_future(future: asyncio.Future[None], error: BaseException | None) -> None:
    """A flush callback's result into ``future``, unless its waiter has gone (cancelled) meanwhile."""
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
    reader callback then reports every finished job.  Holds no reference to the loop (the registry is
    keyed weakly by it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, syncer: Any) -> None:
        self._syncer = syncer
        self._pending: dict[int, Callable[[int], None]] = {}
        self._tokens = itertools.count()
        loop.add_reader(syncer.fileno(), self._collect)

    def _collect(self) -> None:
        for token, error in self._syncer.completed():
            done = self._pending.pop(token, None)
            if done is not None:
                done(error)

    def submit(self, fds: tuple[int, ...], dir_fd: int, done: Callable[[int], None]) -> None:
        """Sync and close the descriptors, then ``done(errno of the first failure, or 0)`` on the loop.
        Raises OSError when no thread could start: the descriptors are then still the caller's."""
        token = next(self._tokens)
        self._syncer.submit(token, fds, dir_fd)
        self._pending[token] = done


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
            _log.warning("native fsync threads unavailable (%(error)s): log.flush.on.ack uses Python threads",
                         {"error": e})
    _native[loop] = syncs
    return syncs


class _LogFlushes:
    """Group commit state of one log: the fsync in flight, who it covers, who waits for the next one."""

    __slots__ = ("covered", "loop", "target", "waiting_next")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.target = 0  # every offset below it was appended before the fsync in flight started
        self.covered: list[FlushCallback] = []  # their data is below ``target``
        self.waiting_next: list[FlushCallback] = []  # appended after it started: the next fsync covers them


# The fsync in flight per log; weak, so a deleted partition's log is not kept alive by it.
_in_flight: WeakKeyDictionary[Flushable, _LogFlushes] = WeakKeyDictionary()


def flush_then(log: Flushable, offset: int, done: FlushCallback) -> None:
    """Call ``done(None)`` on this event loop once the log's data below ``offset`` is on disk, or
    ``done(error)`` if the fsync failed (KafkaStorageError when the log dir failed).

    The callback form is what a produce request uses: the acknowledgement is written from the callback,
    with no task of its own and no extra pass of the event loop between the fsync's end and the answer.
    ``done`` runs once, never inside this call, and must not raise."""
    loop = asyncio.get_running_loop()
    state = _in_flight.get(log)
    if state is not None and state.loop is loop:  # (another loop's is stale: that loop stopped mid-fsync)
        (state.covered if state.target >= offset else state.waiting_next).append(done)
        return
    state = _in_flight[log] = _LogFlushes(loop)
    _start(log, state, [done])


def _start(log: Flushable, state: _LogFlushes, callbacks: list[FlushCallback]) -> None:
    """Start one fsync covering everything appended so far, for ``callbacks``."""
    state.target = target = log.log_end_offset
    state.covered = callbacks
    loop = state.loop

    def in_python_thread() -> None:  # Log.flush_to in one of this module's flusher threads
        try:
            _flushers.submit(log.flush_to, target, loop, lambda error: _finished(log, state, error))
        except Exception as e:  # no flusher thread could start
            loop.call_soon(_finished, log, state, e)

    split: Any = log if hasattr(log, "begin_data_flush") else None  # a Log; test doubles have flush_to alone
    syncs = _native_syncs(loop) if split is not None else None
    if syncs is None:
        in_python_thread()
        return
    try:
        flush = split.begin_data_flush(target)
    except Exception as e:  # KafkaStorageError: the dir is offline
        loop.call_soon(_finished, log, state, e)
        return
    if flush is None:  # durable already
        loop.call_soon(_finished, log, state, None)
        return

    def synced(errno: int) -> None:
        error: BaseException | None = None
        try:
            split.end_data_flush(flush, errno)  # KafkaStorageError for a failed sync
        except BaseException as e:
            error = e
        _finished(log, state, error)

    try:
        syncs.submit(flush.fds, flush.dir_fd, synced)
    except OSError:  # no thread could start: give the descriptors back and sync the ordinary way
        split.abandon_data_flush(flush)
        in_python_thread()


def _finished(log: Flushable, state: _LogFlushes, error: BaseException | None) -> None:
    """The fsync in flight ended: start the next one for those who arrived meanwhile, then answer those
    it covered (a failed fsync fails them all: the log dir is offline, a retry would fail the same)."""
    covered = state.covered
    if state.waiting_next:
        waiting, state.waiting_next = state.waiting_next, []
        _start(log, state, waiting)
    elif _in_flight.get(log) is state:
        del _in_flight[log]
    for done in covered:
        try:
            done(error)
        except Exception:  # a caller's bug must not keep the others from their answer
            _log.exception("a group commit callback failed")


async def flush_to(log: Flushable, offset: int) -> None:
    """Return once the log's data below ``offset`` is on disk; raises what ``Log.flush_to`` raises
    (KafkaStorageError when the log dir failed).  A cancelled caller stops waiting; the fsync goes on."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not on asyncio (anyio on trio): its thread pool
        await anyio.to_thread.run_sync(log.flush_to, offset)
        return
    future: asyncio.Future[None] = loop.create_future()
    flush_then(log, offset, functools.partial(settle_future, future))
    await future
