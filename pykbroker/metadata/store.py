"""The metadata store seam.

Everything the broker knows about topics goes through :class:`MetadataStore`.
The embedded backend keeps it in a file in the data directory; the ZooKeeper
backend (metadata/zookeeper.py) implements the same interface, its watches
feeding :meth:`MetadataStore.add_listener` callbacks on the broker's event loop.

Threading rule: the cached views (topics(), live_brokers(), ...) are read and
changed only on the broker's event loop thread, and listeners are called there.
A store whose writes do network I/O says so with ``blocking = True``; callers on
the event loop then run its writes in a worker thread (:func:`run_store`).
"""

from __future__ import annotations

import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import anyio.to_thread

from pykbroker.security.sasl.scram import ScramCredential

if TYPE_CHECKING:
    from pykbroker.security.acl import AclBinding, AclBindingFilter

T = TypeVar("T")

# __delayed_records: the scheduled log of delayed delivery (pykbroker/delay).
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__delayed_records",
                             "__share_group_state"})
MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")


def topic_name_problem(name: str) -> str | None:
    """Kafka's topic naming rules; None when the name is legal."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return "Topic name cannot be \".\" or \"..\""
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters"
    if not _LEGAL_TOPIC.match(name):
        return (f"Topic name \"{name}\" is illegal, it contains a character other than ASCII alphanumerics, "
                "'.', '_' and '-'")
    return None


@dataclass(slots=True)
class PartitionAssignment:
    replicas: list[int]
    leader: int = -1
    leader_epoch: int = 0
    isr: list[int] = field(default_factory=list)
    # ZooKeeper mode: the controller epoch that wrote the state, and the state znode's version,
    # against which a leader's ISR change is conditional (-1: not from ZooKeeper).
    controller_epoch: int = 0
    zk_version: int = -1
    # A reassignment in progress (KIP-455): replicas being added and removed.
    adding_replicas: list[int] = field(default_factory=list)
    removing_replicas: list[int] = field(default_factory=list)


@dataclass(slots=True)
class TopicRecord:
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionAssignment]
    configs: dict[str, str] = field(default_factory=dict)

    @property
    def internal(self) -> bool:
        return self.name in INTERNAL_TOPICS

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "topic_id": str(self.topic_id),
            "partitions": {
                str(p): {"replicas": a.replicas, "leader": a.leader, "leader_epoch": a.leader_epoch, "isr": a.isr}
                for p, a in sorted(self.partitions.items())
            },
            "configs": self.configs,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> TopicRecord:
        parts = data["partitions"]
        assert isinstance(parts, dict)
        configs = data.get("configs") or {}
        assert isinstance(configs, dict)
        return cls(
            name=str(data["name"]),
            topic_id=uuid.UUID(str(data["topic_id"])),
            partitions={
                int(p): PartitionAssignment(
                    replicas=list(a["replicas"]), leader=int(a["leader"]),
                    leader_epoch=int(a["leader_epoch"]), isr=list(a["isr"]),
                )
                for p, a in parts.items()
            },
            configs={str(k): str(v) for k, v in configs.items()},
        )


class TopicExists(Exception):
    pass


class UnknownTopic(Exception):
    pass


MetadataListener = Callable[[str, "TopicRecord | None"], None]
ConfigListener = Callable[[int, str], None]
ClusterListener = Callable[[], None]


class StaleState(Exception):
    """A conditional write lost: the partition state changed since it was read."""


class StoreUnavailable(Exception):
    """The store cannot be reached (ZooKeeper down or session lost); retriable."""


class MetadataStorageError(StoreUnavailable):
    """The store's own files cannot be written (embedded metadata in a log dir that failed): Kafka's log-dir
    failure of its metadata dir, on which the broker stops.  A request that met it gets KAFKA_STORAGE_ERROR."""

# Kafka's ConfigResource.Type ids of the entities whose dynamic configs live in the store (topic
# configs live with their TopicRecord). ZooKeeper keeps them at /config/brokers/<id> (and
# /config/brokers/<default> for resource name ""), /config/client-metrics/<name>, /config/groups/<id>.
BROKER_RESOURCE = 4
CLIENT_METRICS_RESOURCE = 16
GROUP_RESOURCE = 32
ENTITY_RESOURCES = (BROKER_RESOURCE, CLIENT_METRICS_RESOURCE, GROUP_RESOURCE)

# A client quota entity (KIP-546): (entity type, entity name or None for the default), sorted by type.
QuotaEntity = tuple[tuple[str, str | None], ...]
# A partition being reassigned: its replicas, the replicas being added and those being removed.
Reassignment = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


class MetadataStore(ABC):
    """Topics, partitions, configs and id allocation for the cluster."""

    cluster_id: str
    # Whether writes do network I/O (ZooKeeper): callers on the event loop use run_store().
    blocking: bool = False

    def __init__(self) -> None:
        self._listeners: list[MetadataListener] = []
        self._config_listeners: list[ConfigListener] = []
        self._cluster_listeners: list[ClusterListener] = []
        self._by_id: dict[uuid.UUID, TopicRecord] = {}
        # This broker's schema registry URL, registered with the broker (set before registering; None: off).
        self.schema_registry_url: str | None = None

    def add_cluster_listener(self, listener: ClusterListener) -> None:
        """Called (on the event loop) after the live brokers or the controller changed."""
        self._cluster_listeners.append(listener)

    def _notify_cluster(self) -> None:
        for listener in self._cluster_listeners:
            listener()

    def set_poster(self, post: Callable[[Callable[[], None]], None]) -> None:
        """How the store runs a callable on the broker's event loop thread (thread-safe).

        The embedded store never needs it; the ZooKeeper store delivers every watch through it.
        """
        self._post = post

    def broker_rack(self, broker_id: int) -> str | None:
        """The rack a live broker registered with (broker.rack), if any."""
        return None

    def broker_schema_registry_url(self, broker_id: int) -> str | None:
        """The schema registry URL a live broker registered with (pykbroker.schema.registry.listener), if any."""
        return None

    def is_cluster(self) -> bool:
        """Whether this store coordinates several brokers (ZooKeeper mode)."""
        return False

    def update_isr(self, topic: str, index: int, leader_epoch: int, isr: list[int], zk_version: int) -> int:
        """The leader's ISR change, conditional on the state it last read; returns the new zk_version.

        Raises StaleState when the state changed meanwhile (the leader then waits for the new state).
        """
        rec = self.topics().get(topic)
        if rec is None or index not in rec.partitions:
            raise StaleState(f"{topic}-{index}")
        a = rec.partitions[index]
        if a.leader_epoch != leader_epoch:
            raise StaleState(f"{topic}-{index}")
        a.isr = list(isr)
        return a.zk_version

    def roles_confirmed(self) -> bool:
        """Whether this broker may take the partition roles (leader, follower, coordinator) the metadata gives
        it. A ZooKeeper broker waits at start for the controller to confirm its registration; embedded
        metadata has no one else to wait for."""
        return True

    def add_listener(self, listener: MetadataListener) -> None:
        """Called with (topic name, new record or None when deleted) after every change."""
        self._listeners.append(listener)

    def _notify(self, name: str, record: TopicRecord | None) -> None:
        self._by_id = {}
        for listener in self._listeners:
            listener(name, record)

    def add_config_listener(self, listener: ConfigListener) -> None:
        """Called with (resource type, resource name) after an entity's dynamic configs changed."""
        self._config_listeners.append(listener)

    def _notify_config(self, resource_type: int, name: str) -> None:
        for listener in self._config_listeners:
            listener(resource_type, name)

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def live_brokers(self) -> dict[int, list[tuple[str, str, int]]]:
        """broker id -> advertised (listener name, host, port) endpoints."""

    @abstractmethod
    def controller_id(self) -> int: ...

    @abstractmethod
    def topics(self) -> dict[str, TopicRecord]: ...

    def topic(self, name: str) -> TopicRecord | None:
        return self.topics().get(name)

    def read_topic_configs(self, name: str, *, fresh: bool = False) -> dict[str, str] | None:
        """The topic's config overrides read from the source of truth (None: no such topic).

        Why: a cached store (ZooKeeper) can lag a topic another broker just created; an admin request
        that names it must not get UNKNOWN_TOPIC_OR_PARTITION for that lag. ``fresh``: bypass the cache
        even for a topic it holds (a read-modify-write must build on what another broker just wrote).
        In-memory stores have no lag."""
        rec = self.topic(name)
        return None if rec is None else dict(rec.configs)

    def read_reassignments(self, names: list[str]) -> dict[str, dict[int, Reassignment]]:
        """The partitions of ``names`` being reassigned, as (replicas, adding, removing), read from the source
        of truth (a topic that does not exist is left out).

        Why: a reassignment written a moment ago (through this broker or another) must show in
        ListPartitionReassignments at once, as Kafka's controller answers it; a cached store may not have it
        yet, and a tool that waits for the move to finish would take that for done. In-memory stores have no
        lag."""
        out: dict[str, dict[int, Reassignment]] = {}
        for name in names:
            rec = self.topic(name)
            if rec is not None:
                out[name] = {i: (tuple(a.replicas), tuple(a.adding_replicas), tuple(a.removing_replicas))
                             for i, a in rec.partitions.items() if a.adding_replicas or a.removing_replicas}
        return out

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicRecord | None:
        # An index checked against topics() on every hit, so it cannot serve a deleted or
        # replaced record; a miss rebuilds it (an unknown id costs the scan it always did).
        topics = self.topics()
        rec = self._by_id.get(topic_id)
        if rec is not None and rec.topic_id == topic_id and topics.get(rec.name) is rec:
            return rec
        self._by_id = {r.topic_id: r for r in topics.values()}
        return self._by_id.get(topic_id)

    @abstractmethod
    def create_topic(self, record: TopicRecord) -> None:
        """Raises TopicExists."""

    @abstractmethod
    def delete_topic(self, name: str) -> TopicRecord:
        """Raises UnknownTopic."""

    @abstractmethod
    def add_partitions(self, name: str, new: dict[int, PartitionAssignment]) -> TopicRecord: ...

    @abstractmethod
    def set_topic_configs(self, name: str, configs: dict[str, str]) -> TopicRecord: ...

    # -- client quotas (stored; enforcement comes with the operations work) ---------------------

    @abstractmethod
    def client_quotas(self) -> dict[QuotaEntity, dict[str, float]]:
        """Every entity with at least one stored quota: entity -> quota key -> value."""

    @abstractmethod
    def alter_client_quotas(self, changes: dict[QuotaEntity, dict[str, float | None]]) -> None:
        """Apply validated changes in one write; a None value removes that key."""

    @abstractmethod
    def entity_configs(self, resource_type: int) -> dict[str, dict[str, str]]:
        """Dynamic configs of every entity of one type (BROKER, CLIENT_METRICS, GROUP): name -> configs.

        Entities without configs are absent. For BROKER the name is the broker id, or "" for the
        cluster-wide default. The result must not be modified.
        """

    def configs_of(self, resource_type: int, name: str) -> dict[str, str]:
        """One entity's dynamic configs (a copy; empty when it has none)."""
        return dict(self.entity_configs(resource_type).get(name, {}))

    def read_entity_configs(self, resource_type: int, name: str) -> dict[str, str]:
        """One entity's dynamic configs from the source of truth, not a cache that may lag another
        broker's write (what IncrementalAlterConfigs builds on). In-memory stores have no lag."""
        return self.configs_of(resource_type, name)

    @abstractmethod
    def set_entity_configs(self, resource_type: int, name: str, configs: dict[str, str]) -> None:
        """Replace one entity's dynamic configs (empty removes the entity) and notify config listeners."""

    def client_metrics_configs(self) -> dict[str, dict[str, str]]:
        """KIP-714 client metrics subscriptions: subscription name -> {metrics, interval.ms, match}.

        Only the keys set are present; add_config_listener reports changes with resource type
        CLIENT_METRICS_RESOURCE (16).
        """
        return {k: dict(v) for k, v in self.entity_configs(CLIENT_METRICS_RESOURCE).items()}

    # -- SCRAM credentials (pykbroker.security.sasl; salted keys only, never a password) ----------

    def scram_users(self) -> dict[str, dict[str, str]]:
        """user -> SCRAM mechanism -> Kafka's credential string (salt=..,stored_key=..,server_key=..,
        iterations=n). The result must not be modified."""
        return {}

    def read_scram_mechanisms(self, user: str) -> set[str]:
        """The SCRAM mechanisms a user has credentials for, from the source of truth rather than a cache
        that may lag another broker's write (a deletion must find a credential created a moment ago)."""
        return set(self.scram_users().get(user, {}))

    def scram_credentials(self, user: str) -> dict[str, ScramCredential]:
        """One user's credentials by mechanism name (empty when none)."""
        out: dict[str, ScramCredential] = {}
        for mech, text in self.scram_users().get(user, {}).items():
            try:
                out[mech] = ScramCredential.from_kafka_string(text)
            except ValueError:
                continue  # an unreadable stored credential logs nobody in
        return out

    def alter_scram_credentials(self, upserts: dict[tuple[str, str], ScramCredential],
                                deletions: list[tuple[str, str]]) -> None:
        """Apply validated (user, mechanism) upserts and deletions in one write."""
        raise NotImplementedError("this metadata store does not store SCRAM credentials")

    # -- ACLs (pykbroker.security.acl; the authorizer's index follows add_acl_listener) ----------

    supports_acls = False  # stores that persist ACLs set this

    def acls(self) -> list[AclBinding]:
        """Every stored ACL binding (a snapshot; the authorizer indexes it)."""
        return []

    def create_acls(self, bindings: list[AclBinding]) -> None:
        """Store validated bindings (duplicates are ignored) and notify ACL listeners."""
        raise NotImplementedError("this metadata store does not store ACLs")

    def delete_acls(self, filters: list[AclBindingFilter]) -> list[list[AclBinding]]:
        """Remove the bindings matching each filter; returns per filter the bindings it matched."""
        raise NotImplementedError("this metadata store does not store ACLs")

    def add_acl_listener(self, listener: Callable[[list[AclBinding]], None]) -> None:
        """Called with the full ACL snapshot after every change (local or, in a cluster, remote)."""
        self.__dict__.setdefault("_acl_listeners", []).append(listener)

    def _notify_acls(self) -> None:
        snapshot = self.acls()
        for listener in self.__dict__.get("_acl_listeners", []):
            listener(snapshot)

    @abstractmethod
    def allocate_producer_ids(self, count: int) -> int:
        """Reserve ``count`` producer ids unique for the life of the cluster; returns the first."""


async def run_store(store: MetadataStore, fn: Callable[..., T], *args: object) -> T:
    """Call a store write from the event loop: in a worker thread when it does network I/O."""
    if not store.blocking:
        return fn(*args)
    return await anyio.to_thread.run_sync(fn, *args)
