"""The cluster-shaped APIs on a single broker, through real clients.

DescribeCluster, DescribeTopicPartitions, DescribeLogDirs, AlterReplicaLogDirs, ElectLeaders,
Alter/ListPartitionReassignments, OffsetForLeaderEpoch and the authorized-operations fields of
Metadata and DescribeGroups, each through at least two clients: confluent-kafka (librdkafka),
kafka-python, aiokafka, and the raw protocol (kio) where a client has no call for it.  Every
answer is the one Kafka 3.9 gives for a single-node cluster.

AlterReplicaLogDirs really moves a partition's files between ``log.dirs`` while a producer and a
consumer keep going; afterwards every message is read exactly once in order, the files are in
the target dir, and the move survives a restart.  A SIGKILL during a move leaves the data intact.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from confluent_kafka import ConsumerGroupState, ElectionType, KafkaError, TopicCollection, TopicPartition
from confluent_kafka.admin import AclOperation
from kafka.admin import KafkaAdminClient
from kafka.structs import TopicPartition as KTopicPartition
from kafka.structs import TopicPartitionReplica

from tests.integration.conftest import (
    CLIENT_TIMEOUT,
    BrokerFactory,
    RawConnection,
    admin_for,
    consume_partitions,
    create_topic,
    make_consumer,
    make_producer,
    produce_all,
    unique_topic,
    wait_until,
)
from tests.support.broker import BrokerProcess

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
REPLICA_NOT_AVAILABLE = 9
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_REQUEST = 42
KAFKA_STORAGE_ERROR = 56
LOG_DIR_NOT_FOUND = 57
FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75
ELECTION_NOT_NEEDED = 84
NO_REASSIGNMENT_IN_PROGRESS = 85
MISMATCHED_ENDPOINT_TYPE = 114
UNSUPPORTED_ENDPOINT_TYPE = 115
OMITTED = -2147483648

CLUSTER_OPS = {"CREATE", "ALTER", "DESCRIBE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS",
               "IDEMPOTENT_WRITE"}
TOPIC_OPS = {"READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}
GROUP_OPS = {"READ", "DESCRIBE", "DELETE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}  # as Kafka 4


def kp_admin(b: BrokerProcess) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=int(CLIENT_TIMEOUT * 1000))


def bits(names: set[str]) -> int:
    return sum(1 << AclOperation[n].value for n in names)


@pytest.fixture(scope="module")
def broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    return module_broker_factory({"num.partitions": "1"})


# --- DescribeCluster and authorized operations -----------------------------------------------------


def test_describe_cluster_through_three_clients(broker: BrokerProcess) -> None:
    admin = admin_for(broker)  # kept referenced: a destroyed client fails its futures
    desc = admin.describe_cluster(include_authorized_operations=True,
                                  request_timeout=CLIENT_TIMEOUT).result(CLIENT_TIMEOUT)
    assert [n.port for n in desc.nodes] == [broker.port]
    node_id = desc.nodes[0].id
    assert desc.controller.id == node_id
    assert {op.name for op in desc.authorized_operations} == CLUSTER_OPS
    no_ops = admin.describe_cluster(request_timeout=CLIENT_TIMEOUT).result(CLIENT_TIMEOUT)
    assert not no_ops.authorized_operations  # not asked for: -2147483648 on the wire

    kp = kp_admin(broker)
    try:
        d = kp.describe_cluster()
        assert d["cluster_id"] == desc.cluster_id
        assert d["controller_id"] == node_id
        assert [(x["broker_id"], x["port"]) for x in d["brokers"]] == [(node_id, broker.port)]
        assert set(d["authorized_operations"]) == CLUSTER_OPS
    finally:
        kp.close()

    async def aio() -> dict[str, Any]:
        a = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await a.start()
        try:
            return await a.describe_cluster()
        finally:
            await a.close()

    d = asyncio.run(aio())
    assert d["cluster_id"] == desc.cluster_id
    assert d["controller_id"] == node_id


def test_describe_cluster_versions_and_endpoint_types(broker: BrokerProcess) -> None:
    with RawConnection(broker) as c:
        for v in (0, 1):
            r = c.request(60, v, {"include_cluster_authorized_operations": True, "endpoint_type": 1})
            assert r.error_code == NONE and r.error_message is None
            assert r.cluster_authorized_operations == bits(CLUSTER_OPS) == 8096
            assert [(b.host, b.port) for b in r.brokers] == [("127.0.0.1", broker.port)]
            r = c.request(60, v, {"include_cluster_authorized_operations": False, "endpoint_type": 1})
            assert r.cluster_authorized_operations == OMITTED
        r = c.request(60, 1, {"include_cluster_authorized_operations": False, "endpoint_type": 2})
        assert r.error_code == MISMATCHED_ENDPOINT_TYPE and r.brokers == ()
        assert r.error_message == ("The request was sent to an endpoint of type BROKER, but we wanted an endpoint "
                                   "of type CONTROLLER")
        r = c.request(60, 1, {"include_cluster_authorized_operations": False, "endpoint_type": 9})
        assert r.error_code == UNSUPPORTED_ENDPOINT_TYPE


def test_authorized_operations_in_metadata_and_describe_groups(broker: BrokerProcess) -> None:
    topic = unique_topic("ops")
    create_topic(broker, topic)
    admin = admin_for(broker)
    (fut,) = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True,
                                   request_timeout=CLIENT_TIMEOUT).values()
    assert {op.name for op in fut.result(CLIENT_TIMEOUT).authorized_operations} == TOPIC_OPS
    # A group with a committed offset, then described by two clients.
    group = unique_topic("grp")
    c = make_consumer(broker, **{"group.id": group})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    finally:
        c.close()
    (gfut,) = admin.describe_consumer_groups([group], include_authorized_operations=True,
                                             request_timeout=CLIENT_TIMEOUT).values()
    g = gfut.result(CLIENT_TIMEOUT)
    assert g.state == ConsumerGroupState.EMPTY
    assert {op.name for op in g.authorized_operations} == GROUP_OPS

    kp = kp_admin(broker)
    try:
        kg = kp.describe_groups([group])[group]
        assert kg["group_state"] == "Empty"
        assert set(kg["authorized_operations"]) == GROUP_OPS
        (kt,) = kp.describe_topics([topic])
        assert kt["error_code"] == NONE and kt["name"] == topic
    finally:
        kp.close()

    with RawConnection(broker) as conn:
        for v in range(8, 13):
            body: dict[str, Any] = {"topics": [{"name": topic}], "allow_auto_topic_creation": False,
                                    "include_topic_authorized_operations": True,
                                    "include_cluster_authorized_operations": True}
            r = conn.request(3, v, body)
            assert r.topics[0].topic_authorized_operations == bits(TOPIC_OPS) == 3576
            if v <= 10:
                assert r.cluster_authorized_operations == 8096
            body.update(include_topic_authorized_operations=False, include_cluster_authorized_operations=False)
            r = conn.request(3, v, body)
            assert r.topics[0].topic_authorized_operations == OMITTED
        for v in (3, 4, 5):
            r = conn.request(15, v, {"groups": [group], "include_authorized_operations": True})
            assert r.groups[0].authorized_operations == bits(GROUP_OPS) == 3400
            r = conn.request(15, v, {"groups": [group], "include_authorized_operations": False})
            assert r.groups[0].authorized_operations == OMITTED


# --- DescribeTopicPartitions ---------------------------------------------------------------------


def test_describe_topic_partitions_pages_with_a_cursor(broker: BrokerProcess) -> None:
    prefix = unique_topic("dtp")
    a, b = f"{prefix}-a", f"{prefix}-b"
    create_topic(broker, a, partitions=3)
    create_topic(broker, b, partitions=2)
    kp = kp_admin(broker)
    try:
        page = kp.describe_topic_partitions([b, a], response_partition_limit=2)
        assert [t["name"] for t in page["topics"]] == [a]
        assert [p["partition_index"] for p in page["topics"][0]["partitions"]] == [0, 1]
        assert page["next_cursor"] == {"topic_name": a, "partition_index": 2}
        page = kp.describe_topic_partitions([b, a], response_partition_limit=2, cursor=page["next_cursor"])
        assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in page["topics"]] == \
            [(a, [2]), (b, [0])]
        assert page["next_cursor"] == {"topic_name": b, "partition_index": 1}
        page = kp.describe_topic_partitions([b, a], response_partition_limit=10, cursor=page["next_cursor"])
        assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in page["topics"]] == [(b, [1])]
        assert page["next_cursor"] is None
        t = page["topics"][0]
        assert t["topic_authorized_operations"] == 3576
        p = t["partitions"][0]
        assert (p["leader_id"], p["replica_nodes"], p["isr_nodes"], p["offline_replicas"]) == (0, [0], [0], [])
    finally:
        kp.close()
    with RawConnection(broker) as c:
        # The page fills exactly at a topic's end: the cursor names the next topic, partition 0.
        r = c.request(75, 0, {"topics": [{"name": a}, {"name": b}], "response_partition_limit": 3, "cursor": None})
        assert [x.name for x in r.topics] == [a]
        assert all(p.eligible_leader_replicas == () and p.last_known_elr == () for p in r.topics[0].partitions)
        assert (r.next_cursor.topic_name, r.next_cursor.partition_index) == (b, 0)
        missing = f"{prefix}-missing"
        r = c.request(75, 0, {"topics": [{"name": missing}, {"name": "bad name!"}], "response_partition_limit": 5,
                              "cursor": None})
        assert {x.name: int(x.error_code) for x in r.topics} == {missing: UNKNOWN_TOPIC_OR_PARTITION,
                                                                 "bad name!": 17}
        # A cursor on a topic that was not asked for is an invalid request.
        r = c.request(75, 0, {"topics": [{"name": a}], "response_partition_limit": 5,
                              "cursor": {"topic_name": b, "partition_index": 0}})
        assert [(x.name, int(x.error_code)) for x in r.topics] == [(a, INVALID_REQUEST)]
        # No topics: every topic, from the cursor on.
        r = c.request(75, 0, {"topics": [], "response_partition_limit": 2000,
                              "cursor": {"topic_name": b, "partition_index": 1}})
        names = [x.name for x in r.topics]
        assert names == sorted(names) and names[0] == b and a not in names
        assert [p.partition_index for p in r.topics[0].partitions] == [1]


# --- DescribeLogDirs / AlterReplicaLogDirs --------------------------------------------------------


def _where(b: BrokerProcess, topic: str) -> dict[tuple[str, int], tuple[str, bool]]:
    """(topic, partition) -> (log dir, is future) from kafka-python's describe_log_dirs."""
    kp = kp_admin(b)
    try:
        (entry,) = kp.describe_log_dirs()
    finally:
        kp.close()
    out = {}
    for d in entry["log_dirs"]:
        assert d["error_code"] == NONE, d
        for t in d["topics"]:
            if t["name"] == topic:
                for p in t["partitions"]:
                    out[(topic, p["partition_index"], p["is_future_key"])] = d["log_dir"]
    return {(t, i): (d, fut) for (t, i, fut), d in out.items()}


