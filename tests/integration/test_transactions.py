"""Transactions with real clients: confluent-kafka (librdkafka), kafka-python and aiokafka."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pykbroker.coordinator.transaction.service import FAULT_FILE
from tests.support.broker import BrokerProcess

TXN_OVERRIDES = {
    "transaction.state.log.num.partitions": "4",
    "offsets.topic.num.partitions": "4",
    "transaction.max.timeout.ms": "60000",
}


@pytest.fixture
def tbroker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "broker", overrides=TXN_OVERRIDES)
    b.start()
    try:
        yield b
    finally:
        b.kill()


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)


def txn_producer(bootstrap: str, txn_id: str, **extra: object) -> Producer:
    conf: dict[str, object] = {"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 1}
    conf.update(extra)
    return Producer(conf)


def consume_all(bootstrap: str, topic: str, partitions: int, isolation: str, *, expect: int | None = None,
                idle_s: float = 2.0, timeout_s: float = 20.0) -> list[tuple[int, int, str]]:
    """(partition, offset, value) of everything readable, stopping when idle (or at ``expect``)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:6]}",
                  "isolation.level": isolation, "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[tuple[int, int, str]] = []
    deadline = time.monotonic() + timeout_s
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            if expect is not None and len(out) >= expect:
                break
            if expect is None and time.monotonic() - last > idle_s:
                break
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(m.error())
            out.append((m.partition(), m.offset(), m.value().decode()))
            last = time.monotonic()
    finally:
        c.close()
    return out


def end_offsets(bootstrap: str, topic: str, partitions: int, isolation: str) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "w", "isolation.level": isolation})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                for p in range(partitions)]
    finally:
        c.close()


def by_partition(rows: list[tuple[int, int, str]]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for p, _, v in sorted(rows):
        out.setdefault(p, []).append(v)
    return out


# --- committed and aborted transactions, isolation levels, the last stable offset ---------------------


def test_committed_and_aborted_transactions(tbroker: BrokerProcess, topic_name: str) -> None:
    bs = tbroker.bootstrap
    create_topic(bs, topic_name, 3)
    p = txn_producer(bs, f"tx-{uuid.uuid4().hex[:6]}")
    p.init_transactions(15)
    committed: dict[int, list[str]] = {}
    everything: dict[int, list[str]] = {}
    for t in range(6):
        p.begin_transaction()
        for i in range(12):
            v = f"t{t}-m{i}"
            p.produce(topic_name, v.encode(), partition=i % 3)
            everything.setdefault(i % 3, []).append(v)
            if t % 2 == 0:
                committed.setdefault(i % 3, []).append(v)
        p.flush(15)  # the aborted ones must really reach the log
        if t % 2 == 0:
            p.commit_transaction(15)
        else:
            p.abort_transaction(15)
    # An open transaction at the end: the last stable offset must stop before it.
    hw_before = end_offsets(bs, topic_name, 3, "read_uncommitted")
    p.begin_transaction()
    for i in range(3):
        p.produce(topic_name, f"open-{i}".encode(), partition=i)
        everything[i].append(f"open-{i}")
    p.flush(15)
    assert end_offsets(bs, topic_name, 3, "read_committed") == hw_before
    assert end_offsets(bs, topic_name, 3, "read_uncommitted") == [h + 1 for h in hw_before]

    rc = consume_all(bs, topic_name, 3, "read_committed", expect=sum(map(len, committed.values())))
    assert by_partition(rc) == committed
    ru = consume_all(bs, topic_name, 3, "read_uncommitted", expect=sum(map(len, everything.values())))
    assert by_partition(ru) == everything
    # Nothing more shows up for read_committed while the transaction is open.
    assert len(consume_all(bs, topic_name, 3, "read_committed", idle_s=1.0)) == len(rc)

    p.commit_transaction(15)
    for i in range(3):
        committed[i].append(f"open-{i}")
    rc = consume_all(bs, topic_name, 3, "read_committed", expect=sum(map(len, committed.values())))
    assert by_partition(rc) == committed
    after = end_offsets(bs, topic_name, 3, "read_committed")
    assert after == end_offsets(bs, topic_name, 3, "read_uncommitted")  # LSO caught up with the HW


def test_zombie_producer_is_fenced(tbroker: BrokerProcess, topic_name: str) -> None:
    bs = tbroker.bootstrap
    create_topic(bs, topic_name, 1)
    txn_id = f"zombie-{uuid.uuid4().hex[:6]}"
    old = txn_producer(bs, txn_id)
    old.init_transactions(15)
    old.begin_transaction()
    old.produce(topic_name, b"from-zombie", partition=0)
    old.flush(15)

    new = txn_producer(bs, txn_id)
    new.init_transactions(30)  # aborts the zombie's open transaction, bumping the epoch
    new.begin_transaction()
    new.produce(topic_name, b"from-new", partition=0)
    new.commit_transaction(15)

    with pytest.raises(KafkaException) as e:
        old.produce(topic_name, b"zombie-again", partition=0)
        old.flush(10)
        old.commit_transaction(10)
    err = e.value.args[0]
    assert err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH), err
    assert err.fatal() or err.code() == KafkaError._FENCED, err

    rc = consume_all(bs, topic_name, 1, "read_committed", expect=1, timeout_s=10)
    assert [v for _, _, v in rc] == ["from-new"]
    assert len(consume_all(bs, topic_name, 1, "read_committed", idle_s=1.0)) == 1


