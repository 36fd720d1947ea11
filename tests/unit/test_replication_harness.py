"""Leader and follower in one process: a real broker (the leader, over TCP) and a follower ReplicaManager.

The leader is an embedded broker whose partition is then given replicas [1, 2]; ISR changes go to a
recording writer instead of ZooKeeper.  Covers acks=all waiting for the follower, REQUEST_TIMED_OUT,
ISR shrink after replica.lag.time.max.ms (NOT_ENOUGH_REPLICAS_AFTER_APPEND, then NOT_ENOUGH_REPLICAS
with min.insync.replicas=2), catching up and rejoining the ISR, and truncation by diverging epoch.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.abc import SocketAttribute
from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.protocol import codec
from pykbroker.protocol.framing import FrameDecoder
from pykbroker.protocol.records import build_batch, validate_for_append
from pykbroker.replica.replica_manager import Partition, ReplicaManager
from pykbroker.server.broker import Broker
from pykbroker.storage.log import Log, LogStartOffsetIncrementReason
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.log_manager import REPLICATION_OFFSET_CHECKPOINT_FILE, LogManager, read_offset_checkpoint
from tests.unit.test_dispatcher import frame_for

T0 = 1_700_000_000_000
FAST = {"replica.fetch.wait.max.ms": "100", "replica.fetch.backoff.ms": "50", "replica.lag.time.max.ms": "300",
        "replica.socket.timeout.ms": "3000", "replica.high.watermark.checkpoint.interval.ms": "200"}

DELETE_RECORDS = LogStartOffsetIncrementReason.CLIENT_RECORD_DELETION


async def acall(b: Broker, api_key: int, version: int, body: dict[str, Any]) -> Any:
    out = await b.dispatcher.handle(frame_for(api_key, version, body))
    assert out is not None
    dec = FrameDecoder(1 << 30)
    dec.feed(out)
    payload = dec.next_frame()
    assert payload is not None and struct.unpack_from(">i", payload, 0)[0] == 1
    return codec.decode_response(api_key, version, payload, 5 if codec.is_flexible(api_key, version) else 4)


async def produce(b: Broker, acks: int = -1, timeout_ms: int = 5000, n: int = 2) -> Any:
    batch = build_batch([(b"k", b"v" * 30, [])] * n, timestamp_ms=T0)
    resp = await acall(b, 0, 9, {"acks": acks, "timeout": timeout_ms, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": batch}]}]})
    return resp.responses[0].partition_responses[0]


def log_bytes(lg: Log) -> bytes:
    out, off = b"", lg.log_start_offset
    for _ in range(1000):
        if off >= lg.log_end_offset:
            break
        r = lg.read(off, 1 << 20)
        out, off = out + r.records, r.next_offset
    return out


async def until(cond: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    with anyio.move_on_after(timeout):
        for _ in range(int(timeout / 0.01) + 1):
            if cond():
                return
            await anyio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class Follower:
    """Broker 2's replica manager; its replication runs in a cancellable scope (a killed and restarted follower)."""

    def __init__(self, tmp_path: Path, port: int, tg: anyio.abc.TaskGroup) -> None:
        self.config = BrokerConfig({"log.dirs": str(tmp_path / "f"), "listeners": "PLAINTEXT://127.0.0.1:0",
                                    "broker.id": "2", **FAST})
        self.lm = LogManager(self.config.log_dirs, LogConfig())
        self.lm.startup()
        self.lm.startup_complete()
        self.rm = ReplicaManager(2, self.lm)
        self.rm.set_cluster(lambda b: ("127.0.0.1", port) if b == 1 else None, _no_isr_writes)
        self.tg = tg
        self.scope: anyio.CancelScope | None = None

    def start(self) -> None:
        async def run() -> None:
            with anyio.CancelScope() as scope:
                self.scope = scope
                await self.rm.run_replication(self.config)
        self.tg.start_soon(run)

    def stop(self) -> None:
        assert self.scope is not None
        self.scope.cancel()

    def follow(self, epoch: int) -> Partition:
        p = self.rm.make_follower("t", 0, LogConfig(), leader_id=1, leader_epoch=epoch, replicas=[1, 2],
                                  isr=[1, 2], zk_version=0)
        assert p is not None
        return p


async def _no_isr_writes(topic: str, index: int, epoch: int, isr: list[int], version: int) -> int:
    raise AssertionError("a follower writes no ISR")


def isr_recorder(writes: list[list[int]]) -> Callable[[str, int, int, list[int], int], Awaitable[int]]:
    async def write(topic: str, index: int, epoch: int, isr: list[int], version: int) -> int:
        writes.append(list(isr))
        return version + 1
    return write


