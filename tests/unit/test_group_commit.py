"""group_commit.flush_to: one fsync in flight per log, shared by every request it covers."""

from __future__ import annotations

import asyncio
import threading
import time

import anyio
import pytest

from pykbroker.replica import group_commit
from pykbroker.storage.log import KafkaStorageError


class SlowLog:
    """A log whose flush takes a while in its worker thread and records what each flush covered."""

    def __init__(self, flush_seconds: float = 0.05, fail: bool = False) -> None:
        self.log_end_offset = 0
        self.durable = 0
        self.flushes: list[int] = []
        self.threads: set[int] = set()
        self.flush_seconds = flush_seconds
        self.fail = fail

    def append(self, n: int = 1) -> int:
        self.log_end_offset += n
        return self.log_end_offset

    def flush_to(self, offset: int) -> None:
        self.threads.add(threading.get_ident())
        time.sleep(self.flush_seconds)
        if self.fail:
            raise KafkaStorageError("the log dir is offline")
        self.flushes.append(offset)
        self.durable = max(self.durable, offset)


def test_requests_appended_during_an_fsync_share_the_next_one() -> None:
    log = SlowLog()
    acknowledged: list[tuple[int, int]] = []  # (offset, durable when acknowledged)

    async def request(offset: int) -> None:
        await group_commit.flush_to(log, offset)
        acknowledged.append((offset, log.durable))

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(request, log.append())  # starts an fsync covering offset 1
            await anyio.sleep(0.01)
            for _ in range(20):  # appended while it runs: one more fsync covers them all
                tg.start_soon(request, log.append())
    anyio.run(main)
    assert len(acknowledged) == 21
    assert all(durable >= offset for offset, durable in acknowledged)  # never acknowledged before durable
    assert log.flushes == [1, 21]


def test_a_request_covered_by_the_fsync_in_flight_waits_for_it_only() -> None:
    log = SlowLog()

    async def main() -> None:
        first = log.append(5)
        async with anyio.create_task_group() as tg:
            tg.start_soon(group_commit.flush_to, log, first)
            await anyio.sleep(0.01)
            await group_commit.flush_to(log, 3)  # below the target of the fsync in flight
    anyio.run(main)
    assert log.flushes == [5]


def test_a_failed_fsync_fails_every_request_waiting_for_it() -> None:
    log = SlowLog(fail=True)
    errors: list[str] = []

    async def request(offset: int) -> None:
        try:
            await group_commit.flush_to(log, offset)
        except KafkaStorageError as e:
            errors.append(str(e))

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(request, log.append())
    anyio.run(main)
    assert len(errors) == 5 and log.flushes == []


def test_sequential_requests_each_get_their_fsync() -> None:
    log = SlowLog(flush_seconds=0.0)

    async def main() -> None:
        for _ in range(3):
            await group_commit.flush_to(log, log.append())
    anyio.run(main)
    assert log.flushes == [1, 2, 3]


@pytest.mark.parametrize("cancel_after", [0.0, 0.02])
def test_a_cancelled_waiter_leaves_nothing_behind(cancel_after: float) -> None:
    log = SlowLog()

    async def main() -> None:
        with anyio.move_on_after(cancel_after):
            await group_commit.flush_to(log, log.append())
        await group_commit.flush_to(log, log.append())  # the next request is not stuck behind it
    anyio.run(main)
    assert log.durable == 2
    assert log not in group_commit._in_flight


def test_fsyncs_of_different_logs_run_in_parallel_threads() -> None:
    logs = [SlowLog(flush_seconds=0.3) for _ in range(4)]

    async def main() -> float:
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for log in logs:
                tg.start_soon(group_commit.flush_to, log, log.append())
        return time.monotonic() - started
    elapsed = anyio.run(main)
    assert all(log.flushes == [1] for log in logs)
    assert len({t for log in logs for t in log.threads}) == 4  # one flusher thread each
    assert elapsed < 1.0  # four 0.3 s fsyncs one after another would take 1.2 s


def test_flusher_threads_are_bounded_and_reused() -> None:
    flushers = group_commit._Flushers(max_threads=2)
    logs = [SlowLog(flush_seconds=0.05) for _ in range(6)]

    async def run(log: SlowLog) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        flushers.submit(log.flush_to, log.append(), loop, lambda error: group_commit.settle_future(future, error))
        await future

    async def main() -> None:
        for _ in range(2):
            async with anyio.create_task_group() as tg:
                for log in logs:
                    tg.start_soon(run, log)
    anyio.run(main)
    assert all(log.flushes == [1, 2] for log in logs)
    assert len({t for log in logs for t in log.threads}) <= 2


def test_a_waiter_cancelled_during_the_fsync_lets_the_next_request_start_its_own() -> None:
    log = SlowLog(flush_seconds=0.2)

    async def main() -> None:
        with anyio.move_on_after(0.05):
            await group_commit.flush_to(log, log.append())  # its fsync goes on in the thread
        await group_commit.flush_to(log, log.append())
        assert log.durable >= 2  # never returned before its own data was durable
    anyio.run(main)
    assert log not in group_commit._in_flight


def test_flush_then_calls_back_after_the_fsync_never_inside_the_call() -> None:
    log = SlowLog(flush_seconds=0.02)
    calls: list[tuple[int, BaseException | None, int]] = []  # (request, error, durable when called)

    async def main() -> None:
        returned = []
        group_commit.flush_then(log, log.append(), lambda e: calls.append((1, e, log.durable)))
        returned.append(len(calls))
        await anyio.sleep(0.005)
        for i in range(2, 6):  # appended during that fsync: the next one covers them all
            group_commit.flush_then(log, log.append(), lambda e, i=i: calls.append((i, e, log.durable)))
        returned.append(len(calls))
        with anyio.fail_after(5):
            for _ in range(500):
                if len(calls) == 5:
                    break
                await anyio.sleep(0.01)
        assert returned == [0, 0]
    anyio.run(main)
    assert [c[0] for c in calls] == [1, 2, 3, 4, 5]
    assert all(error is None and durable >= request for request, error, durable in calls)
    assert log.flushes == [1, 5]
    assert log not in group_commit._in_flight


def test_flush_then_gives_a_failure_to_every_callback_and_a_failing_callback_stops_no_other() -> None:
    log = SlowLog(flush_seconds=0.01, fail=True)
    errors: list[BaseException | None] = []

    def broken(error: BaseException | None) -> None:
        raise RuntimeError("a caller's bug")

    async def main() -> None:
        first = log.append()
        group_commit.flush_then(log, first, broken)
        group_commit.flush_then(log, first, errors.append)  # the same fsync as the broken callback
        for _ in range(2):  # and the next one
            group_commit.flush_then(log, log.append(), errors.append)
        with anyio.fail_after(5):
            for _ in range(500):
                if len(errors) == 3:
                    break
                await anyio.sleep(0.01)
    anyio.run(main)
    assert len(errors) == 3 and all(isinstance(e, KafkaStorageError) for e in errors)
    assert log not in group_commit._in_flight
