"""Kafka's partition.metadata file: the topic id of a partition's log (cluster mode, replica/topics.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

from pykbroker.metadata.zk_layout import uuid_to_kafka
from pykbroker.replica.topics import PARTITION_METADATA, read_partition_metadata, write_partition_metadata


def test_written_in_kafkas_format_and_read_back(tmp_path: Path) -> None:
    topic_id = uuid.uuid4()
    write_partition_metadata(tmp_path, topic_id)
    assert (tmp_path / PARTITION_METADATA).read_text() == f"version: 0\ntopic_id: {uuid_to_kafka(topic_id)}\n"
    assert read_partition_metadata(tmp_path) == topic_id
    assert [p.name for p in tmp_path.iterdir()] == [PARTITION_METADATA]  # no temporary file left


def test_an_existing_file_is_kept(tmp_path: Path) -> None:
    first, second = uuid.uuid4(), uuid.uuid4()
    write_partition_metadata(tmp_path, first)
    write_partition_metadata(tmp_path, second)  # the log belongs to the topic that created it
    assert read_partition_metadata(tmp_path) == first


def test_kafka_written_file_is_understood(tmp_path: Path) -> None:
    # As Kafka's PartitionMetadataFile writes it (base64 of the 16 bytes, URL-safe, unpadded).
    (tmp_path / PARTITION_METADATA).write_text("version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ\n")
    assert read_partition_metadata(tmp_path) == uuid.UUID(int=1)


def test_missing_or_unreadable_means_unknown(tmp_path: Path) -> None:
    assert read_partition_metadata(tmp_path) is None
    (tmp_path / PARTITION_METADATA).write_text("version: 0\ntopic_id: not-base64!\n")
    assert read_partition_metadata(tmp_path) is None
    (tmp_path / PARTITION_METADATA).write_text("garbage")
    assert read_partition_metadata(tmp_path) is None
    write_partition_metadata(tmp_path / "missing-dir", uuid.uuid4())  # logged, not raised
