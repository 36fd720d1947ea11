"""segmentio kafka-go (github.com/segmentio/kafka-go), through compat/go/kafkago in one process per worker.

kafka-go has no idempotent or transactional producer, no DeleteRecords, log-dir, transaction or
telemetry admin, and the classic group protocol only; its Writer reports offsets through its
Completion callback, its ConsumerGroup names each generation's partitions, and its protocol-level Client
does the administration (DescribeCluster is not among its requests: Metadata names the cluster id and
controller). For an assigned partition it has no auto.offset.reset other than "none"
(OffsetOutOfRangeError): it skips forward to the log start when behind it and waits past the end.
"""

from __future__ import annotations

from compat import env
from compat.clients import base
from compat.clients.rpc import RpcClient, RpcProcess


class KafkaGoClient(RpcClient):
    name = "kafka-go"
    caps = frozenset({
        base.ADMIN, base.DESCRIBE_CONFIGS, base.ASSIGN, base.GROUPS, base.COMMIT, base.TIMESTAMPS,
        base.LIST_OFFSETS, base.DESCRIBE_UNKNOWN, base.RESET_NONE, base.HEADERS, base.NULL_VALUES,
        base.NULL_HEADER_VALUES, base.BINARY, base.ACKS0, base.MAX_MESSAGE_OVERRIDE, base.DELIVERY_OFFSETS,
        base.GROUP_ADMIN, base.OFFSET_DELETE, base.ALTER_CONFIGS, base.INCREMENTAL_ALTER_CONFIGS,
        base.BROKER_CONFIGS, base.DESCRIBE_CLUSTER,
        base.ELECT_LEADERS, base.REASSIGNMENTS, base.CLIENT_QUOTAS,
    })
    # Not CONFIG_SYNONYMS: kafka-go 0.4.51 splits a DescribeConfigs request per broker into new requests
    # that keep only the resources, so IncludeSynonyms never reaches the broker. Not EMPTY_BYTES: its
    # Reader gives an empty key or value as nil, like a null one. Not BROKER_DEFAULT_CONFIGS: it sends a
    # broker resource's configs requests to the broker its name parses to, which "" (the cluster default)
    # does not.

    # kafka-go 0.4.51 writes its subscription as ConsumerProtocolSubscription version 1 without the
    # OwnedPartitions that version 1 adds: librdkafka as group leader refuses it ("Bad message format")
    # and assigns it nothing, so it stays out of the mixed group (groups of kafka-go members work).
    shares_groups = False

    def __init__(self, bootstrap: str, sasl: base.Sasl | None = None) -> None:
        super().__init__(bootstrap, sasl)
        self.rpc = RpcProcess([str(env.go_driver(self.name)), bootstrap, *self.security_args()])
