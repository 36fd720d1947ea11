"""Cluster metadata in ZooKeeper, with Kafka's own layout (zk_layout.py), on kazoo.

Three threads meet here, and each has one job:

- kazoo's threads deliver watch events and session state changes; they only enqueue.
- the store's watcher thread ("zk-metadata-watcher") turns those events into pipelined reads
  (re-arming the one-shot watches as it reads) and hands the decoded values to the event loop
  through the poster (``set_poster``), batched.
- the event loop thread applies each batch to the caches (topics(), live_brokers(), ...) and calls
  the listeners: one ``_notify(topic, record)`` per changed topic per batch, ``_notify_cluster()`` once
  when brokers or the controller changed, ``_notify_config`` per changed entity.

Writes (create_topic, update_isr, ...) are blocking ZooKeeper calls made from worker threads
(``run_store``); they never touch the caches: their effect comes back through the watches.

kazoo does not re-send watches after a reconnect (it drops them on every disconnection), so every
reconnection, with the same session or a new one, re-reads everything with fresh watches, and a new
session first re-creates this broker's ephemeral znodes.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.paths import _prefix_root
from kazoo.protocol.serialization import Exists, GetChildren, GetData
from kazoo.protocol.states import EventType, WatchedEvent, ZnodeStat

from pykbroker.config import BrokerConfig, parse_protocol_map
from pykbroker.metadata import zk_layout as zl
from pykbroker.metadata.embedded import random_cluster_id
from pykbroker.metadata.store import (
    BROKER_RESOURCE,
    ENTITY_RESOURCES,
    MetadataStore,
    PartitionAssignment,
    QuotaEntity,
    StaleState,
    StoreUnavailable,
    TopicExists,
    TopicRecord,
    UnknownTopic,
)
from pykbroker.metadata.zk_layout import parse_connect, reassign_partition
from pykbroker.security.acl import (
    AclBinding,
    AclBindingFilter,
    PatternType,
    ResourcePattern,
    entry_from_json,
    entry_to_json,
    resource_type_from_name,
    resource_type_name,
)
from pykbroker.security.sasl.scram import ScramCredential

log = logging.getLogger("pykbroker.metadata.zookeeper")

SessionListener = Callable[[str], None]
Poster = Callable[[Callable[[], None]], None]

# Bounded retries of conditional writes that lost a race (BadVersion / NodeExists).
_WRITE_RETRIES = 20
# Watch events of one batch processed together (the rest wait for the next batch).
_MAX_EVENTS_PER_BATCH = 50_000

# Config change notifications: Kafka's brokers delete them after 15 minutes.
_CONFIG_CHANGE_EXPIRY_S = 15 * 60
_KEEP_CONFIG_CHANGES = 20
_PURGE_BATCH = 500

_UNAVAILABLE = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, OperationTimeoutError,
                KazooTimeoutError)


class ZkConnectError(Exception):
    """ZooKeeper could not be reached within zookeeper.connection.timeout.ms."""


class DuplicateBrokerId(Exception):
    """Another live broker holds /brokers/ids/<broker.id>."""


_RETRY = {"max_tries": -1, "delay": 0.05, "backoff": 2, "max_delay": 1.0}


def start_client(connect: str, session_timeout_ms: int, connection_timeout_ms: int,
                 listener: Callable[[str], None] | None = None) -> KazooClient:
    """A started kazoo client rooted at the chroot of ``connect`` (created first when missing, as Kafka's
    brokers do); raises ZkConnectError when ZooKeeper is not reached within ``connection_timeout_ms``."""
    hosts, chroot = parse_connect(connect)
    deadline = time.monotonic() + connection_timeout_ms / 1000.0
    if chroot:
        _create_chroot(connect, session_timeout_ms, connection_timeout_ms, deadline)
    zk = KazooClient(hosts=hosts + chroot, timeout=session_timeout_ms / 1000.0, connection_retry=_RETRY,
                     logger=logging.getLogger("kazoo.client"))
    if listener is not None:
        zk.add_listener(listener)
    _start(zk, connect, connection_timeout_ms, deadline)
    return zk


def _start(zk: KazooClient, connect: str, connection_timeout_ms: int, deadline: float) -> None:
    try:
        zk.start(timeout=max(deadline - time.monotonic(), 0.05))
    except KazooTimeoutError:
        raise ZkConnectError(
            f"Timed out waiting for connection while in state: CONNECTING (zookeeper.connect={connect}, "
            f"waited {connection_timeout_ms} ms: zookeeper.connection.timeout.ms)") from None
    except KazooException as e:
        zk.stop()
        zk.close()
        raise ZkConnectError(f"cannot connect to ZooKeeper {connect}: {e}") from None


def _create_chroot(connect: str, session_timeout_ms: int, connection_timeout_ms: int, deadline: float) -> None:
    """Create the chroot path, as Kafka does, with a client not rooted there."""
    hosts, chroot = parse_connect(connect)
    boot = KazooClient(hosts=hosts, timeout=session_timeout_ms / 1000.0, connection_retry=_RETRY)
    _start(boot, connect, connection_timeout_ms, deadline)
    try:
        boot.ensure_path(chroot)
    except _UNAVAILABLE as e:
        raise ZkConnectError(f"cannot create the chroot {chroot} in ZooKeeper {hosts}: "
                             f"{type(e).__name__}") from None
    finally:
        boot.stop()
        boot.close()


def commit(tx: Any, timeout: float) -> list[Any]:
    """Commit a multi; raise the first failed operation's exception."""
    results = list(tx.commit_async().get(timeout=timeout))
    for r in results:
        if isinstance(r, Exception) and not isinstance(r, RolledBackError):
            raise r
    return results


def edit_entity_configs(zk: KazooClient, changes: dict[str, dict[str, str | None]], timeout: float) -> bool:
    """Set (or, for None, remove) keys of entity config znodes (/config/users/<u>...) in one multi with a
    /config/changes notification each, as Kafka's tools write them, keeping the keys not named (quotas and
    SCRAM credentials share a user's znode); retried when it lost a race. False when it kept losing."""
    for _ in range(_WRITE_RETRIES):
        tx = zk.transaction()
        for path, ops in changes.items():
            try:
                data, stat = zk.get(path)
                current = zl.decode_entity_config(data)
                version: int | None = stat.version
            except NoNodeError:
                current, version = {}, None
            for key, value in ops.items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = value
            if version is None:
                tx.create(path, zl.encode_entity_config(current))
            else:
                tx.set_data(path, zl.encode_entity_config(current), version=version)
            tx.create(zl.CONFIG_CHANGE_PREFIX, zl.encode_config_change(zl.config_change_entity(path)),
                      sequence=True)
        try:
            commit(tx, timeout)
        except (BadVersionError, NodeExistsError, NoNodeError):
            continue
        return True
    return False


def scram_edits(upserts: dict[tuple[str, str], ScramCredential],
                deletions: list[tuple[str, str]]) -> dict[str, dict[str, str | None]]:
    """user -> SCRAM config key -> Kafka's credential string (None: delete), for edit_entity_configs."""
    changes: dict[str, dict[str, str | None]] = {}
    for user, mech in deletions:
        changes.setdefault(user, {})[mech] = None
    for (user, mech), cred in upserts.items():
        changes.setdefault(user, {})[mech] = cred.to_kafka_string()
    return changes


def scram_entries(configs: dict[str, str]) -> dict[str, str]:
    """The SCRAM credentials among a /config/users/<u> znode's configs (the rest are quotas)."""
    return {k: v for k, v in configs.items() if k.startswith("SCRAM-SHA-")}


# --- what the watcher thread hands to the event loop ----------------------------------------------

@dataclass
class _TopicData:
    assignment: zl.TopicAssignment
    states: dict[int, zl.PartitionState] = field(default_factory=dict)
    configs: dict[str, str] = field(default_factory=dict)


@dataclass
class _Snapshot:
    """Everything, read at start and after each reconnection."""

    topics: dict[str, _TopicData]
    deleting: set[str]
    brokers: dict[int, zl.BrokerRegistration]
    controller: int
    entities: dict[int, dict[str, dict[str, str]]]
    quotas: dict[QuotaEntity, dict[str, float]]
    scram: dict[str, dict[str, str]] = field(default_factory=dict)  # user -> mechanism -> credential
    acls: list[AclBinding] = field(default_factory=list)


