"""Several broker processes per host (``pykbroker serve --processes N``), each a member of the
ZooKeeper cluster, so that one host's cores serve requests (docs/architecture.md "Past one core")."""