# --- broker crashes -------------------------------------------------------------------------------------


def test_broker_killed_after_prepare_commit_completes_the_commit(tbroker: BrokerProcess, topic_name: str) -> None:
    bs = tbroker.bootstrap
    create_topic(bs, topic_name, 2)
    p = txn_producer(bs, f"crash-{uuid.uuid4().hex[:6]}", **{"message.timeout.ms": 5000})
    p.init_transactions(15)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic_name, f"m{i}".encode(), partition=i % 2)
    p.flush(15)
    (tbroker.data_dir / "logs" / FAULT_FILE).touch()  # the broker halts right after PrepareCommit
    with pytest.raises(KafkaException):
        p.commit_transaction(5)
    assert tbroker.proc is not None
    tbroker.proc.wait(10)
    assert "halting after PrepareCommit" in tbroker.log()
    del p
    tbroker.start()
    rc = consume_all(bs, topic_name, 2, "read_committed", expect=10, timeout_s=20)
    assert sorted(v for _, _, v in rc) == sorted(f"m{i}" for i in range(10))
    assert "found prepared at load" in tbroker.log()  # completed by the coordinator, not the client
    assert end_offsets(bs, topic_name, 2, "read_committed") == end_offsets(bs, topic_name, 2, "read_uncommitted")


def test_broker_killed_with_open_transaction_aborts_on_timeout(tbroker: BrokerProcess, topic_name: str) -> None:
    bs = tbroker.bootstrap
    create_topic(bs, topic_name, 1)
    p = txn_producer(bs, f"open-{uuid.uuid4().hex[:6]}", **{"transaction.timeout.ms": 3000})
    p.init_transactions(15)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic_name, f"lost{i}".encode(), partition=0)
    p.flush(15)
    tbroker.kill()
    del p
    tbroker.start()
    # Right after the restart the transaction is still open (5 records, no marker), unless the restart took
    # longer than transaction.timeout.ms (a loaded machine): then the coordinator aborted it on loading ...
    hw = end_offsets(bs, topic_name, 1, "read_uncommitted")[0]
    assert hw in (5, 6)
    # ... until the coordinator aborts it (transaction.timeout.ms), writing an abort marker.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if end_offsets(bs, topic_name, 1, "read_committed")[0] == 6:
            break
        time.sleep(0.3)
    assert end_offsets(bs, topic_name, 1, "read_committed") == [6]
    assert consume_all(bs, topic_name, 1, "read_committed", idle_s=1.0) == []
    assert len(consume_all(bs, topic_name, 1, "read_uncommitted", expect=5)) == 5


# --- exactly-once pipeline -------------------------------------------------------------------------------

PIPELINE = textwrap.dedent('''
    import sys, time
    from confluent_kafka import Consumer, Producer, TopicPartition, KafkaError
    bs, src, dst, group, txn_id, nparts = sys.argv[1:7]
    nparts = int(nparts)
    p = Producer({"bootstrap.servers": bs, "transactional.id": txn_id, "linger.ms": 5})
    p.init_transactions(30)  # fences a killed predecessor and aborts its open transaction
    c = Consumer({"bootstrap.servers": bs, "group.id": group, "isolation.level": "read_committed",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    tps = [TopicPartition(src, i) for i in range(nparts)]
    committed = c.committed(tps, timeout=15)
    c.assign([TopicPartition(src, t.partition, t.offset if t.offset >= 0 else 0) for t in committed])
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < 3:
        msgs = [m for m in c.consume(50, 0.5) if not m.error()]
        if not msgs:
            continue
        idle_since = time.monotonic()
        p.begin_transaction()
        for m in msgs:
            p.produce(dst, m.value().upper(), partition=m.partition())
        p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 15)
        p.commit_transaction(15)
        print("committed", len(msgs), flush=True)
    print("done", flush=True)
''')