# Update records, applied in order on the loop:
# ("topic", name, _TopicData)             a topic (re)appeared: assignment, states and config together
# ("gone", name, None)                    /brokers/topics/<t> is gone
# ("assignment", name, TopicAssignment)   the assignment znode changed
# ("states", name, {p: state | None})     partition states changed
# ("tconfig", name, configs)              /config/topics/<t> changed
# ("deleting", None, set[str])            children of /admin/delete_topics
# ("brokers", None, {id: registration})   every live broker
# ("controller", None, id)
# ("entities", resource_type, {name: configs})
# ("quotas", None, {entity: values})
# ("scram", None, {user: {mechanism: credential}})  SCRAM credentials in /config/users/<u>
# ("acls", None, [AclBinding])            every ACL (after a change notification)
# ("reset", None, _Snapshot)
# ("session", None, "suspended" | "lost" | "connected")
_Update = tuple[str, Any, Any]

_STATE_RE = re.compile(r"^/brokers/topics/([^/]+)/partitions/(\d+)/state$")
_TOPIC_RE = re.compile(r"^/brokers/topics/([^/]+)$")
_BROKER_RE = re.compile(r"^/brokers/ids/(\d+)$")
_TOPIC_CONFIG_RE = re.compile(r"^/config/topics/([^/]+)$")
_ENTITY_TYPE_BY_PATH = {p: t for t, p in zl.CONFIG_ENTITY_PATHS.items()}
_QUOTA_ROOTS = (zl.CONFIG_USERS, zl.CONFIG_CLIENTS, zl.CONFIG_IPS)


