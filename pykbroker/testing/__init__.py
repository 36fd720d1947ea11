"""Test an application against a real pykbroker: :class:`Broker` (one broker, embedded metadata) and
:class:`Cluster` (three brokers and ZooKeeper), each a subprocess started in a temporary directory and
removed on exit, and a pytest plugin (``pykbroker.testing.pytest_plugin``, opt-in) with fixtures.

Only the wire protocol of pykbroker is imported here: the broker runs as its own process (docs/testing.md)."""

from pykbroker.testing.broker import TEST_DEFAULTS, Broker, BrokerStartError, free_port
from pykbroker.testing.cluster import Cluster, ZooKeeperUnavailable
from pykbroker.testing.wire import WireError, create_topic, delete_topic

__all__ = ["TEST_DEFAULTS", "Broker", "BrokerStartError", "Cluster", "WireError", "ZooKeeperUnavailable",
           "create_topic", "delete_topic", "free_port"]
