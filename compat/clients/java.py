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
        base.NULL_HEADER_VALUES, base.BINARY, base.ACKS0, base.MAX_MESSAGE_OVERRIDE, base.DELIVERY_OFFSETS,
        base.GROUP_ADMIN, base.OFFSET_DELETE, base.TXN_ADMIN,
    })

    def __init__(self, bootstrap: str) -> None:
        super().__init__(bootstrap)
        cp = env.java_classpath()
        java = shutil.which("java") or "java"
        # A small heap and the client VM's quick start: the suite runs on two cores.
        self.rpc = RpcProcess([java, "-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                               "-Xshare:auto", "-cp", cp, "CompatDriver", bootstrap])