class ZkMetadataStore(MetadataStore):
    """The MetadataStore of a broker in a ZooKeeper-coordinated cluster."""

    blocking = True

    def __init__(self, config: BrokerConfig, broker_id: int, endpoints: list[tuple[str, str, int]],
                 rack: str | None) -> None:
        super().__init__()
        self._config = config
        self._broker_id = broker_id
        self._endpoints = list(endpoints)
        self._rack = rack
        self._connect = str(config["zookeeper.connect"])
        self._chroot = parse_connect(self._connect)[1]
        self._session_timeout_ms = int(config["zookeeper.session.timeout.ms"])
        conn = config["zookeeper.connection.timeout.ms"]
        self._connection_timeout_ms = int(conn) if conn is not None else self._session_timeout_ms
        # How long a write waits for ZooKeeper before StoreUnavailable.
        self._request_timeout = max(self._session_timeout_ms / 1000.0, 1.0)
        self._zk: KazooClient | None = None
        self.cluster_id = ""
        self._post: Poster | None = None  # type: ignore[assignment]
        self._session_listeners: list[SessionListener] = []
        # kazoo threads -> watcher thread
        self._events: queue.Queue[tuple[str, str]] = queue.Queue()
        self._watcher: threading.Thread | None = None
        self._connected = threading.Event()
        self._had_connection = False
        self._closed = False
        self._registered = False
        self._shutdown_requested = False
        # watcher thread only: the topics it watches and their partitions
        self._w_topics: dict[str, zl.TopicAssignment] = {}
        # watcher thread -> loop
        self._pending: list[_Update] = []
        self._pending_lock = threading.Lock()
        self._drain_posted = False
        # loop-thread caches
        self._topic_data: dict[str, _TopicData] = {}
        self._topics: dict[str, TopicRecord] = {}
        self._deleting: set[str] = set()
        self._brokers: dict[int, zl.BrokerRegistration] = {}
        self._live: dict[int, list[tuple[str, str, int]]] = {}
        self._controller = -1
        self._entities: dict[int, dict[str, dict[str, str]]] = {t: {} for t in ENTITY_RESOURCES}
        self._quotas: dict[QuotaEntity, dict[str, float]] = {}
        self._scram: dict[str, dict[str, str]] = {}
        self._acls: list[AclBinding] = []

    # --- plumbing for others ------------------------------------------------------------------

    @property
    def zk(self) -> KazooClient:
        """The kazoo client (rooted at the chroot); the controller shares its session."""
        if self._zk is None:
            raise RuntimeError("ZkMetadataStore.start() has not been called")
        return self._zk

    @property
    def chroot(self) -> str:
        """The chroot of zookeeper.connect ("" when none); zk's paths are already relative to it."""
        return self._chroot

    @property
    def broker_id(self) -> int:
        return self._broker_id

    def is_cluster(self) -> bool:
        return True

    def set_poster(self, post: Callable[[Callable[[], None]], None]) -> None:
        self._post = post
        with self._pending_lock:
            schedule = bool(self._pending) and not self._drain_posted
            if schedule:
                self._drain_posted = True
        if schedule:
            self._schedule_drain()

    def add_session_listener(self, listener: SessionListener) -> None:
        """Called on the event loop with "suspended", "lost" (session expired) or "connected"."""
        self._session_listeners.append(listener)

    # --- start / stop -------------------------------------------------------------------------

    def start(self) -> None:
        zk = start_client(self._connect, self._session_timeout_ms, self._connection_timeout_ms, self._on_state)
        self._zk = zk
        self._connected.set()
        self._had_connection = True
        try:
            for path in zl.PERSISTENT_PATHS:
                zk.ensure_path(path)
            self.cluster_id = self._read_or_create_cluster_id()
            began = time.monotonic()
            snap = self._load_all()
        except _UNAVAILABLE as e:
            self.close()
            raise ZkConnectError(f"lost the ZooKeeper connection to {self._connect} while loading metadata: "
                                 f"{type(e).__name__}") from None
        except KazooException as e:  # e.g. NoAuth on a chroot we may not write
            self.close()
            raise ZkConnectError(f"cannot load metadata from ZooKeeper {self._connect}: {type(e).__name__} "
                                 f"{e}") from None
        self._apply_reset(snap, notify=False)
        log.info("ZooKeeper metadata loaded from %(zookeeper_connect)s in %(elapsed_ms).0f ms: cluster id "
                 "%(cluster_id)s, %(topics)d topics, %(partitions)d partitions, %(brokers)d live brokers, controller "
                 "%(controller)d",
                 {"zookeeper_connect": self._connect, "elapsed_ms": (time.monotonic() - began) * 1000,
                  "cluster_id": self.cluster_id, "topics": len(snap.topics),
                  "partitions": sum(len(t.assignment.partitions) for t in snap.topics.values()),
                  "brokers": len(snap.brokers), "controller": snap.controller})
        self._watcher = threading.Thread(target=self._watch_loop, name="zk-metadata-watcher", daemon=True)
        self._watcher.start()

    def _read_or_create_cluster_id(self) -> str:
        zk = self.zk
        for _ in range(3):
            try:
                data, _stat = zk.get(zl.CLUSTER_ID)
                return zl.decode_cluster_id(data)
            except NoNodeError:
                pass
            new_id = random_cluster_id()
            try:
                zk.create(zl.CLUSTER_ID, zl.encode_cluster_id(new_id), makepath=True)
                log.info("created cluster id %(new_member_id)s in ZooKeeper", {"new_member_id": new_id})
                return new_id
            except NodeExistsError:
                continue
        raise ZkConnectError(f"cannot read or create {zl.CLUSTER_ID} in ZooKeeper {self._connect}")

    def close(self) -> None:
        """End the session (its ephemeral znodes go with it); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._events.put(("stop", ""))
        zk = self._zk
        try:
            if zk is not None:
                zk.remove_listener(self._on_state)
                zk.stop()  # fails the watcher's outstanding reads, so it sees the stop at once
            if self._watcher is not None and self._watcher is not threading.current_thread():
                self._watcher.join(10)
            if zk is not None:
                zk.close()
        except Exception:  # closing is best effort
            log.debug("closing the ZooKeeper client failed", exc_info=True)
        self._connected.clear()

    # --- broker registration --------------------------------------------------------------------

    def _registration(self) -> bytes:
        protocols = parse_protocol_map(str(self._config["listener.security.protocol.map"]))
        for name, _, _ in self._endpoints:
            protocols.setdefault(name, name)
        return zl.encode_broker(zl.BrokerRegistration(self._broker_id, tuple(self._endpoints), protocols,
                                                      self._rack))

    def _session_id(self) -> int:
        client_id = self.zk.client_id
        return int(client_id[0]) if client_id else -1

    def register_broker(self) -> None:
        """Create the ephemeral /brokers/ids/<id>; DuplicateBrokerId when another broker holds it.

        A broker restarted right after being killed finds its previous run's znode until that session
        expires; when the znode names our own endpoints we wait (up to the session timeout) for it to go.
        """
        path = zl.broker_path(self._broker_id)
        data = self._registration()
        wait = self._session_timeout_ms / 1000.0 + 2.0
        deadline: float | None = None
        with self._unavailable():
            for _ in range(10_000):
                try:
                    self.zk.create(path, data, ephemeral=True)
                    self._registered = True
                    log.info("registered broker %(broker_id)d at %(chroot)s%(path)s",
                             {"broker_id": self._broker_id, "chroot": self._chroot, "path": path})
                    return
                except NodeExistsError:
                    pass
                try:
                    old, stat = self.zk.get(path)
                except NoNodeError:
                    continue
                if stat.ephemeralOwner == self._session_id():
                    self._registered = True
                    return
                try:
                    other = zl.decode_broker(self._broker_id, old).endpoints
                except (ValueError, KeyError, TypeError):
                    other = ()
                described = ", ".join(f"{n}://{h}:{p}" for n, h, p in other) or "unreadable registration"
                message = (f"Broker id {self._broker_id} is already registered in ZooKeeper at "
                           f"{self._chroot}{path} by another broker ({described})")
                if set(other) != set(self._endpoints):
                    raise DuplicateBrokerId(message)
                now = time.monotonic()
                if deadline is None:
                    deadline = now + wait
                    log.warning("%(chroot)s%(path)s still holds the registration of a previous run of broker "
                                "%(broker_id)d with the same endpoints; waiting up to %(wait).0f s for its ZooKeeper "
                                "session to expire",
                                {"chroot": self._chroot, "path": path, "broker_id": self._broker_id, "wait": wait})
                if now >= deadline:
                    raise DuplicateBrokerId(f"{message}; it did not expire within {wait:.0f} s")
                gone = threading.Event()
                if self.zk.exists(path, watch=_setter(gone)) is not None:
                    gone.wait(min(deadline - now, 1.0))
        raise DuplicateBrokerId(f"Broker id {self._broker_id}: could not register at {self._chroot}{path}")

    def begin_controlled_shutdown(self) -> None:
        """Ask the controller to move this broker's leaderships away (ephemeral znode)."""
        self._shutdown_requested = True
        with self._unavailable():
            self._create_own_ephemeral(zl.controlled_shutdown_path(self._broker_id), b"")

    def _create_own_ephemeral(self, path: str, data: bytes) -> None:
        try:
            self.zk.create(path, data, ephemeral=True, makepath=True)
        except NodeExistsError:
            stat = self.zk.exists(path)
            if stat is not None and stat.ephemeralOwner != self._session_id():
                # A previous session's leftover: replace it with ours.
                try:
                    self.zk.delete(path, version=stat.version)
                    self.zk.create(path, data, ephemeral=True, makepath=True)
                except (NoNodeError, NodeExistsError, BadVersionError):
                    log.warning("could not take over %(path)s from another ZooKeeper session", {"path": path})

    # --- session ----------------------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        """kazoo's connection thread: no blocking here."""
        if self._closed:
            self._connected.clear()
            return
        if state == KazooState.CONNECTED:
            self._connected.set()
            if self._had_connection and not self._closed:
                log.info("ZooKeeper connection to %(zookeeper_connect)s re-established: re-reading metadata",
                         {"zookeeper_connect": self._connect})
                self._events.put(("resync", ""))
            self._had_connection = True
            self._post_updates([("session", None, "connected")])
        elif state == KazooState.SUSPENDED:
            self._connected.clear()
            if not self._closed:
                log.warning("ZooKeeper connection to %(zookeeper_connect)s lost (session kept if it comes back "
                            "within %(session_timeout_ms)d ms)",
                            {"zookeeper_connect": self._connect, "session_timeout_ms": self._session_timeout_ms})
            self._post_updates([("session", None, "suspended")])
        else:  # LOST
            self._connected.clear()
            if not self._closed:
                log.warning("ZooKeeper session expired or closed: registration and watches are gone until "
                            "the store reconnects")
            self._post_updates([("session", None, "lost")])

    # --- watcher thread -----------------------------------------------------------------------------

    def _watch(self, event: WatchedEvent) -> None:
        """Every watch of the store (kazoo's callback thread): enqueue, nothing else."""
        if event.type == EventType.NONE or event.path is None:
            return  # the connection dropped; a resync follows the reconnection
        self._events.put(("child" if event.type == EventType.CHILD else "data", event.path))

    def _watch_loop(self) -> None:
        while True:
            batch = [self._events.get()]
            for _ in range(_MAX_EVENTS_PER_BATCH):
                try:
                    batch.append(self._events.get_nowait())
                except queue.Empty:
                    break
            if any(kind == "stop" for kind, _ in batch):
                return
            try:
                if any(kind == "resync" for kind, _ in batch):
                    self._resync()
                else:
                    self._post_updates(self._process(batch))
            except _UNAVAILABLE as e:
                log.debug("watch processing interrupted by %(error_type)s", {"error_type": type(e).__name__})
                self._retry_resync()
            except Exception:
                log.exception("processing ZooKeeper watch events failed; re-reading everything")
                self._retry_resync()

    def _retry_resync(self) -> None:
        """Events of a failed batch are lost: re-read everything once connected (about once a second).

        After a disconnection the reconnection already enqueues a resync; this covers reads that
        failed with the connection still up (a timeout, an unexpected error).
        """
        def later() -> None:
            if not self._closed and self._connected.is_set():
                self._events.put(("resync", ""))

        if not self._closed and self._connected.is_set():
            timer = threading.Timer(1.0, later)
            timer.daemon = True
            timer.start()

    def _resync(self) -> None:
        if self._registered:
            self._ensure_registered()
        if self._shutdown_requested:
            self._create_own_ephemeral(zl.controlled_shutdown_path(self._broker_id), b"")
        snap = self._load_all()
        self._post_updates([("reset", None, snap)])

    def _ensure_registered(self) -> None:
        path = zl.broker_path(self._broker_id)
        try:
            self.zk.create(path, self._registration(), ephemeral=True)
            log.info("re-registered broker %(broker_id)d at %(chroot)s%(path)s with the new ZooKeeper session",
                     {"broker_id": self._broker_id, "chroot": self._chroot, "path": path})
        except NodeExistsError:
            stat = self.zk.exists(path)
            if stat is not None and stat.ephemeralOwner != self._session_id():
                log.error("broker id %(broker_id)d is registered at %(chroot)s%(path)s by another ZooKeeper session; "
                          "this broker is not registered",
                          {"broker_id": self._broker_id, "chroot": self._chroot, "path": path})

    def _process(self, batch: list[tuple[str, str]]) -> list[_Update]:
        """Re-read what the events point at (re-arming their watches), in as few round trips as possible."""
        seen: set[tuple[str, str]] = set()
        topics_children = brokers = controller = deleting = quotas = acls = False
        entity_types: set[int] = set()
        topic_nodes: set[str] = set()
        topic_configs: set[str] = set()
        states: dict[str, set[int]] = {}
        for ev in batch:
            if ev in seen:
                continue
            seen.add(ev)
            path = ev[1]
            if path == zl.BROKER_TOPICS:
                topics_children = True
            elif path == zl.BROKER_IDS or _BROKER_RE.match(path):
                brokers = True
            elif path == zl.CONTROLLER:
                controller = True
            elif path == zl.DELETE_TOPICS:
                deleting = True
            elif path in (zl.ACL_LITERAL_CHANGES, zl.ACL_PREFIXED_CHANGES):
                acls = True
            elif m := _STATE_RE.match(path):
                states.setdefault(m.group(1), set()).add(int(m.group(2)))
            elif m := _TOPIC_RE.match(path):
                topic_nodes.add(m.group(1))
            elif m := _TOPIC_CONFIG_RE.match(path):
                topic_configs.add(m.group(1))
            elif any(path == r or path.startswith(r + "/") for r in _QUOTA_ROOTS):
                quotas = True
            else:
                root = path if path in _ENTITY_TYPE_BY_PATH else path.rsplit("/", 1)[0]
                if root in _ENTITY_TYPE_BY_PATH:
                    entity_types.add(_ENTITY_TYPE_BY_PATH[root])
        out: list[_Update] = []
        if brokers:
            out.append(("brokers", None, self._read_brokers()))
        if controller:
            out.append(("controller", None, self._read_controller()))
        if topics_children:
            names = set(self.zk.get_children(zl.BROKER_TOPICS, watch=self._watch))
            new = sorted(names - self._w_topics.keys())
            for name in sorted(self._w_topics.keys() - names):
                del self._w_topics[name]
                out.append(("gone", name, None))
            for name, data in self._read_topics(new).items():
                self._w_topics[name] = data.assignment
                out.append(("topic", name, data))
            topic_nodes -= set(new)
        if topic_nodes:
            out.extend(self._reread_topics(sorted(n for n in topic_nodes if n in self._w_topics), states))
            # a topic skipped before (unreadable assignment) or re-created after its deletion was seen
            unknown = sorted(n for n in topic_nodes if n not in self._w_topics)
            for name, data in self._read_topics(unknown).items():
                self._w_topics[name] = data.assignment
                out.append(("topic", name, data))
        if topic_configs:
            known = sorted(n for n in topic_configs if n in self._w_topics)
            read = self._get_many([zl.topic_config_path(n) for n in known])
            for name in known:
                out.append(("tconfig", name, _decode_configs(read[zl.topic_config_path(name)])))
        if states:
            wanted = [(t, p) for t, ps in sorted(states.items()) if t in self._w_topics
                      for p in sorted(ps) if p in self._w_topics[t].partitions]
            read = self._get_many([zl.partition_state_path(t, p) for t, p in wanted])
            per_topic: dict[str, dict[int, zl.PartitionState | None]] = {}
            for t, p in wanted:
                got = read[zl.partition_state_path(t, p)]
                state = _decode_state(got)
                if state is not None or got is None:  # an unreadable state leaves the cached one alone
                    per_topic.setdefault(t, {})[p] = state
            out.extend(("states", t, s) for t, s in per_topic.items())
        if deleting:
            out.append(("deleting", None, set(self.zk.get_children(zl.DELETE_TOPICS, watch=self._watch))))
        for rtype in sorted(entity_types):
            out.append(("entities", rtype, self._read_entities(rtype)))
        if quotas:
            out.append(("quotas", None, self._read_quotas()))
            out.append(("scram", None, self._read_scram()))
        if acls:
            out.append(("acls", None, self._read_acls()))
        return out

    def _reread_topics(self, names: list[str], states: dict[str, set[int]]) -> list[_Update]:
        """Assignment znodes that changed: gone, replaced (new topic id) or repartitioned/reassigned."""
        out: list[_Update] = []
        read = self._get_many([zl.topic_path(n) for n in names])
        replaced: list[str] = []
        for name in names:
            got = read[zl.topic_path(name)]
            if got is None:
                self._w_topics.pop(name, None)
                out.append(("gone", name, None))
                continue
            assignment = _decode_assignment(name, got)
            if assignment is None:
                continue  # unreadable (a foreign writer?): keep what we have rather than drop the topic
            old = self._w_topics[name]
            if assignment.topic_id != old.topic_id:
                replaced.append(name)
                continue
            self._w_topics[name] = assignment
            out.append(("assignment", name, assignment))
            added = set(assignment.partitions) - set(old.partitions)
            if added:
                states.setdefault(name, set()).update(added)
        for name, data in self._read_topics(replaced).items():
            self._w_topics[name] = data.assignment
            out.append(("topic", name, data))
        return out

    # --- reads (watcher thread, and start()) ----------------------------------------------------------

    def _pipeline(self, request: type, paths: list[str]) -> list[tuple[str, Any]]:
        """Send many watched reads at once: (path, async result) pairs.

        kazoo's *_async calls wake its connection thread once per request (a socket write each, which
        costs more than the request itself under the GIL); queueing the requests and waking it with one
        write per chunk makes loading 10,000 partition states several times faster. Falls back to the
        public calls if kazoo's internals are not what this expects.
        """
        zk = self.zk
        pending = getattr(zk, "_queue", None)
        wake = getattr(getattr(zk, "_connection", None), "_write_sock", None)
        if pending is None or wake is None or not zk.connected or len(paths) < 8:
            call = {GetData: zk.get_async, Exists: zk.exists_async, GetChildren: zk.get_children_async}[request]
            return [(p, call(p, watch=self._watch)) for p in paths]
        out = []
        for i in range(0, len(paths), 1000):
            chunk = paths[i:i + 1000]
            for p in chunk:
                ar = zk.handler.async_result()
                pending.append((request(_prefix_root(zk.chroot, p), self._watch), ar))
                out.append((p, ar))
            try:
                wake.sendall(b"\0" * len(chunk))  # one byte per queued request, as kazoo's _call does
            except OSError:
                for _, ar in out[i:]:
                    ar.set_exception(ConnectionClosedError("Connection has been closed"))
        return out

    def _get_many(self, paths: list[str]) -> dict[str, tuple[bytes, ZnodeStat] | None]:
        """Pipelined reads with data watches; a missing znode gets an exists watch (None in the result)."""
        out: dict[str, tuple[bytes, ZnodeStat] | None] = {}
        todo = list(paths)
        for _ in range(3):
            if not todo:
                break
            calls = self._pipeline(GetData, todo)
            # Answers come in request order: sleep until the last one instead of waking for each.
            calls[-1][1].wait(self._request_timeout)
            missing = []
            for p, ar in calls:
                try:
                    out[p] = ar.get(timeout=self._request_timeout)
                except NoNodeError:
                    missing.append(p)
            checks = self._pipeline(Exists, missing)
            todo = []
            for p, ar in checks:
                if ar.get(timeout=self._request_timeout) is None:
                    out[p] = None
                else:
                    todo.append(p)  # created in between: read it again
        for p in todo:
            out[p] = None
        return out

    def _children_many(self, paths: list[str]) -> dict[str, list[str]]:
        """Pipelined get_children with child watches; a missing znode has no children (no watch)."""
        calls = self._pipeline(GetChildren, paths)
        out: dict[str, list[str]] = {}
        for p, ar in calls:
            try:
                out[p] = list(ar.get(timeout=self._request_timeout))
            except NoNodeError:
                out[p] = []
        return out

    def _read_topics(self, names: Iterable[str]) -> dict[str, _TopicData]:
        names = list(names)
        if not names:
            return {}
        read = self._get_many([zl.topic_path(n) for n in names] + [zl.topic_config_path(n) for n in names])
        topics: dict[str, _TopicData] = {}
        for name in names:
            assignment = _decode_assignment(name, read[zl.topic_path(name)])
            if assignment is not None:
                topics[name] = _TopicData(assignment, configs=_decode_configs(read[zl.topic_config_path(name)]))
        paths = [zl.partition_state_path(n, p) for n, d in topics.items() for p in d.assignment.partitions]
        states = self._get_many(paths)
        for name, data in topics.items():
            for p in data.assignment.partitions:
                state = _decode_state(states[zl.partition_state_path(name, p)])
                if state is not None:
                    data.states[p] = state
        return topics

    def _read_brokers(self) -> dict[int, zl.BrokerRegistration]:
        ids = sorted(int(c) for c in self.zk.get_children(zl.BROKER_IDS, watch=self._watch) if c.isdigit())
        read = self._get_many([zl.broker_path(i) for i in ids])
        brokers = {}
        for i in ids:
            got = read[zl.broker_path(i)]
            if got is None:
                continue
            try:
                brokers[i] = zl.decode_broker(i, got[0])
            except (ValueError, KeyError, TypeError, AttributeError):
                log.warning("ignoring unreadable broker registration %(path)s: %(response)r",
                            {"path": zl.broker_path(i), "response": got[0][:200]})
        return brokers

    def _read_controller(self) -> int:
        got = self._get_many([zl.CONTROLLER])[zl.CONTROLLER]
        if got is None:
            return -1
        try:
            return zl.decode_controller(got[0])
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable %(path)s: %(response)r", {"path": zl.CONTROLLER, "response": got[0][:200]})
            return -1

    def _read_entities(self, rtype: int) -> dict[str, dict[str, str]]:
        root = zl.CONFIG_ENTITY_PATHS[rtype]
        names = self._children_many([root])[root]
        read = self._get_many([f"{root}/{n}" for n in names])
        out = {}
        for n in names:
            configs = _decode_configs(read[f"{root}/{n}"])
            if configs:
                name = "" if rtype == BROKER_RESOURCE and n == zl.DEFAULT_BROKER_ENTITY else n
                out[name] = configs
        return out

    def _read_quotas(self) -> dict[QuotaEntity, dict[str, float]]:
        roots = self._children_many(list(_QUOTA_ROOTS))
        nodes = [f"{r}/{c}" for r in _QUOTA_ROOTS for c in roots[r]]
        user_nodes = [f"{zl.CONFIG_USERS}/{u}" for u in roots[zl.CONFIG_USERS]]
        user_children = self._children_many(user_nodes)
        client_dirs = [f"{u}/clients" for u in user_nodes if "clients" in user_children[u]]
        clients = self._children_many(client_dirs)
        nodes += [f"{d}/{c}" for d in client_dirs for c in clients[d]]
        read = self._get_many(nodes)
        out: dict[QuotaEntity, dict[str, float]] = {}
        for path in nodes:
            entity = zl.quota_entity_from_path(path)
            values = zl.decode_quota_values(_decode_configs(read[path]))
            if entity is not None and values:
                out[tuple(sorted(entity))] = values
        return out

    def _load_all(self) -> _Snapshot:
        """Everything, with watches (at start and after each reconnection)."""
        zk = self.zk
        names = sorted(zk.get_children(zl.BROKER_TOPICS, watch=self._watch))
        topics = self._read_topics(names)
        self._w_topics = {n: d.assignment for n, d in topics.items()}
        deleting = set(zk.get_children(zl.DELETE_TOPICS, watch=self._watch))
        return _Snapshot(
            topics=topics, deleting=deleting, brokers=self._read_brokers(), controller=self._read_controller(),
            entities={t: self._read_entities(t) for t in ENTITY_RESOURCES}, quotas=self._read_quotas(),
            scram=self._read_scram(), acls=self._read_acls())

    def _read_acls(self) -> list[AclBinding]:
        """Every ACL znode (literal and prefixed), re-arming the watches on the two change-notification
        parents: a new notification from any broker makes every broker read them all again."""
        self._children_many([zl.ACL_LITERAL_CHANGES, zl.ACL_PREFIXED_CHANGES])
        out: list[AclBinding] = []
        for prefixed in (False, True):
            root = zl.acl_root(prefixed)
            types = [t for t in self.zk.get_children(root) if _known_resource_type(t)] \
                if self.zk.exists(root) else []
            names = {t: sorted(self.zk.get_children(f"{root}/{t}")) for t in types}
            paths = [zl.acl_resource_path(prefixed, t, n) for t in types for n in names[t]]
            read = self._get_many_unwatched(paths)
            pattern_type = PatternType.PREFIXED if prefixed else PatternType.LITERAL
            for t in types:
                for n in names[t]:
                    got = read.get(zl.acl_resource_path(prefixed, t, n))
                    if got is None:
                        continue
                    pattern = ResourcePattern(resource_type_from_name(t), n, pattern_type)
                    for d in zl.decode_acl_entries(got):
                        try:
                            out.append(AclBinding(pattern, entry_from_json(d)))
                        except (KeyError, ValueError):
                            log.warning("ignoring an unreadable ACL entry in %(resource_type)s/%(resource_name)s: "
                                        "%(data)r",
                                        {"resource_type": t, "resource_name": n, "data": d})
        return out

    def _get_many_unwatched(self, paths: list[str]) -> dict[str, bytes]:
        calls = [(p, self.zk.get_async(p)) for p in paths]
        out: dict[str, bytes] = {}
        for p, ar in calls:
            try:
                out[p] = ar.get(timeout=self._request_timeout)[0]
            except NoNodeError:
                continue
        return out

    def _read_scram(self) -> dict[str, dict[str, str]]:
        """SCRAM credentials: the SCRAM-SHA-* keys of /config/users/<u> (Kafka's ZooKeeper layout)."""
        users = self._children_many([zl.CONFIG_USERS])[zl.CONFIG_USERS]
        nodes = [f"{zl.CONFIG_USERS}/{u}" for u in users]
        read = self._get_many(nodes)
        out: dict[str, dict[str, str]] = {}
        for u, path in zip(users, nodes, strict=True):
            creds = scram_entries(_decode_configs(read[path]))
            if creds:
                out[zl.desanitize(u)] = creds
        return out

    # --- watcher thread -> loop -------------------------------------------------------------------------

    def _post_updates(self, updates: list[_Update]) -> None:
        if not updates:
            return
        with self._pending_lock:
            self._pending.extend(updates)
            schedule = not self._drain_posted and self._post is not None
            if schedule:
                self._drain_posted = True
        if schedule:
            self._schedule_drain()

    def _schedule_drain(self) -> None:
        post = self._post
        if post is None:
            return
        try:
            post(self._drain)
        except RuntimeError:  # the loop is closed (shutdown)
            with self._pending_lock:
                self._drain_posted = False

    def _drain(self) -> None:
        """On the event loop: apply everything queued, then notify."""
        with self._pending_lock:
            updates, self._pending = self._pending, []
            self._drain_posted = False
        if updates:
            self._apply(updates)

    def _apply_reset(self, snap: _Snapshot, notify: bool) -> None:
        self._apply([("reset", None, snap)], notify=notify)

    def _apply(self, updates: list[_Update], notify: bool = True) -> None:
        # ordered: topic name -> the partitions whose state alone changed (None: rebuild the whole record)
        changed: dict[str, set[int] | None] = {}
        cluster_changed = False
        config_changes: list[tuple[int, str]] = []
        sessions: list[str] = []
        acls_changed = False
        data = self._topic_data
        for kind, key, value in updates:
            if kind == "topic":
                data[key] = value
                changed[key] = None
            elif kind == "gone":
                if data.pop(key, None) is not None:
                    changed[key] = None
            elif kind == "assignment":
                if key in data:
                    data[key].assignment = value
                    changed[key] = None
            elif kind == "states":
                if key in data:
                    states = data[key].states
                    for p, s in value.items():
                        if s is None:
                            states.pop(p, None)
                        else:
                            states[p] = s
                    if key not in changed:
                        changed[key] = set(value)
                    elif (parts := changed[key]) is not None:
                        parts.update(value)
            elif kind == "tconfig":
                if key in data:
                    data[key].configs = value
                    changed[key] = None
            elif kind == "deleting":
                self._deleting = value
            elif kind == "brokers":
                cluster_changed |= self._set_brokers(value)
            elif kind == "controller":
                cluster_changed |= value != self._controller
                self._controller = value
            elif kind == "entities":
                config_changes.extend(self._set_entities(key, value))
            elif kind == "quotas":
                self._quotas = value
            elif kind == "scram":
                self._scram = value
            elif kind == "acls":
                acls_changed = True
                self._acls = value
            elif kind == "reset":
                snap: _Snapshot = value
                for name in list(data) + list(snap.topics):
                    changed[name] = None
                self._topic_data = data = dict(snap.topics)
                self._deleting = set(snap.deleting)
                cluster_changed |= self._set_brokers(snap.brokers)
                cluster_changed |= snap.controller != self._controller
                self._controller = snap.controller
                for rtype in ENTITY_RESOURCES:
                    config_changes.extend(self._set_entities(rtype, snap.entities.get(rtype, {})))
                self._quotas = snap.quotas
                self._scram = snap.scram
                acls_changed = True
                self._acls = snap.acls
            elif kind == "session":
                sessions.append(value)
        notifications: list[tuple[str, TopicRecord | None]] = []
        for name, only in changed.items():
            old = self._topics.get(name)
            new = self._build(name, old, only)
            if new is old:
                continue
            if new is None:
                del self._topics[name]
            else:
                self._topics[name] = new
            notifications.append((name, new))
        if not notify:
            return
        _call_each(self._notify_cluster, [()] if cluster_changed else [])
        _call_each(self._notify, notifications)
        _call_each(self._notify_config, config_changes)
        if acls_changed:
            try:
                self._notify_acls()
            except Exception:
                log.exception("an ACL listener failed")
        for state in sessions:
            for listener in self._session_listeners:
                _call_each(listener, [(state,)])

    def _set_brokers(self, brokers: dict[int, zl.BrokerRegistration]) -> bool:
        live = {i: list(r.endpoints) for i, r in sorted(brokers.items())}
        racks = {i: r.rack for i, r in brokers.items()}
        if live == self._live and racks == {i: r.rack for i, r in self._brokers.items()}:
            return False
        self._brokers = dict(brokers)
        self._live = live
        return True

    def _set_entities(self, rtype: int, entities: dict[str, dict[str, str]]) -> list[tuple[int, str]]:
        old = self._entities.get(rtype, {})
        changes = [(rtype, n) for n in sorted(old.keys() | entities.keys()) if old.get(n) != entities.get(n)]
        self._entities[rtype] = entities
        return changes

    def _build(self, name: str, old: TopicRecord | None, only: set[int] | None = None) -> TopicRecord | None:
        """The TopicRecord of a topic's current data; ``old`` itself when nothing changed.

        Unchanged partitions keep their PartitionAssignment objects; with ``only`` (partitions whose
        state alone changed) the others are not even looked at, so one ISR change in a topic of
        thousands of partitions costs little.
        """
        data = self._topic_data.get(name)
        if data is None:
            return None
        a = data.assignment
        if (only is not None and old is not None and old.topic_id == a.topic_id
                and only <= old.partitions.keys() and only <= a.partitions.keys()):
            replaced = {p: pa for p in only if (pa := self._partition(data, p)) != old.partitions[p]}
            if not replaced:
                return old
            return TopicRecord(name=name, topic_id=a.topic_id, partitions={**old.partitions, **replaced},
                               configs=old.configs)
        old_parts = old.partitions if old is not None and old.topic_id == a.topic_id else {}
        parts: dict[int, PartitionAssignment] = {}
        same = len(old_parts) == len(a.partitions)
        for p in sorted(a.partitions):
            pa = self._partition(data, p)
            prev = old_parts.get(p)
            if prev is not None and prev == pa:
                parts[p] = prev
            else:
                parts[p] = pa
                same = False
        if old is not None and same and old.topic_id == a.topic_id and old.configs == data.configs:
            return old
        return TopicRecord(name=name, topic_id=a.topic_id, partitions=parts, configs=dict(data.configs))

    @staticmethod
    def _partition(data: _TopicData, p: int) -> PartitionAssignment:
        a = data.assignment
        s = data.states.get(p)
        return PartitionAssignment(
            replicas=list(a.partitions[p]),
            leader=s.leader if s else -1, leader_epoch=s.leader_epoch if s else 0,
            isr=list(s.isr) if s else [], controller_epoch=s.controller_epoch if s else 0,
            zk_version=s.zk_version if s else -1,
            adding_replicas=list(a.adding_replicas.get(p, ())),
            removing_replicas=list(a.removing_replicas.get(p, ())))

    # --- cached views (event loop) ---------------------------------------------------------------------

    def live_brokers(self) -> dict[int, list[tuple[str, str, int]]]:
        return self._live

    def broker_rack(self, broker_id: int) -> str | None:
        reg = self._brokers.get(broker_id)
        return reg.rack if reg is not None else None

    def broker_registration(self, broker_id: int) -> zl.BrokerRegistration | None:
        return self._brokers.get(broker_id)

    def controller_id(self) -> int:
        return self._controller

    def topics(self) -> dict[str, TopicRecord]:
        return self._topics

    def topics_being_deleted(self) -> set[str]:
        """Topics marked in /admin/delete_topics (still in topics() until the controller removes them)."""
        return self._deleting

    def entity_configs(self, resource_type: int) -> dict[str, dict[str, str]]:
        return self._entities.get(resource_type, {})

    def client_quotas(self) -> dict[QuotaEntity, dict[str, float]]:
        return self._quotas

    # --- writes (worker threads; the caches follow through the watches) ---------------------------------

    @contextmanager
    def _unavailable(self) -> Iterator[None]:
        """Wait (bounded) for a connection, and turn kazoo's connection errors into StoreUnavailable."""
        if self._closed or self._zk is None:
            raise StoreUnavailable("the ZooKeeper metadata store is closed")
        if not self._connected.wait(self._request_timeout):
            raise StoreUnavailable(f"ZooKeeper {self._connect} unreachable for {self._request_timeout:.0f} s")
        try:
            yield
        except _UNAVAILABLE as e:
            raise StoreUnavailable(f"ZooKeeper {self._connect}: {type(e).__name__}") from e

    def _commit(self, tx: Any) -> list[Any]:
        return commit(tx, self._request_timeout)

    def _read_assignment(self, name: str) -> tuple[zl.TopicAssignment, int]:
        try:
            data, stat = self.zk.get(zl.topic_path(name))
        except NoNodeError:
            raise UnknownTopic(name) from None
        return zl.decode_topic_assignment(data), stat.version

    def _config_node_op(self, tx: Any, path: str, configs: dict[str, str]) -> None:
        """Add to a multi: write an entity config znode (create it when missing)."""
        if self.zk.exists(path) is None:
            tx.create(path, zl.encode_entity_config(configs))
        else:
            tx.set_data(path, zl.encode_entity_config(configs))

    def create_topic(self, record: TopicRecord) -> None:
        """The assignment znode and the topic config in one multi; the controller writes partition states."""
        name = record.name
        assignment = zl.TopicAssignment(
            topic_id=record.topic_id,
            partitions={p: list(a.replicas) for p, a in record.partitions.items()})
        with self._unavailable():
            if self.zk.exists(zl.delete_topic_path(name)) is not None:
                raise TopicExists(f"Topic '{name}' is marked for deletion.")
            tx = self.zk.transaction()
            self._config_node_op(tx, zl.topic_config_path(name), record.configs)
            tx.create(zl.topic_path(name), zl.encode_topic_assignment(assignment))
            try:
                self._commit(tx)
            except NodeExistsError:
                raise TopicExists(name) from None
            except NoNodeError:  # /config/topics/<t> vanished between exists() and the multi
                raise TopicExists(name) from None
        log.info("created topic %(name)s (%(partitions)d partitions) in ZooKeeper",
                 {"name": name, "partitions": len(assignment.partitions)})

    def delete_topic(self, name: str) -> TopicRecord:
        """Mark the topic for deletion (/admin/delete_topics/<t>); the controller deletes it."""
        with self._unavailable():
            rec = self._topics.get(name)
            if rec is None:
                assignment, _ = self._read_assignment(name)
                rec = TopicRecord(name, assignment.topic_id,
                                  {p: PartitionAssignment(list(r)) for p, r in assignment.partitions.items()})
            elif self.zk.exists(zl.topic_path(name)) is None:
                raise UnknownTopic(name)
            try:
                self.zk.create(zl.delete_topic_path(name), makepath=True)
            except NodeExistsError:
                pass
        log.info("marked topic %(name)s for deletion", {"name": name})
        return rec

    def add_partitions(self, name: str, new: dict[int, PartitionAssignment]) -> TopicRecord:
        """Rewrite the assignment znode, conditional on its version. StaleState if a partition exists."""
        with self._unavailable():
            for _ in range(_WRITE_RETRIES):
                assignment, version = self._read_assignment(name)
                clash = sorted(set(new) & set(assignment.partitions))
                if clash:
                    raise StaleState(f"topic {name} already has partitions {clash}")
                for p, a in new.items():
                    assignment.partitions[p] = list(a.replicas)
                try:
                    self.zk.set(zl.topic_path(name), zl.encode_topic_assignment(assignment), version=version)
                except BadVersionError:
                    continue
                break
            else:
                raise StoreUnavailable(f"the assignment of {name} kept changing; partitions not added")
        base = self._topics.get(name)
        parts = dict(base.partitions) if base is not None else {}
        for p, r in assignment.partitions.items():
            parts.setdefault(p, PartitionAssignment(list(r)))
        log.info("added partitions %(new)s to topic %(name)s", {"new": sorted(new), "name": name})
        return TopicRecord(name, assignment.topic_id, parts, dict(base.configs) if base else {})

    def read_topic_configs(self, name: str, *, fresh: bool = False) -> dict[str, str] | None:
        rec = self._topics.get(name)
        if rec is not None and not fresh:
            return dict(rec.configs)
        with self._unavailable():
            self.zk.sync(zl.topic_path(name))
            if self.zk.exists(zl.topic_path(name)) is None:
                return None
            try:
                data, _ = self.zk.get(zl.topic_config_path(name))
            except NoNodeError:
                return {}
        return zl.decode_entity_config(data)

    def set_topic_configs(self, name: str, configs: dict[str, str]) -> TopicRecord:
        path = zl.topic_config_path(name)
        with self._unavailable():
            tx = self.zk.transaction()
            tx.check(zl.topic_path(name), -1)  # the topic exists
            self._config_node_op(tx, path, configs)
            tx.create(zl.CONFIG_CHANGE_PREFIX, zl.encode_config_change(zl.config_change_entity(path)),
                      sequence=True)
            try:
                self._commit(tx)
            except NoNodeError:
                raise UnknownTopic(name) from None
            self._purge_config_changes()
        base = self._topics.get(name)
        if base is None:
            assignment, _ = self._read_assignment(name)
            base = TopicRecord(name, assignment.topic_id,
                               {p: PartitionAssignment(list(r)) for p, r in assignment.partitions.items()})
        return TopicRecord(name, base.topic_id, dict(base.partitions), dict(configs))

    def read_entity_configs(self, resource_type: int, name: str) -> dict[str, str]:
        if resource_type not in zl.CONFIG_ENTITY_PATHS:
            raise ValueError(f"resource type {resource_type} has no dynamic configs")
        path = zl.entity_config_path(resource_type, name)
        with self._unavailable():
            self.zk.sync(path)
            try:
                return _decode_configs(self.zk.get(path))
            except NoNodeError:
                return {}

    def set_entity_configs(self, resource_type: int, name: str, configs: dict[str, str]) -> None:
        """/config/brokers/<id|<default>>, /config/client-metrics/<n>, /config/groups/<g>; empty removes it."""
        if resource_type not in zl.CONFIG_ENTITY_PATHS:
            raise ValueError(f"resource type {resource_type} has no dynamic configs")
        path = zl.entity_config_path(resource_type, name)
        with self._unavailable():
            for _ in range(_WRITE_RETRIES):
                tx = self.zk.transaction()
                exists = self.zk.exists(path) is not None
                if configs:
                    if exists:
                        tx.set_data(path, zl.encode_entity_config(configs))
                    else:
                        tx.create(path, zl.encode_entity_config(configs))
                elif exists:
                    tx.delete(path)
                tx.create(zl.CONFIG_CHANGE_PREFIX, zl.encode_config_change(zl.config_change_entity(path)),
                          sequence=True)
                try:
                    self._commit(tx)
                except (NodeExistsError, NoNodeError, NotEmptyError):
                    continue
                self._purge_config_changes()
                return
        raise StoreUnavailable(f"{path} kept changing; configs not written")

    def alter_client_quotas(self, changes: dict[QuotaEntity, dict[str, float | None]]) -> None:
        """Read-modify-write of each entity's znode, all in one multi (retried when it lost a race)."""
        with self._unavailable():
            paths = {entity: zl.quota_entity_path(entity) for entity in changes}
            for path in paths.values():
                self._ensure_quota_parents(path)
        self._edit_entity_configs(
            {paths[e]: {k: None if v is None else zl.encode_quota_value(k, v) for k, v in ops.items()}
             for e, ops in changes.items()}, "client quotas")

    def _edit_entity_configs(self, changes: dict[str, dict[str, str | None]], what: str) -> None:
        """edit_entity_configs from a worker thread: StoreUnavailable when ZooKeeper is unreachable or the
        znodes kept changing."""
        with self._unavailable():
            if edit_entity_configs(self.zk, changes, self._request_timeout):
                self._purge_config_changes()
                return
        raise StoreUnavailable(f"{what} kept changing; not written")

    def scram_users(self) -> dict[str, dict[str, str]]:
        return self._scram

    # --- ACLs ---------------------------------------------------------------------------------------

    supports_acls = True

    def acls(self) -> list[AclBinding]:
        return list(self._acls)

    def create_acls(self, bindings: list[AclBinding]) -> None:
        """Add entries to their resources' znodes (read-modify-write, version-checked) with a change
        notification per resource, in one multi; every broker's watch then reloads the ACLs."""
        by_resource: dict[ResourcePattern, list[AclBinding]] = {}
        for b in bindings:
            by_resource.setdefault(b.pattern, []).append(b)

        def edit(current: list[dict[str, str]], pattern: ResourcePattern) -> list[dict[str, str]]:
            out = list(current)
            for b in by_resource[pattern]:
                entry = entry_to_json(b.entry)
                if entry not in out:
                    out.append(entry)
            return out

        self._write_acls(list(by_resource), edit)

    def delete_acls(self, filters: list[AclBindingFilter]) -> list[list[AclBinding]]:
        """Remove what each filter matches, read fresh from ZooKeeper; a znode left empty is deleted."""
        with self._unavailable():
            current = self._read_acls()
        matched = [[b for b in current if f.matches(b)] for f in filters]
        gone: dict[ResourcePattern, set[AclBinding]] = {}
        for m in matched:
            for b in m:
                gone.setdefault(b.pattern, set()).add(b)
        if gone:
            def edit(entries: list[dict[str, str]], pattern: ResourcePattern) -> list[dict[str, str]]:
                drop = [entry_to_json(b.entry) for b in gone[pattern]]
                return [e for e in entries if e not in drop]

            self._write_acls(list(gone), edit)
        return matched

    def _write_acls(self, patterns: list[ResourcePattern],
                    edit: Callable[[list[dict[str, str]], ResourcePattern], list[dict[str, str]]]) -> None:
        with self._unavailable():
            for _ in range(_WRITE_RETRIES):
                tx = self.zk.transaction()
                written: dict[ResourcePattern, list[dict[str, str]]] = {}  # each resource's entries now
                for pattern in patterns:
                    prefixed = pattern.pattern_type == PatternType.PREFIXED
                    rtype = resource_type_name(pattern.resource_type)
                    parent = f"{zl.acl_root(prefixed)}/{rtype}"
                    path = zl.acl_resource_path(prefixed, rtype, pattern.name)
                    self.zk.ensure_path(parent)
                    try:
                        data, stat = self.zk.get(path)
                        entries, version = zl.decode_acl_entries(data), stat.version
                    except NoNodeError:
                        entries, version = [], None
                    new = written[pattern] = edit(entries, pattern)
                    if version is None:
                        if not new:
                            continue
                        tx.create(path, zl.encode_acl_entries(new))
                    elif not new:
                        tx.delete(path, version=version)
                    else:
                        tx.set_data(path, zl.encode_acl_entries(new), version=version)
                    changes = zl.ACL_PREFIXED_CHANGES if prefixed else zl.ACL_LITERAL_CHANGES
                    tx.create(f"{changes}/{zl.ACL_CHANGE_NODE}", zl.encode_acl_change(prefixed, rtype, pattern.name),
                              sequence=True)
                try:
                    self._commit(tx)
                except (BadVersionError, NodeExistsError, NoNodeError):
                    continue
                self._purge_acl_changes()
                # The caller (CreateAcls/DeleteAcls, then a request it authorizes) sees the change at once:
                # the written resources' entries replace theirs in the cache (the watch brings the same set).
                self._acls = [b for b in self._acls if b.pattern not in written] + [
                    AclBinding(p, entry_from_json(e)) for p, entries in written.items() for e in entries]
                self._post_updates([("acls", None, self._acls)])
                return
        raise StoreUnavailable("ACLs kept changing; not written")

    def _purge_acl_changes(self) -> None:
        """Keep the newest ACL change notifications only: brokers re-read every ACL on any notification."""
        try:
            for root in (zl.ACL_LITERAL_CHANGES, zl.ACL_PREFIXED_CHANGES):
                children = sorted(self.zk.get_children(root))
                for c in children[:-_KEEP_CONFIG_CHANGES][:_PURGE_BATCH]:
                    self.zk.delete_async(f"{root}/{c}")
        except (KazooException, *_UNAVAILABLE):
            log.debug("purging old ACL change notifications failed", exc_info=True)

    def read_scram_mechanisms(self, user: str) -> set[str]:
        path = zl.quota_entity_path((("user", user),))
        with self._unavailable():
            self.zk.sync(path)
            try:
                got = self.zk.get(path)
            except NoNodeError:
                return set()
        return set(scram_entries(_decode_configs(got)))

    def alter_scram_credentials(self, upserts: dict[tuple[str, str], ScramCredential],
                                deletions: list[tuple[str, str]]) -> None:
        """Kafka's layout: /config/users/<u> config keys SCRAM-SHA-256 / SCRAM-SHA-512, written with a
        read-modify-write that keeps the user's quota keys, plus a /config/changes notification."""
        changes = scram_edits(upserts, deletions)
        self._edit_entity_configs({zl.quota_entity_path((("user", u),)): ops for u, ops in changes.items()},
                                  "SCRAM credentials")
        # Our own write shows up through the watch too; update the cache now so the caller
        # (AlterUserScramCredentials, then a login) sees it at once.
        cache = {u: dict(c) for u, c in self._scram.items()}
        for user, ops in changes.items():
            creds = cache.setdefault(user, {})
            for key, value in ops.items():
                if value is None:
                    creds.pop(key, None)
                else:
                    creds[key] = value
            if not creds:
                cache.pop(user, None)
        self._scram = cache

    def _purge_config_changes(self) -> None:
        """Delete /config/changes notifications older than 15 minutes, as Kafka's brokers do.

        pykbroker's brokers watch the config znodes themselves, so nothing else would ever remove
        the notifications it writes for Kafka's tools. Best effort, bounded per call.
        """
        try:
            children = sorted(self.zk.get_children(zl.CONFIG_CHANGES))
            if len(children) <= _KEEP_CONFIG_CHANGES:
                return
            oldest = children[:-_KEEP_CONFIG_CHANGES][:_PURGE_BATCH]
            stats = [(c, self.zk.exists_async(f"{zl.CONFIG_CHANGES}/{c}")) for c in oldest]
            cutoff_ms = (time.time() - _CONFIG_CHANGE_EXPIRY_S) * 1000
            for c, ar in stats:
                stat = ar.get(timeout=self._request_timeout)
                if stat is None:
                    continue
                if stat.ctime >= cutoff_ms:
                    break  # sequence order is age order: the rest are younger
                self.zk.delete_async(f"{zl.CONFIG_CHANGES}/{c}")
        except (KazooException, *_UNAVAILABLE):
            log.debug("purging old config change notifications failed", exc_info=True)

    def _ensure_quota_parents(self, path: str) -> None:
        """/config/users/<u>/clients/<c> needs /config/users/<u> (an empty config) and .../clients."""
        parts = path.split("/")
        if len(parts) != 6:  # "", config, users, <u>, clients, <c>
            return
        user = "/".join(parts[:4])
        for p, data in ((user, zl.encode_entity_config({})), (user + "/clients", b"")):
            try:
                self.zk.create(p, data)
            except NodeExistsError:
                pass

    def allocate_producer_ids(self, count: int) -> int:
        """A block of ``count`` ids from /latest_producer_id_block (conditional update, bounded retry)."""
        if count < 1:
            raise ValueError("count must be positive")
        path = zl.LATEST_PRODUCER_ID_BLOCK
        with self._unavailable():
            for _ in range(_WRITE_RETRIES * 5):
                try:
                    data, stat = self.zk.get(path)
                except NoNodeError:
                    data, stat = b"", None
                if data:
                    _, end = zl.decode_producer_id_block(data)
                    start = end + 1
                else:
                    start = 0
                if start + count - 1 > 2**63 - 1:
                    raise StoreUnavailable("producer ids are exhausted")
                block = zl.encode_producer_id_block(self._broker_id, start, start + count - 1)
                try:
                    if stat is None:
                        self.zk.create(path, block)
                    else:
                        self.zk.set(path, block, version=stat.version)
                except (BadVersionError, NodeExistsError):
                    continue
                return start
        raise StoreUnavailable("could not allocate a producer id block: too much contention")

    def update_isr(self, topic: str, index: int, leader_epoch: int, isr: list[int], zk_version: int) -> int:
        """The leader's ISR change, conditional on the state version it read, plus an ISR change notification.

        Like Kafka's leader, a version mismatch whose stored data already says what we meant to write
        counts as success. StaleState when the leader epoch or the state moved on.
        """
        path = zl.partition_state_path(topic, index)
        with self._unavailable():
            try:
                data, stat = self.zk.get(path)
            except NoNodeError:
                raise StaleState(f"{topic}-{index}: no partition state") from None
            current = zl.decode_partition_state(data, stat.version)
            if current.leader_epoch != leader_epoch:
                raise StaleState(f"{topic}-{index}: leader epoch is {current.leader_epoch}, not {leader_epoch}")
            if stat.version != zk_version:
                if current.isr == list(isr):
                    return stat.version
                raise StaleState(f"{topic}-{index}: state version is {stat.version}, not {zk_version}")
            new = zl.PartitionState(current.leader, current.leader_epoch, list(isr), current.controller_epoch,
                                    current.leader_recovery_state)
            tx = self.zk.transaction()
            tx.set_data(path, zl.encode_partition_state(new), version=zk_version)
            tx.create(zl.ISR_CHANGE_PREFIX, zl.encode_partition_list([(topic, index)]), sequence=True)
            try:
                results = self._commit(tx)
            except (BadVersionError, NoNodeError):
                raise StaleState(f"{topic}-{index}: the state changed meanwhile") from None
        new_stat = results[0]
        log.info("ISR of %(topic)s-%(partition)d is now %(isr)s (leader epoch %(leader_epoch)d)",
                 {"topic": topic, "partition": index, "isr": list(isr), "leader_epoch": leader_epoch})
        return int(new_stat.version)

    def request_election(self, partitions: list[tuple[str, int]], election_type: int) -> None:
        """Hand an ElectLeaders request to the controller (sequential /pykbroker/elections/election_)."""
        with self._unavailable():
            self.zk.create(zl.ELECTION_PREFIX, zl.encode_election_request(partitions, election_type),
                           sequence=True, makepath=True)

    def alter_reassignments(self, moves: dict[tuple[str, int], list[int] | None]) -> None:
        """Write KIP-455 reassignments into the assignment znodes (None cancels one).

        For target replicas T of a partition whose original replicas are O (its replicas without the
        ones being added): replicas = T + (O - T), adding = T - O, removing = O - T.
        """
        by_topic: dict[str, dict[int, list[int] | None]] = {}
        for (t, p), target in moves.items():
            by_topic.setdefault(t, {})[p] = target
        with self._unavailable():
            for topic, parts in sorted(by_topic.items()):
                for _ in range(_WRITE_RETRIES):
                    assignment, version = self._read_assignment(topic)
                    for p, target in parts.items():
                        if p not in assignment.partitions:
                            raise UnknownTopic(f"{topic}-{p}")
                        reassign_partition(assignment, p, target)
                    try:
                        self.zk.set(zl.topic_path(topic), zl.encode_topic_assignment(assignment), version=version)
                    except BadVersionError:
                        continue
                    break
                else:
                    raise StoreUnavailable(f"the assignment of {topic} kept changing; reassignment not written")
        log.info("reassignments written: %(reassignments)s",
                 {"reassignments": {f'{t}-{p}': r for (t, p), r in sorted(moves.items())}})