@pytest.fixture
def two_dirs(broker_factory: BrokerFactory, tmp_path: Path) -> tuple[BrokerProcess, Path, Path]:
    d1, d2 = tmp_path / "dir-a", tmp_path / "dir-b"
    b = broker_factory({"log.dirs": f"{d1},{d2}", "log.segment.bytes": str(1024 * 1024),
                        "num.partitions": "1"})
    return b, d1, d2


def test_describe_log_dirs_sizes_lag_and_space(two_dirs: tuple[BrokerProcess, Path, Path]) -> None:
    b, d1, d2 = two_dirs
    topic = unique_topic("dld")
    create_topic(b, topic, partitions=2)
    produce_all(make_producer(b), topic, [{"value": b"x" * 1000, "partition": i % 2} for i in range(200)])
    kp = kp_admin(b)
    try:
        (entry,) = kp.describe_log_dirs({topic: [0, 1]})
    finally:
        kp.close()
    dirs = {d["log_dir"]: d for d in entry["log_dirs"]}
    assert set(dirs) == {str(d1), str(d2)}
    seen = {}
    for path, d in dirs.items():
        assert d["error_code"] == NONE and d["total_bytes"] > d["usable_bytes"] > 0
        for t in d["topics"]:
            if t["name"] != topic:
                assert t["partitions"] == []  # only the partitions asked for
                continue
            for p in t["partitions"]:
                on_disk = sum(f.stat().st_size for f in (Path(path) / f"{topic}-{p['partition_index']}").glob("*.log"))
                assert p["partition_size"] == on_disk > 100 * 1000
                assert (p["offset_lag"], p["is_future_key"]) == (0, False)
                seen[p["partition_index"]] = path
    assert sorted(seen) == [0, 1]
    # The same through the raw protocol, every version: v4 adds the space fields.
    with RawConnection(b) as c:
        for v in range(1, 5):
            r = c.request(35, v, {"topics": [{"topic": topic, "partitions": [0]}]})
            assert int(r.error_code) == NONE if v >= 3 else True
            results = {x.log_dir: x for x in r.results}
            part = [p for x in results.values() for t in x.topics if t.name == topic for p in t.partitions]
            assert [p.partition_index for p in part] == [0]
            if v >= 4:
                assert all(x.total_bytes > 0 and x.usable_bytes > 0 for x in results.values())


