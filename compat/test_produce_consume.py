"""Produce/consume round trips: keys, headers, null values, large messages, codecs, acks."""

from __future__ import annotations

import os

import pytest

from compat import scenario as s
from compat.check import assert_same, binary_msgs, expect_error, text_msgs
from compat.clients import base
from compat.clients.base import Client, Msg


@s.scenario("produce.roundtrip-text", "produce/consume", needs=(base.HEADERS,), apis=(0, 1))
def test_roundtrip_text(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=3)
    sent = [m for p in range(3) for m in text_msgs(20, prefix=f"p{p}", partition=p)]
    deliveries = client.produce(topic, sent)
    for p in range(3) if base.DELIVERY_OFFSETS in client.caps else []:
        offs = [d.offset for d, m in zip(deliveries, sent, strict=True) if m.partition == p]
        assert offs == list(range(20)), f"partition {p}: delivery offsets {offs}"
    got = client.consume(topic, [0, 1, 2], count=len(sent))
    assert_same(sent, got)


@s.scenario("produce.roundtrip-binary", "produce/consume",
            needs=(base.HEADERS, base.NULL_VALUES, base.BINARY, base.EMPTY_BYTES), apis=(0, 1))
def test_roundtrip_binary(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=2)
    sent = binary_msgs(0) + binary_msgs(1)
    client.produce(topic, sent)
    got = client.consume(topic, [0, 1], count=len(sent))
    assert_same(sent, got)


@s.scenario("produce.null-values", "produce/consume", needs=(base.NULL_VALUES,), apis=(0, 1))
def test_null_values(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=1)
    sent = text_msgs(12, prefix="tomb", partition=0, headers=False, null_every=3)
    client.produce(topic, sent)
    got = client.consume(topic, [0], count=len(sent))
    assert_same(sent, got, check_headers=False)
    assert sum(r.value is None for r in got) == 4


@s.scenario("produce.null-header-value", "produce/consume", needs=(base.HEADERS, base.NULL_HEADER_VALUES),
            apis=(0, 1))
def test_null_header_value(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=1)
    sent = [Msg(value=b"v", key=b"k", partition=0, headers=[("null", None), ("set", b"x")])]
    client.produce(topic, sent)
    assert_same(sent, client.consume(topic, [0], count=1))


LIMIT = 1048588  # Kafka's default message.max.bytes, set on the topic so the cluster's default does not matter


@s.scenario("produce.large-message", "produce/consume", apis=(0, 1))
def test_large_message(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=1, configs={"max.message.bytes": str(LIMIT)})
    # One record per request, just under the limit once the batch overhead is added; hex text so that
    # every client (kcat included) can carry it, incompressible enough not to matter.
    big = os.urandom(500_000).hex().encode()[: LIMIT - 1024]
    sent = [Msg(value=big, key=b"big", partition=0)]
    client.produce(topic, sent)
    got = client.consume(topic, [0], count=1, timeout=30)
    assert_same(sent, got, check_headers=False)


@s.scenario("produce.compression", "produce/consume", apis=(0, 1))
@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression(client: Client, new_topic, codec: str) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=2)
    sent = [m for p in range(2) for m in text_msgs(100, prefix=f"{codec}{p}", partition=p)]
    client.produce(topic, sent, compression=codec)
    got = client.consume(topic, [0, 1], count=len(sent))
    assert_same(sent, got)


@s.scenario("produce.acks", "produce/consume", apis=(0, 1))
@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks(client: Client, new_topic, acks: str) -> None:  # type: ignore[no-untyped-def]
    if acks == "0" and base.ACKS0 not in client.caps:
        raise base.NotSupportedByClient("acks=0")
    topic = new_topic(partitions=1)
    sent = text_msgs(20, prefix=f"acks{acks}", partition=0)
    deliveries = client.produce(topic, sent, acks=acks)
    if acks != "0" and base.DELIVERY_OFFSETS in client.caps:
        assert [d.offset for d in deliveries] == list(range(20))
    got = client.consume(topic, [0], count=len(sent), timeout=20)
    assert_same(sent, got)


@s.scenario("error.message-too-large", "errors", needs=(base.MAX_MESSAGE_OVERRIDE,), apis=(0,), consumes=False)
def test_message_too_large(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=1, configs={"max.message.bytes": "10000"})
    big = os.urandom(10_000).hex().encode()  # 20 000 bytes, over the topic's limit
    expect_error("MESSAGE_TOO_LARGE", client.produce, topic, [Msg(value=big, partition=0)], timeout=20)
    # The broker rejected that batch only; the topic still takes small records.
    client.produce(topic, [Msg(value=b"small", partition=0)])
    assert [r.value for r in client.consume(topic, [0], count=1)] == [b"small"]
