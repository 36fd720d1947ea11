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
        base.TXN_OFFSETS, base.HEADERS, base.NULL_VALUES, base.BINARY,
        base.EMPTY_BYTES, base.ACKS0, base.MAX_MESSAGE_OVERRIDE,
        base.DELIVERY_OFFSETS, base.GROUP_ADMIN, base.ALTER_CONFIGS, base.DESCRIBE_CLUSTER, base.REASSIGNMENTS,
    })
    consume_apis = scenario.GROUPS
    # kafkajs 2 has PLAIN, SCRAM-SHA-256/512, AWS and OAUTHBEARER.

    def __init__(self, bootstrap: str, sasl: base.Sasl | None = None) -> None:
        super().__init__(bootstrap, sasl)
        env.node_modules()
        node = shutil.which("node") or "node"
        self.rpc = RpcProcess([node, str(env.JS_DIR / "driver.js"), bootstrap, *self.security_args()],
                              cwd=env.JS_DIR)

    def alter_reassignments(self, topic: str, targets: dict[int, list[int] | None]) -> dict[int, str | None]:
        # The driver answers each partition's error as kafkajs reports it: a Kafka error code.
        res = self.rpc.call("alter_reassignments", topic=topic, targets={str(p): r for p, r in targets.items()})
        return {int(p): (None if code is None else base.error_name(int(code))) for p, code in res.items()}