def test_describe_log_dirs_reports_an_offline_dir(broker_factory: BrokerFactory, tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    bad.write_text("a file where a log dir should be: the dir fails to load and is offline")
    b = broker_factory({"log.dirs": f"{good},{bad}"})
    topic = unique_topic("off")
    create_topic(b, topic)
    kp = kp_admin(b)
    try:
        (entry,) = kp.describe_log_dirs()
        dirs = {d["log_dir"]: d for d in entry["log_dirs"]}
        assert dirs[str(bad)]["error_code"] == KAFKA_STORAGE_ERROR and dirs[str(bad)]["topics"] == []
        assert dirs[str(good)]["error_code"] == NONE
        # Moving onto the offline dir is a storage error; to a path that is no log dir, LOG_DIR_NOT_FOUND.
        res = kp.alter_replica_log_dirs({TopicPartitionReplica(topic, 0, 0): str(bad),
                                         TopicPartitionReplica(topic, 1, 0): str(tmp_path / "nowhere")})
        assert {k.partition: v.errno for k, v in res.items()} == {0: KAFKA_STORAGE_ERROR, 1: LOG_DIR_NOT_FOUND}
    finally:
        kp.close()


def test_alter_replica_log_dirs_errors(two_dirs: tuple[BrokerProcess, Path, Path]) -> None:
    b, _d1, d2 = two_dirs
    topic = unique_topic("arld")
    create_topic(b, topic)
    (current, _), = _where(b, topic).values()
    kp = kp_admin(b)
    try:
        res = kp.alter_replica_log_dirs({
            TopicPartitionReplica(topic, 0, 0): current,  # where it already is: nothing to do
            TopicPartitionReplica(topic, 5, 0): str(d2),  # not hosted here
            TopicPartitionReplica(unique_topic("nope"), 0, 0): str(d2),
        })
        assert sorted((k.topic == topic, k.partition, v.errno) for k, v in res.items()) == \
            [(False, 0, REPLICA_NOT_AVAILABLE), (True, 0, NONE), (True, 5, REPLICA_NOT_AVAILABLE)]
    finally:
        kp.close()
    assert _where(b, topic) == {(topic, 0): (current, False)}
    with RawConnection(b) as c:
        for v in (1, 2):
            r = c.request(34, v, {"dirs": [{"path": "/not/a/log/dir", "topics": [{"name": topic, "partitions": [0]}]}]})
            assert [(x.topic_name, [(p.partition_index, int(p.error_code)) for p in x.partitions])
                    for x in r.results] == [(topic, [(0, LOG_DIR_NOT_FOUND)])]


class Traffic:
    """An idempotent confluent-kafka producer and an assign()ed consumer on one partition, in threads."""

    def __init__(self, b: BrokerProcess, topic: str, start: int) -> None:
        self.b, self.topic = b, topic
        self.next = start
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.consumed: list[tuple[int, bytes]] = []
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def _produce(self) -> None:
        p = make_producer(self.b, **{"enable.idempotence": True, "linger.ms": 2, "batch.size": 65536})
        deadline = time.monotonic() + 120

        def cb(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                self.errors.append(f"produce: {err}")

        while not self.stop.is_set() and time.monotonic() < deadline:
            for _ in range(50):
                p.produce(self.topic, value=b"m%08d" % self.next + b"." * 500, partition=0, on_delivery=cb)
                self.next += 1
            p.poll(0)
            time.sleep(0.005)
        if p.flush(CLIENT_TIMEOUT) != 0:
            self.errors.append("produce: messages left unflushed")

    def _consume(self) -> None:
        c = make_consumer(self.b)
        c.assign([TopicPartition(self.topic, 0, 0)])
        deadline = time.monotonic() + 120
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                for m in c.consume(500, 0.1):
                    if m.error() is not None:
                        self.errors.append(f"consume: {m.error()}")
                    else:
                        self.consumed.append((m.offset(), m.value()[:9]))
        finally:
            c.close()


def _check_all(b: BrokerProcess, topic: str, count: int) -> None:
    msgs = consume_partitions(b, [TopicPartition(topic, 0, 0)], count, timeout=60)
    values = [m.value()[:9] for m in msgs]
    assert len(values) == count, f"read {len(values)} of {count}"
    assert values == [b"m%08d" % i for i in range(count)], "not every message exactly once in order"
    assert [m.offset() for m in msgs] == list(range(count))


def test_alter_replica_log_dirs_moves_a_partition_under_traffic(two_dirs: tuple[BrokerProcess, Path, Path]) -> None:
    b, d1, d2 = two_dirs
    topic = unique_topic("move")
    create_topic(b, topic)
    ((_, (src, _)),) = _where(b, topic).items()
    target = d2 if src == str(d1) else d1
    # Some megabytes in several segments first, so the copy takes more than one round.
    initial = 6000
    produce_all(make_producer(b, **{"batch.size": 65536}), topic, [{"value": b"m%08d" % i + b"." * 500, "partition": 0}
                                          for i in range(initial)])
    with Traffic(b, topic, initial) as traffic:
        wait_until(lambda: len(traffic.consumed) > initial, what="the consumer to read", timeout=30)
        kp = kp_admin(b)
        try:
            res = kp.alter_replica_log_dirs({TopicPartitionReplica(topic, 0, 0): str(target)})
            assert [v.errno for v in res.values()] == [NONE]
            # Asked again while it moves (or after): still fine, nothing new started.
            res = kp.alter_replica_log_dirs({TopicPartitionReplica(topic, 0, 0): str(target)})
            assert [v.errno for v in res.values()] == [NONE]
        finally:
            kp.close()
        wait_until(lambda: _where(b, topic) == {(topic, 0): (str(target), False)}, timeout=60,
                   what="the partition to be in the target dir, with no future replica left")
        moved_at = traffic.next
        wait_until(lambda: traffic.next > moved_at + 2000, what="production to continue after the move", timeout=30)
    assert not traffic.errors, traffic.errors[:5]
    assert f"Moved {topic}-0 to {target}" in b.log()
    produced = traffic.next
    consumed = [v for _, v in traffic.consumed]
    assert consumed == [b"m%08d" % i for i in range(len(consumed))], "the live consumer lost or repeated messages"
    _check_all(b, topic, produced)
    part = target / f"{topic}-0"
    assert len(list(part.glob("*.log"))) >= 2 and (part / "leader-epoch-checkpoint").exists()
    assert not (Path(src) / f"{topic}-0").exists()
    assert not [p for p in Path(src).iterdir() if p.name.startswith(topic)], "a leftover -delete or -future dir"
    b.stop()
    assert "Truncated" not in b.log()
    b.start()
    assert _where(b, topic) == {(topic, 0): (str(target), False)}
    _check_all(b, topic, produced)


def test_asking_for_the_current_dir_cancels_a_move(two_dirs: tuple[BrokerProcess, Path, Path]) -> None:
    b, d1, d2 = two_dirs
    topic = unique_topic("cancel")
    create_topic(b, topic)
    ((_, (src, _)),) = _where(b, topic).items()
    target = d2 if src == str(d1) else d1
    count = 8000
    produce_all(make_producer(b, **{"batch.size": 65536}), topic,
                [{"value": b"m%08d" % i + b"." * 500, "partition": 0} for i in range(count)])
    kp = kp_admin(b)
    try:
        # Back to where it is right after: the move is cancelled (or, if it already finished, undone).
        res = kp.alter_replica_log_dirs({TopicPartitionReplica(topic, 0, 0): str(target)})
        assert [v.errno for v in res.values()] == [NONE]
        res = kp.alter_replica_log_dirs({TopicPartitionReplica(topic, 0, 0): src})
        assert [v.errno for v in res.values()] == [NONE]
    finally:
        kp.close()
    wait_until(lambda: _where(b, topic) == {(topic, 0): (src, False)} and
               not [p for p in target.iterdir() if p.name.startswith(topic)], timeout=30,
               what="the partition back in its dir with no future replica or copy elsewhere")
    _check_all(b, topic, count)


def test_sigkill_during_a_move_leaves_the_data_intact(two_dirs: tuple[BrokerProcess, Path, Path]) -> None:
    b, d1, d2 = two_dirs
    topic = unique_topic("kill")
    create_topic(b, topic)
    ((_, (src, _)),) = _where(b, topic).items()
    target = d2 if src == str(d1) else d1
    count = 20000
    produce_all(make_producer(b, **{"batch.size": 65536}), topic, [{"value": b"m%08d" % i + b"." * 500, "partition": 0}
                                          for i in range(count)])
    with RawConnection(b) as c:
        r = c.request(34, 2, {"dirs": [{"path": str(target), "topics": [{"name": topic, "partitions": [0]}]}]})
        assert int(r.results[0].partitions[0].error_code) == NONE
        assert b.proc is not None
        b.proc.send_signal(signal.SIGKILL)  # at once: the move has at most begun
        b.proc.wait(10)
    b.start()
    where = _where(b, topic)
    assert len(where) == 1 and not next(iter(where.values()))[1], where
    (d,) = {d for d, _ in where.values()}
    assert [p.name for p in (Path(d)).iterdir() if p.name.startswith(topic)] == [f"{topic}-0"]
    other = Path(src) if d != src else target
    assert not [p for p in other.iterdir() if p.name.startswith(topic)], "a stale copy or -future dir left behind"
    _check_all(b, topic, count)


# --- ElectLeaders, partition reassignments --------------------------------------------------------


def test_elect_leaders_single_node_answers(broker: BrokerProcess) -> None:
    topic = unique_topic("elect")
    create_topic(broker, topic, partitions=2)
    admin = admin_for(broker)
    # (confluent-kafka 2.16's elect_leaders fails on keyword arguments such as request_timeout)
    res = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0), TopicPartition(topic, 1)]
                              ).result(CLIENT_TIMEOUT)
    assert {tp.partition: (err.code() if err else None) for tp, err in res.items()} == \
        {0: ELECTION_NOT_NEEDED, 1: ELECTION_NOT_NEEDED}
    res = admin.elect_leaders(ElectionType.UNCLEAN, [TopicPartition(topic, 0), TopicPartition(topic, 7)]
                              ).result(CLIENT_TIMEOUT)
    assert {tp.partition: (err.code() if err else None) for tp, err in res.items()} == \
        {0: ELECTION_NOT_NEEDED, 7: UNKNOWN_TOPIC_OR_PARTITION}
    kp = kp_admin(broker)
    try:
        r = kp.elect_leaders(0, {topic: [0, 1]}, raise_errors=False)
        assert r.error_code == NONE
        (t,) = r.replica_election_results
        assert [(p.partition_id, p.error_code, p.error_message) for p in t.partition_result] == \
            [(i, ELECTION_NOT_NEEDED, "Leader election not needed for topic partition.") for i in (0, 1)]
    finally:
        kp.close()
    with RawConnection(broker) as c:
        for v in (0, 1, 2):
            # Null: every partition; those already led by their preferred replica are left out.
            r = c.request(43, v, {"election_type": 0, "topic_partitions": None, "timeout": 30000})
            assert r.replica_election_results == ()
            r = c.request(43, v, {"election_type": 0, "timeout": 30000,
                                  "topic_partitions": [{"topic": f"{topic}-nope", "partitions": [0]}]})
            (res0,) = r.replica_election_results[0].partition_result
            assert (int(res0.error_code), res0.error_message) == (UNKNOWN_TOPIC_OR_PARTITION,
                                                                   f"No such topic as {topic}-nope")


