"""The admin CLI against a 3-broker ZooKeeper cluster: what it shows of brokers, replicas and ISR, and that
changes made through one broker are seen through the others."""

from __future__ import annotations

from tests.integration.test_admin_cli import cli, unique
from tests.support.cluster import Cluster, wait_for


def test_cluster_info_shows_every_broker_and_the_controller(cluster: Cluster) -> None:
    doc = cli("cluster", "info", "-o", "json", bootstrap=cluster.bootstrap).doc
    ids = sorted(cluster.running())
    assert [b["id"] for b in doc["brokers"]] == ids == [1, 2, 3]
    assert doc["controller"] == cluster.controller_id()
    assert [b["controller"] for b in doc["brokers"]] == [b == doc["controller"] for b in ids]


def test_topics_with_three_replicas_and_configs_through_another_broker(cluster: Cluster) -> None:
    t = unique("admin-rf3")
    first, other = cluster.broker(1).bootstrap, cluster.broker(3).bootstrap
    cli("topic", "create", t, "-p", "3", "-r", "3", "-c", "min.insync.replicas=2", bootstrap=first)
    cluster.wait_leaders(t, 3)

    def described() -> dict | None:
        (doc,) = cli("topic", "describe", t, "-o", "json", bootstrap=other).doc
        in_sync = all(sorted(p["isr"]) == [1, 2, 3] for p in doc["partitions"])
        return doc if len(doc["partitions"]) == 3 and in_sync else None

    doc = wait_for(described, timeout=30, what="three partitions with all three replicas in sync")
    assert doc["configs"] == {"min.insync.replicas": "2"}
    assert all(sorted(p["replicas"]) == [1, 2, 3] and p["leader"] in (1, 2, 3) for p in doc["partitions"])
    assert sorted(p["leader"] for p in doc["partitions"]) == [1, 2, 3]  # leaders spread, one per broker

    cli("config", "set", "topic", t, "retention.ms=60000", bootstrap=other)
    got = cli("config", "get", "topic", t, "retention.ms", "-o", "json", bootstrap=first).doc
    assert got["configs"][0]["value"] == "60000"
    too_many = cli("topic", "create", unique("admin-rf4"), "-r", "4", "-o", "json", bootstrap=first, expect=1)
    assert too_many.doc[0]["error"] == "INVALID_REPLICATION_FACTOR"
    cli("topic", "delete", t, bootstrap=other)
    wait_for(lambda: cli("topic", "list", t, "-o", "json", bootstrap=first).doc == [], timeout=30,
             what="the deleted topic gone from every broker's answer")


def test_a_broker_config_set_on_one_broker(cluster: Cluster) -> None:
    broker_id = 2
    b = cluster.bootstrap
    cli("config", "set", "broker", str(broker_id), "log.cleaner.threads=3", bootstrap=b)
    got = cli("config", "get", "broker", str(broker_id), "log.cleaner.threads", "-o", "json",
              bootstrap=cluster.broker(broker_id).bootstrap).doc
    assert got["configs"][0]["value"] == "3" and got["configs"][0]["source"] == "DYNAMIC_BROKER_CONFIG"
    cli("config", "delete", "broker", str(broker_id), "log.cleaner.threads", bootstrap=b)