def _setter(event: threading.Event) -> Callable[[WatchedEvent], None]:
    return lambda _e: event.set()


def _known_resource_type(name: str) -> bool:
    try:
        resource_type_from_name(name)
    except KeyError:
        return False
    return True


def _call_each(fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> None:
    """Call ``fn`` for each argument tuple; a failing listener is logged and does not stop the rest."""
    for args in calls:
        try:
            fn(*args)
        except Exception:
            log.exception("metadata listener failed")


def _decode_assignment(name: str, got: tuple[bytes, ZnodeStat] | None) -> zl.TopicAssignment | None:
    if got is None:
        return None
    try:
        return zl.decode_topic_assignment(got[0])
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("ignoring topic %(name)s: unreadable assignment %(response)r",
                    {"name": name, "response": got[0][:200]})
        return None


def _decode_state(got: tuple[bytes, ZnodeStat] | None) -> zl.PartitionState | None:
    if got is None:
        return None
    try:
        return zl.decode_partition_state(got[0], got[1].version)
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("ignoring unreadable partition state %(response)r", {"response": got[0][:200]})
        return None


def _decode_configs(got: tuple[bytes, ZnodeStat] | None) -> dict[str, str]:
    if got is None or not got[0]:
        return {}
    try:
        return zl.decode_entity_config(got[0])
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("ignoring unreadable config %(response)r", {"response": got[0][:200]})
        return {}


__all__ = ["DuplicateBrokerId", "ZkConnectError", "ZkMetadataStore", "commit", "edit_entity_configs", "parse_connect",
           "reassign_partition", "scram_edits", "scram_entries", "start_client"]
