"""The controller context's derived views."""

from __future__ import annotations

import uuid

from pykbroker.controller.context import ControllerContext, TopicInfo
from pykbroker.metadata.zk_layout import PartitionState


def make() -> ControllerContext:
    ctx = ControllerContext(epoch=3, live_brokers={1: None, 2: None, 3: "r"}, shutting_down={3})
    ctx.topics["a"] = TopicInfo(uuid.uuid4(), {0: [1, 2], 1: [2, 1], 2: [3, 1], 3: [1]})
    ctx.topics["b"] = TopicInfo(uuid.uuid4(), {0: [4, 1, 2], 1: [1, 2]}, adding={0: [4]}, removing={0: [2]})
    ctx.states.update({
        ("a", 0): PartitionState(2, 1, [1, 2], 3), ("a", 1): PartitionState(2, 0, [2, 1], 3),
        ("a", 2): PartitionState(3, 0, [3, 1], 3), ("b", 0): PartitionState(1, 0, [1, 2], 3),
        ("b", 1): PartitionState(-1, 4, [1], 3),
    })
    return ctx


def test_online_excludes_brokers_shutting_down() -> None:
    ctx = make()
    assert ctx.online() == {1, 2}
    assert ctx.is_online(1) and not ctx.is_online(3) and not ctx.is_online(9)


def test_partition_views() -> None:
    ctx = make()
    assert ctx.new_partitions() == [("a", 3)]
    assert ctx.partitions_led_by(2) == [("a", 0), ("a", 1)]
    assert ctx.offline_partitions() == [("a", 2), ("b", 1)]  # leader 3 is shutting down; b-1 has none
    assert ctx.partitions_on(2) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    ctx.deleting.add("b")
    assert ctx.partitions_on(2) == [("a", 0), ("a", 1)]


def test_reassignment_target_and_completion() -> None:
    ctx = make()
    info = ctx.topics["b"]
    assert info.target(0) == [4, 1] and info.is_reassigning(0) and not info.is_reassigning(1)
    assert ctx.reassigning() == [("b", 0)]
    assert not ctx.reassignment_complete(("b", 0))
    ctx.states[("b", 0)].isr = [1, 2, 4]
    assert ctx.reassignment_complete(("b", 0))


def test_preferred_imbalance() -> None:
    ctx = make()
    ratio, others = ctx.preferred_imbalance(1)  # prefers a-0, a-3 (no state), b-1; leads none of them
    assert others == [("a", 0), ("b", 1)] and ratio == 2 / 3
    assert ctx.preferred_imbalance(2) == (0.0, [])
    assert ctx.preferred_imbalance(9) == (0.0, [])


def test_remove_topic_drops_its_states() -> None:
    ctx = make()
    ctx.deleting.add("a")
    ctx.remove_topic("a")
    assert "a" not in ctx.topics and "a" not in ctx.deleting
    assert all(t == "b" for t, _ in ctx.states)