def test_leader_and_follower_in_process(tmp_path: Path) -> None:
    async def main() -> None:
        cfg = BrokerConfig({"log.dirs": str(tmp_path / "l"), "listeners": "PLAINTEXT://127.0.0.1:0",
                            "broker.id": "1", "min.insync.replicas": "2", **FAST})
        b = Broker(cfg)
        b.startup()
        writes: list[list[int]] = []
        try:
            async with anyio.create_task_group() as tg:
                listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
                port = listener.extra(SocketAttribute.local_port)
                tg.start_soon(b.server.serve_listener, listener, "PLAINTEXT", tg)
                b.replicas.set_cluster(lambda _b: None, isr_recorder(writes))
                tg.start_soon(b.replicas.run_replication, cfg)
                created = await acall(b, 19, 7, {"topics": [{"name": "t", "num_partitions": 1,
                                                             "replication_factor": 1, "assignments": [],
                                                             "configs": []}], "timeout": 1000})
                assert created.topics[0].error_code == ErrorCode.none
                leader = b.replicas.make_leader("t", 0, LogConfig(), leader_epoch=1, replicas=[1, 2], isr=[1, 2],
                                                zk_version=0)
                assert leader is not None and leader.is_leader
                f = Follower(tmp_path, port, tg)
                follower_lm.append(f.lm)
                fp = f.follow(1)
                f.start()

                # acks=all waits for the follower's fetch: then both logs hold the same bytes.
                r = await produce(b)
                assert r.error_code == ErrorCode.none and r.base_offset == 0
                assert leader.high_watermark == 2
                await until(lambda: fp.high_watermark == 2, "the follower's HW")
                assert log_bytes(fp.log) == log_bytes(leader.log)
                assert not fp.is_leader and fp.leader_id == 1

                # The follower stops: acks=all times out while the ISR still names it.
                f.stop()
                b.replicas.lag_time_max_ms = 60_000
                r = await produce(b, timeout_ms=300)
                assert r.error_code == ErrorCode.request_timed_out
                assert leader.high_watermark == 2 and leader.log.log_end_offset == 4
                fetched = await acall(b, 1, 12, {"max_wait": 0, "min_bytes": 1, "isolation_level": 0, "topics": [
                    {"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 2,
                                                   "partition_max_bytes": 1 << 20}]}],
                    "forgotten_topics_data": []})
                assert fetched.responses[0].partitions[0].high_watermark == 2
                assert not fetched.responses[0].partitions[0].records  # offsets 2, 3 are past the HW
                follower_fetch = await acall(b, 1, 12, {
                    "replica_id": 2, "max_wait": 0, "min_bytes": 1, "isolation_level": 0, "topics": [
                        {"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 2, "current_leader_epoch": 1,
                                                       "partition_max_bytes": 1 << 20}]}],
                    "forgotten_topics_data": []})
                assert follower_fetch.responses[0].partitions[0].records  # a follower reads up to the LEO
                stale = await acall(b, 1, 12, {
                    "replica_id": 2, "max_wait": 0, "min_bytes": 1, "isolation_level": 0, "topics": [
                        {"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 2, "current_leader_epoch": 0,
                                                       "partition_max_bytes": 1 << 20}]}],
                    "forgotten_topics_data": []})
                assert stale.responses[0].partitions[0].error_code == ErrorCode.fenced_leader_epoch
                stranger = await acall(b, 1, 12, {
                    "replica_id": 7, "max_wait": 0, "min_bytes": 1, "isolation_level": 0, "topics": [
                        {"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 2, "current_leader_epoch": 1,
                                                       "partition_max_bytes": 1 << 20}]}],
                    "forgotten_topics_data": []})
                assert stranger.responses[0].partitions[0].error_code == ErrorCode.not_leader_or_follower

                # After replica.lag.time.max.ms it leaves the ISR; the waiting produce completes, below min ISR.
                b.replicas.lag_time_max_ms = 300
                r = await produce(b, timeout_ms=5000)
                assert r.error_code == ErrorCode.not_enough_replicas_after_append
                assert writes == [[1]] and leader.isr == [1] and leader.zk_version == 1
                assert leader.high_watermark == leader.log.log_end_offset == 6
                r = await produce(b)
                assert r.error_code == ErrorCode.not_enough_replicas
                r = await produce(b, acks=1)
                assert r.error_code == ErrorCode.none

                # It comes back, catches up and rejoins the ISR.
                f.start()
                await until(lambda: leader.isr == [1, 2], "the ISR expansion")
                assert writes == [[1], [1, 2]]
                r = await produce(b)
                assert r.error_code == ErrorCode.none
                await until(lambda: fp.high_watermark == leader.log.log_end_offset, "the follower's HW")
                assert log_bytes(fp.log) == log_bytes(leader.log)
                # Both write their HW to replication-offset-checkpoint every 200 ms here.
                hw = leader.high_watermark
                for d in (tmp_path / "l", tmp_path / "f"):
                    def checkpointed(d: Path = d) -> bool:
                        return read_offset_checkpoint(d / REPLICATION_OFFSET_CHECKPOINT_FILE).get(("t", 0)) == hw
                    await until(checkpointed, f"the HW checkpoint in {d}")
                assert await b.replicas.wait_for_high_watermark(leader, hw, 0.1)
                assert not await b.replicas.wait_for_high_watermark(leader, hw + 1, 0.1)

                # Divergence: broker 2 led epoch 2 alone and appended what broker 1 never got; broker 1
                # then leads epoch 3.  Following again, broker 2 truncates its epoch-2 batches away.
                f.stop()
                end = leader.log.log_end_offset
                mine = f.rm.make_leader("t", 0, LogConfig(), leader_epoch=2, replicas=[1, 2], isr=[2], zk_version=5)
                assert mine is fp
                batch = bytearray(build_batch([(b"x", b"lost", [])] * 3, timestamp_ms=T0))
                fp.log.append(batch, validate_for_append(batch, max_batch_bytes=1 << 20, now_ms=T0, timestamp_type=0))
                assert fp.log.log_end_offset == end + 3
                b.replicas.make_leader("t", 0, LogConfig(), leader_epoch=3, replicas=[1, 2], isr=[1, 2], zk_version=6)
                assert writes == [[1], [1, 2]]
                r = await produce(b, acks=1, n=1)
                assert r.error_code == ErrorCode.none
                f.follow(3)
                f.start()
                await until(lambda: fp.log.log_end_offset == leader.log.log_end_offset
                            and log_bytes(fp.log) == log_bytes(leader.log), "truncation and catch-up")
                assert [(e.epoch, e.start_offset) for e in fp.log.leader_epoch_cache.entries()] == \
                    [(1, 0), (3, end)]
                r = await produce(b)
                assert r.error_code == ErrorCode.none
                f.stop()
                tg.cancel_scope.cancel()
        finally:
            b.log_manager.shutdown()
            if follower_lm:
                follower_lm[0].shutdown()

    follower_lm: list[LogManager] = []
    anyio.run(main)


