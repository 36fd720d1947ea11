"""The metrics endpoint of each broker in a replicating cluster: follower traffic, under-replicated
partitions while a follower is paused, the controller's offline-partition count, lag on a group's
coordinator."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.cluster.test_replication_faults import _create, _wait_isr
from tests.integration.test_metrics import scrape, total, value
from tests.support.broker import free_port
from tests.support.cluster import Cluster, wait_for


def test_cluster_metrics(tmp_path: Path) -> None:
    ports = {i: free_port() for i in (1, 2, 3)}
    overrides = {"min.insync.replicas": "2", "replica.lag.time.max.ms": "2000",
                 "zookeeper.session.timeout.ms": "20000", "offsets.topic.replication.factor": "3"}
    per_broker = {i: {"pykbroker.metrics.listener": f"http://127.0.0.1:{p}"} for i, p in ports.items()}
    with Cluster(tmp_path, 3, overrides=overrides, broker_overrides=per_broker) as cluster:
        topic = _create(cluster)
        leader = cluster.wait_leaders(topic, 1)[0]
        followers = [b for b in cluster.brokers if b != leader]
        p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
        for i in range(500):
            p.produce(topic, value=b"v" * 100, key=str(i).encode(), partition=0)
        assert p.flush(30) == 0

        def replicated() -> bool:
            return all(value(scrape(ports[f]), "kafka_server_brokertopicmetrics_replicationbytesin_total",
                             topic=topic) >= 500 * 100 for f in followers)

        wait_for(replicated, timeout=20, what="followers' ReplicationBytesIn")
        lead = scrape(ports[leader])
        assert value(lead, "kafka_server_brokertopicmetrics_messagesin_total", topic=topic) == 500
        assert value(lead, "kafka_server_brokertopicmetrics_replicationbytesout_total", topic=topic) >= 500 * 100
        assert value(lead, "kafka_cluster_partition_underreplicated", topic=topic, partition="0") == 0
        for f in followers:  # followers count what they hold, not what they were sent by producers
            fs = scrape(ports[f])
            assert value(fs, "kafka_server_brokertopicmetrics_messagesin_total", topic=topic) == 0
            assert value(fs, "kafka_log_log_logendoffset", topic=topic, partition="0") == 500
        controllers = [value(scrape(ports[i]), "kafka_controller_kafkacontroller_activecontrollercount")
                       for i in ports]
        assert sorted(controllers) == [0, 0, 1]
        controller = cluster.controller_id()
        assert value(scrape(ports[controller]), "kafka_controller_kafkacontroller_offlinepartitionscount") == 0

        # A consumer group; its coordinator reports the lag of what it committed.
        group = f"g-{uuid.uuid4().hex[:6]}"
        c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False})
        try:
            c.commit(offsets=[TopicPartition(topic, 0, 120)], asynchronous=False)
        finally:
            c.close()
        # Only the coordinator reports the group; if it follows the partition, it computes the lag from the
        # high watermark it last learned from the leader, at most one replica fetch (replica.fetch.wait.max.ms)
        # behind: wait for it rather than take the first reading.
        def reported() -> list[float] | None:
            lags = [value(scrape(ports[i]), "kafka_consumergroup_lag", consumergroup=group, topic=topic,
                          partition="0") for i in ports
                    if total(scrape(ports[i]), "kafka_consumergroup_current_offset", consumergroup=group)]
            return lags if lags == [380] else None

        wait_for(reported, timeout=20, what="the group's coordinator (alone) reporting a lag of 380")

        cluster.pause(followers[0])
        try:
            _wait_isr(cluster, topic, [leader, followers[1]], via=[leader], timeout=20)
            lead = scrape(ports[leader])
            assert value(lead, "kafka_server_replicamanager_underreplicatedpartitions") >= 1
            assert value(lead, "kafka_cluster_partition_underreplicated", topic=topic, partition="0") == 1
            assert value(lead, "kafka_server_replicamanager_isrshrinks_total") >= 1
        finally:
            cluster.resume(followers[0])
        _wait_isr(cluster, topic, [1, 2, 3], timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and value(scrape(ports[leader]), "kafka_cluster_partition_underreplicated",
                                                    topic=topic, partition="0"):
            time.sleep(0.2)
        assert value(scrape(ports[leader]), "kafka_cluster_partition_underreplicated", topic=topic,
                     partition="0") == 0
        # The ISR churn the pause caused: the leader counted the shrink and the expansion that undid it.
        assert value(scrape(ports[leader]), "kafka_server_replicamanager_isrexpands_total") >= 1
