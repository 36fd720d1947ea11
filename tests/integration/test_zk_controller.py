"""The ZooKeeper-mode controller against a real ZooKeeper, with fake brokers.

A fake broker is its own kazoo session holding an ephemeral /brokers/ids/<id>; closing the session
is the broker's death. Each test works under its own chroot of one module-wide ZooKeeper.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from pykbroker.config import BrokerConfig
from pykbroker.controller.controller import ELECTIONS, ZkController
from pykbroker.controller.partition_state_machine import ControllerMoved, ZkOp
from pykbroker.metadata import zk_layout as zl
from tests.support.zookeeper import ZooKeeperEnsemble

pytestmark = [pytest.mark.xdist_group("zk-controller"), pytest.mark.timeout(120)]

WAIT_S = 15.0


def wait_for(what: str, fn: Callable[[], Any], timeout: float = WAIT_S) -> Any:
    """Poll ``fn`` until it returns something truthy, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    for _ in range(int(timeout / 0.05) + 1):
        last = fn()
        if last:
            return last
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


@pytest.fixture(scope="module")
def zk_connect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    ensemble = ZooKeeperEnsemble(Path(tmp_path_factory.mktemp("zk")), 1).start()
    try:
        yield ensemble.connect
    finally:
        ensemble.stop()


class Cluster:
    """Fake brokers and controllers sharing one chroot."""

    def __init__(self, connect: str) -> None:
        root = f"/ctl-{uuid.uuid4().hex[:8]}"
        boot = KazooClient(connect)
        boot.start(timeout=15)
        boot.ensure_path(root)
        boot.stop()
        boot.close()
        self.connect = connect + root
        self.admin = self._client()
        for path in zl.PERSISTENT_PATHS:
            self.admin.ensure_path(path)
        self.brokers: dict[int, KazooClient] = {}
        self.controllers: list[tuple[ZkController, KazooClient]] = []

    def _client(self) -> KazooClient:
        zk = KazooClient(self.connect, timeout=4.0)
        zk.start(timeout=15)
        return zk

    def broker_up(self, broker_id: int, rack: str | None = None) -> None:
        zk = self._client()
        reg = zl.BrokerRegistration(broker_id, (("PLAINTEXT", "127.0.0.1", 9000 + broker_id),), rack=rack)
        zk.create(zl.broker_path(broker_id), zl.encode_broker(reg), ephemeral=True)
        self.brokers[broker_id] = zk

    def broker_down(self, broker_id: int) -> None:
        zk = self.brokers.pop(broker_id)
        zk.stop()
        zk.close()

    def controller(self, broker_id: int, **overrides: str) -> ZkController:
        zk = self._client()
        cfg = BrokerConfig({"broker.id": str(broker_id), "zookeeper.connect": self.connect,
                            "zookeeper.session.timeout.ms": "4000", **overrides})
        ctl = ZkController(zk, broker_id, cfg)
        ctl.start()
        self.controllers.append((ctl, zk))
        return ctl

    def close_session(self, ctl: ZkController) -> None:
        for c, zk in self.controllers:
            if c is ctl:
                zk.stop()

    def create_topic(self, name: str, partitions: dict[int, list[int]], configs: dict[str, str] | None = None) -> None:
        if configs:
            self.admin.create(zl.topic_config_path(name), zl.encode_entity_config(configs), makepath=True)
        self.admin.create(zl.topic_path(name), zl.encode_topic_assignment(
            zl.TopicAssignment(uuid.uuid4(), partitions)), makepath=True)

    def state(self, topic: str, partition: int) -> zl.PartitionState | None:
        stat = self.admin.exists(zl.partition_state_path(topic, partition))
        if stat is None:
            return None
        data, stat = self.admin.get(zl.partition_state_path(topic, partition))
        return zl.decode_partition_state(data, stat.version)

    def wait_state(self, topic: str, partition: int, check: Callable[[zl.PartitionState], bool],
                   timeout: float = WAIT_S) -> zl.PartitionState:
        def probe() -> zl.PartitionState | None:
            s = self.state(topic, partition)
            return s if s is not None and check(s) else None
        return wait_for(f"state of {topic}-{partition}", probe, timeout)  # type: ignore[no-any-return]

    def leader_write(self, topic: str, partition: int, isr: list[int]) -> None:
        """What a partition leader does to change its ISR: conditional set, then a notification."""
        data, stat = self.admin.get(zl.partition_state_path(topic, partition))
        s = zl.decode_partition_state(data)
        s.isr = isr
        self.admin.set(zl.partition_state_path(topic, partition), zl.encode_partition_state(s), version=stat.version)
        self.admin.create(f"{zl.ISR_CHANGE_NOTIFICATION}/isr_change_",
                          zl.encode_partition_list([(topic, partition)]), sequence=True)

    def close(self) -> None:
        for ctl, _zk in self.controllers:
            ctl.stop(timeout=10)
        for _ctl, zk in self.controllers:
            zk.stop()
            zk.close()
        for b in list(self.brokers):
            self.broker_down(b)
        self.admin.stop()
        self.admin.close()


