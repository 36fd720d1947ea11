"""Scenario metadata: which family a test belongs to, and what it needs from the client and the broker."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from compat.wire import api_name

# How a skip reason starts when a scenario cannot run: the results and the report classify it by this.
NS_CLIENT = "NOT SUPPORTED by client"
NS_BROKER = "NOT SUPPORTED by broker"
# The scenario needs something this particular cluster lacks, though its broker supports it (moving a
# replica between log dirs on a broker with one log dir): neither a failure nor a gap of the broker.
NS_CLUSTER = "NOT POSSIBLE on this cluster"

# Broker APIs (keys) behind each feature, as a client needs them.
GROUPS = (10, 11, 12, 13, 14, 8, 9)        # FindCoordinator, JoinGroup, Heartbeat, LeaveGroup, SyncGroup,
                                            # OffsetCommit, OffsetFetch
COMMITS = (10, 8, 9)                        # FindCoordinator, OffsetCommit, OffsetFetch
CONSUMER_PROTOCOL = (68, 10, 8, 9)          # ConsumerGroupHeartbeat (KIP-848) + offsets
CONSUMER_GROUP_HEARTBEAT = 68
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


def needed_versions(apis: Iterable[int], client_needs: Iterable[Mapping[int, int]]) -> dict[int, int]:
    """The lowest version of each API key the scenario can use: 0 unless a client involved needs more
    (``Client.api_versions_needed``: librdkafka speaks only ConsumerGroupHeartbeat v1, for example)."""
    out = dict.fromkeys(apis, 0)
    for needs in client_needs:
        for key, version in needs.items():
            if key in out:
                out[key] = max(out[key], version)
    return out


def broker_gaps(advertised: Mapping[int, tuple[int, int]], needed: Mapping[int, int]) -> list[str]:
    """What the broker's ApiVersions answer lacks for ``needed`` ({key: lowest usable version}): an API it
    does not advertise, or one whose advertised range stops below the version a client needs.
    Presence of the key alone is not enough: Kafka 3.8 advertises ConsumerGroupHeartbeat v0 only."""
    gaps = []
    for key, version in needed.items():
        name = f"{api_name(key)}({key})"
        if key not in advertised:
            gaps.append(f"{name} is not advertised")
            continue
        lo, hi = advertised[key]
        if hi < version:
            gaps.append(f"{name} v{version}+ is needed, the broker advertises v{lo}–{hi}")
    return gaps
