"""pykbroker.scheduler.slice.us in a real ``pykbroker serve``: every thread of the broker, the fsync
threads of log.flush.on.ack included (they start later and inherit it), runs with the slice; 0 leaves the
slice the process was started with; an explicit value the kernel cannot keep fails the start."""

from __future__ import annotations

import os

from pykbroker.server.cpu_slice import thread_slice_ns
from tests.integration.conftest import BrokerFactory, create_topic, make_producer, produce_all, unique_topic
from tests.support.broker import BrokerProcess
from tests.support.slices import kernel_keeps_slices


def _broker_slices(b: BrokerProcess) -> dict[int, int]:
    assert b.proc is not None
    return {int(t): thread_slice_ns(int(t)) for t in os.listdir(f"/proc/{b.proc.pid}/task")}


def _flush_on_ack_traffic(b: BrokerProcess) -> None:
    """Acknowledged produces under log.flush.on.ack: the native fsync threads start on demand."""
    topic = unique_topic("slice")
    create_topic(b, topic, partitions=1)
    reports = produce_all(make_producer(b, acks="1"), topic, [{"value": b"v%d" % i} for i in range(20)])
    assert all(r.error is None for r in reports)


def test_every_broker_thread_runs_with_the_default_slice(broker_factory: BrokerFactory) -> None:
    b = broker_factory({"log.flush.on.ack": "true"})
    _flush_on_ack_traffic(b)
    slices = _broker_slices(b)
    if not kernel_keeps_slices():  # an older kernel: the default is told in the log, the start goes on
        assert "keep the kernel's default slice" in b.log()
        return
    assert len(slices) >= 3, slices  # the event loop, anyio's worker, the fsync thread(s)
    assert set(slices.values()) == {200_000}, slices


def test_zero_leaves_the_slice_alone_and_an_explicit_value_is_taken(broker_factory: BrokerFactory) -> None:
    own = thread_slice_ns()
    assert own != 1_000_000, "this test process already runs with a 1 ms slice: 0 and 1000 would look alike"
    b0 = broker_factory({"log.flush.on.ack": "true", "pykbroker.scheduler.slice.us": "0"})
    _flush_on_ack_traffic(b0)
    assert set(_broker_slices(b0).values()) == {own}

    b1 = broker_factory({"log.flush.on.ack": "true", "pykbroker.scheduler.slice.us": "1000"}, start=False)
    if not kernel_keeps_slices():
        try:
            b1.start(timeout=20)
        except RuntimeError as e:  # the broker exits at start, saying why
            assert "pykbroker.scheduler.slice.us=1000" in str(e)
            return
        raise AssertionError("an explicit slice the kernel cannot keep must fail the start")
    b1.start()
    _flush_on_ack_traffic(b1)
    assert set(_broker_slices(b1).values()) == {1_000_000}