@pytest.fixture
def cluster(zk_connect: str) -> Iterator[Cluster]:
    c = Cluster(zk_connect)
    try:
        yield c
    finally:
        c.close()


def active(ctls: list[ZkController]) -> list[ZkController]:
    return [c for c in ctls if c.is_active()]


def epoch_in_zk(c: Cluster) -> int:
    return zl.decode_controller_epoch(c.admin.get(zl.CONTROLLER_EPOCH)[0])


def test_one_controller_then_failover_with_a_new_epoch(cluster: Cluster) -> None:
    cluster.broker_up(1)
    cluster.broker_up(2)
    a = cluster.controller(1)
    b = cluster.controller(2)
    first = wait_for("one active controller", lambda: active([a, b]))
    assert len(first) == 1
    time.sleep(0.3)
    assert len(active([a, b])) == 1
    winner = first[0]
    other = b if winner is a else a
    assert zl.decode_controller(cluster.admin.get(zl.CONTROLLER)[0]) == winner.broker_id
    assert epoch_in_zk(cluster) == winner.epoch
    old_epoch = winner.epoch

    started = time.monotonic()
    cluster.close_session(winner)
    wait_for("the other controller to take over", other.is_active, timeout=10)
    took = time.monotonic() - started
    assert took < 5, took
    assert other.epoch == old_epoch + 1 == epoch_in_zk(cluster)
    assert zl.decode_controller(cluster.admin.get(zl.CONTROLLER)[0]) == other.broker_id
    assert not winner.is_active()


def test_a_zombie_controller_cannot_write(cluster: Cluster) -> None:
    cluster.broker_up(1)
    cluster.broker_up(2)
    a = cluster.controller(1)
    wait_for("controller", a.is_active)
    stale_epoch = a.epoch
    # Another controller was elected meanwhile (as far as ZooKeeper knows): the epoch moved on.
    cluster.admin.set(zl.CONTROLLER_EPOCH, zl.encode_controller_epoch(stale_epoch + 1))
    with pytest.raises(ControllerMoved):
        a._multi([ZkOp("create", "/zombie-was-here")])
    assert cluster.admin.exists("/zombie-was-here") is None

    # Its next real write fails the same way: it resigns and a fresh election (epoch + 2) follows,
    # so the topic's states carry the new epoch, never the stale one.
    cluster.create_topic("zombie", {0: [1, 2]})
    s = cluster.wait_state("zombie", 0, lambda s: True)
    assert s.controller_epoch == stale_epoch + 2 == a.epoch
    assert (s.leader, s.isr, s.leader_epoch) == (1, [1, 2], 0)


