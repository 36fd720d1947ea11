"""kafkajs (npm), through compat/js/driver.js in one Node process per worker.

kafkajs has no manual partition assignment: it consumes only as a member of a consumer group, so its
consume() needs the broker's group APIs (``consume_apis``)."""

from __future__ import annotations

import shutil

from compat import env, scenario
from compat.clients import base
from compat.clients.rpc import RpcClient, RpcProcess


class KafkajsClient(RpcClient):
    name = "kafkajs"
    caps = frozenset({
        base.ADMIN, base.DESCRIBE_CONFIGS, base.DELETE_RECORDS, base.ASSIGN, base.GROUPS, base.COMMIT,
        base.TIMESTAMPS, base.LIST_OFFSETS, base.DESCRIBE_UNKNOWN, base.IDEMPOTENCE, base.TRANSACTIONS,
        base.TXN_OFFSETS, base.HEADERS, base.NULL_VALUES, base.BINARY, base.ACKS0, base.MAX_MESSAGE_OVERRIDE,
        base.DELIVERY_OFFSETS, base.GROUP_ADMIN,
    })
    consume_apis = scenario.GROUPS

    def __init__(self, bootstrap: str) -> None:
        super().__init__(bootstrap)
        env.node_modules()
        node = shutil.which("node") or "node"
        self.rpc = RpcProcess([node, str(env.JS_DIR / "driver.js"), bootstrap], cwd=env.JS_DIR)
