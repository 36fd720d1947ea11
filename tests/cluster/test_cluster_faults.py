"""Cluster faults: controller failover, controlled shutdown, ZooKeeper restarts, bad starts.

Each test starts its own cluster (ZooKeeper + brokers as subprocesses) so that it can kill or stop
any process; every wait is bounded.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest

from compat.clients import make_client
from compat.clients.base import Msg
from tests.cluster.steady import SteadyProducer, assert_nothing_lost, read_all
from tests.support.cluster import Cluster, metadata, wait_for

pytestmark = [pytest.mark.timeout(300)]


def _create(cluster: Cluster, partitions: int = 6, rf: int = 3, via: int | None = None) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    admin = make_client("confluent-kafka", cluster.broker(via).bootstrap if via else cluster.any_bootstrap())
    try:
        admin.create_topic(name, partitions, rf)
    finally:
        admin.close()
    cluster.wait_leaders(name, partitions)
    return name


def _round_trip(cluster: Cluster, topic: str, partitions: int) -> None:
    c = make_client("confluent-kafka", cluster.any_bootstrap())
    try:
        c.produce(topic, [Msg(f"rt{p}".encode(), partition=p) for p in range(partitions)], acks="all")
        for p in range(partitions):
            got = c.consume(topic, [p], count=1_000, idle=2.0, timeout=30)
            assert f"rt{p}".encode() in [r.value for r in got], f"partition {p}"
    finally:
        c.close()


def test_kill_controller_elects_a_new_one(tmp_path: Path) -> None:
    with Cluster(tmp_path, 3) as cluster:
        before = _create(cluster)
        old = cluster.controller_id()
        started = time.monotonic()
        cluster.kill(old)
        new = wait_for(lambda: (c := cluster.controller_id()) != old and c > 0 and c, timeout=30,
                       what="a new controller")
        elapsed = time.monotonic() - started
        assert new in cluster.running()
        # Within the session timeout (6 s here) plus the election.
        assert elapsed < 20, f"new controller after {elapsed:.1f}s"
        cluster.wait_registered([i for i in cluster.brokers if i != old])
        # Two brokers are left: RF 3 is refused as Kafka refuses it, RF 2 works.
        after = _create(cluster, rf=2)
        _round_trip(cluster, after, 6)
        # Partitions the dead broker led moved to live replicas.
        leaders = cluster.wait_leaders(before, 6, exclude=(old,))
        assert old not in leaders.values()
        _round_trip(cluster, before, 6)
        # The old controller comes back as a broker and rejoins every ISR of the RF 3 topic.
        cluster.broker(old).start()
        cluster.wait_registered(list(cluster.brokers))
        wait_for(lambda: all(sorted(isr) == [1, 2, 3] for _, _, isr in cluster.partition_states(before).values()),
                 timeout=60, what="the restarted broker back in every ISR")


def test_controlled_shutdown_moves_leaders_first(tmp_path: Path) -> None:
    with Cluster(tmp_path, 3) as cluster:
        topic = _create(cluster)
        leaders = cluster.wait_leaders(topic, 6)
        victim = max(cluster.brokers, key=lambda b: sum(1 for x in leaders.values() if x == b))
        others = [i for i in cluster.brokers if i != victim]
        producer = SteadyProducer(",".join(cluster.broker(i).bootstrap for i in others), topic).start()
        try:
            wait_for(lambda: producer.acked_count() > 200, timeout=30, what="steady acknowledged produce")
            rc = cluster.stop(victim, timeout=60)
            assert rc == 0, cluster.broker(victim).log()[-3000:]
            log = cluster.broker(victim).log()
            assert "controlled shutdown" in log.lower(), log[-3000:]
            # Leadership moved while the broker was still up: every partition has a live leader at once.
            now = cluster.wait_leaders(topic, 6, exclude=(victim,), timeout=10)
            assert victim not in now.values()
            acked = producer.acked_count()
            wait_for(lambda: producer.acked_count() > acked + 200, timeout=30, what="produce to go on")
            # Once out of the ISRs it follows, a stopping broker stays out (it no longer fetches).
            began = next(line[:24] for line in log.splitlines() if "asking the controller" in line)
            for i in others:
                readded = [line for line in cluster.broker(i).log().splitlines()
                           if line[:24] >= began and "Expanding ISR" in line
                           and line.rstrip().endswith(("]",)) and str(victim) in line.rsplit(" to ", 1)[-1]]
                assert not readded, readded[:3]
            cluster.broker(victim).start()
            cluster.wait_registered(list(cluster.brokers))
            # It catches up and rejoins every ISR.
            wait_for(lambda: all(sorted(isr) == [1, 2, 3] for _, _, isr in cluster.partition_states(topic).values()),
                     timeout=60, what="the restarted broker back in every ISR")
        finally:
            producer.stop()
        assert not producer.errors, producer.errors[:5]
        seen = read_all(cluster.any_bootstrap(), topic, 6)
        assert_nothing_lost(producer, seen)


@pytest.mark.parametrize("outage", [2.0, 9.0], ids=["shorter-than-session", "sessions-expire"])
def test_zookeeper_restart_under_load(tmp_path: Path, outage: float) -> None:
    with Cluster(tmp_path, 3) as cluster:
        topic = _create(cluster)
        producer = SteadyProducer(cluster.bootstrap, topic).start()
        try:
            wait_for(lambda: producer.acked_count() > 200, timeout=30, what="steady acknowledged produce")
            cluster.zk.stop()
            time.sleep(outage)
            cluster.zk.start()
            cluster.wait_registered(list(cluster.brokers), timeout=60)
            acked = producer.acked_count()
            wait_for(lambda: producer.acked_count() > acked + 200, timeout=60, what="produce to go on")
            # The controller works again: a new topic gets leaders.
            _round_trip(cluster, _create(cluster), 6)
        finally:
            producer.stop()
        assert not producer.errors, producer.errors[:5]
        assert_nothing_lost(producer, read_all(cluster.any_bootstrap(), topic, 6))


def test_cluster_on_a_three_node_ensemble_survives_losing_one(tmp_path: Path) -> None:
    with Cluster(tmp_path, 3, zk_size=3) as cluster:
        topic = _create(cluster)
        cluster.zk.servers[0].kill()
        _round_trip(cluster, topic, 6)
        _round_trip(cluster, _create(cluster), 6)
        md = metadata(cluster.any_bootstrap(), [])
        assert sorted(b.node_id for b in md.brokers) == [1, 2, 3]


def test_restarted_broker_takes_no_role_before_the_controller_confirms_it(tmp_path: Path) -> None:
    """A leader killed with SIGKILL and started again at once (its previous ZooKeeper session still holds its
    registration): the new run leads nothing, and coordinates nothing, until the controller has moved what
    the previous run led and confirmed the new registration; then it takes its roles back."""
    with Cluster(tmp_path, 3) as cluster:
        topic = _create(cluster)
        _round_trip(cluster, topic, 6)
        victim = cluster.wait_leaders(topic, 6)[0]
        log_before = len(cluster.broker(victim).log())
        cluster.kill(victim)
        cluster.broker(victim).start()
        cluster.wait_registered(list(cluster.brokers), timeout=60)

        def run_log() -> str:
            return cluster.broker(victim).log()[log_before:]

        wait_for(lambda: "confirmed by the controller" in run_log(), timeout=60,
                 what="the controller's confirmation of the restarted broker")
        text = run_log()
        confirmed_at = text.index("confirmed by the controller")
        assert text.index("registered with broker epoch") < confirmed_at, text[-4000:]
        for role in (r"Became leader of", r"Became follower of", r"loaded \d+ __\w+ partition"):
            found = re.search(role, text)
            assert found is None or found.start() > confirmed_at, \
                f"{role!r} before the confirmation:\n{text[:confirmed_at][-4000:]}"
        assert any(f"broker {victim} confirmed" in cluster.broker(i).log() for i in cluster.brokers)
        # The partition it led went to another replica first; it is back in every ISR afterwards.
        wait_for(lambda: all(sorted(isr) == [1, 2, 3] for _, _, isr in cluster.partition_states(topic).values()),
                 timeout=60, what="the restarted broker back in every ISR")
        _round_trip(cluster, topic, 6)
