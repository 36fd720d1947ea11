"""ListOffsets with MAX_TIMESTAMP (-3, KIP-734): the offset of the record with the largest timestamp.

The answer pairs that record's offset with its timestamp.  Records are produced with timestamps out of
order, so the largest is neither the first nor the last record, nor in the last batch, and two client
libraries ask for it: confluent-kafka (``OffsetSpec.max_timestamp()``) and kafka-python
(``OffsetSpec.MAX_TIMESTAMP``).
"""

from __future__ import annotations

import time

from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import OffsetSpec as CkOffsetSpec
from kafka.admin import KafkaAdminClient
from kafka.admin import OffsetSpec as KpOffsetSpec
from kafka.structs import TopicPartition as KpTopicPartition

from tests.integration.conftest import (
    CLIENT_TIMEOUT,
    BrokerFactory,
    admin_for,
    create_topic,
    make_producer,
    unique_topic,
)
from tests.support.broker import BrokerProcess

BASE = (int(time.time()) - 3600) * 1000
# offset -> timestamp; the maximum is at offset 3, in the second of three batches.
STAMPS = [BASE + 10, BASE + 20, BASE + 30, BASE + 90_000, BASE + 40, BASE + 50, BASE + 60]
MAX_OFFSET = 3


def _produce(b: BrokerProcess, topic: str) -> None:
    p = make_producer(b, **{"linger.ms": 0})
    for batch in ((0, 3), (3, 5), (5, 7)):  # flushed separately: one batch each
        for offset in range(*batch):
            p.produce(topic, value=f"v{offset}".encode(), partition=0, timestamp=STAMPS[offset])
        assert p.flush(CLIENT_TIMEOUT) == 0


def test_max_timestamp_through_confluent_kafka_and_kafka_python(broker_factory: BrokerFactory) -> None:
    b = broker_factory()
    topic = unique_topic("maxts")
    create_topic(b, topic)
    admin = admin_for(b)
    empty = admin.list_offsets({CkTopicPartition(topic, 0): CkOffsetSpec.max_timestamp()},
                               request_timeout=CLIENT_TIMEOUT)
    r = empty[CkTopicPartition(topic, 0)].result(timeout=CLIENT_TIMEOUT)
    assert (r.offset, r.timestamp) == (-1, -1), "an empty partition has no record with a maximum timestamp"

    _produce(b, topic)

    fs = admin.list_offsets({CkTopicPartition(topic, 0): CkOffsetSpec.max_timestamp()},
                            request_timeout=CLIENT_TIMEOUT)
    r = fs[CkTopicPartition(topic, 0)].result(timeout=CLIENT_TIMEOUT)
    assert (r.offset, r.timestamp) == (MAX_OFFSET, STAMPS[MAX_OFFSET])

    kp = KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=int(CLIENT_TIMEOUT * 1000))
    try:
        tp = KpTopicPartition(topic, 0)
        got = kp.list_partition_offsets({tp: KpOffsetSpec.MAX_TIMESTAMP})[tp]
        assert (got.offset, got.timestamp) == (MAX_OFFSET, STAMPS[MAX_OFFSET])
        # The other specs answer as usual.
        latest = kp.list_partition_offsets({tp: KpOffsetSpec.LATEST})[tp]
        earliest = kp.list_partition_offsets({tp: KpOffsetSpec.EARLIEST})[tp]
        assert (earliest.offset, latest.offset) == (0, len(STAMPS))
    finally:
        kp.close()

    # A later record with a still larger timestamp takes over.
    p = make_producer(b)
    p.produce(topic, value=b"newest", partition=0, timestamp=BASE + 100_000)
    assert p.flush(CLIENT_TIMEOUT) == 0
    fs = admin.list_offsets({CkTopicPartition(topic, 0): CkOffsetSpec.max_timestamp()},
                            request_timeout=CLIENT_TIMEOUT)
    r = fs[CkTopicPartition(topic, 0)].result(timeout=CLIENT_TIMEOUT)
    assert (r.offset, r.timestamp) == (len(STAMPS), BASE + 100_000)
