"""IBM Sarama (github.com/IBM/sarama), through compat/go/sarama in one process per worker.

Sarama speaks the classic group protocol only; it has no DescribeTopicPartitions, AlterReplicaLogDirs
or CLIENT_METRICS configs, no OffsetForLeaderEpoch validation of a position and no KIP-714 telemetry.
Its partition consumer has no auto.offset.reset: a start outside the log is OFFSET_OUT_OF_RANGE, and the
driver then goes where the application asked (or keeps the error for "none"). Its
AlterPartitionReassignments addresses partitions 0..n-1 together and cannot cancel.
"""

from __future__ import annotations

from compat import env
from compat.clients import base
from compat.clients.rpc import RpcClient, RpcProcess


class SaramaClient(RpcClient):
    name = "sarama"
    caps = frozenset({
        base.ADMIN, base.DESCRIBE_CONFIGS, base.DELETE_RECORDS, base.ASSIGN, base.GROUPS, base.COMMIT,
        base.TIMESTAMPS, base.LIST_OFFSETS, base.DESCRIBE_UNKNOWN, base.IDEMPOTENCE, base.TRANSACTIONS,
        base.TXN_OFFSETS, base.RESET_NONE, base.HEADERS, base.NULL_VALUES, base.NULL_HEADER_VALUES, base.BINARY,
        base.EMPTY_BYTES,
        base.ACKS0, base.MAX_MESSAGE_OVERRIDE, base.DELIVERY_OFFSETS, base.GROUP_ADMIN, base.OFFSET_DELETE,
        base.TXN_ADMIN, base.ALTER_CONFIGS, base.INCREMENTAL_ALTER_CONFIGS, base.CONFIG_SYNONYMS,
        base.BROKER_CONFIGS, base.BROKER_DEFAULT_CONFIGS, base.DESCRIBE_CLUSTER, base.CLUSTER_AUTHORIZED_OPS,
        base.TOPIC_AUTHORIZED_OPS, base.GROUP_AUTHORIZED_OPS, base.LOG_DIRS, base.ELECT_LEADERS,
        base.REASSIGNMENTS, base.CLIENT_QUOTAS,
    })

    def __init__(self, bootstrap: str, sasl: base.Sasl | None = None) -> None:
        super().__init__(bootstrap, sasl)
        self.rpc = RpcProcess([str(env.go_driver(self.name)), bootstrap, *self.security_args()])

    def topic_authorized_operations(self, name: str) -> set[str] | None:
        # Metadata v8+ with IncludeTopicAuthorizedOperations (Sarama has no DescribeTopicPartitions).
        ops = self.rpc.call("topic_authorized_operations", name=name)
        return None if ops is None else {str(o).upper() for o in ops}
