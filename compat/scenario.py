"""Scenario metadata: which family a test belongs to, and what it needs from the client and the broker."""

from __future__ import annotations

from typing import Any

import pytest

# Broker APIs (keys) behind each feature, as a client needs them.
GROUPS = (10, 11, 12, 13, 14, 8, 9)        # FindCoordinator, JoinGroup, Heartbeat, LeaveGroup, SyncGroup,
                                            # OffsetCommit, OffsetFetch
COMMITS = (10, 8, 9)                        # FindCoordinator, OffsetCommit, OffsetFetch
CONSUMER_PROTOCOL = (68, 10, 8, 9)          # ConsumerGroupHeartbeat (KIP-848) + offsets
IDEMPOTENCE = (22,)                         # InitProducerId
TRANSACTIONS = (22, 10, 24, 26)             # + FindCoordinator, AddPartitionsToTxn, EndTxn
TXN_OFFSETS = (*TRANSACTIONS, 25, 28)       # + AddOffsetsToTxn, TxnOffsetCommit
ADMIN_CREATE = (19,)
ADMIN_DELETE = (20,)
CREATE_PARTITIONS = (37,)
DESCRIBE_CONFIGS = (32,)
DELETE_RECORDS = (21,)
LIST_OFFSETS = (2,)


def scenario(name: str, family: str, *, needs: tuple[str, ...] = (), apis: tuple[int, ...] = (),
             consumes: bool = True) -> Any:
    """Mark a test as the scenario ``name``.

    needs: client capabilities (compat.clients.base constants); a client without one reports
           "not supported" (by the client).
    apis:  API keys the broker must advertise in ApiVersions; otherwise "not supported" (by the broker).
    consumes: the scenario reads records back, so the client's own consume prerequisites apply
           (kafkajs can only consume through a consumer group).
    """
    return pytest.mark.compat_scenario(name=name, family=family, needs=tuple(needs), apis=tuple(apis),
                                       consumes=consumes)
