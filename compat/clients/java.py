"""The Java client, kafka-clients 3.9.0, through compat/java/CompatDriver.java in one JVM per worker."""

from __future__ import annotations

import shutil

from compat import env
from compat.clients import base
from compat.clients.rpc import RpcClient, RpcProcess


class JavaClient(RpcClient):
    name = "java"
    caps = frozenset({
        base.ADMIN, base.DESCRIBE_CONFIGS, base.DELETE_RECORDS, base.ASSIGN, base.GROUPS,
        base.GROUP_PROTOCOL_CONSUMER, base.COMMIT, base.TIMESTAMPS, base.LIST_OFFSETS, base.DESCRIBE_UNKNOWN,
        base.IDEMPOTENCE, base.TRANSACTIONS, base.TXN_OFFSETS, base.RESET_NONE, base.HEADERS, base.NULL_VALUES,
        base.NULL_HEADER_VALUES, base.BINARY,
        base.EMPTY_BYTES, base.ACKS0, base.MAX_MESSAGE_OVERRIDE, base.DELIVERY_OFFSETS,
        base.GROUP_ADMIN, base.OFFSET_DELETE, base.TXN_ADMIN,
        base.ALTER_CONFIGS, base.INCREMENTAL_ALTER_CONFIGS, base.CONFIG_SYNONYMS, base.BROKER_CONFIGS,
        base.BROKER_DEFAULT_CONFIGS, base.CLIENT_METRICS_CONFIGS,
        base.DESCRIBE_CLUSTER, base.CLUSTER_AUTHORIZED_OPS, base.DESCRIBE_TOPIC_PARTITIONS,
        base.TOPIC_AUTHORIZED_OPS, base.GROUP_AUTHORIZED_OPS, base.LOG_DIRS, base.ALTER_LOG_DIRS,
        base.ELECT_LEADERS, base.REASSIGNMENTS, base.CLIENT_QUOTAS, base.MAX_TIMESTAMP, base.EPOCH_VALIDATION,
        base.CLIENT_INSTANCE_ID, base.PUSH_TELEMETRY,
    })

    def __init__(self, bootstrap: str, sasl: base.Sasl | None = None) -> None:
        super().__init__(bootstrap, sasl)
        cp = env.java_classpath()
        java = shutil.which("java") or "java"
        # A small heap and the client VM's quick start: the suite runs on two cores.
        self.rpc = RpcProcess([java, "-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                               "-Xshare:auto", "-cp", cp, "CompatDriver", bootstrap, *self.security_args()])
