"""Records from kafka-python, aiokafka and kafkajs producers read by confluent-kafka ShareConsumers (KIP-932).

Each client produces records one batch each (no compression) and a batch of many records compressed with
a codec of its own; two ShareConsumers in one share group must together get every record exactly once
(delivery count 1), with its key, value and headers (binary values, a repeated header name, their
order) as produced. The log is checked to really hold a compressed multi-record batch.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ShareConsumer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from pykbroker.protocol.records import iter_batches
from tests.integration.conftest import BrokerFactory, admin_for, create_topic, unique_topic
from tests.support.broker import BrokerProcess

SHARE = {"group.share.enable": "true"}
CLIENT_TIMEOUT = 20
PLAIN = 12  # records sent one per batch
COMPRESSED = 40  # records sent as one compressed batch
ROOT = Path(__file__).resolve().parents[2]

Record = tuple[bytes, bytes, list[tuple[str, bytes]]]  # key, value, headers


def records(client: str) -> list[Record]:
    """What ``client`` produces: record i, keyed and with headers (binary, repeated name) derived from i."""
    return [(b"%s-k%d" % (client.encode(), i), b"%s-v%d\x00\xc8" % (client.encode(), i),
             [("client", client.encode()), ("i", b"%d" % i), ("bin", bytes([0, 255, i])), ("dup", b"a"),
              ("dup", b"b")])
            for i in range(PLAIN + COMPRESSED)]


def produce_kafka_python(b: BrokerProcess, topic: str, recs: list[Record]) -> str:
    from kafka import KafkaProducer

    plain = KafkaProducer(bootstrap_servers=b.bootstrap, linger_ms=0)
    try:
        for k, v, h in recs[:PLAIN]:
            plain.send(topic, key=k, value=v, headers=h).get(timeout=CLIENT_TIMEOUT)
    finally:
        plain.close(timeout=CLIENT_TIMEOUT)
    packed = KafkaProducer(bootstrap_servers=b.bootstrap, compression_type="lz4", linger_ms=500,
                           batch_size=1 << 20)
    try:
        futures = [packed.send(topic, key=k, value=v, headers=h, partition=0) for k, v, h in recs[PLAIN:]]
        packed.flush(timeout=CLIENT_TIMEOUT)
        for f in futures:
            f.get(timeout=CLIENT_TIMEOUT)
    finally:
        packed.close(timeout=CLIENT_TIMEOUT)
    return "lz4"


def produce_aiokafka(b: BrokerProcess, topic: str, recs: list[Record]) -> str:
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        plain = AIOKafkaProducer(bootstrap_servers=b.bootstrap)
        await plain.start()
        try:
            for k, v, h in recs[:PLAIN]:
                await plain.send_and_wait(topic, v, key=k, headers=h)
        finally:
            await plain.stop()
        packed = AIOKafkaProducer(bootstrap_servers=b.bootstrap, compression_type="zstd", linger_ms=500,
                                  max_batch_size=1 << 20)
        await packed.start()
        try:
            futures = [await packed.send(topic, v, key=k, headers=h, partition=0) for k, v, h in recs[PLAIN:]]
            await packed.flush()
            await asyncio.gather(*futures)
        finally:
            await packed.stop()

    asyncio.run(asyncio.wait_for(run(), 60))
    return "zstd"


# The same records as records("kafkajs"); plain ones one send() each, the rest in one gzip send().
KAFKAJS = """
const { Kafka, CompressionTypes, logLevel } = require('kafkajs');
const [broker, topic, plain, compressed] = process.argv.slice(2);
const kafka = new Kafka({ brokers: [broker], logLevel: logLevel.NOTHING });
const rec = (i) => ({
  key: Buffer.from('kafkajs-k' + i),
  value: Buffer.concat([Buffer.from('kafkajs-v' + i), Buffer.from([0, 0xc8])]),
  headers: { client: 'kafkajs', i: String(i), bin: Buffer.from([0, 255, i]), dup: ['a', 'b'] },
});
(async () => {
  const p = kafka.producer();
  await p.connect();
  const n = Number(plain), m = Number(compressed);
  for (let i = 0; i < n; i++) await p.send({ topic, messages: [rec(i)] });
  const batch = [];
  for (let i = n; i < n + m; i++) batch.push({ ...rec(i), partition: 0 });
  await p.send({ topic, compression: CompressionTypes.GZIP, messages: batch });
  await p.disconnect();
  console.log(JSON.stringify({ sent: n + m }));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def produce_kafkajs(b: BrokerProcess, topic: str, recs: list[Record]) -> str:
    from compat import env

    if shutil.which("node") is None:
        pytest.fail("node is not installed (scripts/install.sh --test installs it)")
    modules = env.node_modules()
    script = b.data_dir / "share_producer.js"
    script.write_text(KAFKAJS)
    out = subprocess.run(["node", str(script), b.bootstrap, topic, str(PLAIN), str(COMPRESSED)],
                         capture_output=True, timeout=60, env={**os.environ, "NODE_PATH": str(modules)})
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert json.loads(out.stdout) == {"sent": len(recs)}
    return "gzip"


PRODUCERS: dict[str, Callable[[BrokerProcess, str, list[Record]], str]] = {
    "kafka-python": produce_kafka_python, "aiokafka": produce_aiokafka, "kafkajs": produce_kafkajs}
CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def compressed_batches(b: BrokerProcess, topic: str) -> list[tuple[int, int]]:
    """(codec, record count) of every compressed batch in the topic's segment files."""
    out = []
    for seg in sorted((b.data_dir / "logs").glob(f"{topic}-*/*.log")):
        out += [(h.attributes & 7, h.records_count) for h in iter_batches(seg.read_bytes()) if h.attributes & 7]
    return out


def share_read(b: BrokerProcess, group: str, topic: str, want: int, consumers: int = 2) -> list[Any]:
    """Poll ``consumers`` ShareConsumers of one group in turn until ``want`` records came (bounded), then a
    little longer to catch duplicates; implicit acknowledgement."""
    admin = admin_for(b)
    res = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(timeout=CLIENT_TIMEOUT)
    cs = [ShareConsumer({"bootstrap.servers": b.bootstrap, "broker.address.family": "v4", "group.id": group})
          for _ in range(consumers)]
    got: list[Any] = []
    try:
        for c in cs:
            c.subscribe([topic])
        deadline = time.monotonic() + 40
        while len(got) < want and time.monotonic() < deadline:
            for c in cs:
                for m in c.poll(0.3):
                    assert m.error() is None, m.error()
                    got.append(m)
        for _ in range(3):
            for c in cs:
                got += [m for m in c.poll(0.3) if m.error() is None]
    finally:
        for c in cs:
            c.close()
    return got


@pytest.fixture(scope="module")
def broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    return module_broker_factory(SHARE)


@pytest.mark.parametrize("client", sorted(PRODUCERS))
def test_share_consumers_read_what_other_clients_produce(broker: BrokerProcess, client: str) -> None:
    topic, group = unique_topic("share"), unique_topic("g")
    create_topic(broker, topic, 2)
    recs = records(client)
    codec = PRODUCERS[client](broker, topic, recs)
    assert (CODECS[codec], COMPRESSED) in compressed_batches(broker, topic), \
        f"no {codec} batch of {COMPRESSED} records in the log: {compressed_batches(broker, topic)}"
    got = share_read(broker, group, topic, len(recs))
    keys = [m.key() for m in got]
    assert sorted(keys) == sorted(k for k, _, _ in recs), "every record exactly once"
    want = {k: (v, h) for k, v, h in recs}
    for m in got:
        assert (m.value(), m.headers()) == want[m.key()], m.key()
        assert m.delivery_count() == 1
        assert m.topic() == topic
