"""Transaction markers: the control batches that close a transaction in a data partition.

A marker is a one-record control batch carrying the producer id and epoch; its key is
(int16 version 0, int16 type: 0 abort, 1 commit) and its value (int16 version 0, int32
coordinator epoch), as in Kafka's EndTransactionMarker.  Within one broker it is a local
append through the replica manager; WriteTxnMarkers (from another coordinator) uses the same.
"""

from __future__ import annotations

import logging
import struct
import time

from kio.schema.errors import ErrorCode

from pykbroker.protocol.records import InvalidRecords, build_batch, validate_for_append
from pykbroker.replica.replica_manager import Partition, ReplicaManager

log = logging.getLogger("pykbroker.txn")

CONTROL_ABORT = 0
CONTROL_COMMIT = 1
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


def control_key(commit: bool) -> bytes:
    return _KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)


def control_value(coordinator_epoch: int) -> bytes:
    return _VALUE.pack(0, coordinator_epoch)


def parse_control_key(key: bytes | None) -> int | None:
    """The control record type (0 abort, 1 commit), or None if the key is not a control key."""
    if key is None or len(key) < 4:
        return None
    return int(_KEY.unpack_from(key, 0)[1])


def build_marker(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                 timestamp_ms: int) -> bytes:
    return build_batch([(control_key(commit), control_value(coordinator_epoch), ())], timestamp_ms=timestamp_ms,
                       producer_id=producer_id, producer_epoch=producer_epoch, is_control=True,
                       is_transactional=True)


def append_internal(p: Partition, buf: bytearray) -> None:
    """Append coordinator-built batches (markers, transactional offset commits) to a partition."""
    now = time.time_ns() // 1_000_000
    batches = validate_for_append(buf, max_batch_bytes=max(len(buf), p.log.config.max_message_bytes),
                                  now_ms=now, timestamp_type=0, from_client=False, allow_multiple_batches=True)
    p.log.append(buf, batches, leader_epoch=p.leader_epoch, origin="coordinator")


def write_marker(replicas: ReplicaManager, topic: str, partition: int, producer_id: int, producer_epoch: int,
                 commit: bool, coordinator_epoch: int) -> ErrorCode:
    p = replicas.partition(topic, partition)
    if p is None:
        return ErrorCode.unknown_topic_or_partition
    if p.leader_id != replicas.broker_id:
        return ErrorCode.not_leader_or_follower
    buf = bytearray(build_marker(producer_id, producer_epoch, commit, coordinator_epoch, time.time_ns() // 1_000_000))
    try:
        append_internal(p, buf)
    except InvalidRecords as e:
        log.warning("marker rejected by %(topic)s-%(partition)d: %(error)s",
                    {"topic": topic, "partition": partition, "error": e})
        return ErrorCode(e.error_code)
    except Exception as e:
        code = getattr(e, "error_code", None)
        if code is not None:
            log.warning("marker rejected by %(topic)s-%(partition)d: %(error)s",
                        {"topic": topic, "partition": partition, "error": e})
            return ErrorCode(code)
        raise
    replicas.on_appended(p)
    return ErrorCode.none
