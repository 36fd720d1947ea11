"""The operator's admin CLI: ``pykbroker topic|group|config|...`` over Kafka's Admin API on the wire, so the same
commands work against pykbroker and against any Kafka cluster (docs/admin.md).

Nothing is imported here: ``pykbroker.cli`` asks only for the command names, to route to the admin app, and the
broker's own ``serve`` and ``healthcheck`` must not pay for the admin client."""

from __future__ import annotations

# The first words that belong to the admin app (the rest of ``pykbroker`` is the broker's own commands).
COMMANDS = frozenset({"cluster", "topic", "group", "share-group", "config", "acl", "user", "quota", "partition",
                      "txn", "produce", "consume", "completion"})
# click's shell completion asks the app through this variable (set by the completion script).
COMPLETE_VAR = "_PYKBROKER_COMPLETE"
