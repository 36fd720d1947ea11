"""ZkMetadataStore against a real ZooKeeper: watches, caches, writes, sessions (no broker process).

Each test roots its stores at its own chroot, so one ZooKeeper serves the whole module. The event loop
is simulated by a thread-safe queue that the test drains (``Loop.pump``), bounded in time and rounds.
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from pykbroker.config import BrokerConfig
from pykbroker.metadata import zk_layout as zl
from pykbroker.metadata.store import (
    BROKER_RESOURCE,
    GROUP_RESOURCE,
    PartitionAssignment,
    StaleState,
    StoreUnavailable,
    TopicExists,
    TopicRecord,
    UnknownTopic,
)
from pykbroker.metadata.zk_client import ZkConnectError
from pykbroker.metadata.zk_registration import DuplicateBrokerId
from pykbroker.metadata.zookeeper import ZkMetadataStore
from tests.support.zookeeper import ZooKeeperEnsemble, _free_port

pytestmark = [
    pytest.mark.xdist_group("zk-store"),
    pytest.mark.timeout(120),
]


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperEnsemble]:
    ens = ZooKeeperEnsemble(tmp_path_factory.mktemp("zk"), 1).start()
    try:
        yield ens
    finally:
        ens.kill()


class Loop:
    """Stands in for the broker's event loop: the store posts callables, the test runs them."""

    def __init__(self) -> None:
        self.q: queue.Queue[Callable[[], None]] = queue.Queue()

    def post(self, fn: Callable[[], None]) -> None:
        self.q.put(fn)

    def pump(self, until: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        for _ in range(100_000):
            while True:
                try:
                    self.q.get_nowait()()
                except queue.Empty:
                    break
            result = until()
            if result:
                return result
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                self.q.get(timeout=min(left, 0.05))()
            except queue.Empty:
                pass
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Stores:
    """Creates stores rooted at one chroot per test; closes them all at the end."""

    def __init__(self, connect: str) -> None:
        self.connect = connect
        self.chroot = f"/t-{uuid.uuid4().hex[:10]}"
        self.opened: list[ZkMetadataStore] = []
        self.clients: list[KazooClient] = []
        self._controller: KazooClient | None = None

    def config(self, **extra: str) -> BrokerConfig:
        raw = {"zookeeper.connect": self.connect + self.chroot, "zookeeper.session.timeout.ms": "6000"}
        raw.update({k.replace("_", "."): v for k, v in extra.items()})
        return BrokerConfig(raw)

    def store(self, broker_id: int, port: int | None = None, rack: str | None = None, register: bool = True,
              confirm: bool = True, **extra: str) -> tuple[ZkMetadataStore, Loop]:
        """A broker's store; registered, and confirmed as a controller would confirm it (``confirm``)."""
        endpoints = [("PLAINTEXT", "127.0.0.1", port or 9000 + broker_id)]
        s = ZkMetadataStore(self.config(**extra), broker_id, endpoints, rack)
        loop = Loop()
        s.set_poster(loop.post)
        self.opened.append(s)
        s.start()
        if register:
            s.register_broker()
            if confirm:
                self.confirm(broker_id)
                loop.pump(s.roles_confirmed, what=f"broker {broker_id} confirmed")
        return s, loop

    def confirm(self, broker_id: int, broker_epoch: int | None = None) -> None:
        """Play the controller: /pykbroker/confirmed_brokers/<id> with the registration's czxid (or another)."""
        zk = self._controller if self._controller is not None else self.raw()
        self._controller = zk
        if broker_epoch is None:
            broker_epoch = int(zk.exists(zl.broker_path(broker_id)).czxid)
        path = zl.confirmed_broker_path(broker_id)
        data = zl.encode_confirmation(broker_epoch, 1)
        if zk.exists(path) is None:
            zk.create(path, data, makepath=True)
        else:
            zk.set(path, data)

    def raw(self, chrooted: bool = True) -> KazooClient:
        """A plain kazoo client, playing the controller or an admin tool."""
        c = KazooClient(hosts=self.connect, timeout=10)
        c.start(timeout=10)
        if chrooted:
            c.ensure_path(self.chroot)
            c.stop()
            c.close()
            c = KazooClient(hosts=self.connect + self.chroot, timeout=10)
            c.start(timeout=10)
        self.clients.append(c)
        return c

    def close(self) -> None:
        for s in self.opened:
            s.close()
        for c in self.clients:
            c.stop()
            c.close()


@pytest.fixture
def stores(zk_server: ZooKeeperEnsemble) -> Iterator[Stores]:
    st = Stores(zk_server.connect)
    try:
        yield st
    finally:
        st.close()


def record(name: str, replicas: dict[int, list[int]], configs: dict[str, str] | None = None) -> TopicRecord:
    return TopicRecord(name, uuid.uuid4(), {p: PartitionAssignment(list(r)) for p, r in replicas.items()},
                       dict(configs or {}))


def write_state(zk: KazooClient, topic: str, p: int, leader: int, epoch: int, isr: list[int]) -> None:
    """What the controller does for a new partition."""
    zk.create(zl.partition_state_path(topic, p), zl.encode_partition_state(zl.PartitionState(leader, epoch, isr, 1)),
              makepath=True)


def test_two_stores_see_each_other(stores: Stores) -> None:
    s1, l1 = stores.store(1, rack="r1")
    s2, l2 = stores.store(2, rack="r2")
    assert s1.cluster_id == s2.cluster_id and len(s1.cluster_id) == 22
    l1.pump(lambda: set(s1.live_brokers()) == {1, 2}, what="broker 2 seen by broker 1")
    assert s1.live_brokers()[2] == [("PLAINTEXT", "127.0.0.1", 9002)]
    assert s1.broker_rack(2) == "r2" and s1.broker_rack(9) is None
    assert s1.controller_id() == -1

    events2: list[tuple[str, TopicRecord | None]] = []
    cluster2: list[int] = []
    configs2: list[tuple[int, str]] = []
    s2.add_listener(lambda n, r: events2.append((n, r)))
    s2.add_cluster_listener(lambda: cluster2.append(s2.controller_id()))
    s2.add_config_listener(lambda t, n: configs2.append((t, n)))

    # another topic that stays untouched: its record object must stay the same
    s1.create_topic(record("other", {0: [1]}))
    l2.pump(lambda: "other" in s2.topics(), what="topic other")
    other = s2.topics()["other"]
    assert events2 == [("other", other)]
    events2.clear()

    rec = record("orders", {0: [1, 2], 1: [2, 1]}, {"retention.ms": "1000"})
    s1.create_topic(rec)
    with pytest.raises(TopicExists):
        s2.create_topic(record("orders", {0: [2]}))
    got = l2.pump(lambda: s2.topics().get("orders"), what="topic orders on broker 2")
    assert got.topic_id == rec.topic_id and got.configs == {"retention.ms": "1000"}
    assert got.partitions[0].replicas == [1, 2] and got.partitions[0].leader == -1
    assert got.partitions[0].isr == [] and got.partitions[0].zk_version == -1
    assert s2.topic_by_id(rec.topic_id) is got

    zk = stores.raw()
    write_state(zk, "orders", 0, 1, 0, [1, 2])
    write_state(zk, "orders", 1, 2, 0, [2, 1])
    got = l2.pump(lambda: (r := s2.topics()["orders"]).partitions[1].leader == 2 and r, what="partition states")
    p0 = got.partitions[0]
    assert (p0.leader, p0.leader_epoch, p0.isr, p0.controller_epoch, p0.zk_version) == (1, 0, [1, 2], 1, 0)
    assert s2.topics()["other"] is other
    assert all(n == "orders" for n, _ in events2)

    zk.create(zl.CONTROLLER, zl.encode_controller(2), ephemeral=True)
    l2.pump(lambda: s2.controller_id() == 2, what="controller")
    assert cluster2 and cluster2[-1] == 2

    updated = s2.set_topic_configs("orders", {"retention.ms": "5000"})
    assert updated.configs == {"retention.ms": "5000"}
    l1.pump(lambda: s1.topics()["orders"].configs == {"retention.ms": "5000"}, what="topic config on broker 1")
    changes = zk.get_children(zl.CONFIG_CHANGES)
    assert changes and all(c.startswith("config_change_") for c in changes)
    assert {json.loads(zk.get(f"{zl.CONFIG_CHANGES}/{c}")[0])["entity_path"] for c in changes} == {"topics/orders"}
    with pytest.raises(UnknownTopic):
        s1.set_topic_configs("nope", {})

    s1.set_entity_configs(BROKER_RESOURCE, "", {"log.retention.ms": "100"})
    s1.set_entity_configs(BROKER_RESOURCE, "2", {"num.io.threads": "4"})
    s1.set_entity_configs(GROUP_RESOURCE, "g1", {"consumer.session.timeout.ms": "50000"})
    l2.pump(lambda: (GROUP_RESOURCE, "g1") in configs2, what="entity configs on broker 2")
    assert s2.entity_configs(BROKER_RESOURCE) == {"": {"log.retention.ms": "100"}, "2": {"num.io.threads": "4"}}
    assert zl.decode_entity_config(zk.get("/config/brokers/<default>")[0]) == {"log.retention.ms": "100"}
    assert s2.configs_of(GROUP_RESOURCE, "g1") == {"consumer.session.timeout.ms": "50000"}
    s1.set_entity_configs(GROUP_RESOURCE, "g1", {})
    l2.pump(lambda: s2.entity_configs(GROUP_RESOURCE) == {}, what="group config removal")

    s2.alter_client_quotas({(("user", "alice"),): {"producer_byte_rate": 1024.0},
                            (("client-id", "c 1"), ("user", None)): {"request_percentage": 50.0},
                            (("ip", None),): {"connection_creation_rate": 10.0}})
    l1.pump(lambda: len(s1.client_quotas()) == 3, what="quotas on broker 1")
    assert s1.client_quotas() == {(("user", "alice"),): {"producer_byte_rate": 1024.0},
                                  (("client-id", "c 1"), ("user", None)): {"request_percentage": 50.0},
                                  (("ip", None),): {"connection_creation_rate": 10.0}}
    assert zl.decode_entity_config(zk.get("/config/users/alice")[0]) == {"producer_byte_rate": "1024"}
    assert zk.exists("/config/users/<default>/clients/c%201") is not None
    s1.alter_client_quotas({(("user", "alice"),): {"producer_byte_rate": None}})
    l2.pump(lambda: (("user", "alice"),) not in s2.client_quotas(), what="quota removal")

    # partitions added by one broker, seen (with their states once the controller writes them) by the other
    added = s1.add_partitions("orders", {2: PartitionAssignment([1])})
    assert sorted(added.partitions) == [0, 1, 2]
    with pytest.raises(StaleState):
        s2.add_partitions("orders", {2: PartitionAssignment([2])})
    l2.pump(lambda: 2 in s2.topics()["orders"].partitions, what="new partition")
    write_state(zk, "orders", 2, 1, 0, [1])
    l2.pump(lambda: s2.topics()["orders"].partitions[2].leader == 1, what="new partition's state")

    # deletion: marked first (still visible), gone when the controller removes the topic znode
    events2.clear()
    deleted = s2.delete_topic("orders")
    assert deleted.topic_id == rec.topic_id
    with pytest.raises(UnknownTopic):
        s2.delete_topic("nope")
    l1.pump(lambda: "orders" in s1.topics_being_deleted(), what="deletion mark")
    assert "orders" in s1.topics()
    s2.delete_topic("orders")  # already marked: fine, as in Kafka
    zk.delete(zl.topic_path("orders"), recursive=True)
    with pytest.raises(TopicExists, match="marked for deletion"):
        s1.create_topic(record("orders", {0: [1]}))
    zk.delete(zl.topic_config_path("orders"))
    zk.delete(zl.delete_topic_path("orders"))
    l2.pump(lambda: ("orders", None) in events2, what="deletion notification")
    assert "orders" not in s2.topics() and s2.topics()["other"] is other
    l1.pump(lambda: "orders" not in s1.topics() and not s1.topics_being_deleted(), what="deletion on broker 1")

    # a broker leaving
    s1.close()
    l2.pump(lambda: set(s2.live_brokers()) == {2}, what="broker 1 gone")


def test_topic_appears_with_its_states_and_changes_are_batched(stores: Stores) -> None:
    s, loop = stores.store(1)
    zk = stores.raw()
    seen: list[tuple[str, TopicRecord | None]] = []
    s.add_listener(lambda n, r: seen.append((n, r)))
    # the controller's view of a topic written at once: the first record seen already has its leaders
    a = zl.TopicAssignment(uuid.uuid4(), {p: [1] for p in range(50)})
    tx = zk.transaction()
    tx.create(zl.topic_path("at-once"), zl.encode_topic_assignment(a))
    tx.create(zl.partitions_path("at-once"))
    for p in range(50):
        tx.create(zl.partition_path("at-once", p))
        tx.create(zl.partition_state_path("at-once", p), zl.encode_partition_state(zl.PartitionState(1, 0, [1], 1)))
    tx.commit()
    first = loop.pump(lambda: seen and seen[0][1], what="topic at-once")
    assert all(pa.leader == 1 and pa.zk_version == 0 for pa in first.partitions.values())
    # 50 state changes: however the watcher batches them, everything pending is applied in one drain,
    # with one notification for the topic
    seen.clear()
    tx = zk.transaction()
    for p in range(50):
        tx.set_data(zl.partition_state_path("at-once", p), zl.encode_partition_state(zl.PartitionState(1, 1, [1], 1)))
    tx.commit()

    def all_pending() -> bool:
        with s._pending_lock:
            return sum(len(v) for kind, _, v in s._pending if kind == "states") >= 50

    deadline = time.monotonic() + 10
    while not all_pending() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all_pending()
    loop.pump(lambda: seen, what="one drain")
    assert len(seen) == 1 and all(pa.leader_epoch == 1 for pa in seen[0][1].partitions.values())
    # one partition's state changes: a new record, the other partitions' objects are kept
    before = s.topics()["at-once"]
    zk.set(zl.partition_state_path("at-once", 3), zl.encode_partition_state(zl.PartitionState(1, 2, [1], 1)))
    after = loop.pump(lambda: (r := s.topics()["at-once"]).partitions[3].leader_epoch == 2 and r, what="epoch 2")
    assert after is not before and list(after.partitions) == list(range(50))
    assert all(after.partitions[p] is before.partitions[p] for p in range(50) if p != 3)


def test_own_leaderships_wait_for_the_controllers_confirmation(stores: Stores) -> None:
    """A registered broker shows no leader where the states name it, until the controller confirms the
    registration's broker epoch; then it shows them, and every topic is notified again."""
    s, loop = stores.store(1, confirm=False)
    zk = stores.raw()
    seen: list[tuple[str, TopicRecord | None]] = []
    s.add_listener(lambda n, r: seen.append((n, r)))
    a = zl.TopicAssignment(uuid.uuid4(), {0: [1, 2], 1: [2, 1]})
    tx = zk.transaction()
    tx.create(zl.topic_path("fenced"), zl.encode_topic_assignment(a))
    tx.create(zl.partitions_path("fenced"))
    for p, leader in ((0, 1), (1, 2)):
        tx.create(zl.partition_path("fenced", p))
        state = zl.encode_partition_state(zl.PartitionState(leader, 3, [1, 2], 1))
        tx.create(zl.partition_state_path("fenced", p), state)
    tx.commit()
    got = loop.pump(lambda: s.topics().get("fenced"), what="topic fenced")
    assert not s.roles_confirmed()
    assert got.partitions[0].leader == -1 and got.partitions[0].leader_epoch == 3  # ours: held back
    assert got.partitions[1].leader == 2  # another broker's leadership is shown as it is
    stores.confirm(1, broker_epoch=12345)  # a confirmation of another registration changes nothing
    time.sleep(0.5)
    loop.pump(lambda: True)
    assert not s.roles_confirmed() and s.topics()["fenced"].partitions[0].leader == -1
    seen.clear()
    stores.confirm(1)
    loop.pump(s.roles_confirmed, what="the confirmation")
    assert s.topics()["fenced"].partitions[0].leader == 1
    assert [n for n, _ in seen] == ["fenced"] and seen[0][1] is s.topics()["fenced"]


def test_topic_recreated_with_new_id(stores: Stores) -> None:
    s1, l1 = stores.store(1)
    zk = stores.raw()
    first = record("t", {0: [1]})
    s1.create_topic(first)
    l1.pump(lambda: "t" in s1.topics(), what="topic")
    seen: list[TopicRecord | None] = []
    s1.add_listener(lambda _n, r: seen.append(r))
    zk.delete(zl.topic_path("t"), recursive=True)
    zk.delete(zl.topic_config_path("t"))
    second = record("t", {0: [1], 1: [1]})
    s1.create_topic(second)
    write_state(zk, "t", 1, 1, 3, [1])
    l1.pump(lambda: (r := s1.topics().get("t")) is not None and r.topic_id == second.topic_id
            and r.partitions[1].leader_epoch == 3, what="re-created topic")
    assert seen and seen[-1] is s1.topics()["t"]


def test_chroot_is_created(stores: Stores) -> None:
    stores.chroot = f"/kafka-{uuid.uuid4().hex[:6]}/cluster1"
    s, _ = stores.store(5)
    root = stores.raw(chrooted=False)
    assert root.exists(stores.chroot + "/brokers/ids/5") is not None
    assert root.exists(stores.chroot + "/cluster/id") is not None
    assert root.exists("/brokers/ids/5") is None
    assert s.chroot == stores.chroot
    assert s.zk.exists("/brokers/ids/5") is not None  # the shared client is rooted at the chroot


def test_duplicate_broker_id(stores: Stores) -> None:
    stores.store(1, port=9101)
    other = ZkMetadataStore(stores.config(), 1, [("PLAINTEXT", "127.0.0.1", 9102)], None)
    stores.opened.append(other)
    other.start()
    began = time.monotonic()
    with pytest.raises(DuplicateBrokerId, match=r"Broker id 1 is already registered in ZooKeeper at "
                       r"/t-\w+/brokers/ids/1 by another broker \(PLAINTEXT://127.0.0.1:9101\)"):
        other.register_broker()
    assert time.monotonic() - began < 2.0  # a different broker: no waiting


def test_stale_registration_of_own_previous_run_is_waited_for(stores: Stores) -> None:
    # The "previous run": a session holding /brokers/ids/3 with our endpoints, which ends after a while.
    old = stores.raw()
    reg = zl.BrokerRegistration(3, (("PLAINTEXT", "127.0.0.1", 9103),))
    old.create(zl.broker_path(3), zl.encode_broker(reg), ephemeral=True, makepath=True)
    ender = threading.Timer(1.0, old.stop)
    ender.start()
    try:
        s, _ = stores.store(3, port=9103, register=False)
        began = time.monotonic()
        s.register_broker()
        assert 0.5 < time.monotonic() - began < 8.0
        _data, stat = s.zk.get(zl.broker_path(3))
        assert stat.ephemeralOwner == s.zk.client_id[0]
    finally:
        ender.join(5)


def test_stale_registration_that_never_expires_fails_bounded(stores: Stores) -> None:
    holder = stores.raw()
    reg = zl.BrokerRegistration(4, (("PLAINTEXT", "127.0.0.1", 9104),))
    holder.create(zl.broker_path(4), zl.encode_broker(reg), ephemeral=True, makepath=True)
    s, _ = stores.store(4, port=9104, register=False, zookeeper_session_timeout_ms="1000")
    began = time.monotonic()
    with pytest.raises(DuplicateBrokerId, match="did not expire within 3 s"):
        s.register_broker()
    assert 2.5 < time.monotonic() - began < 6.0


def test_connect_timeout_is_bounded_and_clear(tmp_path: Path) -> None:
    port = _free_port()  # nothing listens there
    cfg = BrokerConfig({"zookeeper.connect": f"127.0.0.1:{port}/x", "zookeeper.connection.timeout.ms": "1500"})
    s = ZkMetadataStore(cfg, 1, [("PLAINTEXT", "127.0.0.1", 9092)], None)
    began = time.monotonic()
    with pytest.raises(ZkConnectError) as err:
        s.start()
    took = time.monotonic() - began
    assert 1.0 < took < 5.0
    assert "Timed out waiting for connection while in state: CONNECTING" in str(err.value)
    assert f"127.0.0.1:{port}/x" in str(err.value) and "1500 ms" in str(err.value)
    s.close()
    with pytest.raises(StoreUnavailable):
        s.allocate_producer_ids(1)


def test_producer_id_blocks_unique_under_concurrency(stores: Stores) -> None:
    s1, _ = stores.store(1, register=False)
    s2, _ = stores.store(2, register=False)
    blocks: list[tuple[int, int]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def allocate(s: ZkMetadataStore) -> None:
        try:
            for _ in range(15):
                first = s.allocate_producer_ids(10)
                with lock:
                    blocks.append((first, first + 9))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=allocate, args=(s,)) for s in (s1, s2, s1, s2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(blocks) == 60
    blocks.sort()
    assert blocks[0][0] == 0 and blocks[-1][1] == 599
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(blocks))
    doc = json.loads(s1.zk.get(zl.LATEST_PRODUCER_ID_BLOCK)[0])
    assert doc["block_end"] == "599" and doc["broker"] in (1, 2)


def test_update_isr_is_fenced(stores: Stores) -> None:
    s, loop = stores.store(1)
    zk = stores.raw()
    s.create_topic(record("isr", {0: [1, 2]}))
    write_state(zk, "isr", 0, 1, 4, [1, 2])
    a = loop.pump(lambda: (r := s.topics().get("isr")) and r.partitions[0].leader == 1 and r.partitions[0],
                  what="state")
    assert a.zk_version == 0
    v = s.update_isr("isr", 0, 4, [1], a.zk_version)
    assert v == 1
    state = zl.decode_partition_state(*zk.get(zl.partition_state_path("isr", 0)))
    assert (state.leader, state.leader_epoch, state.isr, state.controller_epoch) == (1, 4, [1], 1)
    notes = zk.get_children(zl.ISR_CHANGE_NOTIFICATION)
    assert len(notes) == 1 and notes[0].startswith("isr_change_")
    assert zl.decode_partition_list(zk.get(f"{zl.ISR_CHANGE_NOTIFICATION}/{notes[0]}")[0]) == [("isr", 0)]
    loop.pump(lambda: s.topics()["isr"].partitions[0].zk_version == 1, what="cache follows the ISR change")
    assert s.topics()["isr"].partitions[0].isr == [1]
    # the same change again with the old version: already what we wanted, so it counts as done
    assert s.update_isr("isr", 0, 4, [1], 0) == 1
    # a stale version with a different ISR loses
    with pytest.raises(StaleState):
        s.update_isr("isr", 0, 4, [1, 2], 0)
    # the controller moved the leader epoch: the old leader's change loses
    zk.set(zl.partition_state_path("isr", 0), zl.encode_partition_state(zl.PartitionState(2, 5, [2], 1)))
    with pytest.raises(StaleState):
        s.update_isr("isr", 0, 4, [1, 2], 2)
    with pytest.raises(StaleState):
        s.update_isr("isr", 7, 0, [1], 0)


def test_reassignment_znode_shape(stores: Stores) -> None:
    s, loop = stores.store(1)
    zk = stores.raw()
    s.create_topic(record("re", {0: [1, 2], 1: [2, 3]}))
    s.alter_reassignments({("re", 0): [3, 2]})
    doc = json.loads(zk.get(zl.topic_path("re"))[0])
    assert doc["version"] == 3
    assert doc["partitions"] == {"0": [3, 2, 1], "1": [2, 3]}
    assert doc["adding_replicas"] == {"0": [3]} and doc["removing_replicas"] == {"0": [1]}
    a = loop.pump(lambda: (r := s.topics().get("re")) and r.partitions[0].adding_replicas and r.partitions[0],
                  what="reassignment in cache")
    assert (a.replicas, a.adding_replicas, a.removing_replicas) == ([3, 2, 1], [3], [1])
    s.alter_reassignments({("re", 0): None})
    doc = json.loads(zk.get(zl.topic_path("re"))[0])
    assert doc["partitions"]["0"] == [2, 1] and doc["adding_replicas"] == {} and doc["removing_replicas"] == {}
    with pytest.raises(UnknownTopic):
        s.alter_reassignments({("re", 5): [1]})
    with pytest.raises(UnknownTopic):
        s.alter_reassignments({("missing", 0): [1]})


def test_controlled_shutdown_and_election_requests(stores: Stores) -> None:
    s, _ = stores.store(6)
    s.begin_controlled_shutdown()
    s.begin_controlled_shutdown()  # idempotent
    stat = s.zk.exists(zl.controlled_shutdown_path(6))
    assert stat is not None and stat.ephemeralOwner == s.zk.client_id[0]
    s.request_election([("a", 0), ("b", 2)], zl.PREFERRED_ELECTION)
    (child,) = s.zk.get_children(zl.ELECTIONS)
    assert child.startswith("election_")
    assert zl.decode_election_request(s.zk.get(f"{zl.ELECTIONS}/{child}")[0]) == (0, [("a", 0), ("b", 2)])


def test_session_expiry_reregisters_and_rewatches(stores: Stores) -> None:
    s, loop = stores.store(7)
    s.begin_controlled_shutdown()
    sessions: list[str] = []
    s.add_session_listener(sessions.append)
    old_session = s.zk.client_id[0]
    # Expire the session: a second client attaches to it and closes it (ZooKeeper then ends the session).
    twin = KazooClient(hosts=stores.connect, client_id=s.zk.client_id, timeout=6)
    twin.start(timeout=10)
    twin.stop()
    twin.close()
    loop.pump(lambda: "lost" in sessions and sessions[-1] == "connected", timeout=20, what="new session")

    def registered_again() -> bool:
        stat = s.zk.exists(zl.broker_path(7))
        return stat is not None and stat.ephemeralOwner not in (0, old_session)

    loop.pump(registered_again, timeout=10, what="re-registration")
    assert s.zk.exists(zl.broker_path(7)).ephemeralOwner == s.zk.client_id[0]
    stat = s.zk.exists(zl.controlled_shutdown_path(7))
    assert stat is not None and stat.ephemeralOwner == s.zk.client_id[0]
    # watches work again: another broker appears, a topic appears
    other, _ = stores.store(8)
    other.create_topic(record("after", {0: [7]}))
    loop.pump(lambda: 8 in s.live_brokers() and "after" in s.topics(), what="watches re-armed")


def test_zookeeper_down_writes_fail_bounded_then_recover(tmp_path: Path) -> None:
    ens = ZooKeeperEnsemble(tmp_path / "own", 1).start()
    st = Stores(ens.connect)
    try:
        s, loop = st.store(1, zookeeper_session_timeout_ms="4000")
        ens.stop()
        began = time.monotonic()
        with pytest.raises(StoreUnavailable):
            s.create_topic(record("down", {0: [1]}))
        assert time.monotonic() - began < 8.0
        ens.start()
        loop.pump(lambda: s.zk.connected, timeout=30, what="reconnection")
        s.create_topic(record("up", {0: [1]}))
        loop.pump(lambda: "up" in s.topics(), timeout=10, what="topic after reconnection")
        assert s.zk.exists(zl.broker_path(1)) is not None
    finally:
        st.close()
        ens.kill()


def test_loading_ten_thousand_partitions(stores: Stores, capsys: pytest.CaptureFixture[str]) -> None:
    zk = stores.raw()
    for path in ("/brokers/topics", "/config/topics"):
        zk.ensure_path(path)
    topics, per_topic = 100, 100
    ops = 0
    tx = zk.transaction()
    for t in range(topics):
        name = f"big{t}"
        a = zl.TopicAssignment(uuid.uuid4(), {p: [1, 2, 3] for p in range(per_topic)})
        tx.create(zl.topic_path(name), zl.encode_topic_assignment(a))
        tx.create(zl.topic_config_path(name), zl.encode_entity_config({}))
        tx.create(zl.partitions_path(name))
        for p in range(per_topic):
            tx.create(zl.partition_path(name, p))
            tx.create(zl.partition_state_path(name, p),
                      zl.encode_partition_state(zl.PartitionState(1 + p % 3, 0, [1, 2, 3], 1)))
        ops += 3 + 2 * per_topic
        if ops >= 1000:
            tx.commit()
            tx, ops = zk.transaction(), 0
    tx.commit()
    began = time.monotonic()
    s, _ = stores.store(1, register=False)
    took = time.monotonic() - began
    assert sum(len(r.partitions) for r in s.topics().values()) == topics * per_topic
    assert s.topics()["big7"].partitions[5].leader == 3
    with capsys.disabled():
        print(f"\nZkMetadataStore.start() with {topics * per_topic} partitions: {took * 1000:.0f} ms")
    assert took < 20.0


def test_unreadable_znodes_do_not_drop_what_is_known(stores: Stores) -> None:
    s, loop = stores.store(1)
    zk = stores.raw()
    s.create_topic(record("sturdy", {0: [1]}))
    write_state(zk, "sturdy", 0, 1, 2, [1])
    loop.pump(lambda: (r := s.topics().get("sturdy")) and r.partitions[0].leader == 1, what="topic")
    gone: list[str] = []
    s.add_listener(lambda n, r: gone.append(n) if r is None else None)
    zk.set(zl.topic_path("sturdy"), b"{not json")
    zk.set(zl.partition_state_path("sturdy", 0), b"garbage")
    # a later, readable change is applied: the watches survived the unreadable values
    zk.create(zl.CONTROLLER, zl.encode_controller(1), ephemeral=True)
    loop.pump(lambda: s.controller_id() == 1, what="controller")
    assert "sturdy" in s.topics() and s.topics()["sturdy"].partitions[0].leader == 1 and not gone
    tid = s.topics()["sturdy"].topic_id
    zk.set(zl.topic_path("sturdy"), zl.encode_topic_assignment(zl.TopicAssignment(tid, {0: [1], 1: [1]})))
    loop.pump(lambda: 1 in s.topics()["sturdy"].partitions, what="readable assignment again")
    # a topic whose assignment was unreadable when it appeared is picked up once it is fixed
    zk.create(zl.topic_path("late"), b"{broken")
    other = record("marker", {0: [1]})
    s.create_topic(other)
    loop.pump(lambda: "marker" in s.topics(), what="marker topic")
    assert "late" not in s.topics()
    zk.set(zl.topic_path("late"), zl.encode_topic_assignment(zl.TopicAssignment(uuid.uuid4(), {0: [1]})))
    loop.pump(lambda: "late" in s.topics(), what="fixed topic")


def test_old_config_change_notifications_are_purged(stores: Stores, monkeypatch: pytest.MonkeyPatch) -> None:
    from pykbroker.metadata import zk_writes

    s, _ = stores.store(1)
    for i in range(30):
        s.set_entity_configs(GROUP_RESOURCE, f"g{i}", {"consumer.session.timeout.ms": "45000"})
    assert len(s.zk.get_children(zl.CONFIG_CHANGES)) == 30  # young ones stay
    monkeypatch.setattr(zk_writes, "_CONFIG_CHANGE_EXPIRY_S", 0)
    s.set_entity_configs(GROUP_RESOURCE, "last", {"consumer.session.timeout.ms": "45000"})
    left = s.zk.get_children(zl.CONFIG_CHANGES)
    deadline = time.monotonic() + 5
    while len(left) > zk_writes._KEEP_CONFIG_CHANGES and time.monotonic() < deadline:
        time.sleep(0.05)
        left = s.zk.get_children(zl.CONFIG_CHANGES)
    assert len(left) == zk_writes._KEEP_CONFIG_CHANGES
    newest = max(left)
    assert json.loads(s.zk.get(f"{zl.CONFIG_CHANGES}/{newest}")[0])["entity_path"] == "groups/last"


def test_read_topic_configs_sees_a_topic_before_the_cache_does(stores: Stores) -> None:
    """Admin requests right after another broker created a topic read ZooKeeper itself (the watch may lag)."""
    s1, _ = stores.store(1)
    s2, _ = stores.store(2)  # its loop is never pumped: its cache cannot have seen the topic
    s1.create_topic(record("fresh", {0: [1]}, {"retention.ms": "1234"}))
    s1.create_topic(record("bare", {0: [1]}))
    assert s2.topic("fresh") is None
    assert s2.read_topic_configs("fresh") == {"retention.ms": "1234"}
    assert s2.read_topic_configs("bare") == {}
    assert s2.read_topic_configs("absent") is None
