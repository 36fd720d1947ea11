"""Ordering per key across partitions; error codes for unknown topics."""

from __future__ import annotations

from collections import defaultdict

from compat import scenario as s
from compat.check import expect_error
from compat.clients import base
from compat.clients.base import Client, Msg
from compat.conftest import unique_topic


@s.scenario("ordering.per-key", "ordering", apis=(0, 1))
def test_ordering_per_key(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=4)
    keys = [f"key-{k}".encode() for k in range(10)]
    sent = [Msg(value=f"{k.decode()}#{i}".encode(), key=k) for i in range(30) for k in keys]
    client.produce(topic, sent)  # the client's default partitioner chooses the partition
    got = client.consume(topic, [0, 1, 2, 3], count=len(sent), timeout=30)
    assert len(got) == len(sent)
    where: dict[bytes, set[int]] = defaultdict(set)
    seq: dict[bytes, list[int]] = defaultdict(list)
    for r in sorted(got, key=lambda r: (r.partition, r.offset)):
        assert r.key is not None and r.value is not None
        where[r.key].add(r.partition)
        seq[r.key].append(int(r.value.split(b"#")[1]))
    for k in keys:
        assert len(where[k]) == 1, f"{k!r} landed in partitions {sorted(where[k])}"
        assert seq[k] == list(range(30)), f"{k!r} out of order: {seq[k]}"
    assert len({p for ps in where.values() for p in ps}) > 1, "all keys in one partition: not a partitioned test"


@s.scenario("error.unknown-topic.metadata", "errors", needs=(base.DESCRIBE_UNKNOWN,), apis=(3,), consumes=False)
def test_unknown_topic_metadata(client: Client) -> None:
    expect_error("UNKNOWN_TOPIC_OR_PARTITION", client.describe_topic, unique_topic("never-created"))


@s.scenario("error.unknown-topic.admin", "errors", needs=(base.ADMIN,), apis=(20, 37), consumes=False)
def test_unknown_topic_admin(client: Client) -> None:
    name = unique_topic("never-created")
    expect_error("UNKNOWN_TOPIC_OR_PARTITION", client.delete_topic, name)
    expect_error("UNKNOWN_TOPIC_OR_PARTITION", client.create_partitions, name, 3)
