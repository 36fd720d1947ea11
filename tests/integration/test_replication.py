"""Replication in a real cluster: ZooKeeper and three broker subprocesses, a topic with three replicas.

acks=all produce continues once a killed follower leaves the ISR (replica.lag.time.max.ms), the
follower catches up and rejoins after a restart, and every replica's log holds the same batches.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from compat.clients import make_client
from pykbroker.protocol.records import build_batch
from pykbroker.storage.log import Log
from pykbroker.storage.log_config import LogConfig
from tests.support.cluster import Cluster, raw_request, wait_for
from tests.support.zookeeper import zookeeper_available

if not zookeeper_available():  # scripts/install.sh --test installs Debian's zookeeper package
    raise RuntimeError("ZooKeeper (Debian package zookeeper) is needed by this test: run scripts/install.sh --test")

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("replication")]

T0 = 1_700_000_000_000




def produce(bootstrap: str, topic: str, value: bytes, *, acks: int = -1, timeout_ms: int = 20_000) -> Any:
    """One Produce v9 of one batch to partition 0 on a fresh connection; the partition response."""
    batch = build_batch([(b"k", value, [])], timestamp_ms=T0)
    body = {"transactional_id": None, "acks": acks, "timeout": timeout_ms, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}
    resp = raw_request(bootstrap, 0, 9, body, timeout=timeout_ms / 1000 + 10, client_id="replication-test")
    return resp.responses[0].partition_responses[0]


def log_bytes(path: Path) -> bytes:
    lg = Log.open(path, LogConfig(), recover=True)
    try:
        out, off = b"", lg.log_start_offset
        for _ in range(10_000):
            if off >= lg.log_end_offset:
                break
            r = lg.read(off, 1 << 20)
            out, off = out + r.records, r.next_offset
        return out
    finally:
        lg.close()


def test_follower_killed_leaves_the_isr_then_catches_up(tmp_path: Path) -> None:
    with Cluster(tmp_path, 3, overrides={"replica.lag.time.max.ms": "3000"}) as cluster:
        admin = make_client("confluent-kafka", cluster.any_bootstrap())
        try:
            admin.create_topic("r", 1, 3, {"min.insync.replicas": "2"})
        finally:
            admin.close()
        leader = cluster.wait_leaders("r", 1)[0]
        lb = cluster.broker(leader).bootstrap
        wait_for(lambda: cluster.partition_states("r")[0][2] == [1, 2, 3], what="a full ISR")
        for i in range(20):
            r = produce(lb, "r", b"before-%d" % i)
            assert r.error_code == ErrorCode.none, r
            assert r.base_offset == i

        follower = next(i for i in cluster.brokers if i != leader)
        cluster.kill(follower)
        started = time.monotonic()
        r = produce(lb, "r", b"during-0")  # waits for the ISR to drop the dead follower
        assert r.error_code == ErrorCode.none, (r, cluster.logs())
        waited = time.monotonic() - started
        assert 1.0 < waited < 15, waited  # about replica.lag.time.max.ms: the follower was in the ISR until then
        wait_for(lambda: sorted(set(cluster.brokers) - {follower}) == cluster.partition_states("r", via=leader)[0][2],
                 timeout=10, what="the ISR without the killed follower")
        for i in range(1, 20):
            assert produce(lb, "r", b"during-%d" % i).error_code == ErrorCode.none
        time.sleep(1)  # idle: the other follower's fetches must not bring the dead one back
        assert follower not in cluster.partition_states("r", via=leader)[0][2]

        cluster.broker(follower).start()
        wait_for(lambda: cluster.partition_states("r", via=leader)[0][2] == [1, 2, 3], timeout=30,
                 what="the restarted follower back in the ISR")
        for i in range(20):
            assert produce(lb, "r", b"after-%d" % i).error_code == ErrorCode.none
        assert cluster.leaders("r")[0] == leader
        logs = {i: cluster.broker(i).data_dir / "logs" / "r-0" for i in cluster.brokers}
    # Every broker is down (killed); the three logs hold the same 60 batches, byte for byte.
    contents = {i: log_bytes(p) for i, p in logs.items()}
    assert len(set(contents.values())) == 1
    assert contents[leader].count(b"after-19") == 1
