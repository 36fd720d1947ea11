"""What the coordinators' request handlers and the produce path's transaction verification need of the
broker's services: a Protocol on this floor, which the server's ``Services`` satisfies, so that the
coordinators never import the server above them."""

from __future__ import annotations

from typing import Protocol

from pykbroker.config import BrokerConfig
from pykbroker.coordinator.group.service import GroupCoordinator
from pykbroker.coordinator.share.service import ShareCoordinator
from pykbroker.coordinator.transaction.service import TransactionCoordinator
from pykbroker.metadata.store import MetadataStore
from pykbroker.replica.replica_manager import ReplicaManager


class CoordinatorServices(Protocol):
    @property
    def config(self) -> BrokerConfig: ...

    @property
    def store(self) -> MetadataStore: ...

    @property
    def replicas(self) -> ReplicaManager: ...

    @property
    def groups(self) -> GroupCoordinator | None: ...

    @property
    def txn_coordinator(self) -> TransactionCoordinator | None: ...

    @property
    def shares(self) -> ShareCoordinator | None: ...

    @property
    def broker_id(self) -> int: ...
