"""FetchWaiters, the long-poll purgatory: a wait ends when one of its partitions is notified (True) or when its
time is up (False), and leaves nothing registered however it ends, a cancellation included."""

from __future__ import annotations

import anyio
import pytest

from pykbroker.replica.replica_manager import FetchWaiters

pytestmark = pytest.mark.anyio

A, B = ("t", 0), ("t", 1)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_notified_partition_ends_the_wait_with_true() -> None:
    waiters = FetchWaiters()
    results: list[bool] = []

    async def poll() -> None:
        results.append(await waiters.wait([A, B], 10.0))

    async with anyio.create_task_group() as tg:
        tg.start_soon(poll)
        with anyio.fail_after(5):
            for _ in range(500):
                if waiters.waiting:
                    break
                await anyio.sleep(0.001)
        waiters.notify(B)
    assert results == [True]
    assert waiters.waiting == 0 and not waiters._by_partition


async def test_the_time_running_out_ends_the_wait_with_false() -> None:
    waiters = FetchWaiters()
    started = anyio.current_time()
    assert await waiters.wait([A], 0.05) is False
    assert anyio.current_time() - started >= 0.04
    assert waiters.waiting == 0 and not waiters._by_partition
    assert await waiters.wait([A], 0) is False  # no time at all: answered at once


async def test_a_cancelled_wait_leaves_nothing_registered_and_a_later_notify_is_harmless() -> None:
    waiters = FetchWaiters()
    with anyio.move_on_after(0.02):
        await waiters.wait([A], 10.0)
    assert waiters.waiting == 0 and not waiters._by_partition
    waiters.notify(A)
    waiters.notify_all()


async def test_events_registered_directly_are_set_too() -> None:
    """Share fetches register an anyio.Event of their own under the same partitions."""
    waiters = FetchWaiters()
    event = anyio.Event()
    waiters.register([A], event)
    waiters.notify(A)
    assert event.is_set()
    other = anyio.Event()
    waiters.register([B], other)
    waiters.notify_all()
    assert other.is_set()