def test_new_topic_states_and_offline_new_partitions(cluster: Cluster) -> None:
    for b in (1, 2, 3):
        cluster.broker_up(b)
    ctl = cluster.controller(1)
    wait_for("controller", ctl.is_active)
    cluster.create_topic("fresh", {0: [1, 2, 3], 1: [3, 4, 1], 2: [4]})
    s0 = cluster.wait_state("fresh", 0, lambda s: True)
    assert (s0.leader, s0.leader_epoch, s0.isr, s0.controller_epoch) == (1, 0, [1, 2, 3], ctl.epoch)
    s1 = cluster.wait_state("fresh", 1, lambda s: True)
    assert (s1.leader, s1.isr) == (3, [3, 1])  # live replicas in assignment order
    time.sleep(0.3)
    assert cluster.state("fresh", 2) is None  # no live replica: stays a new partition
    cluster.broker_up(4)
    s2 = cluster.wait_state("fresh", 2, lambda s: True)
    assert (s2.leader, s2.isr, s2.leader_epoch) == (4, [4], 0)
    s1 = cluster.state("fresh", 1)
    assert s1 is not None and (s1.leader, s1.isr) == (3, [3, 1])  # the leader adds 4 to the ISR, not us

    # Partitions added later (the assignment znode rewritten) are initialized as well.
    data, stat = cluster.admin.get(zl.topic_path("fresh"))
    a = zl.decode_topic_assignment(data)
    a.partitions[3] = [2, 3]
    cluster.admin.set(zl.topic_path("fresh"), zl.encode_topic_assignment(a), version=stat.version)
    s3 = cluster.wait_state("fresh", 3, lambda s: True)
    assert (s3.leader, s3.isr) == (2, [2, 3])


def test_broker_death_moves_leaders_and_shrinks_isrs(cluster: Cluster) -> None:
    for b in (1, 2, 3):
        cluster.broker_up(b)
    ctl = cluster.controller(3)
    wait_for("controller", ctl.is_active)
    cluster.create_topic("deaths", {0: [1, 2, 3], 1: [2, 1, 3], 2: [2, 3]})
    for p in range(3):
        cluster.wait_state("deaths", p, lambda s: True)
    cluster.broker_down(1)
    s0 = cluster.wait_state("deaths", 0, lambda s: s.leader != 1)
    assert (s0.leader, s0.isr, s0.leader_epoch) == (2, [2, 3], 1)
    s1 = cluster.wait_state("deaths", 1, lambda s: 1 not in s.isr)
    assert (s1.leader, s1.isr, s1.leader_epoch) == (2, [2, 3], 1)
    s2 = cluster.state("deaths", 2)
    assert s2 is not None and (s2.leader, s2.isr, s2.leader_epoch) == (2, [2, 3], 0)  # untouched


def test_only_dead_isr_leaves_no_leader_until_it_returns(cluster: Cluster) -> None:
    cluster.broker_up(1)
    ctl = cluster.controller(1)
    wait_for("controller", ctl.is_active)
    cluster.create_topic("clean", {0: [1, 2]})
    cluster.create_topic("unclean", {0: [1, 2]}, configs={"unclean.leader.election.enable": "true"})
    cluster.wait_state("clean", 0, lambda s: s.isr == [1])
    cluster.wait_state("unclean", 0, lambda s: s.isr == [1])
    cluster.broker_up(2)
    time.sleep(0.3)
    cluster.broker_down(1)
    s = cluster.wait_state("clean", 0, lambda s: s.leader != 1)
    assert (s.leader, s.isr, s.leader_epoch) == (-1, [1], 1)  # the last ISR member is kept
    u = cluster.wait_state("unclean", 0, lambda s: s.leader != 1)
    assert (u.leader, u.isr, u.leader_epoch) == (2, [2], 1)  # topic config allows unclean election
    cluster.broker_up(1)
    s = cluster.wait_state("clean", 0, lambda s: s.leader != -1)
    assert (s.leader, s.isr, s.leader_epoch) == (1, [1], 2)


