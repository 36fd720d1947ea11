"""Zero-copy fetch with real clients: large records (sent from the segment files with sendfile) and
small ones (read into the response), over PLAINTEXT and over SSL (where the ranges are read before
sending), by confluent-kafka, kafka-python and aiokafka; and fetches running while retention deletes
segments and the cleaner replaces them lose nothing and never crash the broker."""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import BrokerProcess, free_port
from tests.support.certs import Pki, make_pki

TIMEOUT = 40.0
# 300 KB records make ranges far above the in-memory threshold; 100 B ones stay small.
SIZES = [100, 300_000, 100, 2_000, 100, 150_000]


class Setup:
    def __init__(self, broker: BrokerProcess, ssl_port: int, pki: Pki) -> None:
        self.broker, self.ssl_port, self.pki = broker, ssl_port, pki

    @property
    def ssl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.ssl_port}"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    p0, p1 = free_port(), free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("zc-broker"), {
        "listeners": f"PLAINTEXT://127.0.0.1:{p0},SSL://127.0.0.1:{p1}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(pki.server.pem),
        "message.max.bytes": "2000000",
    }, port=p0).start()
    yield Setup(b, p1, pki)
    b.stop()


def _topic(b: BrokerProcess, config: dict[str, str] | None = None, partitions: int = 2) -> str:
    name = f"zc-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])[name].result(TIMEOUT)
    return name


def _values(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [f"{i:08d}".encode() + rng.randbytes(SIZES[i % len(SIZES)]) for i in range(n)]


def _produce(b: BrokerProcess, topic: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 20, "message.max.bytes": 2_000_000,
                  "batch.size": 1_000_000})
    for i, v in enumerate(values):
        p.produce(topic, v, partition=i % 2)
        p.poll(0)
    assert p.flush(TIMEOUT) == 0


def _confluent_read(conf: dict[str, Any], topic: str, n: int) -> list[bytes]:
    c = Consumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False,
                  "fetch.message.max.bytes": 2_000_000})
    c.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    got: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT
    while len(got) < n and time.monotonic() < deadline:
        for m in c.consume(200, 0.5):
            assert m.error() is None, m.error()
            got.append(m.value() or b"")
    c.close()
    return got


def _kafka_python_read(kw: dict[str, Any], topic: str, n: int) -> list[bytes]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP
    c = KafkaConsumer(consumer_timeout_ms=15000, max_partition_fetch_bytes=2_000_000, **kw)
    c.assign([KTP(topic, 0), KTP(topic, 1)])
    c.seek_to_beginning()
    got = [m.value for _, m in zip(range(n), c, strict=False)]
    c.close()
    return got


def _aiokafka_read(kw: dict[str, Any], topic: str, n: int) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as ATP

    async def run() -> list[bytes]:
        c = AIOKafkaConsumer(auto_offset_reset="earliest", max_partition_fetch_bytes=2_000_000, **kw)
        await c.start()
        out: list[bytes] = []
        try:
            c.assign([ATP(topic, 0), ATP(topic, 1)])
            async with asyncio.timeout(TIMEOUT):
                while len(out) < n:
                    for msgs in (await c.getmany(timeout_ms=500)).values():
                        out.extend(m.value for m in msgs)
        finally:
            await c.stop()
        return out

    return asyncio.run(run())


def _check(got: list[bytes], values: list[bytes]) -> None:
    assert len(got) == len(values)
    assert sorted(got) == sorted(values)  # two partitions: each in order, interleaved across them


@pytest.mark.parametrize("client", ["confluent", "kafka-python", "aiokafka"])
@pytest.mark.parametrize("listener", ["PLAINTEXT", "SSL"])
def test_clients_read_large_and_small_records(setup: Setup, client: str, listener: str) -> None:
    b = setup.broker
    topic = _topic(b)
    values = _values(60, seed=hash((client, listener)) & 0xFFFF)
    _produce(b, topic, values)
    ssl = listener == "SSL"
    bootstrap = setup.ssl_bootstrap if ssl else b.bootstrap
    if client == "confluent":
        conf: dict[str, Any] = {"bootstrap.servers": bootstrap}
        if ssl:
            conf.update({"security.protocol": "SSL", "ssl.ca.location": str(setup.pki.ca.cert_path)})
        got = _confluent_read(conf, topic, len(values))
    elif client == "kafka-python":
        kw: dict[str, Any] = {"bootstrap_servers": bootstrap}
        if ssl:
            kw.update({"security_protocol": "SSL", "ssl_cafile": str(setup.pki.ca.cert_path)})
        got = _kafka_python_read(kw, topic, len(values))
    else:
        kw = {"bootstrap_servers": bootstrap}
        if ssl:
            from aiokafka.helpers import create_ssl_context
            kw.update({"security_protocol": "SSL",
                       "ssl_context": create_ssl_context(cafile=str(setup.pki.ca.cert_path))})
        got = _aiokafka_read(kw, topic, len(values))
    _check(got, values)
    assert "Traceback" not in b.log()


