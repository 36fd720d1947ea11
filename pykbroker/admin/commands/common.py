"""Small pieces several commands share: KEY=VALUE options, replica assignments, node ids, partition offsets."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import OffsetSpec

from ..errors import EXIT_FAILED, EXIT_USAGE, AdminError, kafka_error
from ..session import Session


def key_values(items: Iterable[str], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise AdminError(f"{option} takes KEY=VALUE, not {item!r}", EXIT_USAGE)
        out[key] = value
    return out


def parse_assignment(text: str) -> list[list[int]]:
    """``0:1,1:2`` (kafka-topics' --replica-assignment): the broker ids of partition 0, then of partition 1."""
    try:
        return [[int(b) for b in part.split(":")] for part in text.split(",")]
    except ValueError as e:
        raise AdminError(f"--replica-assignment takes broker ids like 0:1,1:2, not {text!r}", EXIT_USAGE) from e


def node_id(node: Any) -> int | None:
    """A librdkafka Node's id; None for no node (a partition without a leader)."""
    return None if node is None or node.id < 0 else int(node.id)


def offsets_of(session: Session, topic: str, partitions: Iterable[int], spec: str | int) -> dict[int, int]:
    """ListOffsets of ``partitions``: ``spec`` is earliest, latest, max-timestamp or a timestamp in ms.
    A partition whose answer failed is left out (its leader may be moving)."""
    if spec == "earliest":
        offset_spec = OffsetSpec.earliest()
    elif spec == "latest":
        offset_spec = OffsetSpec.latest()
    elif spec == "max-timestamp":
        offset_spec = OffsetSpec.max_timestamp()
    else:
        offset_spec = OffsetSpec.for_timestamp(int(spec))
    admin = session.admin
    request = {TopicPartition(topic, p): offset_spec for p in partitions}
    if not request:
        return {}
    results = admin.wait_each(admin.client.list_offsets(request, request_timeout=admin.timeout),
                              lambda tp: f"offsets of {tp.topic}/{tp.partition}")
    return {tp.partition: int(r.offset) for tp, r in results.items() if not isinstance(r, AdminError)}


def existing_topic(session: Session, topic: str) -> Any:
    """The topic's metadata, or UNKNOWN_TOPIC_OR_PARTITION; asked in a Metadata request for all topics, which (unlike
    one naming the topic) never creates it on a cluster with auto.create.topics.enable."""
    md = session.admin.metadata().topics.get(topic)
    if md is None:
        raise AdminError(f"topic {topic}: Broker: Unknown topic or partition", EXIT_FAILED,
                         error="UNKNOWN_TOPIC_OR_PARTITION")
    if md.error is not None:
        raise kafka_error(md.error, f"topic {topic}")
    return md