def test_controlled_shutdown_moves_leaderships_away(cluster: Cluster) -> None:
    for b in (1, 2, 3):
        cluster.broker_up(b)
    ctl = cluster.controller(2)
    wait_for("controller", ctl.is_active)
    cluster.create_topic("cs", {0: [1, 2, 3], 1: [2, 1, 3], 2: [1]})
    for p in range(3):
        cluster.wait_state("cs", p, lambda s: True)
    cluster.brokers[1].create(zl.controlled_shutdown_path(1), b"", ephemeral=True)
    s0 = cluster.wait_state("cs", 0, lambda s: s.leader != 1)
    assert (s0.leader, s0.isr, s0.leader_epoch) == (2, [2, 3], 1)
    s1 = cluster.wait_state("cs", 1, lambda s: 1 not in s.isr)
    assert (s1.leader, s1.isr, s1.leader_epoch) == (2, [2, 3], 1)
    s2 = cluster.state("cs", 2)
    assert s2 is not None and (s2.leader, s2.isr, s2.leader_epoch) == (1, [1], 0)  # one replica: stays
    # A new topic is not led by a broker that is shutting down.
    cluster.create_topic("cs2", {0: [1, 3]})
    n = cluster.wait_state("cs2", 0, lambda s: True)
    assert (n.leader, n.isr) == (3, [3])


def test_preferred_election_request(cluster: Cluster) -> None:
    cluster.broker_up(2)
    ctl = cluster.controller(2, **{"auto.leader.rebalance.enable": "false"})
    wait_for("controller", ctl.is_active)
    cluster.create_topic("pref", {0: [1, 2], 1: [2, 1]})
    cluster.wait_state("pref", 0, lambda s: s.leader == 2)
    cluster.wait_state("pref", 1, lambda s: s.leader == 2)
    cluster.broker_up(1)
    cluster.leader_write("pref", 0, [2, 1])  # 1 caught up
    cluster.wait_state("pref", 0, lambda s: s.isr == [2, 1])
    time.sleep(0.3)
    s = cluster.state("pref", 0)
    assert s is not None and s.leader == 2  # no auto rebalance
    path = cluster.admin.create(f"{ELECTIONS}/election_", json.dumps(
        {"version": 1, "election_type": 0, "partitions": [{"topic": "pref", "partition": 0},
                                                          {"topic": "pref", "partition": 1}]}).encode(), sequence=True,
        makepath=True)
    s = cluster.wait_state("pref", 0, lambda s: s.leader == 1)
    assert (s.isr, s.leader_epoch) == ([2, 1], 1)
    wait_for("request deleted", lambda: cluster.admin.exists(path) is None)
    s1 = cluster.state("pref", 1)
    assert s1 is not None and (s1.leader, s1.leader_epoch) == (2, 0)  # already preferred


def test_auto_leader_rebalance(cluster: Cluster) -> None:
    cluster.broker_up(2)
    ctl = cluster.controller(2, **{"leader.imbalance.check.interval.seconds": "1"})
    wait_for("controller", ctl.is_active)
    cluster.create_topic("rebal", {0: [1, 2]})
    cluster.wait_state("rebal", 0, lambda s: s.leader == 2)
    cluster.broker_up(1)
    cluster.leader_write("rebal", 0, [2, 1])
    s = cluster.wait_state("rebal", 0, lambda s: s.leader == 1, timeout=12)
    assert s.isr == [2, 1]


def test_topic_deletion_removes_znodes(cluster: Cluster) -> None:
    cluster.broker_up(1)
    ctl = cluster.controller(1)
    wait_for("controller", ctl.is_active)
    cluster.create_topic("doomed", {0: [1], 1: [1]}, configs={"retention.ms": "1000"})
    cluster.create_topic("kept", {0: [1]})
    cluster.wait_state("doomed", 1, lambda s: True)
    cluster.wait_state("kept", 0, lambda s: True)
    cluster.admin.create(zl.delete_topic_path("doomed"))
    wait_for("topic znode gone", lambda: cluster.admin.exists(zl.topic_path("doomed")) is None)
    wait_for("deletion request gone", lambda: cluster.admin.exists(zl.delete_topic_path("doomed")) is None)
    assert cluster.admin.exists(zl.topic_config_path("doomed")) is None
    assert cluster.admin.exists(zl.topic_path("kept")) is not None
    # A topic created again under the same name starts afresh.
    cluster.create_topic("doomed", {0: [1]})
    s = cluster.wait_state("doomed", 0, lambda s: True)
    assert s.leader_epoch == 0


