"""Share groups (KIP-932) in a three-broker ZooKeeper cluster with confluent-kafka's ShareConsumer.

The group coordinator (leader of the group's ``__consumer_offsets`` partition) keeps membership, each
partition's leader keeps its share-partition, and the leader of the key's ``__share_group_state``
partition (the share coordinator) persists it.  Every record must be delivered, and a record whose
acknowledgement the broker confirmed must never be delivered again, also when the partition leader or
the share coordinator is killed with SIGKILL mid-stream.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from pykbroker.coordinator.internal_topic import partition_for
from tests.support.cluster import Cluster, metadata, raw_request, wait_for

pytestmark = [pytest.mark.timeout(420)]

SHARE = {"group.share.enable": "true", "share.coordinator.state.topic.num.partitions": "6",
         "min.insync.replicas": "2"}
TIMEOUT = 30
PARTITIONS = 3
STATE_TOPIC = "__share_group_state"
FIND_COORDINATOR, LIST_GROUPS, SHARE_GROUP_DESCRIBE = 10, 16, 77
DESCRIBE_SHARE_GROUP_OFFSETS, ALTER_SHARE_GROUP_OFFSETS = 90, 91


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("share-cluster"), 3, overrides=SHARE)
    with c:
        yield c


def healthy(cluster: Cluster) -> None:
    """Every broker running and registered (an earlier test may have killed one)."""
    for i, b in cluster.brokers.items():
        if i not in cluster.running():
            b.start()
    cluster.wait_registered(list(cluster.brokers), timeout=60)


def setup_topic(cluster: Cluster, group: str, n: int) -> str:
    topic = f"share-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "broker.address.family": "v4"})
    admin.create_topics([NewTopic(topic, PARTITIONS, 3)])[topic].result(timeout=TIMEOUT)
    res = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(timeout=TIMEOUT)
    cluster.wait_leaders(topic, PARTITIONS, timeout=60)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "broker.address.family": "v4", "acks": "all",
                  "linger.ms": 5})
    for i in range(n):
        p.produce(topic, key=b"%d" % i, value=b"v%d" % i, partition=i % PARTITIONS)
    assert p.flush(TIMEOUT) == 0
    return topic


class Consumers:
    """ShareConsumers of one group, polled in turn; what each delivered and which acknowledgements the
    broker confirmed (commit_sync without error for that partition)."""

    def __init__(self, cluster: Cluster, group: str, topic: str, count: int) -> None:
        self.cluster, self.group, self.topic = cluster, group, topic
        self.consumers: list[ShareConsumer] = [self._new() for _ in range(count)]
        self.deliveries: list[tuple[int, int]] = []  # (partition, offset) in delivery order
        self.confirmed: set[tuple[int, int]] = set()
        self.redelivered_after_ack: list[tuple[int, int]] = []

    def _new(self) -> ShareConsumer:
        c = ShareConsumer({"bootstrap.servers": self.cluster.bootstrap, "broker.address.family": "v4",
                           "group.id": self.group, "share.acknowledgement.mode": "explicit",
                           "max.poll.records": 25})
        c.subscribe([self.topic])
        return c

    def poll_round(self) -> int:
        got = 0
        for c in self.consumers:
            try:
                msgs = c.poll(0.3)
            except Exception:  # a broker going away surfaces as errors; the consumer retries
                continue
            mine = []
            for m in msgs:
                if m.error() is not None:
                    continue
                part, offset = m.partition(), m.offset()
                assert part is not None and offset is not None
                tp = (part, offset)
                if tp in self.confirmed:
                    self.redelivered_after_ack.append(tp)
                self.deliveries.append(tp)
                c.acknowledge(m, AcknowledgeType.ACCEPT)
                mine.append(tp)
            if not mine:
                continue
            got += len(mine)
            try:
                result = c.commit_sync(TIMEOUT)
            except Exception:
                continue  # not confirmed: these may come back
            failed = {tp.partition for tp, err in result.items() if err is not None}
            self.confirmed.update(tp for tp in mine if tp[0] not in failed)
        return got

    def run_until(self, done: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for _ in range(int(timeout / 0.2) + 10):
            if done() or time.monotonic() > deadline:
                return
            self.poll_round()

    def delivered(self) -> set[tuple[int, int]]:
        return set(self.deliveries)

    def close(self) -> None:
        for c in self.consumers:
            try:
                c.close()
            except Exception:  # best effort
                pass


def all_records(n: int) -> set[tuple[int, int]]:
    per = [0] * PARTITIONS
    out = set()
    for i in range(n):
        p = i % PARTITIONS
        out.add((p, per[p]))
        per[p] += 1
    return out


def topic_id(cluster: Cluster, topic: str) -> uuid.UUID:
    md = metadata(cluster.any_bootstrap(), [topic])
    return uuid.UUID(str(md.topics[0].topic_id))


def group_coordinator(cluster: Cluster, group: str) -> int:
    def find() -> int | None:
        try:
            resp = raw_request(cluster.any_bootstrap(), FIND_COORDINATOR, 3, {"key": group, "key_type": 0})
        except OSError:
            return None
        return int(resp.node_id) if int(resp.error_code) == 0 and int(resp.node_id) in cluster.running() else None
    return wait_for(find, timeout=60, interval=0.5, what="the group coordinator")


def test_three_consumers_share_three_partitions(cluster: Cluster) -> None:
    healthy(cluster)
    group = f"g-{uuid.uuid4().hex[:8]}"
    n = 300
    topic = setup_topic(cluster, group, n)
    cs = Consumers(cluster, group, topic, 3)
    try:
        cs.run_until(lambda: cs.delivered() >= all_records(n), 120)
    finally:
        cs.close()
    assert cs.delivered() == all_records(n)
    assert len(cs.deliveries) == n, "a record was delivered more than once"
    assert not cs.redelivered_after_ack


def _kill_mid_stream(cluster: Cluster, pick_victim: Any) -> None:
    healthy(cluster)
    group = f"g-{uuid.uuid4().hex[:8]}"
    n = 600
    topic = setup_topic(cluster, group, n)
    cs = Consumers(cluster, group, topic, 3)
    try:
        cs.run_until(lambda: len(cs.confirmed) >= n // 3, 90)
        assert len(cs.confirmed) >= n // 3, f"only {len(cs.confirmed)} acknowledged before the kill"
        victim = pick_victim(topic, group)
        cluster.kill(victim)
        cs.run_until(lambda: False, 4)  # keep consuming while the leadership moves
        cluster.broker(victim).start()
        cluster.wait_registered(list(cluster.brokers), timeout=60)
        cs.run_until(lambda: cs.delivered() >= all_records(n), 180)
    finally:
        cs.close()
    assert not cs.redelivered_after_ack, f"acknowledged records delivered again: {cs.redelivered_after_ack[:10]}"
    missing = all_records(n) - cs.delivered()
    assert not missing, f"{len(missing)} records never delivered, e.g. {sorted(missing)[:10]}"


def test_kill9_partition_leader_mid_stream(cluster: Cluster) -> None:
    _kill_mid_stream(cluster, lambda topic, group: cluster.leaders(topic)[0])


def test_kill9_share_coordinator_mid_stream(cluster: Cluster) -> None:
    def share_coordinator(topic: str, group: str) -> int:
        key = f"{group}:{topic_id(cluster, topic)}:0"
        return cluster.leaders(STATE_TOPIC)[partition_for(key, 6)]
    _kill_mid_stream(cluster, share_coordinator)


def test_kill9_group_coordinator_mid_stream(cluster: Cluster) -> None:
    _kill_mid_stream(cluster, lambda topic, group: group_coordinator(cluster, group))


def test_group_listed_on_its_coordinator_after_a_restart(cluster: Cluster) -> None:
    healthy(cluster)
    group = f"g-{uuid.uuid4().hex[:8]}"
    topic = setup_topic(cluster, group, 30)
    cs = Consumers(cluster, group, topic, 1)
    try:
        cs.run_until(lambda: len(cs.delivered()) >= 30, 60)
    finally:
        cs.close()  # the group is Empty now; only its persisted record keeps it
    coordinator = group_coordinator(cluster, group)
    cluster.kill(coordinator)
    cluster.broker(coordinator).start()
    cluster.wait_registered(list(cluster.brokers), timeout=60)

    def listed() -> tuple[int, Any] | None:
        node = group_coordinator(cluster, group)
        bootstrap = cluster.broker(node).bootstrap
        try:
            resp = raw_request(bootstrap, LIST_GROUPS, 5, {"states_filter": [], "types_filter": ["share"]})
            described = raw_request(bootstrap, SHARE_GROUP_DESCRIBE, 1,
                                    {"group_ids": [group], "include_authorized_operations": False}).groups[0]
        except OSError:
            return None
        mine = [(g.group_id, g.group_type, g.group_state) for g in resp.groups if g.group_id == group]
        if mine != [(group, "share", "Empty")] or int(described.error_code) != 0:
            return None
        return node, described
    node, described = wait_for(listed, timeout=60, interval=0.5, what="the share group listed by its coordinator")
    assert described.group_state == "Empty" and described.group_epoch >= 1
    # Other brokers are not its coordinator.
    other = next(i for i in cluster.running() if i != node)
    resp = raw_request(cluster.broker(other).bootstrap, SHARE_GROUP_DESCRIBE, 1,
                       {"group_ids": [group], "include_authorized_operations": False})
    assert int(resp.groups[0].error_code) == 16  # NOT_COORDINATOR


def test_alter_share_group_offsets_reaches_every_share_partition_leader(cluster: Cluster) -> None:
    """The group coordinator writes the reset state to each share coordinator; the partition leaders, which
    held the old state in memory, read the new one when the group comes back."""
    healthy(cluster)
    group = f"g-{uuid.uuid4().hex[:8]}"
    n = 60
    topic = setup_topic(cluster, group, n)
    first = Consumers(cluster, group, topic, 1)
    try:
        first.run_until(lambda: first.confirmed >= all_records(n), 60)
    finally:
        first.close()
    assert first.confirmed == all_records(n)
    assert len(set(cluster.leaders(topic).values())) > 1, "partitions led by one broker: nothing to test"
    body = {"group_id": group, "topics": [{"topic_name": topic, "partitions": [
        {"partition_index": i, "start_offset": 0} for i in range(PARTITIONS)]}]}

    def altered() -> bool:
        node = group_coordinator(cluster, group)
        resp = raw_request(cluster.broker(node).bootstrap, ALTER_SHARE_GROUP_OFFSETS, 0, body)
        return int(resp.error_code) == 0 and all(
            int(p.error_code) == 0 for t in resp.responses for p in t.partitions)
    wait_for(altered, timeout=60, interval=1.0, what="AlterShareGroupOffsets accepted (the group empty)")
    node = group_coordinator(cluster, group)
    described = raw_request(cluster.broker(node).bootstrap, DESCRIBE_SHARE_GROUP_OFFSETS, 1, {"groups": [
        {"group_id": group, "topics": [{"topic_name": topic, "partitions": list(range(PARTITIONS))}]}]})
    assert [(int(p.partition_index), int(p.start_offset)) for p in described.groups[0].topics[0].partitions] == \
        [(i, 0) for i in range(PARTITIONS)]
    again = Consumers(cluster, group, topic, 2)
    try:
        again.run_until(lambda: again.confirmed >= all_records(n), 90)
    finally:
        again.close()
    assert again.delivered() == all_records(n)
    assert again.confirmed == all_records(n)


def test_delete_group_deletes_its_state_on_every_share_coordinator(cluster: Cluster) -> None:
    """DeleteGroups on an empty share group removes its share-partition state even where no state key is
    on a share coordinator partition its group coordinator leads: the group coordinator knows the group's
    topics from its records in __consumer_offsets. A new group of that name then reads from the start."""
    healthy(cluster)
    n = 20
    topic = f"share-del-{uuid.uuid4().hex[:8]}"  # one partition: one state key, on one share coordinator
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "broker.address.family": "v4"})
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(timeout=TIMEOUT)
    cluster.wait_leaders(topic, 1, timeout=60)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "broker.address.family": "v4", "acks": "all"})
    for i in range(n):
        p.produce(topic, key=b"%d" % i, value=b"v%d" % i, partition=0)
    assert p.flush(TIMEOUT) == 0
    records = {(0, i) for i in range(n)}
    tid = topic_id(cluster, topic)

    def earliest(group: str) -> None:
        res = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=[
            ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([res])[res].result(timeout=TIMEOUT)

    def read_all(group: str) -> Consumers:
        cs = Consumers(cluster, group, topic, 1)
        try:
            cs.run_until(lambda: cs.confirmed >= records, 60)
        finally:
            cs.close()
        return cs

    warm = f"warm-{uuid.uuid4().hex[:6]}"  # brings __share_group_state about
    earliest(warm)
    read_all(warm)
    state_leaders = wait_for(lambda: (lambda ls: ls if len(ls) == 6 and min(ls.values()) >= 0 else None)(
        cluster.leaders(STATE_TOPIC)), timeout=60, what=f"{STATE_TOPIC} with leaders")

    def state_elsewhere(g: str) -> bool:
        return state_leaders[partition_for(f"{g}:{tid}:0", 6)] != group_coordinator(cluster, g)

    group = next((g for g in (f"g-{uuid.uuid4().hex[:8]}" for _ in range(40)) if state_elsewhere(g)), None)
    assert group is not None, "no group id whose state is on another broker than its coordinator"
    earliest(group)
    assert read_all(group).confirmed == records

    def deleted() -> bool:
        try:
            admin.delete_consumer_groups([group], request_timeout=TIMEOUT)[group].result(timeout=TIMEOUT)
        except Exception:  # NON_EMPTY_GROUP until the closed member is gone, or a coordinator moving
            return False
        return True
    wait_for(deleted, timeout=60, interval=1.0, what="DeleteGroups accepted")
    again = read_all(group)
    assert again.delivered() == records, "the deleted group's state was left on its share coordinator"
