"""Replaying a partition of ``__consumer_offsets`` the way transactions left it: a transactional
commit counts once its marker says COMMIT, and never after an ABORT.  The group coordinator loads its
partitions through this filter; the transaction package owns it because it owns the markers."""

from __future__ import annotations

from dataclasses import dataclass, field

from pykbroker.coordinator.transaction.markers import CONTROL_COMMIT, parse_control_key
from pykbroker.protocol.records import BatchHeader

KV = tuple[bytes | None, bytes | None]


@dataclass
class TxnLoadFilter:
    """Replays a ``__consumer_offsets`` partition honouring transactions (fed batch by batch)."""

    open: dict[int, list[KV]] = field(default_factory=dict)

    def feed(self, header: BatchHeader, records: list[KV]) -> list[KV]:
        """Records of this batch to apply now, in log order."""
        if header.is_control:
            held = self.open.pop(header.producer_id, [])
            commit = bool(records) and parse_control_key(records[0][0]) == CONTROL_COMMIT
            return held if commit else []
        if header.is_transactional:
            self.open.setdefault(header.producer_id, []).extend(records)
            return []
        return records