def test_reassignment_completes_when_target_is_in_isr(cluster: Cluster) -> None:
    for b in (1, 2, 3):
        cluster.broker_up(b)
    ctl = cluster.controller(1)
    wait_for("controller", ctl.is_active)
    cluster.create_topic("move", {0: [1, 2]})
    cluster.wait_state("move", 0, lambda s: s.isr == [1, 2])
    # KIP-455: target [2, 3] from [1, 2]; the znode holds target + original, adding and removing.
    data, stat = cluster.admin.get(zl.topic_path("move"))
    a = zl.decode_topic_assignment(data)
    a.partitions[0], a.adding_replicas[0], a.removing_replicas[0] = [2, 3, 1], [3], [1]
    cluster.admin.set(zl.topic_path("move"), zl.encode_topic_assignment(a), version=stat.version)
    time.sleep(0.3)
    s = cluster.state("move", 0)
    assert s is not None and (s.leader, s.isr) == (1, [1, 2])  # waits for 3 to join the ISR
    cluster.leader_write("move", 0, [1, 2, 3])
    s = cluster.wait_state("move", 0, lambda s: s.leader != 1)
    assert (s.leader, s.isr, s.leader_epoch) == (2, [2, 3], 1)
    final = wait_for("final assignment", lambda: (lambda d: d if not d.adding_replicas else None)(
        zl.decode_topic_assignment(cluster.admin.get(zl.topic_path("move"))[0])))
    assert final.partitions == {0: [2, 3]} and final.removing_replicas == {}
    assert wait_for("no notifications left", lambda: cluster.admin.get_children(zl.ISR_CHANGE_NOTIFICATION) == [])


def test_failover_elects_for_partitions_orphaned_meanwhile(cluster: Cluster) -> None:
    for b in (1, 2):
        cluster.broker_up(b)
    a = cluster.controller(1)
    wait_for("controller", a.is_active)
    cluster.create_topic("orphan", {0: [1, 2]})
    cluster.wait_state("orphan", 0, lambda s: s.leader == 1)
    cluster.close_session(a)  # the controller and broker 1 die together
    cluster.broker_down(1)
    b = cluster.controller(2)
    wait_for("new controller", b.is_active)
    s = cluster.wait_state("orphan", 0, lambda s: s.leader == 2)
    assert (s.isr, s.leader_epoch, s.controller_epoch) == ([2], 1, b.epoch)


def test_thousand_partitions_initialize_quickly(cluster: Cluster) -> None:
    for b in (1, 2, 3):
        cluster.broker_up(b)
    ctl = cluster.controller(1)
    wait_for("controller", ctl.is_active)
    n = 1000
    cluster.create_topic("big", {p: [1 + p % 3, 1 + (p + 1) % 3, 1 + (p + 2) % 3] for p in range(n)})
    started = time.monotonic()
    wait_for("1000 states", lambda: sum(1 for t, _p in ctl.context.states if t == "big") >= n, timeout=60)
    took = time.monotonic() - started
    print(f"\ninitialized {n} partition states in {took:.2f}s")
    reads = [cluster.admin.get_async(zl.partition_state_path("big", p)) for p in range(n)]
    states = [zl.decode_partition_state(r.get(timeout=10)[0]) for r in reads]
    assert all(s.leader == 1 + p % 3 and len(s.isr) == 3 for p, s in enumerate(states))
    assert took < 30, took
    # Failover: the next controller reads them all back.
    other = cluster.controller(2)
    started = time.monotonic()
    ctl.stop()
    wait_for("failover", lambda: other.is_active() and len(other.context.states) >= n, timeout=30)
    print(f"failover with {n} partitions took {time.monotonic() - started:.2f}s")
    started = time.monotonic()
    cluster.admin.create(zl.delete_topic_path("big"))
    wait_for("deletion", lambda: cluster.admin.exists(zl.delete_topic_path("big")) is None, timeout=30)
    print(f"deleted the {n}-partition topic in {time.monotonic() - started:.2f}s")
    assert cluster.admin.exists(zl.topic_path("big")) is None