def test_partition_reassignments_single_node_answers(broker: BrokerProcess) -> None:
    topic = unique_topic("reassign")
    create_topic(broker, topic, partitions=2)
    kp = kp_admin(broker)
    try:
        assert kp.list_partition_reassignments() == {}
        res = kp.alter_partition_reassignments({KTopicPartition(topic, 0): [0], KTopicPartition(topic, 1): [0, 7]})
        by_partition = {tp.partition: v for tp, v in res.items()}
        assert by_partition[0] is None
        assert by_partition[1].errno == INVALID_REPLICA_ASSIGNMENT
        res = kp.alter_partition_reassignments({KTopicPartition(topic, 0): None})
        assert [v.errno for v in res.values()] == [NO_REASSIGNMENT_IN_PROGRESS]
        assert kp.list_partition_reassignments({topic: [0, 1]}) == {}
    finally:
        kp.close()
    with RawConnection(broker) as c:
        r = c.request(45, 0, {"timeout": 30000, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "replicas": [0]},
                                           {"partition_index": 1, "replicas": [0, 0]},
                                           {"partition_index": 2, "replicas": [0]},
                                           {"partition_index": 0, "replicas": None}]},
            {"name": f"{topic}-nope", "partitions": [{"partition_index": 0, "replicas": [0]}]}]})
        got = [(t.name, p.partition_index, int(p.error_code), p.error_message) for t in r.responses
               for p in t.partitions]
        assert got == [
            (topic, 0, NONE, None),
            (topic, 1, INVALID_REPLICA_ASSIGNMENT,
             "The manual partition assignment includes the broker 0 more than once."),
            (topic, 2, UNKNOWN_TOPIC_OR_PARTITION, f"Unable to find partition {topic}:2."),
            (topic, 0, NO_REASSIGNMENT_IN_PROGRESS, "No partition reassignment is in progress."),
            (f"{topic}-nope", 0, UNKNOWN_TOPIC_OR_PARTITION, f"Unable to find a topic named {topic}-nope."),
        ]
        r = c.request(46, 0, {"timeout": 30000, "topics": None})
        assert (int(r.error_code), r.topics) == (NONE, ())


