"""A ``broker=<id>`` field on every log line of a child of ``serve --processes``.

The children write to the parent's stdout and stderr, interleaved line by line; many lines (shutdown,
ZooKeeper session, storage) do not name the broker, so the field says which process wrote each. It
travels as a structured field (``kv``), so text, logfmt and JSON lines all carry it.
"""

from __future__ import annotations

import logging


class BrokerTag(logging.Filter):
    """Adds ``broker`` to a record's structured fields, keeping any it already has."""

    def __init__(self, broker_id: int) -> None:
        super().__init__()
        self.broker_id = broker_id

    def filter(self, record: logging.LogRecord) -> bool:
        kv = getattr(record, "kv", None)
        record.kv = {**kv, "broker": self.broker_id} if isinstance(kv, dict) else {"broker": self.broker_id}
        return True


def tag_log_lines(broker_id: int) -> None:
    """Install the tag on the root logger's handlers (after logsetup.configure has made them)."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(BrokerTag(broker_id))