def expire_session(c: Cluster, ctl: ZkController) -> None:
    """Expire a controller's session the way ZooKeeper would: another client closes it."""
    zk = next(z for x, z in c.controllers if x is ctl)
    session_id, password = zk.client_id
    thief = KazooClient(c.connect, client_id=(session_id, password))
    thief.start(timeout=15)
    thief.stop()
    thief.close()


def test_session_loss_stops_acting_and_reelects_after_reconnect(cluster: Cluster) -> None:
    cluster.broker_up(1)
    cluster.broker_up(2)
    a = cluster.controller(1)
    wait_for("controller", a.is_active)
    first = a.epoch
    expire_session(cluster, a)
    # Alone, it loses controllership with its session, then wins the next election on a new one.
    wait_for("re-elected with a new session", lambda: a.is_active() and a.epoch > first, timeout=15)
    assert epoch_in_zk(cluster) == a.epoch

    b = cluster.controller(2)
    time.sleep(0.3)
    assert not b.is_active()
    expire_session(cluster, a)
    wait_for("the other takes over", b.is_active, timeout=10)
    wait_for("the first to reconnect and see the new controller", lambda: a.controller_id == 2, timeout=10)
    assert not a.is_active()
    cluster.create_topic("after", {0: [1, 2]})
    s = cluster.wait_state("after", 0, lambda s: True)
    assert s.controller_epoch == b.epoch


def test_restarted_broker_loses_its_leaderships(cluster: Cluster) -> None:
    for b in (1, 2):
        cluster.broker_up(b)
    ctl = cluster.controller(2)
    wait_for("controller", ctl.is_active)
    cluster.create_topic("bounce", {0: [1, 2]})
    cluster.wait_state("bounce", 0, lambda s: s.leader == 1)
    cluster.broker_down(1)
    cluster.broker_up(1)  # back at once: seen dead then new, or as a new registration (czxid)
    s = cluster.wait_state("bounce", 0, lambda s: s.leader == 2)
    assert (s.isr, s.leader_epoch) == ([2], 1)
    time.sleep(0.3)
    s2 = cluster.state("bounce", 0)
    assert s2 is not None and (s2.leader, s2.isr) == (2, [2])


def test_unclean_election_request_and_legacy_preferred_znode(cluster: Cluster) -> None:
    cluster.broker_up(1)
    ctl = cluster.controller(1, **{"auto.leader.rebalance.enable": "false"})
    wait_for("controller", ctl.is_active)
    cluster.create_topic("u", {0: [1, 2], 1: [1, 2]})
    cluster.wait_state("u", 0, lambda s: s.isr == [1])
    cluster.wait_state("u", 1, lambda s: s.isr == [1])
    cluster.broker_up(2)
    time.sleep(0.2)
    cluster.broker_down(1)
    cluster.wait_state("u", 0, lambda s: s.leader == -1)
    cluster.wait_state("u", 1, lambda s: s.leader == -1)
    cluster.admin.create(f"{ELECTIONS}/election_", zl.encode_partition_list([("u", 0)])[:-1] + b',"election_type":1}',
                         sequence=True, makepath=True)
    s = cluster.wait_state("u", 0, lambda s: s.leader == 2)
    assert (s.isr, s.leader_epoch) == ([2], 2)
    s1 = cluster.state("u", 1)
    assert s1 is not None and s1.leader == -1  # not named in the request
    wait_for("requests consumed", lambda: cluster.admin.get_children(ELECTIONS) == [])

    # Kafka's legacy /admin/preferred_replica_election: 1 returns, catches up, is made leader of u-0.
    cluster.broker_up(1)
    cluster.wait_state("u", 1, lambda s: s.leader == 1)  # its only ISR member is back
    cluster.leader_write("u", 0, [2, 1])
    cluster.wait_state("u", 0, lambda s: s.isr == [2, 1])
    cluster.admin.create(zl.PREFERRED_REPLICA_ELECTION, zl.encode_partition_list([("u", 0)]))
    s = cluster.wait_state("u", 0, lambda s: s.leader == 1)
    assert s.isr == [2, 1]
    wait_for("legacy znode consumed", lambda: cluster.admin.exists(zl.PREFERRED_REPLICA_ELECTION) is None)


