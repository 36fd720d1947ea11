"""Exactly-once across failovers.

A transactional read-process-write pipeline (confluent-kafka: a read_committed consumer in a group and a
transactional producer that commits the consumer's offsets in its transactions) runs while brokers are
killed with SIGKILL and restarted: first the leader of an input/output partition, then the broker
coordinating the group, then the one coordinating the transactional id. Meanwhile an idempotent acks=all
producer feeds the input. At the end every input value is in the output exactly once (read_committed),
nothing from an aborted transaction is there, the group's committed offsets are the input's end offsets,
and the idempotent producer's acknowledged records are all in the input once, at their offsets.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from pykbroker.coordinator.internal_topic import partition_for
from pykbroker.protocol import codec
from tests.cluster.steady import SteadyProducer, assert_nothing_lost, read_all
from tests.support.cluster import Cluster, raw_request, read_frame, wait_for

pytestmark = [pytest.mark.timeout(420)]

PARTITIONS = 6
ABORT_EVERY = 5  # the pipeline aborts every 5th transaction after producing its records
INTERNAL_PARTITIONS = 6  # offsets.topic.num.partitions / transaction.state.log.num.partitions (CLUSTER_DEFAULTS)
OVERRIDES = {"min.insync.replicas": "2", "offsets.topic.replication.factor": "3",
             "transaction.state.log.replication.factor": "3", "transaction.state.log.min.isr": "2"}


class Pipeline:
    """Consume, transform, produce and commit the consumer's offsets in one transaction; bounded in time.

    On an error that needs an abort the transaction is aborted and the consumer rewound to the group's
    committed offsets; on a fatal one (e.g. fenced after a coordinator failover) the producer is replaced,
    which aborts whatever it left open. Each transaction tags its records with its attempt number, so the
    output shows which transaction wrote a record.
    """

    def __init__(self, bootstrap: str, src: str, dst: str, group: str, txn_id: str, max_seconds: float) -> None:
        self.bootstrap, self.src, self.dst, self.txn_id = bootstrap, src, dst, txn_id
        self.max_seconds = max_seconds
        self.committed_txns = 0
        self.aborted: set[int] = set()  # attempts whose abort_transaction succeeded
        self.errors: list[str] = []
        self.trace: list[str] = []  # the last steps, for a failure's message
        self._idle = 0
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
            "enable.auto.commit": False, "auto.offset.reset": "earliest", "session.timeout.ms": 20000,
            "topic.metadata.refresh.interval.ms": 1000})
        self.producer = self._producer()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _note(self, what: str) -> None:
        self.trace = [*self.trace[-30:], f"{time.strftime('%H:%M:%S')} {what}"]

    def _producer(self) -> Producer:
        self._note("new producer")
        # connections.max.idle.ms: librdkafka's send_offsets_to_transaction waits for a group coordinator that
        # died (past its timeout) until some broker connection changes state (librdkafka issues 5456 and
        # 5511); closing idle connections makes such changes happen.
        p = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.txn_id, "linger.ms": 5,
                      "transaction.timeout.ms": 30000, "topic.metadata.refresh.interval.ms": 1000,
                      "connections.max.idle.ms": 3000})
        self._retry(lambda: p.init_transactions(30), "init_transactions")
        self._note("init_transactions done")
        return p

    def _retry(self, fn: Any, what: str, attempts: int = 4) -> None:
        """Retry a call while librdkafka says its error is retriable (a coordinator moving, say)."""
        for i in range(attempts):
            try:
                fn()
                return
            except KafkaException as e:
                err = e.args[0]
                if not err.retriable() or i == attempts - 1:
                    raise
                self.errors.append(f"{what}: {err.name()} (retried)")
                self._note(f"{what}: {err.name()} (retried)")
                time.sleep(0.5)

    def start(self) -> Pipeline:
        self.consumer.subscribe([self.src])
        self._thread.start()
        return self

    def _rewind(self) -> None:
        """Back to the group's committed offsets: what an aborted transaction consumed is processed again."""
        assigned = self.consumer.assignment()
        if not assigned:
            return
        for tp in self.consumer.committed(assigned, timeout=30):
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))

    def _transaction(self, attempt: int, msgs: list[Any]) -> None:
        p = self.producer
        self._note(f"begin {attempt}: {len(msgs)} records")
        p.begin_transaction()
        for m in msgs:
            p.produce(self.dst, m.value() + b"|" + str(attempt).encode(), partition=m.partition())
        if attempt % ABORT_EVERY == 0:  # aborted on purpose: none of these may be read as committed
            p.abort_transaction(30)
            self.aborted.add(attempt)
            self._rewind()
            self._note(f"aborted {attempt}")
            return
        positions = self.consumer.position(self.consumer.assignment())
        self._note("send_offsets_to_transaction")
        self._retry(lambda: p.send_offsets_to_transaction(positions, self.consumer.consumer_group_metadata(), 30),
                    "send_offsets_to_transaction")
        self._note("commit_transaction")
        self._retry(lambda: p.commit_transaction(30), "commit_transaction")
        self._note("committed")
        self.committed_txns += 1

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        attempt = 0
        try:
            for _ in range(1_000_000):
                if self._stop.is_set() or time.monotonic() > deadline:
                    return
                msgs = [m for m in self.consumer.consume(500, 0.5) if not m.error()]
                if not msgs:
                    self._idle += 1
                    if self._idle % 20 == 0:
                        self._note(f"idle {self._idle}, assignment {self.consumer.assignment()}")
                    continue
                attempt += 1
                try:
                    self._transaction(attempt, msgs)
                except KafkaException as e:
                    err = e.args[0]
                    self.errors.append(f"attempt {attempt}: {err.name()}: {err.str()}")
                    self._note(self.errors[-1])
                    if err.txn_requires_abort():
                        try:
                            self.producer.abort_transaction(30)
                            self.aborted.add(attempt)
                        except KafkaException as e2:
                            self.errors.append(f"abort of {attempt}: {e2.args[0].name()}")
                            self.producer = self._producer()
                    else:
                        self.producer = self._producer()  # fences and aborts what the old one left open
                    self._rewind()
                    self._note("rewound")
        except BaseException as e:  # reported by stop()
            self.failure = e

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(90)
        assert not self._thread.is_alive(), "the pipeline did not stop"
        self.consumer.close()
        self.producer.flush(10)
        if self.failure is not None:
            raise AssertionError(f"the pipeline failed: {self.failure!r}; errors: {self.errors[-10:]}")