def test_fetches_during_retention_and_compaction(tmp_path: Path) -> None:
    """Segments deleted by retention and replaced by the cleaner while consumers fetch from them: a
    consumer following the tail receives every record, re-readers from the start see only whole
    records, and the broker keeps serving."""
    b = BrokerProcess(tmp_path / "b", {
        "log.retention.check.interval.ms": "200",
        "log.cleaner.backoff.ms": "200",
        "log.segment.delete.delay.ms": "0",
        "message.max.bytes": "2000000",
    }).start()
    try:
        # Retention: small segments, keep about 3 MB.  Compaction: records come in pairs with one key, so
        # the cleaner rewrites segments (new files under the old names) without the first of each pair.
        deleting = _topic(b, {"segment.bytes": "1000000", "retention.bytes": "3000000"}, partitions=1)
        compacted = _topic(b, {"segment.bytes": "1000000", "cleanup.policy": "compact",
                               "min.cleanable.dirty.ratio": "0.01", "segment.ms": "500"}, partitions=1)
        n = 150
        rng = random.Random(3)
        payloads = [f"{i:08d}".encode() + rng.randbytes(150_000 if i % 3 else 1_000) for i in range(n)]
        stop = threading.Event()
        errors: list[str] = []
        rereads = [0]

        def reread(topic: str) -> None:
            """Read from the start again and again while segments go away under it."""
            c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"r-{uuid.uuid4().hex[:6]}",
                          "auto.offset.reset": "earliest", "fetch.message.max.bytes": 2_000_000,
                          "enable.auto.commit": False})
            try:
                for _ in range(10_000):
                    if stop.is_set():
                        break
                    c.assign([TopicPartition(topic, 0, -2)])  # OFFSET_BEGINNING
                    for m in c.consume(50, 0.3):
                        if m.error() is None:
                            value = m.value() or b""
                            expect = payloads[int(value[:8])]
                            if value != expect:
                                errors.append(f"{topic}: wrong bytes at offset {m.offset()}")
                            rereads[0] += 1
            finally:
                c.close()

        threads = [threading.Thread(target=reread, args=(t,), daemon=True) for t in (deleting, compacted)]
        for t in threads:
            t.start()
        tail = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"t-{uuid.uuid4().hex[:6]}",
                         "fetch.message.max.bytes": 2_000_000, "enable.auto.commit": False})
        tail.assign([TopicPartition(compacted, 0, 0), TopicPartition(deleting, 0, 0)])
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, "message.max.bytes": 2_000_000})
        got: dict[str, list[bytes]] = {deleting: [], compacted: []}
        deadline = time.monotonic() + 90
        for i, v in enumerate(payloads):
            p.produce(deleting, v, key=f"k{i}".encode())
            p.produce(compacted, v, key=f"k{i // 2}".encode())
            p.poll(0)
            if i % 10 == 9:
                p.flush(TIMEOUT)
                for m in tail.consume(100, 0.05):
                    assert m.error() is None, m.error()
                    got[m.topic() or ""].append(m.value() or b"")
        assert p.flush(TIMEOUT) == 0
        latest = set(range(1, n, 2))  # the last record of each key: compaction keeps them

        def indexes(values: list[bytes]) -> list[int]:
            return [int(v[:8]) for v in values]

        while (len(got[deleting]) < n or not latest <= set(indexes(got[compacted]))) \
                and time.monotonic() < deadline:
            for m in tail.consume(100, 0.3):
                assert m.error() is None, m.error()
                got[m.topic() or ""].append(m.value() or b"")
        time.sleep(2)  # let the cleaner and retention run under the re-readers a little longer
        stop.set()
        for t in threads:
            t.join(30)
        tail.close()
        assert got[deleting] == payloads, f"{len(got[deleting])} of {n} records"
        seen = indexes(got[compacted])
        assert seen == sorted(set(seen)) and latest <= set(seen)  # in order, no duplicates, no loss
        assert all(v == payloads[i] for i, v in zip(seen, got[compacted], strict=True))
        assert not errors, errors[:5]
        assert rereads[0] > 0
        text = b.log()
        assert "Deleting segment" in text  # retention did run under the fetches
        assert f"cleaned {compacted}-0" in text  # and the cleaner replaced segments
        assert "Traceback" not in text and "unexpected error" not in text
        assert b.proc is not None and b.proc.poll() is None  # still serving
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "final", "enable.auto.commit": False,
                      "fetch.message.max.bytes": 2_000_000})
        c.assign([TopicPartition(compacted, 0, 0)])
        final: list[bytes] = []
        for _ in range(200):
            if latest <= set(indexes(final)):
                break
            final.extend(m.value() or b"" for m in c.consume(100, 0.3) if m.error() is None)
        c.close()
        in_final = indexes(final)
        assert in_final == sorted(set(in_final)) and latest <= set(in_final)
        assert len(in_final) < n  # the cleaner did drop superseded records
        assert all(v == payloads[i] for i, v in zip(in_final, final, strict=True))
    finally:
        b.stop()