def test_a_leaders_concurrent_isr_change_is_not_lost(cluster: Cluster) -> None:
    for b in (1, 2, 3):
        cluster.broker_up(b)
    ctl = cluster.controller(1)
    wait_for("controller", ctl.is_active)
    cluster.create_topic("race", {0: [1, 2, 3]})
    cluster.wait_state("race", 0, lambda s: s.isr == [1, 2, 3])
    # The leader shrinks the ISR; the controller has not re-read it (no notification yet) ...
    data, stat = cluster.admin.get(zl.partition_state_path("race", 0))
    s = zl.decode_partition_state(data)
    s.isr = [1, 2]
    cluster.admin.set(zl.partition_state_path("race", 0), zl.encode_partition_state(s), version=stat.version)
    # ... when broker 2 dies: its conditional write fails, it re-reads and applies its change on top.
    cluster.broker_down(2)
    s = cluster.wait_state("race", 0, lambda s: 2 not in s.isr)
    assert (s.leader, s.isr, s.leader_epoch) == (1, [1], 1)


def test_stop_hands_over_and_deletion_can_be_disabled(cluster: Cluster) -> None:
    cluster.broker_up(1)
    cluster.broker_up(2)
    a = cluster.controller(1, **{"delete.topic.enable": "false"})
    wait_for("controller", a.is_active)
    b = cluster.controller(2, **{"delete.topic.enable": "false"})
    cluster.create_topic("keep", {0: [1, 2]})
    cluster.wait_state("keep", 0, lambda s: True)
    cluster.admin.create(zl.delete_topic_path("keep"))
    wait_for("request dropped", lambda: cluster.admin.exists(zl.delete_topic_path("keep")) is None)
    assert cluster.admin.exists(zl.topic_path("keep")) is not None
    started = time.monotonic()
    a.stop()
    assert not a.is_active()
    wait_for("handover", b.is_active, timeout=5)
    assert time.monotonic() - started < 3


def test_broker_back_from_controlled_shutdown_can_lead_again(cluster: Cluster) -> None:
    for b in (1, 2):
        cluster.broker_up(b)
    ctl = cluster.controller(2)
    wait_for("controller", ctl.is_active)
    cluster.brokers[1].create(zl.controlled_shutdown_path(1), b"", ephemeral=True)
    time.sleep(0.3)
    cluster.create_topic("cs-back", {0: [1]})
    time.sleep(0.3)
    assert cluster.state("cs-back", 0) is None  # its only replica is shutting down
    cluster.brokers[1].delete(zl.controlled_shutdown_path(1))  # shutdown aborted
    s = cluster.wait_state("cs-back", 0, lambda s: True)
    assert (s.leader, s.isr) == (1, [1])


def test_legacy_reassign_partitions_znode(cluster: Cluster) -> None:
    for b in (1, 2, 3):
        cluster.broker_up(b)
    ctl = cluster.controller(1)
    wait_for("controller", ctl.is_active)
    cluster.create_topic("legacy", {0: [1, 2], 1: [2, 1]})
    cluster.wait_state("legacy", 0, lambda s: s.isr == [1, 2])
    cluster.admin.create(zl.REASSIGN_PARTITIONS, zl.encode_reassignment({("legacy", 0): [2, 3], ("legacy", 1): [2, 1]}))
    wait_for("znode consumed", lambda: cluster.admin.exists(zl.REASSIGN_PARTITIONS) is None)
    a = zl.decode_topic_assignment(cluster.admin.get(zl.topic_path("legacy"))[0])
    assert (a.partitions, a.adding_replicas, a.removing_replicas) == ({0: [2, 3, 1], 1: [2, 1]}, {0: [3]}, {0: [1]})
    cluster.leader_write("legacy", 0, [1, 2, 3])
    s = cluster.wait_state("legacy", 0, lambda s: s.leader == 2)
    assert s.isr == [2, 3]
    final = wait_for("completed", lambda: (lambda d: d if not d.adding_replicas else None)(
        zl.decode_topic_assignment(cluster.admin.get(zl.topic_path("legacy"))[0])))
    assert final.partitions == {0: [2, 3], 1: [2, 1]}