# --- OffsetForLeaderEpoch -----------------------------------------------------------------------


def test_offset_for_leader_epoch_and_librdkafka_truncation_check(broker: BrokerProcess) -> None:
    topic = unique_topic("ofle")
    create_topic(broker, topic)
    produce_all(make_producer(broker), topic, [{"value": b"v%d" % i} for i in range(10)])
    with RawConnection(broker) as c:
        for v in (2, 3, 4):
            def ask(current: int, epoch: int, partition: int = 0, v: int = v) -> tuple[int, int, int]:
                r = c.request(23, v, {"replica_id": -1, "topics": [{"topic": topic, "partitions": [
                    {"partition": partition, "current_leader_epoch": current, "leader_epoch": epoch}]}]})
                p = r.topics[0].partitions[0]
                return int(p.error_code), p.leader_epoch, p.end_offset

            assert ask(-1, 0) == (NONE, 0, 10)  # the latest epoch ends at the log end
            assert ask(0, 0) == (NONE, 0, 10)
            assert ask(-1, -1) == (NONE, -1, -1)
            assert ask(-1, 5) == (NONE, -1, -1)  # an epoch newer than any known
            assert ask(1, 0) == (UNKNOWN_LEADER_EPOCH, -1, -1)
            assert ask(-1, 0, partition=3) == (UNKNOWN_TOPIC_OR_PARTITION, -1, -1)
    # librdkafka validates a position that carries a leader epoch (KIP-320): offset 15 in epoch 0,
    # which ends at 10, was truncated, so the consumer goes on from 10 (it reaches the end there at
    # once); without the check it would fetch 15, be out of range and reset to 0.
    c = make_consumer(broker, **{"enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, 0, 15, leader_epoch=0)])
        events: list[tuple[str, int]] = []
        deadline = time.monotonic() + 20
        while not events and time.monotonic() < deadline:
            for m in c.consume(10, 0.2):
                err = m.error()
                events.append(("eof" if err is not None and err.code() == KafkaError._PARTITION_EOF
                               else str(err) if err is not None else "message", m.offset() or 0))
        assert events[:1] == [("eof", 10)], events
        produce_all(make_producer(broker), topic, [{"value": b"v%d" % i} for i in range(10, 15)])
        got: list[int] = []
        deadline = time.monotonic() + 20
        while len(got) < 5 and time.monotonic() < deadline:
            got += [m.offset() or 0 for m in c.consume(10, 0.2) if m.error() is None]
        assert got == [10, 11, 12, 13, 14]
    finally:
        c.close()


def test_leader_epochs_are_stamped_and_survive_restart(broker_factory: BrokerFactory) -> None:
    b = broker_factory()
    topic = unique_topic("epoch")
    create_topic(b, topic)
    produce_all(make_producer(b), topic, [{"value": b"v"}])
    c = make_consumer(b)
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        msgs: list[Any] = []
        deadline = time.monotonic() + 20
        while not msgs and time.monotonic() < deadline:
            msgs = [m for m in c.consume(1, 0.2) if m.error() is None]
        assert msgs and msgs[0].leader_epoch() == 0  # the broker stamps its leader epoch into each batch
    finally:
        c.close()
    cp = Path(b.overrides["log.dirs"]) / f"{topic}-0" / "leader-epoch-checkpoint"
    assert cp.read_text().split("\n")[:3] == ["0", "1", "0 0"]
    b.stop()
    b.start()
    with RawConnection(b) as conn:
        r = conn.request(23, 4, {"replica_id": -1, "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}]}]})
        p = r.topics[0].partitions[0]
        assert (int(p.error_code), p.leader_epoch, p.end_offset) == (NONE, 0, 1)

