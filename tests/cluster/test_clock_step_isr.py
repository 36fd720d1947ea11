"""A leader whose wall clock stepped back still drops a follower that stopped fetching from the ISR after
replica.lag.time.max.ms: the follower's last caught-up time is measured on the monotonic clock, so acks=all
produces wait seconds, not the length of the step (tests/support/faketime.py: Debian's libfaketime). The
follower is paused (SIGSTOP) with a ZooKeeper session timeout longer than the test, so only the lag check can
take it out of the ISR."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.cluster import Cluster, wait_for
from tests.support.faketime import WallClock

STEP_S = 300.0
LAG_S = 4.0  # replica.lag.time.max.ms of tests/support/cluster.py
SESSION_MS = 40000


def test_leader_clock_step_back_still_drops_a_stalled_follower_from_the_isr(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 3, overrides={"min.insync.replicas": "2",
                                              "zookeeper.session.timeout.ms": str(SESSION_MS)})
    clock = WallClock(tmp_path / "faketime")
    clock.attach(cluster.broker(1))
    with cluster:
        topic = f"step-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "broker.address.family": "v4"})
        admin.create_topics([NewTopic(topic, 1, replica_assignment=[[1, 2, 3]])])[topic].result(timeout=30)
        cluster.wait_leaders(topic, 1, timeout=60)
        assert cluster.leaders(topic) == {0: 1}
        wait_for(lambda: cluster.partition_states(topic)[0][2] == [1, 2, 3] or None, timeout=30,
                 what="all three replicas in the ISR")
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "broker.address.family": "v4", "acks": "all",
                             "enable.idempotence": True, "linger.ms": 0, "message.timeout.ms": 60000})
        delivered: list[tuple[KafkaError | None, float]] = []
        producer.produce(topic, b"before", on_delivery=lambda e, m: delivered.append((e, time.monotonic())))
        assert producer.flush(30) == 0 and delivered[0][0] is None

        clock.set(-STEP_S)
        cluster.pause(3)
        sent = time.monotonic()
        producer.produce(topic, b"after", on_delivery=lambda e, m: delivered.append((e, time.monotonic())))
        assert producer.flush(SESSION_MS / 1000 - 10) == 0, "acks=all produce still waiting for the stalled follower"
        err, at = delivered[1]
        assert err is None, err
        assert at - sent < LAG_S + 10, f"acknowledged {at - sent:.1f} s after the send"  # the lag, not the step
        wait_for(lambda: cluster.partition_states(topic, via=2)[0][2] == [1, 2] or None, timeout=10,
                 what="the ISR without the stalled follower")