def test_cancelled_reassignment_takes_added_replicas_out_of_the_isr(cluster: Cluster) -> None:
    for b in (1, 2, 3):
        cluster.broker_up(b)
    ctl = cluster.controller(1)
    wait_for("controller", ctl.is_active)
    cluster.create_topic("cancel", {0: [1, 2]})
    cluster.wait_state("cancel", 0, lambda s: s.isr == [1, 2])
    data, stat = cluster.admin.get(zl.topic_path("cancel"))
    a = zl.decode_topic_assignment(data)
    a.partitions[0], a.adding_replicas[0], a.removing_replicas[0] = [3, 4, 1, 2], [3, 4], [1, 2]  # 4 is down
    cluster.admin.set(zl.topic_path("cancel"), zl.encode_topic_assignment(a), version=stat.version)
    cluster.leader_write("cancel", 0, [1, 2, 3])
    cluster.wait_state("cancel", 0, lambda s: s.isr == [1, 2, 3])
    time.sleep(0.3)
    s = cluster.state("cancel", 0)
    assert s is not None and (s.leader, s.leader_epoch) == (1, 0)  # incomplete: 4 never joined
    data, stat = cluster.admin.get(zl.topic_path("cancel"))
    a = zl.decode_topic_assignment(data)
    a.partitions[0], a.adding_replicas, a.removing_replicas = [1, 2], {}, {}
    cluster.admin.set(zl.topic_path("cancel"), zl.encode_topic_assignment(a), version=stat.version)
    s = cluster.wait_state("cancel", 0, lambda s: 3 not in s.isr)
    assert (s.leader, s.isr, s.leader_epoch) == (1, [1, 2], 1)


def test_topic_without_an_id_gets_one(cluster: Cluster) -> None:
    cluster.broker_up(1)
    ctl = cluster.controller(1)
    wait_for("controller", ctl.is_active)
    cluster.admin.create(zl.topic_path("old-tool"), json.dumps({"version": 1, "partitions": {"0": [1]}}).encode(),
                         makepath=True)
    s = cluster.wait_state("old-tool", 0, lambda s: True)
    assert (s.leader, s.isr) == (1, [1])
    a = zl.decode_topic_assignment(cluster.admin.get(zl.topic_path("old-tool"))[0])
    assert a.topic_id.int != 0 and a.partitions == {0: [1]}


def test_connection_loss_reaches_every_watch_without_errors(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """kazoo calls every pending watch with a session event (no path) when the connection drops; the
    controller's watches (controller, children, topic, preferred election, reassignment) take it quietly,
    and the controller carries on after the reconnection."""
    ensemble = ZooKeeperEnsemble(tmp_path / "zk", 1).start()
    cluster = Cluster(ensemble.connect)
    try:
        cluster.broker_up(1)
        standby_zk = cluster._client()
        a = cluster.controller(1)
        wait_for("controller", a.is_active)
        standby = ZkController(standby_zk, 2, BrokerConfig({"broker.id": "2", "zookeeper.connect": cluster.connect,
                                                            "zookeeper.session.timeout.ms": "4000"}))
        standby.start()  # watches /controller
        cluster.controllers.append((standby, standby_zk))
        cluster.create_topic("watched", {0: [1]})  # a topic watch
        cluster.wait_state("watched", 0, lambda s: s.leader == 1)
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            ensemble.restart()
            wait_for("a controller again after the reconnection", lambda: a.is_active() or standby.is_active(),
                     timeout=30)
            cluster.create_topic("after-reconnect", {0: [1]})
            cluster.wait_state("after-reconnect", 0, lambda s: s.leader == 1, timeout=30)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
        assert not errors, [(r.name, r.getMessage(), r.exc_text) for r in errors]
    finally:
        cluster.close()
        ensemble.stop()