def _create_topics(bootstrap: str, names: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, PARTITIONS, 3, config={"min.insync.replicas": "2"}) for n in names])
    for f in futures.values():
        f.result(30)


def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=20)[1] for p in range(PARTITIONS)}
    finally:
        c.close()


def _committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets, asked by a consumer that does not join the group."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return {tp.partition: tp.offset
                for tp in c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=20)}
    finally:
        c.close()


def _read_committed(bootstrap: str, topic: str, timeout: float = 60.0) -> list[bytes]:
    """Every record of ``topic`` visible to read_committed, up to its last stable offsets."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "verify-eos", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                  "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        out: list[bytes] = []
        eof: set[int] = set()
        deadline = time.monotonic() + timeout
        for _ in range(1_000_000):
            if len(eof) == PARTITIONS or time.monotonic() > deadline:
                break
            for m in c.consume(1000, 0.5):
                if m.error() is None:
                    out.append(m.value())
                    eof.discard(m.partition())
                elif m.error().code() == -191:  # _PARTITION_EOF
                    eof.add(m.partition())
        assert len(eof) == PARTITIONS, f"read to the end of only partitions {sorted(eof)} within {timeout}s"
        return out
    finally:
        c.close()


def _wait_full_isr(cluster: Cluster, topics: list[str], timeout: float = 90.0) -> None:
    def full() -> bool:
        try:
            return all(sorted(isr) == [1, 2, 3] and leader in cluster.running()
                       for t in topics for leader, _, isr in cluster.partition_states(t).values())
        except (OSError, ConnectionError, StopIteration):
            return False
    wait_for(full, timeout=timeout, interval=0.5, what=f"every replica back in the ISRs of {topics}")


def _wait_commits(pipeline: Pipeline, at_least: int, what: str) -> None:
    try:
        wait_for(lambda: pipeline.committed_txns >= at_least, timeout=90, interval=0.2, what=what)
    except AssertionError as e:
        raise AssertionError(f"{e}; the pipeline's last steps: {pipeline.trace}") from None


def _kill_and_restart(cluster: Cluster, victim: int, pipeline: Pipeline, feeder: SteadyProducer,
                      topics: list[str]) -> None:
    """SIGKILL a broker: its partitions get new leaders and the idempotent feeder goes on without it; then it
    restarts, the pipeline goes on and every replica is back in the ISRs.

    The pipeline is not required to commit while the victim is down: when the victim coordinated the group,
    librdkafka's send_offsets_to_transaction may wait for that broker past its own timeout until some broker
    connection changes state (librdkafka issues 5456 and 5511).
    """
    commits, acked = pipeline.committed_txns, feeder.acked_count()
    cluster.kill(victim)
    for topic in topics:
        cluster.wait_leaders(topic, PARTITIONS, exclude=(victim,), timeout=60)
    wait_for(lambda: feeder.acked_count() >= acked + 100, timeout=60, interval=0.2,
             what=f"idempotent produce with broker {victim} down")
    cluster.broker(victim).start()
    cluster.wait_registered(list(cluster.brokers), timeout=60)
    _wait_commits(pipeline, commits + 5, f"transactions committed after killing broker {victim}")
    _wait_full_isr(cluster, topics)


@contextlib.contextmanager
def _logs_on_failure(cluster: Cluster) -> Iterator[None]:
    try:
        yield
    except BaseException:
        print(cluster.logs())
        raise


def test_exactly_once_pipeline_across_leader_and_coordinator_failovers(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    src, dst, group, txn_id = f"in-{tag}", f"out-{tag}", f"eos-{tag}", f"eos-txn-{tag}"
    with Cluster(tmp_path, 3, overrides=OVERRIDES) as cluster, _logs_on_failure(cluster):
        _create_topics(cluster.bootstrap, [src, dst])
        cluster.wait_leaders(src, PARTITIONS)
        cluster.wait_leaders(dst, PARTITIONS)
        feeder = SteadyProducer(cluster.bootstrap, src, rate=150, max_seconds=240).start()
        pipeline: Pipeline | None = None
        try:
            wait_for(lambda: feeder.acked_count() >= 500, timeout=30, what="the input pre-filled")
            pipeline = Pipeline(cluster.bootstrap, src, dst, group, txn_id, max_seconds=300).start()
            _wait_commits(pipeline, 5, "the pipeline's first transactions")
            internal = ["__consumer_offsets", "__transaction_state"]
            everything = [src, dst, *internal]
            _wait_full_isr(cluster, everything)

            # (a) the leader of input partition 0 (it also leads other input/output partitions).
            _kill_and_restart(cluster, cluster.leaders(src)[0], pipeline, feeder, everything)
            # (b) the group's coordinator, (c) the transactional id's coordinator
            group_coordinator = cluster.leaders("__consumer_offsets")[partition_for(group, INTERNAL_PARTITIONS)]
            _kill_and_restart(cluster, group_coordinator, pipeline, feeder, everything)
            # (the same broker again, if it leads that partition now).
            txn_coordinator = cluster.leaders("__transaction_state")[partition_for(txn_id, INTERNAL_PARTITIONS)]
            _kill_and_restart(cluster, txn_coordinator, pipeline, feeder, everything)

            feeder.stop()
            assert not feeder.errors, feeder.errors[:5]
            ends = _end_offsets(cluster.bootstrap, src)
            wait_for(lambda: _committed(cluster.bootstrap, group, src) == ends, timeout=90, interval=1.0,
                     what=f"the group's offsets at the input's end {ends}")
        finally:
            if pipeline is not None:
                pipeline.stop()
            feeder.stop()

        inputs = read_all(cluster.bootstrap, src, PARTITIONS)
        assert_nothing_lost(feeder, inputs)
        outputs = _read_committed(cluster.bootstrap, dst)
        values: dict[bytes, list[int]] = {}
        for record in outputs:
            value, _, attempt = record.rpartition(b"|")
            values.setdefault(value, []).append(int(attempt))
        from_aborted = {v: a for v, a in values.items() if set(a) & pipeline.aborted}
        assert not from_aborted, f"records of aborted transactions read as committed: {list(from_aborted.items())[:5]}"
        twice = {v: a for v, a in values.items() if len(a) > 1}
        assert not twice, f"{len(twice)} input values in the output more than once: {list(twice.items())[:5]}"
        assert set(values) == set(inputs), (
            f"{len(set(inputs) - set(values))} inputs missing from the output, "
            f"{len(set(values) - set(inputs))} outputs not from the input")
        assert pipeline.aborted, "the pipeline aborted transactions (on purpose, and maybe after failures)"


def _request(bootstrap: str, api_key: int, version: int, body: dict[str, Any], timeout: float = 45.0) -> Any:
    return raw_request(bootstrap, api_key, version, body, timeout=timeout, client_id="eos-test")


def _coordinator(bootstrap: str, key: str, key_type: int) -> int | None:
    resp = _request(bootstrap, 10, 4, {"key_type": key_type, "coordinator_keys": [key]})
    c = resp.coordinators[0]
    return int(c.node_id) if int(c.error_code) == 0 else None


def _commit(bootstrap: str, group: str, topic: str, offset: int) -> ErrorCode:
    body = {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None,
            "topics": [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": offset,
                                                       "committed_leader_epoch": -1, "committed_metadata": ""}]}]}
    resp = _request(bootstrap, 8, 8, body)
    return ErrorCode(int(resp.topics[0].partitions[0].error_code))


def _fetch(bootstrap: str, group: str, topic: str) -> int:
    body = {"groups": [{"group_id": group, "topics": [{"name": topic, "partition_indexes": [0]}]}],
            "require_stable": False}
    resp = _request(bootstrap, 9, 8, body)
    return int(resp.groups[0].topics[0].partitions[0].committed_offset)


def _offset_delete(bootstrap: str, group: str, topic: str) -> ErrorCode:
    # OffsetDelete has only v0, a non-flexible version: request header v1, response header v0.
    body = {"group_id": group, "topics": [{"name": topic, "partitions": [{"partition_index": 0}]}]}
    cid = b"eos-test"
    payload = struct.pack(">hhih", 47, 0, 7, len(cid)) + cid + codec.encode_entity(
        codec.build(codec.request_class(47, 0), body))
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=45) as s:
        s.settimeout(45)
        s.sendall(struct.pack(">i", len(payload)) + payload)
        frame = read_frame(s)
    assert struct.unpack_from(">i", frame, 0)[0] == 7
    resp = codec.decode_response(47, 0, frame, 4)
    if int(resp.error_code):
        return ErrorCode(int(resp.error_code))
    return ErrorCode(int(resp.topics[0].partitions[0].error_code))


def _delete_group(bootstrap: str, group: str) -> ErrorCode:
    return ErrorCode(int(_request(bootstrap, 42, 2, {"groups_names": [group]}).results[0].error_code))


def _init_producer_id(bootstrap: str, txn_id: str) -> ErrorCode:
    body = {"transactional_id": txn_id, "transaction_timeout": 10000, "producer_id": -1, "producer_epoch": -1}
    return ErrorCode(int(_request(bootstrap, 22, 4, body).error_code))


def test_coordinator_writes_wait_for_min_isr(tmp_path: Path) -> None:
    """As Kafka's coordinators write with acks=all: with their partition's ISR below min.insync.replicas an
    offset commit and a transaction state change are refused with COORDINATOR_NOT_AVAILABLE (retriable) and
    change nothing; once a replica is back they succeed."""
    tag = uuid.uuid4().hex[:6]
    topic, group = f"data-{tag}", f"g-{tag}"
    with Cluster(tmp_path, 3, overrides=OVERRIDES) as cluster, _logs_on_failure(cluster):
        _create_topics(cluster.bootstrap, [topic])
        cluster.wait_leaders(topic, PARTITIONS)
        bs = cluster.any_bootstrap()
        node = wait_for(lambda: _coordinator(bs, group, 0), timeout=30, what="the group's coordinator")
        wait_for(lambda: _coordinator(bs, "any", 1), timeout=30, what="__transaction_state created")
        cluster.wait_leaders("__transaction_state", INTERNAL_PARTITIONS)
        txn_leaders = cluster.leaders("__transaction_state")
        txn_id = next(t for t in (f"tx-{tag}-{i}" for i in range(1000))
                      if txn_leaders[partition_for(t, INTERNAL_PARTITIONS)] == node)
        bs = cluster.broker(node).bootstrap
        assert _commit(bs, group, topic, 1) == ErrorCode.none
        assert _init_producer_id(bs, txn_id) == ErrorCode.none

        others = [i for i in cluster.brokers if i != node]
        for i in others:
            cluster.kill(i)
        offsets_partition = partition_for(group, INTERNAL_PARTITIONS)
        txn_partition = partition_for(txn_id, INTERNAL_PARTITIONS)
        wait_for(lambda: cluster.partition_states("__consumer_offsets", via=node)[offsets_partition][2] == [node]
                 and cluster.partition_states("__transaction_state", via=node)[txn_partition][2] == [node],
                 timeout=60, interval=0.5, what=f"broker {node} alone in the ISRs")
        assert _commit(bs, group, topic, 2) == ErrorCode.coordinator_not_available
        assert _fetch(bs, group, topic) == 1, "a refused commit changes nothing"
        assert _offset_delete(bs, group, topic) == ErrorCode.coordinator_not_available
        assert _delete_group(bs, group) == ErrorCode.coordinator_not_available
        assert _fetch(bs, group, topic) == 1, "a refused OffsetDelete / DeleteGroups changes nothing"
        assert _init_producer_id(bs, txn_id) == ErrorCode.coordinator_not_available

        cluster.broker(others[0]).start()
        wait_for(lambda: len(cluster.partition_states("__consumer_offsets", via=node)[offsets_partition][2]) == 2
                 and len(cluster.partition_states("__transaction_state", via=node)[txn_partition][2]) == 2,
                 timeout=60, interval=0.5, what="a second replica back in the ISRs")
        assert _commit(bs, group, topic, 3) == ErrorCode.none
        assert _fetch(bs, group, topic) == 3
        assert _offset_delete(bs, group, topic) == ErrorCode.none
        assert _fetch(bs, group, topic) == -1
        assert _init_producer_id(bs, txn_id) == ErrorCode.none