def test_follower_out_of_range_truncates_into_the_leaders_range(tmp_path: Path) -> None:
    """OFFSET_OUT_OF_RANGE: below the leader's log start -> restart there; above its end -> truncate."""
    async def main() -> None:
        cfg = BrokerConfig({"log.dirs": str(tmp_path / "l"), "listeners": "PLAINTEXT://127.0.0.1:0",
                            "broker.id": "1", **FAST})
        b = Broker(cfg)
        b.startup()
        try:
            async with anyio.create_task_group() as tg:
                listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
                port = listener.extra(SocketAttribute.local_port)
                tg.start_soon(b.server.serve_listener, listener, "PLAINTEXT", tg)
                b.replicas.set_cluster(lambda _b: None, isr_recorder([]))
                tg.start_soon(b.replicas.run_replication, cfg)
                created = await acall(b, 19, 7, {"topics": [
                    {"name": n, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}
                    for n in ("t", "u")], "timeout": 1000})
                assert [t.error_code for t in created.topics] == [ErrorCode.none] * 2
                leaders = {}
                for n in ("t", "u"):
                    lp = b.replicas.make_leader(n, 0, LogConfig(), leader_epoch=1, replicas=[1, 2], isr=[1])
                    assert lp is not None
                    leaders[n] = lp
                for _ in range(5):
                    assert (await produce(b, acks=1)).error_code == ErrorCode.none  # topic t
                    batch = bytearray(build_batch([(b"u", b"u", [])] * 2, timestamp_ms=T0))
                    leaders["u"].log.append(batch, validate_for_append(batch, max_batch_bytes=1 << 20, now_ms=T0,
                                                                       timestamp_type=0))
                    b.replicas.on_appended(leaders["u"])
                t = leaders["t"]
                assert t.log.delete_records_before(6, reason=DELETE_RECORDS, high_watermark=t.high_watermark) == 6

                f = Follower(tmp_path, port, tg)
                follower_lm.append(f.lm)
                # u: this replica holds 13 records without leader epochs, the leader 10.
                seeded = f.lm.get_or_create_log("u", 0, LogConfig())
                batch = bytearray(build_batch([(b"x", b"x", [])] * 13, timestamp_ms=T0))
                seeded.append(batch, validate_for_append(batch, max_batch_bytes=1 << 20, now_ms=T0, timestamp_type=0))
                fps = {}
                for n in ("t", "u"):
                    fp = f.rm.make_follower(n, 0, LogConfig(), leader_id=1, leader_epoch=1, replicas=[1, 2], isr=[1],
                                            zk_version=0)
                    assert fp is not None
                    fps[n] = fp
                f.start()
                t, u = fps["t"], fps["u"]
                await until(lambda: t.log.log_end_offset == 10 and u.log.log_end_offset == 10, "both in range")
                assert t.log.log_start_offset == 6 and log_bytes(t.log) == log_bytes(leaders["t"].log)
                assert u.log.log_start_offset == 0
                f.stop()
                tg.cancel_scope.cancel()
        finally:
            b.log_manager.shutdown()
            if follower_lm:
                follower_lm[0].shutdown()

    follower_lm: list[LogManager] = []
    anyio.run(main)
