"""The admin APIs of a ZooKeeper cluster of three pykbroker processes.

A topic created, altered, grown and deleted through one broker is seen the same way by every
broker; a preferred leader election brings leadership back after it moved; a broker that cannot
reach ZooKeeper, or whose id is taken, exits at once with one clear line.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, ElectionType, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, NewTopic

from tests.support.broker import free_port
from tests.support.cluster import Cluster, metadata, raw_request, wait_for

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.xdist_group("cluster-admin"),
]

PARTITIONS = 6
TIMEOUT = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # No automatic preferred-leader rebalance: test_preferred_election_brings_leadership_back moves leaders itself.
    c = Cluster(tmp_path_factory.mktemp("cluster-admin"), 3, overrides={"auto.leader.rebalance.enable": "false"})
    with c:
        yield c


def _admin(cluster: Cluster, via: int = 1) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.broker(via).bootstrap})


def _result(futures: dict[Any, Any]) -> dict[Any, Any]:
    return {k: f.result(timeout=TIMEOUT) for k, f in futures.items()}


def _create(cluster: Cluster, tag: str, partitions: int = PARTITIONS, rf: int = 3,
            configs: dict[str, str] | None = None) -> str:
    name = f"{tag}-{uuid.uuid4().hex[:8]}"
    admin = _admin(cluster)  # kept alive until its futures are done
    _result(admin.create_topics([NewTopic(name, partitions, rf, config=configs or {})], operation_timeout=TIMEOUT))
    return name


def _view(bootstrap: str, topic: str) -> list[tuple[int, int, int, tuple[int, ...], tuple[int, ...]]]:
    md = metadata(bootstrap, [topic])
    return sorted((p.partition_index, p.leader_id, p.leader_epoch, tuple(p.replica_nodes), tuple(sorted(p.isr_nodes)))
                  for t in md.topics for p in t.partitions)


def _request(bootstrap: str, api_key: int, version: int, body: dict[str, Any], timeout: float = 10.0) -> Any:
    return raw_request(bootstrap, api_key, version, body, timeout=timeout, client_id="cluster-admin-test")


def _find_coordinator(bootstrap: str, key: str, key_type: int = 0) -> tuple[int, int]:
    """(error code, node id) of FindCoordinator v4 for one key."""
    resp = _request(bootstrap, 10, 4, {"key_type": key_type, "coordinator_keys": [key]})
    c = resp.coordinators[0]
    return int(c.error_code), int(c.node_id)


def _auto_create_metadata(bootstrap: str, topic: str) -> Any:
    body = {"topics": [{"name": topic, "topic_id": None}], "allow_auto_topic_creation": True,
            "include_topic_authorized_operations": False}
    return next(iter(_request(bootstrap, 3, 12, body).topics))


def _log_dirs(cluster: Cluster, topic: str) -> dict[int, list[str]]:
    return {i: sorted(p.name for p in (b.data_dir / "logs").glob(f"{topic}-*")) for i, b in cluster.brokers.items()}


def test_create_topics_every_broker_sees_the_same_partitions(cluster: Cluster) -> None:
    # CreateTopics answers once the broker it went to knows a leader for every partition.
    topic = _create(cluster, "create")
    first = _view(cluster.broker(1).bootstrap, topic)
    assert len(first) == PARTITIONS and all(leader in (1, 2, 3) for _, leader, _, _, _ in first), first

    def agreed() -> list[Any] | None:
        views = [_view(b.bootstrap, topic) for b in cluster.brokers.values()]
        settled = all(set(isr) == set(replicas) for _, _, _, replicas, isr in views[0])
        return views if settled and views[0] == views[1] == views[2] else None
    views = wait_for(agreed, timeout=TIMEOUT, what="every broker's view of the new topic")
    parts = views[0]
    assert {leader for _, leader, _, _, _ in parts} == {1, 2, 3}, parts
    for _, leader, epoch, replicas, _ in parts:
        assert sorted(replicas) == [1, 2, 3] and replicas[0] == leader and epoch == 0
    mds = [metadata(b.bootstrap, []) for b in cluster.brokers.values()]
    for md in mds:
        assert sorted((b.node_id, b.host, b.port) for b in md.brokers) == sorted(
            (i, "127.0.0.1", b.port) for i, b in cluster.brokers.items())
        assert md.controller_id == mds[0].controller_id and md.controller_id in cluster.brokers
        assert md.cluster_id == mds[0].cluster_id and md.cluster_id
    for i in cluster.brokers:
        admin = _admin(cluster, i)
        described = admin.describe_cluster(request_timeout=TIMEOUT).result(timeout=TIMEOUT)
        assert sorted(n.id for n in described.nodes) == [1, 2, 3]
        assert described.controller.id == mds[0].controller_id and described.cluster_id == mds[0].cluster_id
    # Every broker holds a log of every partition: it is a replica of each.
    wait_for(lambda: all(len(dirs) == PARTITIONS for dirs in _log_dirs(cluster, topic).values()),
             timeout=TIMEOUT, what="every replica's log")


def test_create_topics_errors_as_kafka(cluster: Cluster) -> None:
    name = f"rf4-{uuid.uuid4().hex[:8]}"
    admin = _admin(cluster)
    futures = admin.create_topics([NewTopic(name, 1, 4)], operation_timeout=TIMEOUT)
    with pytest.raises(Exception) as e:
        futures[name].result(timeout=TIMEOUT)
    assert "INVALID_REPLICATION_FACTOR" in str(e.value)
    assert "only 3 broker(s) are registered" in str(e.value)
    existing = _create(cluster, "dup", partitions=1, rf=1)
    admin2 = _admin(cluster, 2)
    futures = admin2.create_topics([NewTopic(existing, 1, 1)], operation_timeout=TIMEOUT)
    with pytest.raises(Exception, match="TOPIC_ALREADY_EXISTS"):
        futures[existing].result(timeout=TIMEOUT)


def test_alter_configs_are_seen_by_every_broker(cluster: Cluster) -> None:
    topic = _create(cluster, "configs", partitions=1)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "123456", incremental_operation=AlterConfigOpType.SET)])
    admin = _admin(cluster, 2)
    _result(admin.incremental_alter_configs([resource]))
    admins = {i: _admin(cluster, i) for i in cluster.brokers}

    def everywhere() -> bool:
        for i in cluster.brokers:
            described = _result(admins[i].describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]))
            entries = next(iter(described.values()))
            if entries["retention.ms"].value != "123456":
                return False
        return True
    wait_for(everywhere, timeout=TIMEOUT, what="retention.ms=123456 on every broker")
    # A cluster-wide dynamic broker default, written through broker 1, is in force on broker 3.
    # (IncrementalAlterConfigs v1 by hand: confluent-kafka refuses the empty name of the default resource.)
    resp = _request(cluster.broker(1).bootstrap, 44, 1, {"validate_only": False, "resources": [
        {"resource_type": 4, "resource_name": "", "configs": [
            {"name": "log.retention.ms", "config_operation": 0, "value": "12345678"}]}]})
    assert [int(r.error_code) for r in resp.responses] == [0]

    def on_broker_3() -> bool:
        described = _result(admins[3].describe_configs([ConfigResource(ConfigResource.Type.BROKER, "3")]))
        return next(iter(described.values()))["log.retention.ms"].value == "12345678"
    wait_for(on_broker_3, timeout=TIMEOUT, what="the dynamic broker default on broker 3")


def test_create_partitions_gets_leaders_on_every_broker(cluster: Cluster) -> None:
    topic = _create(cluster, "grow", partitions=3)
    admin = _admin(cluster, 3)
    answering = int(metadata(cluster.broker(3).bootstrap, [topic]).controller_id)
    _result(admin.create_partitions([NewPartitions(topic, 7)], operation_timeout=TIMEOUT))
    # The broker that answered (the controller: librdkafka sends CreatePartitions there) already knows leaders for
    # the new partitions; the others learn them from ZooKeeper's watches a moment later.
    assert [p for p, leader, *_ in _view(cluster.broker(answering).bootstrap, topic) if leader < 0] == []
    views = wait_for(lambda: (v := [_view(b.bootstrap, topic) for b in cluster.brokers.values()])
                     and v[0] == v[1] == v[2] and len(v[0]) == 7 and v, timeout=TIMEOUT, what="7 partitions")
    for _, leader, _, replicas, _ in views[0]:
        assert leader in replicas and len(replicas) == 3


def test_delete_topics_removes_the_logs_on_every_broker(cluster: Cluster) -> None:
    topic = _create(cluster, "delete")
    wait_for(lambda: all(len(d) == PARTITIONS for d in _log_dirs(cluster, topic).values()),
             timeout=TIMEOUT, what="logs before deletion")
    admin = _admin(cluster, 2)
    _result(admin.delete_topics([topic], operation_timeout=TIMEOUT))
    # The broker that answered no longer knows the topic.
    md = metadata(cluster.broker(2).bootstrap, [topic])
    assert [t.error_code for t in md.topics] == [3]  # UNKNOWN_TOPIC_OR_PARTITION
    wait_for(lambda: all(not d for d in _log_dirs(cluster, topic).values()), timeout=TIMEOUT,
             what="no log of the deleted topic on any broker")
    for b in cluster.brokers.values():
        assert [t.error_code for t in metadata(b.bootstrap, [topic]).topics] == [3]


def test_preferred_election_brings_leadership_back(cluster: Cluster) -> None:
    topic = _create(cluster, "elect", partitions=3)
    cluster.wait_leaders(topic, 3)
    # Wait for full ISRs, so that a restarted broker can lead again once it has caught up.
    wait_for(lambda: all(set(isr) == {1, 2, 3} for *_, isr in _view(cluster.any_bootstrap(), topic)),
             timeout=TIMEOUT, what="full ISRs")
    preferred = {p: replicas[0] for p, _, _, replicas, _ in _view(cluster.any_bootstrap(), topic)}
    moved = [p for p, b in preferred.items() if b == 3]
    assert moved, preferred
    assert cluster.stop(3) == 0  # controlled shutdown: broker 3's leaderships move away
    cluster.wait_leaders(topic, 3, exclude=(3,))
    cluster.broker(3).start()
    cluster.wait_registered([1, 2, 3])
    wait_for(lambda: all(set(isr) == {1, 2, 3} for *_, isr in _view(cluster.broker(1).bootstrap, topic)),
             timeout=60, what="broker 3 back in every ISR")
    assert all(_view(cluster.broker(1).bootstrap, topic)[p][1] != 3 for p in moved)
    admin = _admin(cluster, 1)
    partitions = [TopicPartition(topic, p) for p in range(3)]
    result = admin.elect_leaders(ElectionType.PREFERRED, partitions).result(timeout=TIMEOUT)
    errors = {tp.partition: err for tp, err in result.items()}
    for p in range(3):
        if p in moved:
            assert errors[p] is None, errors
        else:
            assert errors[p] is not None and "ELECTION_NOT_NEEDED" in str(errors[p]), errors
    assert {p: leader for p, leader, *_ in _view(cluster.broker(1).bootstrap, topic)} == preferred
    wait_for(lambda: {p: leader for p, leader, *_ in _view(cluster.broker(2).bootstrap, topic)} == preferred,
             timeout=TIMEOUT, what="the preferred leaders on broker 2")


def test_find_coordinator_creates_the_offsets_topic_on_first_use(cluster: Cluster) -> None:
    admin = _admin(cluster, 2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    # describe/list offsets of a group needs its coordinator: the offsets topic is created with 3 replicas.
    wait_for(lambda: _offsets_ok(admin, group), timeout=TIMEOUT, what="a group coordinator")
    md = metadata(cluster.broker(1).bootstrap, ["__consumer_offsets"])
    parts = [p for t in md.topics for p in t.partitions]
    assert parts and all(len(p.replica_nodes) == 3 for p in parts)


def _offsets_ok(admin: AdminClient, group: str) -> bool:
    try:
        admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=10)
    except Exception:
        return False
    return True


def test_duplicate_broker_id_exits_with_the_reason(cluster: Cluster, tmp_path: Path) -> None:
    proc = _serve(tmp_path, {"broker.id": "2", "zookeeper.connect": cluster.zk.connect,
                             "zookeeper.session.timeout.ms": "6000"})
    out = proc.stdout.read().decode() if proc.stdout else ""
    assert proc.returncode == 1, out
    assert "Broker id 2 is already registered in ZooKeeper at /brokers/ids/2 by another broker" in out, out
    assert "Traceback" not in out
    assert 2 in {b.node_id for b in metadata(cluster.broker(2).bootstrap, []).brokers}  # the first one stays


def test_unreachable_zookeeper_exits_within_the_connection_timeout(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    proc = _serve(tmp_path, {"broker.id": "1", "zookeeper.connect": dead, "zookeeper.connection.timeout.ms": "2000"})
    elapsed = time.monotonic() - started
    out = proc.stdout.read().decode() if proc.stdout else ""
    assert proc.returncode == 1, out
    assert "Timed out waiting for connection while in state: CONNECTING" in out, out
    assert dead in out and "Traceback" not in out
    assert elapsed < 15, f"took {elapsed:.1f}s"


def _serve(tmp_path: Path, overrides: dict[str, str], timeout: float = 60) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "pykbroker", "serve", "--override", f"listeners=PLAINTEXT://127.0.0.1:{free_port()}",
            "--override", f"log.dirs={tmp_path / 'logs'}"]
    for k, v in overrides.items():
        args += ["--override", f"{k}={v}"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise
    return proc


def test_transaction_spans_partitions_led_by_every_broker(cluster: Cluster) -> None:
    """Markers reach the partitions other brokers lead (WriteTxnMarkers) and those leaders check the
    transaction with its coordinator on another broker (KIP-890) before its first batch."""
    topic = _create(cluster, "txn")
    leaders = cluster.wait_leaders(topic, PARTITIONS)
    assert set(leaders.values()) == {1, 2, 3}
    producer = Producer({"bootstrap.servers": cluster.broker(1).bootstrap, "transactional.id": f"tx-{topic}",
                         "transaction.timeout.ms": 60000})
    producer.init_transactions(TIMEOUT)
    producer.begin_transaction()
    for p in range(PARTITIONS):
        producer.produce(topic, value=f"aborted-{p}".encode(), partition=p)
    producer.flush(TIMEOUT)
    producer.abort_transaction(TIMEOUT)
    producer.begin_transaction()
    for p in range(PARTITIONS):
        producer.produce(topic, value=f"committed-{p}".encode(), partition=p)
    producer.commit_transaction(TIMEOUT)
    consumer = Consumer({"bootstrap.servers": cluster.broker(2).bootstrap, "group.id": f"g-{topic}",
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        seen: list[str] = []
        deadline = time.monotonic() + TIMEOUT
        for _ in range(1000):
            if len(seen) >= PARTITIONS or time.monotonic() > deadline:
                break
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                seen.append(msg.value().decode())
        assert sorted(seen) == sorted(f"committed-{p}" for p in range(PARTITIONS))
        # The last stable offset passed every marker: nothing is left open on any leader.
        for p in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT)
            assert high == 4, (p, low, high)  # aborted record, abort marker, committed record, commit marker
    finally:
        consumer.close()


def test_partition_reassignment_moves_the_replicas(cluster: Cluster) -> None:
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.errors import InvalidReplicationAssignmentError, NoReassignmentInProgressError

    name = f"move-{uuid.uuid4().hex[:8]}"
    admin = _admin(cluster)
    _result(admin.create_topics([NewTopic(name, 1, replica_assignment=[[1, 2]])], operation_timeout=TIMEOUT))
    cluster.wait_leaders(name, 1)
    wait_for(lambda: _log_dirs(cluster, name)[1], timeout=TIMEOUT, what="broker 1's replica")
    kadmin = KafkaAdminClient(bootstrap_servers=cluster.broker(2).bootstrap, request_timeout_ms=int(TIMEOUT * 1000))
    try:
        tp = KTopicPartition(name, 0)
        assert kadmin.alter_partition_reassignments({tp: [9]}) == {tp: InvalidReplicationAssignmentError}
        assert kadmin.alter_partition_reassignments({tp: [2, 2]}) == {tp: InvalidReplicationAssignmentError}
        assert kadmin.alter_partition_reassignments({tp: None}) == {tp: NoReassignmentInProgressError}
        assert kadmin.alter_partition_reassignments({tp: [3, 2]}) == {tp: None}

        def moved() -> bool:
            views = [_view(b.bootstrap, name) for b in cluster.brokers.values()]
            return all(v and v[0][3] == (3, 2) and v[0][1] in (2, 3) and set(v[0][4]) == {2, 3} for v in views)
        wait_for(moved, timeout=60, what="replicas [3, 2] with a leader among them on every broker")
        wait_for(lambda: not _log_dirs(cluster, name)[1] and _log_dirs(cluster, name)[3], timeout=TIMEOUT,
                 what="the log gone from broker 1 and present on broker 3")
        assert kadmin.list_partition_reassignments() == {}
    finally:
        kadmin.close()


def test_offline_replicas_and_logs_of_topics_deleted_while_down(tmp_path: Path) -> None:
    with Cluster(tmp_path, 2) as cluster:
        admin = _admin(cluster)
        both = f"both-{uuid.uuid4().hex[:8]}"
        only2 = f"only2-{uuid.uuid4().hex[:8]}"
        _result(admin.create_topics([NewTopic(both, 2, 2), NewTopic(only2, 1, replica_assignment=[[2]])],
                                    operation_timeout=TIMEOUT))
        cluster.wait_leaders(both, 2)
        cluster.wait_leaders(only2, 1)
        # offsets.topic.replication.factor is 3: with two brokers Kafka creates no offsets topic.
        assert _find_coordinator(cluster.broker(1).bootstrap, "g") == (15, -1)  # COORDINATOR_NOT_AVAILABLE
        assert _find_coordinator(cluster.broker(2).bootstrap, "tx", key_type=1) == (15, -1)
        assert int(_auto_create_metadata(cluster.broker(1).bootstrap, "__consumer_offsets").error_code) == 15
        assert metadata(cluster.broker(2).bootstrap, ["__consumer_offsets", "__transaction_state"]).topics[0] \
            .error_code == 3
        wait_for(lambda: all(len(isr) == 2 for *_, isr in _view(cluster.broker(1).bootstrap, both)),
                 timeout=TIMEOUT, what="full ISRs")
        assert _log_dirs(cluster, only2)[2]
        cluster.kill(2)

        def broker2_gone() -> Any:
            md = metadata(cluster.broker(1).bootstrap, [both, only2])
            parts = {(t.name, p.partition_index): p for t in md.topics for p in t.partitions}
            ok = [b.node_id for b in md.brokers] == [1] and all(p.leader_id == 1 for (t, _), p in parts.items()
                                                                if t == both)
            return parts if ok else None
        parts = wait_for(broker2_gone, timeout=30, what="broker 2 gone from broker 1's view")
        lone = parts[(only2, 0)]
        assert (lone.leader_id, lone.error_code, tuple(lone.offline_replicas)) == (-1, 5, (2,))  # LEADER_NOT_AVAILABLE
        for i in range(2):
            p = parts[(both, i)]
            assert p.error_code == 0 and tuple(p.offline_replicas) == (2,) and tuple(p.isr_nodes) == (1,)
        # Deleted while broker 2 is down: it removes its log when it comes back.
        _result(admin.delete_topics([only2], operation_timeout=TIMEOUT))
        cluster.broker(2).start()
        cluster.wait_registered([1, 2])
        assert not _log_dirs(cluster, only2)[2]
        assert "this broker is no longer one of its replicas" in cluster.broker(2).log()
        wait_for(lambda: all(len(isr) == 2 for *_, isr in _view(cluster.broker(2).bootstrap, both)),
                 timeout=TIMEOUT, what="broker 2 back in the ISRs")


def test_metadata_auto_creates_topics_and_internal_topics(cluster: Cluster) -> None:
    name = f"auto-{uuid.uuid4().hex[:8]}"
    first = _auto_create_metadata(cluster.broker(3).bootstrap, name)
    # As Kafka: a topic this request created is LEADER_NOT_AVAILABLE with no partitions; the client asks again.
    assert int(first.error_code) == 5 and not first.partitions, first
    leaders = cluster.wait_leaders(name, 1)  # num.partitions=1, default.replication.factor=1
    assert list(leaders) == [0]
    assert int(_auto_create_metadata(cluster.broker(1).bootstrap, name).error_code) == 0
    # The transaction state topic comes with its coordinator's settings, not num.partitions.
    wait_for(lambda: int(_auto_create_metadata(cluster.broker(2).bootstrap, "__transaction_state").error_code) == 0,
             timeout=TIMEOUT, what="__transaction_state with leaders")
    md = metadata(cluster.broker(1).bootstrap, ["__transaction_state"])
    parts = [p for t in md.topics for p in t.partitions]
    assert len(parts) == 6 and all(len(p.replica_nodes) == 3 for p in parts)  # tests/support/cluster.py's setting
    assert md.topics[0].is_internal
    _, node = wait_for(lambda: (r := _find_coordinator(cluster.broker(1).bootstrap, "tx-1", 1))[0] == 0 and r,
                          timeout=TIMEOUT, what="a transaction coordinator")
    assert node in cluster.brokers


def test_log_dir_of_another_cluster_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    """A wrong zookeeper.connect (here another chroot: another cluster) must not make the broker treat
    its logs as strays of an empty cluster and delete them: meta.properties names the cluster."""
    logs = tmp_path / "logs"
    logs.mkdir()
    meta = (cluster.broker(1).data_dir / "logs" / "meta.properties").read_text()
    assert "cluster.id=" in meta and "broker.id=1" in meta
    (logs / "meta.properties").write_text(meta)
    (logs / "kept-0").mkdir()
    proc = _serve(tmp_path, {"broker.id": "1", "zookeeper.connect": cluster.zk.connect + "/another"})
    out = proc.stdout.read().decode() if proc.stdout else ""
    assert proc.returncode == 1, out
    assert "doesn't match stored clusterId" in out and "Configured zookeeper.connect may be wrong" in out, out
    assert (logs / "kept-0").is_dir()