def test_exactly_once_pipeline_survives_kill9(tbroker: BrokerProcess, tmp_path: Path) -> None:
    bs = tbroker.bootstrap
    src, dst = f"in-{uuid.uuid4().hex[:6]}", f"out-{uuid.uuid4().hex[:6]}"
    create_topic(bs, src, 3)
    create_topic(bs, dst, 3)
    n = 1500
    prod = Producer({"bootstrap.servers": bs, "linger.ms": 5})
    for i in range(n):
        prod.produce(src, f"msg-{i:05d}".encode(), partition=i % 3)
    prod.flush(15)
    script = tmp_path / "pipeline.py"
    script.write_text(PIPELINE)
    args = [sys.executable, str(script), bs, src, dst, "eos-group", "eos-txn", "3"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}
    kills = 0
    for _ in range(3):
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        assert proc.stdout is not None
        commits = 0
        deadline = time.monotonic() + 30
        while commits < 3 and time.monotonic() < deadline:  # let it commit a few transactions
            line = proc.stdout.readline().decode()
            if not line:
                break
            commits += line.startswith("committed")
        time.sleep(0.05)
        proc.kill()  # SIGKILL mid-stream, usually inside a transaction
        proc.wait(10)
        kills += 1
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out.decode()[-3000:]
    assert kills == 3
    rows = consume_all(bs, dst, 3, "read_committed", expect=n, timeout_s=30)
    values = [v for _, _, v in rows]
    assert sorted(values) == sorted(f"MSG-{i:05d}" for i in range(n))
    assert len(consume_all(bs, dst, 3, "read_committed", idle_s=1.0)) == n  # nothing twice
    # Order within each partition is kept.
    for part, vals in by_partition(rows).items():
        assert vals == sorted(vals), part


# --- other clients ---------------------------------------------------------------------------------------


def test_kafka_python_transactions(tbroker: BrokerProcess, topic_name: str) -> None:
    kafka = pytest.importorskip("kafka")
    bs = tbroker.bootstrap
    create_topic(bs, topic_name, 2)
    p = kafka.KafkaProducer(bootstrap_servers=bs, transactional_id=f"kp-{uuid.uuid4().hex[:6]}")
    p.init_transactions()
    p.begin_transaction()
    for i in range(4):
        p.send(topic_name, f"keep{i}".encode(), partition=i % 2)
    p.commit_transaction()
    p.begin_transaction()
    for i in range(4):
        p.send(topic_name, f"drop{i}".encode(), partition=i % 2)
    p.flush()
    p.abort_transaction()
    p.close()
    c = kafka.KafkaConsumer(bootstrap_servers=bs, isolation_level="read_committed", auto_offset_reset="earliest",
                            consumer_timeout_ms=2000, enable_auto_commit=False)
    c.assign([kafka.TopicPartition(topic_name, i) for i in range(2)])
    c.seek_to_beginning()
    got = sorted(m.value.decode() for m in c)
    c.close()
    assert got == [f"keep{i}" for i in range(4)]


def test_aiokafka_transactions(tbroker: BrokerProcess, topic_name: str) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    bs = tbroker.bootstrap
    create_topic(bs, topic_name, 2)

    async def run() -> list[str]:
        p = aiokafka.AIOKafkaProducer(bootstrap_servers=bs, transactional_id=f"ak-{uuid.uuid4().hex[:6]}")
        await p.start()
        try:
            async with p.transaction():
                for i in range(4):
                    await p.send_and_wait(topic_name, f"keep{i}".encode(), partition=i % 2)
            with pytest.raises(RuntimeError):
                async with p.transaction():
                    for i in range(4):
                        await p.send_and_wait(topic_name, f"drop{i}".encode(), partition=i % 2)
                    raise RuntimeError("abort")
        finally:
            await p.stop()
        c = aiokafka.AIOKafkaConsumer(bootstrap_servers=bs, isolation_level="read_committed",
                                      auto_offset_reset="earliest", enable_auto_commit=False)
        await c.start()
        try:
            c.assign([aiokafka.TopicPartition(topic_name, i) for i in range(2)])
            await c.seek_to_beginning()
            got: list[str] = []
            deadline = time.monotonic() + 10
            while len(got) < 4 and time.monotonic() < deadline:
                batches = await c.getmany(timeout_ms=500)
                for msgs in batches.values():
                    got.extend(m.value.decode() for m in msgs)
            extra = await c.getmany(timeout_ms=1000)
            got.extend(m.value.decode() for msgs in extra.values() for m in msgs)
            return sorted(got)
        finally:
            await c.stop()

    assert asyncio.run(run()) == [f"keep{i}" for i in range(4)]
