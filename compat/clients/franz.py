"""franz-go (github.com/twmb/franz-go: kgo, kadm), through compat/go/franz in one process per worker.

Its admin API (kadm) covers almost every Kafka admin API; the driver sends the few it lacks
(DescribeCluster, DescribeTopicPartitions, DescribeConfigs as asked, CLIENT_METRICS configs) as
franz-go's own request types. franz-go tells its KIP-714 client instance id only in its log (when a
subscription matches it), so it pushes metrics but cannot report its instance id on demand.
"""

from __future__ import annotations

from compat import env
from compat.clients import base
from compat.clients.rpc import RpcClient, RpcProcess


class FranzClient(RpcClient):
    name = "franz-go"
    # franz-go tells its KIP-714 instance id only in its log (the module docstring).
    caps = base.COMPLETE - {base.CLIENT_INSTANCE_ID}
    # franz-go's KIP-848 consumer needs ConsumerGroupHeartbeat v1 (it falls back to the classic protocol
    # below that).
    api_versions_needed = {68: 1}

    def __init__(self, bootstrap: str, sasl: base.Sasl | None = None) -> None:
        super().__init__(bootstrap, sasl)
        self.rpc = RpcProcess([str(env.go_driver(self.name)), bootstrap, *self.security_args()])

    def push_telemetry(self, client_id: str, hold: float) -> str | None:
        res = self.rpc.call("push_telemetry", 60 + hold, client_id=client_id, hold=hold)
        return None if res is None else str(res)

    def topic_authorized_operations(self, name: str) -> set[str] | None:
        # Metadata v8+ with IncludeTopicAuthorizedOperations (Kafka 3.x in ZooKeeper mode has no
        # DescribeTopicPartitions), as the Java admin falls back to.
        ops = self.rpc.call("topic_authorized_operations", name=name)
        return None if ops is None else {str(o).upper() for o in ops}
