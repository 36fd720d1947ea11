"""Cluster administration: DescribeCluster, DescribeTopicPartitions, authorized operations, log dirs,
leader elections, partition reassignments, client quotas, ListOffsets MAX_TIMESTAMP, position
validation with OffsetForLeaderEpoch, and the KIP-714 client instance id.

A single-node Kafka 3.9 gives the same answers (one replica per partition: nothing to elect, the
reassignment to the current replica is immediate)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from compat import scenario as s
from compat.check import text_msgs
from compat.clients import base
from compat.clients.base import Client, ClientError, Msg, NotSupportedByClient, wait_until
from compat.cluster import ClusterInfo
from compat.conftest import get_client, unique_topic

# The operations Kafka defines on each resource type (AclEntry.supportedOperations; Kafka 4 adds the
# config operations on groups). Without an authorizer a broker reports all of them.
CLUSTER_OPS = {"ALTER", "ALTER_CONFIGS", "CLUSTER_ACTION", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS",
               "IDEMPOTENT_WRITE"}
TOPIC_OPS = {"READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}
GROUP_OPS = {"READ", "DESCRIBE", "DELETE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}
ZERO_UUIDS = {"AAAAAAAAAAAAAAAAAAAAAA", "00000000-0000-0000-0000-000000000000", "00000000000000000000000000000000"}


@s.scenario("cluster.describe", "cluster admin", needs=(base.DESCRIBE_CLUSTER,), apis=(60, 3), consumes=False)
def test_describe_cluster(client: Client, helper: Client) -> None:
    md = helper.metadata()
    d = client.describe_cluster()
    assert d["cluster_id"] and d["cluster_id"] == md["cluster_id"], (d, md.get("cluster_id"))
    assert d["brokers"] == md["brokers"], (d["brokers"], md["brokers"])
    # KRaft names a live broker as the controller clients see.
    assert d["controller"] in d["brokers"], d
    if base.CLUSTER_AUTHORIZED_OPS in client.caps:
        assert d["authorized_operations"] is None, f"not asked for, yet reported: {d['authorized_operations']}"
        ops = client.describe_cluster(authorized_operations=True)["authorized_operations"]
        assert ops is not None, "asked for the cluster's authorized operations, got none (-2147483648)"
        assert "DESCRIBE" in ops and ops <= CLUSTER_OPS, ops


@s.scenario("topic.describe-partitions", "cluster admin", needs=(base.DESCRIBE_TOPIC_PARTITIONS,), apis=(75,),
            consumes=False)
def test_describe_topic_partitions(client: Client, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=3)
    brokers = set(helper.metadata()["brokers"])
    d = client.describe_topic_detail(topic)
    assert sorted(d["partitions"]) == [0, 1, 2], d
    for p, info in d["partitions"].items():
        assert info["leader"] in brokers, (p, info)
        assert info["replicas"] == [info["leader"]] and info["isr"] == [info["leader"]], (p, info)
    assert d["topic_id"] and d["topic_id"] not in ZERO_UUIDS, d["topic_id"]
    assert d["authorized_operations"] is None, f"not asked for, yet reported: {d['authorized_operations']}"
    ops = client.describe_topic_detail(topic, authorized_operations=True)["authorized_operations"]
    assert ops is not None, "asked for the topic's authorized operations, got none (-2147483648)"
    assert {"DESCRIBE", "READ", "WRITE"} <= ops <= TOPIC_OPS, ops
    try:
        client.describe_topic_detail(unique_topic("absent"))
    except ClientError as e:
        assert e.name == "UNKNOWN_TOPIC_OR_PARTITION", e
    else:
        raise AssertionError("describing a topic that does not exist succeeded")


@s.scenario("topic.authorized-operations", "cluster admin", needs=(base.TOPIC_AUTHORIZED_OPS,), apis=(3,),
            consumes=False)
def test_topic_authorized_operations(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=1)
    ops = client.topic_authorized_operations(topic)
    assert ops is not None, "asked for the topic's authorized operations, got none (-2147483648)"
    assert {"DESCRIBE", "READ", "WRITE"} <= ops <= TOPIC_OPS, ops


@s.scenario("group.authorized-operations", "cluster admin", needs=(base.GROUP_AUTHORIZED_OPS,), apis=(15, 8, 10),
            consumes=False)
def test_group_authorized_operations(client: Client, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=1)
    group = f"compat-group-ops-{uuid.uuid4().hex[:10]}"
    helper.commit_offsets(group, topic, {0: 0})
    try:
        ops = client.group_authorized_operations(group)
        assert ops is not None, "asked for the group's authorized operations, got none (-2147483648)"
        assert {"DESCRIBE", "READ"} <= ops <= GROUP_OPS, ops
    finally:
        try:
            helper.delete_group(group)
        except ClientError:
            pass


def _replica_dirs(client: Client, broker: int, topic: str, partition: int) -> dict[str, dict[str, Any]]:
    dirs = client.describe_log_dirs(broker)
    return {path: d["replicas"][(topic, partition)] for path, d in dirs.items() if (topic, partition) in d["replicas"]}


@s.scenario("logdirs.describe", "cluster admin", needs=(base.LOG_DIRS,), apis=(35,), consumes=False)
def test_describe_log_dirs(client: Client, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=2)
    msgs = text_msgs(20, partition=0)
    helper.produce(topic, msgs)
    written = sum(len(m.value or b"") + len(m.key or b"") for m in msgs)
    leaders = helper.partition_leaders(topic)
    broker = leaders[0]
    dirs = client.describe_log_dirs(broker)
    assert dirs, "no log dirs described"
    where = _replica_dirs(client, broker, topic, 0)
    current = {p: r for p, r in where.items() if not r["future"]}
    assert len(current) == 1, f"partition 0 should be in exactly one log dir: {where}"
    (path, replica), = current.items()
    assert dirs[path]["error"] is None, dirs[path]
    assert replica["size"] >= written, f"partition 0 holds {written} bytes of keys and values, described {replica}"
    # In a cluster partition 1 may live on another broker: asked of its own leader.
    assert len(_replica_dirs(client, leaders[1], topic, 1)) == 1, "partition 1 is not described"


@s.scenario("logdirs.alter-replica", "cluster admin", needs=(base.LOG_DIRS, base.ALTER_LOG_DIRS), apis=(34, 35, 0, 1))
def test_alter_replica_log_dirs(client: Client, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=1)
    helper.produce(topic, text_msgs(10, partition=0))
    broker = helper.partition_leaders(topic)[0]
    online = sorted(p for p, d in client.describe_log_dirs(broker).items() if d["error"] is None)
    if len(online) < 2:
        pytest.skip(f"{s.NS_CLUSTER}: broker {broker} has {len(online)} online log dir(s), moving a replica needs two")
    (source,) = [p for p, r in _replica_dirs(client, broker, topic, 0).items() if not r["future"]]
    target = next(p for p in online if p != source)
    client.alter_replica_log_dir(topic, 0, broker, target)

    def moved() -> bool:
        where = _replica_dirs(client, broker, topic, 0)
        return list(where) == [target] and not where[target]["future"]

    wait_until(moved, 60, interval=0.5, what=f"partition 0 to move from {source} to {target}")
    # The partition keeps its records and takes new ones.
    helper.produce(topic, text_msgs(5, prefix="after", partition=0))
    recs = helper.consume(topic, [0], count=15)
    assert [r.offset for r in recs] == list(range(15))
    assert [r.value for r in recs[10:]] == [f"after-value-{i}".encode() for i in range(5)]


@s.scenario("leaders.elect-preferred", "cluster admin", needs=(base.ELECT_LEADERS,), apis=(43,), consumes=False)
def test_elect_preferred(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=2)
    # Every partition is already led by its preferred (only) replica.
    assert client.elect_leaders(topic, [0, 1]) == {0: "ELECTION_NOT_NEEDED", 1: "ELECTION_NOT_NEEDED"}
    absent = unique_topic("absent")
    try:
        res = client.elect_leaders(absent, [0])
    except ClientError as e:
        assert e.name == "UNKNOWN_TOPIC_OR_PARTITION", e
    else:
        assert res == {0: "UNKNOWN_TOPIC_OR_PARTITION"}, res


@s.scenario("reassignments.same-replicas", "cluster admin", needs=(base.REASSIGNMENTS,), apis=(45, 46),
            consumes=False)
def test_reassignments(client: Client, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=2)
    leaders = helper.partition_leaders(topic)
    assert client.list_reassignments(topic, [0, 1]) == {}
    # To the replicas it already has: accepted, and complete at once.
    assert client.alter_reassignments(topic, {0: [leaders[0]]}) == {0: None}
    wait_until(lambda: client.list_reassignments(topic, [0, 1]) == {}, 20, what="no reassignment in progress")
    # Nothing to cancel (kafkajs cannot express a cancellation; the rest still applies to it).
    try:
        assert client.alter_reassignments(topic, {1: None}) == {1: "NO_REASSIGNMENT_IN_PROGRESS"}
    except NotSupportedByClient:
        pass
    # A broker that does not exist.
    nowhere = max(helper.metadata()["brokers"]) + 1000
    assert client.alter_reassignments(topic, {1: [nowhere]}) == {1: "INVALID_REPLICA_ASSIGNMENT"}
    assert helper.partition_leaders(topic) == leaders


@s.scenario("quotas.client-id", "cluster admin", needs=(base.CLIENT_QUOTAS,), apis=(48, 49), consumes=False)
def test_client_quotas(client: Client) -> None:
    entity = {"client-id": f"compat-quota-{uuid.uuid4().hex[:10]}"}
    assert client.describe_client_quotas(entity) == {}
    try:
        client.alter_client_quotas(entity, {"producer_byte_rate": 1024.0}, validate_only=True)
        time.sleep(0.5)
        assert client.describe_client_quotas(entity) == {}, "validate_only changed the quotas"
        client.alter_client_quotas(entity, {"producer_byte_rate": 1024.0, "consumer_byte_rate": 2048.0})
        want = {"producer_byte_rate": 1024.0, "consumer_byte_rate": 2048.0}
        wait_until(lambda: client.describe_client_quotas(entity) == want, 20, what=f"quotas {want}")
        client.alter_client_quotas(entity, {"producer_byte_rate": None})
        wait_until(lambda: client.describe_client_quotas(entity) == {"consumer_byte_rate": 2048.0}, 20,
                   what="producer_byte_rate removed")
        # An unknown quota key is never stored. Kafka's controller means to answer INVALID_REQUEST, but
        # releases whose ClientQuotaControlManager records the entity's result after the key check
        # answer NONE: either is Kafka's behaviour.
        try:
            client.alter_client_quotas(entity, {"no_such_quota": 1.0})
        except ClientError as e:
            assert e.name == "INVALID_REQUEST", e
        time.sleep(0.5)
        assert client.describe_client_quotas(entity) == {"consumer_byte_rate": 2048.0}
    finally:
        client.alter_client_quotas(entity, {"producer_byte_rate": None, "consumer_byte_rate": None})
    wait_until(lambda: client.describe_client_quotas(entity) == {}, 20, what="quotas removed")


@s.scenario("offsets.max-timestamp", "offsets", needs=(base.MAX_TIMESTAMP, base.TIMESTAMPS), apis=(2, 0))
def test_max_timestamp(client: Client, helper: Client, cluster: ClusterInfo, new_topic) -> None:  # type: ignore[no-untyped-def]
    if cluster.api_versions[2][1] < 7:
        pytest.skip(f"{s.NS_BROKER}: ApiVersions: ListOffsets v7+ (MAX_TIMESTAMP) is needed, the broker "
                    f"advertises v{cluster.api_versions[2][0]}–{cluster.api_versions[2][1]}")
    topic = new_topic(partitions=1)
    t0 = (int(time.time()) - 600) * 1000
    # The largest timestamp is neither the first nor the last record, of its batch or of the log.
    first = [Msg(value=b"a", timestamp=t0, partition=0), Msg(value=b"b", timestamp=t0 + 5000, partition=0),
             Msg(value=b"c", timestamp=t0 + 1000, partition=0)]
    second = [Msg(value=b"d", timestamp=t0 + 2000, partition=0), Msg(value=b"e", timestamp=t0 + 3000, partition=0)]
    client.produce(topic, first)
    client.produce(topic, second)
    assert client.max_timestamp_offset(topic, 0) == (1, t0 + 5000)
    empty = new_topic(partitions=1)
    assert client.max_timestamp_offset(empty, 0)[0] == -1


@s.scenario("offsets.validate-leader-epoch", "offsets", needs=(base.EPOCH_VALIDATION,), apis=(23, 0, 1))
def test_validate_leader_epoch(client: Client, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=1)
    msgs = text_msgs(10, partition=0)
    helper.produce(topic, msgs)
    # Seeking with the record's leader epoch makes the consumer ask OffsetForLeaderEpoch where that
    # epoch ends; with auto.offset.reset=none an answer below the position would surface as log truncation.
    recs = client.consume_validated(topic, 0, 4, 6)
    assert [r.offset for r in recs] == list(range(4, 10))
    assert [r.value for r in recs] == [m.value for m in msgs[4:]]


@s.scenario("telemetry.client-instance-id", "cluster admin", needs=(base.CLIENT_INSTANCE_ID,), apis=(71, 72),
            consumes=False)
def test_client_instance_id(client: Client) -> None:
    first = client.client_instance_id()
    assert first and first not in ZERO_UUIDS, first
    # Each client instance gets its own.
    assert client.client_instance_id() != first


@s.scenario("telemetry.push-subscribed", "cluster admin",
            needs=(base.PUSH_TELEMETRY,), apis=(71, 72, 44, 74), consumes=False)
def test_push_subscribed(client: Client, cluster: ClusterInfo) -> None:
    """A producer matched by a metrics subscription learns it (GetTelemetrySubscriptions) and pushes
    (PushTelemetry) every interval and when it closes; what it pushes is the broker's to keep."""
    # Named like the rest of the client's traffic (compat-<client>-...), which the coverage report attributes.
    client_id = f"compat-{client.name}-telemetry-{uuid.uuid4().hex[:10]}"
    name = f"compat-subscription-{uuid.uuid4().hex[:10]}"
    ops: list[tuple[str, str, str | None]] = [("set", "metrics", "org.apache.kafka.producer."),
                                              ("set", "interval.ms", "200"), ("set", "match", f"client_id={client_id}")]
    # The subscription is made with the Java client (CLIENT_METRICS resources are not in every admin API).
    admin = get_client("java", cluster)
    admin.alter_configs("client_metrics", name, ops)
    try:
        instance = client.push_telemetry(client_id, hold=1.5)
        assert instance is None or (instance and instance not in ZERO_UUIDS), instance
    finally:
        admin.alter_configs("client_metrics", name, [("delete", k, None) for _op, k, _v in ops])
