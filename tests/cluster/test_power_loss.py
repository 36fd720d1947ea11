"""Power losses: every broker's log dir on a filesystem that drops every write not yet fsynced when its power
goes (tests/support/lazyfs.py), brokers SIGKILLed with it, under an idempotent acks=all producer.

- with ``log.flush.on.ack=true``, a power loss of the whole cluster loses nothing acknowledged, also when it
  reaches a leader first and the followers that took over moments later;
- without it, a power loss of one broker loses nothing acknowledged (replication, not fsync, protects acks=all),
  though that broker itself lost what it had not fsynced; a power loss of the whole cluster loses what no replica
  had fsynced, acknowledged or not, and the cluster serves again (docs/reliability.md, "Power loss").
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.steady import SteadyProducer, assert_nothing_lost, read_all
from tests.support.cluster import Cluster, wait_for
from tests.support.lazyfs import LazyFs

PARTITIONS = 3
OVERRIDES = {"min.insync.replicas": "2", "unclean.leader.election.enable": "false",
             "auto.leader.rebalance.enable": "false"}


@contextmanager
def lazy_cluster(base: Path, overrides: dict[str, str]) -> Iterator[tuple[Cluster, dict[int, LazyFs]]]:
    """Three brokers, each with its log dir on its own lazyfs."""
    cluster = Cluster(base, 3, overrides={**OVERRIDES, **overrides})
    disks = {i: LazyFs(base / f"disk{i}", Path(b.overrides["log.dirs"])) for i, b in cluster.brokers.items()}
    try:
        for disk in disks.values():
            disk.mount()
        with cluster:
            yield cluster, disks
    finally:
        for disk in disks.values():
            disk.power_off()


def _topic(cluster: Cluster) -> str:
    topic = f"power-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "broker.address.family": "v4"})
    admin.create_topics([NewTopic(topic, PARTITIONS, 3)])[topic].result(timeout=30)
    cluster.wait_leaders(topic, PARTITIONS, timeout=60)
    return topic


def _acked_at_least(producer: SteadyProducer, n: int, what: str) -> None:
    wait_for(lambda: producer.acked_count() >= n or None, timeout=60, interval=0.1, what=what)


def _power_loss(cluster: Cluster, disks: dict[int, LazyFs], ids: list[int]) -> None:
    """The power goes on ``ids`` at once (SIGKILL, unsynced data dropped), then comes back: mounted, started."""
    for i in ids:
        cluster.kill(i)
    _power_back(cluster, disks, ids)


def _power_back(cluster: Cluster, disks: dict[int, LazyFs], ids: list[int]) -> None:
    for i in ids:
        disks[i].power_off()
    for i in ids:
        disks[i].mount()
    for i in ids:
        cluster.broker(i).start(timeout=60)
    cluster.wait_registered(list(cluster.brokers), timeout=60)


def _log_bytes(root: Path, topic: str) -> int:
    return sum(f.stat().st_size for f in root.glob(f"{topic}-*/*.log"))


def _all_in_isr(cluster: Cluster, topic: str) -> bool | None:
    try:
        states = cluster.partition_states(topic)
    except (OSError, ConnectionError):
        return None
    return all(sorted(isr) == [1, 2, 3] for _, _, isr in states.values()) or None


def test_whole_cluster_power_loss_keeps_every_acknowledged_record_with_flush_on_ack(tmp_path: Path) -> None:
    with lazy_cluster(tmp_path, {"log.flush.on.ack": "true"}) as (cluster, disks):
        topic = _topic(cluster)
        producer = SteadyProducer(cluster.bootstrap, topic, rate=100, max_seconds=120).start()
        _acked_at_least(producer, 150, "acknowledgements before the power loss")
        # Mid-load, the power goes on the leader of partition 0 first; once a follower leads in its place (with
        # what it fetched as a follower), on the other two.
        first = cluster.leaders(topic)[0]
        cluster.kill(first)
        cluster.wait_leaders(topic, PARTITIONS, exclude=(first,), timeout=60)
        for i in sorted(set(cluster.brokers) - {first}):
            cluster.kill(i)
        _power_back(cluster, disks, [1, 2, 3])
        before = producer.acked_count()
        _acked_at_least(producer, before + 100, "acknowledgements after the power came back")
        producer.stop()
        assert not producer.errors, producer.errors[:5]
        assert_nothing_lost(producer, read_all(cluster.bootstrap, topic, PARTITIONS))


def test_power_loss_without_flush_on_ack_one_broker_then_the_whole_cluster(tmp_path: Path) -> None:
    with lazy_cluster(tmp_path, {}) as (cluster, disks):
        topic = _topic(cluster)
        producer = SteadyProducer(cluster.bootstrap, topic, rate=100, max_seconds=120).start()
        _acked_at_least(producer, 150, "acknowledgements before the power loss")

        # One broker: it loses what it had not fsynced, the other replicas keep every acknowledged record.
        logs = Path(cluster.broker(1).overrides["log.dirs"])
        seen = _log_bytes(logs, topic)
        _power_loss(cluster, disks, [1])
        kept = _log_bytes(tmp_path / "disk1", topic)
        assert kept < seen, f"broker 1 kept {kept} of the {seen} log bytes it had: nothing unsynced was dropped"
        before = producer.acked_count()
        _acked_at_least(producer, before + 100, "acknowledgements after broker 1 came back")
        producer.stop()
        assert not producer.errors, producer.errors[:5]
        wait_for(lambda: _all_in_isr(cluster, topic), timeout=60, interval=0.5, what="broker 1 back in every ISR")
        assert_nothing_lost(producer, read_all(cluster.bootstrap, topic, PARTITIONS))

        # The whole cluster: what no replica had fsynced is gone, acknowledged or not; the cluster serves again.
        acked = dict(producer.acked)
        _power_loss(cluster, disks, [1, 2, 3])
        cluster.wait_leaders(topic, PARTITIONS, timeout=60)
        after = read_all(cluster.bootstrap, topic, PARTITIONS)
        lost = [v for v in acked if v not in after]
        assert lost, f"all {len(acked)} acknowledged records survived a power loss without any fsync"
        assert all(after[v] == [acked[v]] for v in after if v in acked), "a surviving record moved"
        again = SteadyProducer(cluster.bootstrap, topic, rate=100, max_seconds=60, prefix="again-").start()
        _acked_at_least(again, 50, "acknowledgements after the whole cluster came back")
        again.stop()
        assert not again.errors, again.errors[:5]
        final = read_all(cluster.bootstrap, topic, PARTITIONS)
        assert_nothing_lost(again, final)
