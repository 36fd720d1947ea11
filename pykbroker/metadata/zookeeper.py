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

The znode work lives beside it: connecting and multis in ``zk_client.py``, the watcher thread's reads
in ``zk_reader.py``, the conditional writes in ``zk_writes.py``, this broker's ephemeral znodes in
``zk_registration.py``; this module holds the threads, the caches and the MetadataStore interface.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
)
from kazoo.protocol.states import EventType, WatchedEvent

from pykbroker.config import BrokerConfig, parse_protocol_map
from pykbroker.metadata import zk_layout as zl
from pykbroker.metadata.embedded import random_cluster_id
from pykbroker.metadata.store import (
    ENTITY_RESOURCES,
    MetadataStore,
    PartitionAssignment,
    QuotaEntity,
    Reassignment,
    StaleState,
    StoreUnavailable,
    TopicRecord,
    UnknownTopic,
)
from pykbroker.metadata.zk_client import (
    UNAVAILABLE,
    ZkConnectError,
    commit,
    edit_entity_configs,
    scram_edits,
    scram_entries,
    start_client,
)
from pykbroker.metadata.zk_layout import parse_connect
from pykbroker.metadata.zk_reader import MetadataSnapshot, TopicData, Update, ZkMetadataReader, decode_configs
from pykbroker.metadata.zk_registration import create_own_ephemeral, ensure_registered, register_broker
from pykbroker.metadata.zk_writes import (
    AclEdit,
    add_partition_assignments,
    allocate_producer_id_block,
    create_topic_znodes,
    ensure_quota_parents,
    purge_acl_changes,
    purge_config_changes,
    read_assignment,
    write_acls,
    write_entity_configs,
    write_reassignments,
    write_topic_configs,
)
from pykbroker.security.acl import (
    AclBinding,
    AclBindingFilter,
    ResourcePattern,
    entry_from_json,
    entry_to_json,
)
from pykbroker.security.sasl.scram import ScramCredential

log = logging.getLogger("pykbroker.metadata.zookeeper")

SessionListener = Callable[[str], None]
Poster = Callable[[Callable[[], None]], None]

# Watch events of one batch processed together (the rest wait for the next batch).
_MAX_EVENTS_PER_BATCH = 50_000


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
        # The czxid of our /brokers/ids/<id> (Kafka's broker epoch), once registered; the watcher thread waits
        # for the controller to confirm it (zl.CONFIRMED_BROKERS) and then posts "confirmed".
        self._broker_epoch = -1
        self._confirmed_epoch = -1  # watcher thread
        self._roles_confirmed = False  # loop thread: until then this broker leads nothing (_partition)
        # watcher thread only: its reads, and the topics it watches with their partitions
        self._reader = ZkMetadataReader(lambda: self.zk, self._watch, self._request_timeout)
        # watcher thread -> loop
        self._pending: list[Update] = []
        self._pending_lock = threading.Lock()
        self._drain_posted = False
        # loop-thread caches
        self._topic_data: dict[str, TopicData] = {}
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
            snap = self._reader.load_all()
        except UNAVAILABLE as e:
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
                                                      self._rack, self.schema_registry_url))

    def register_broker(self) -> None:
        """Create the ephemeral /brokers/ids/<id>; DuplicateBrokerId when another broker holds it.

        A broker restarted right after being killed finds its previous run's znode until that session
        expires; when the znode names our own endpoints we wait (up to the session timeout) for it to go.
        """
        data = self._registration()
        with self._unavailable():
            register_broker(self.zk, self._broker_id, data, self._endpoints, self._chroot, self._session_timeout_ms)
            self._registered = True
            stat = self.zk.exists(zl.broker_path(self._broker_id))
            self._broker_epoch = int(stat.czxid) if stat is not None else -1
        log.info("broker %(broker_id)d registered with broker epoch %(broker_epoch)d: taking no partition role "
                 "until the controller confirms it", {"broker_id": self._broker_id, "broker_epoch": self._broker_epoch})
        self._events.put(("confirm", ""))

    def roles_confirmed(self) -> bool:
        return self._roles_confirmed

    def begin_controlled_shutdown(self) -> None:
        """Ask the controller to move this broker's leaderships away (ephemeral znode)."""
        self._shutdown_requested = True
        with self._unavailable():
            create_own_ephemeral(self.zk, zl.controlled_shutdown_path(self._broker_id), b"")

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
            confirmation = zl.confirmed_broker_path(self._broker_id)
            confirm = any(kind == "confirm" or path == confirmation for kind, path in batch)
            batch = [(kind, path) for kind, path in batch if kind != "confirm" and path != confirmation]
            try:
                if any(kind == "resync" for kind, _ in batch):
                    self._resync()
                elif batch:
                    self._post_updates(self._reader.process(batch))
                if confirm:
                    self._check_confirmation()
            except UNAVAILABLE as e:
                log.debug("watch processing interrupted by %(error_type)s", {"error_type": type(e).__name__})
                self._retry_resync()
            except Exception:
                log.exception("processing ZooKeeper watch events failed; re-reading everything")
                self._retry_resync()

    def _check_confirmation(self) -> None:
        """Watcher thread: has the controller confirmed our registration? Then re-read everything (the states
        the controller wrote before confirming) and post it with the confirmation; else watch for it."""
        if self._broker_epoch < 0 or self._confirmed_epoch == self._broker_epoch:
            return
        path = zl.confirmed_broker_path(self._broker_id)
        try:
            data, _stat = self.zk.get(path, watch=self._watch)
        except NoNodeError:
            if self.zk.exists(path, watch=self._watch) is not None:
                self._events.put(("confirm", ""))
            return
        if zl.decode_confirmation(data) != self._broker_epoch:
            return
        self._confirmed_epoch = self._broker_epoch
        snap = self._reader.load_all()
        self._post_updates([("confirmed", None, snap)])

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
            ensure_registered(self.zk, self._broker_id, self._registration(), self._chroot)
        if self._shutdown_requested:
            create_own_ephemeral(self.zk, zl.controlled_shutdown_path(self._broker_id), b"")
        snap = self._reader.load_all()
        self._post_updates([("reset", None, snap)])
        if self._confirmed_epoch != self._broker_epoch:
            self._events.put(("confirm", ""))  # a watch lost with the connection

    # --- watcher thread -> loop -------------------------------------------------------------------------

    def _post_updates(self, updates: list[Update]) -> None:
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

    def _apply_reset(self, snap: MetadataSnapshot, notify: bool) -> None:
        self._apply([("reset", None, snap)], notify=notify)

    def _apply(self, updates: list[Update], notify: bool = True) -> None:
        # ordered: topic name -> the partitions whose state alone changed (None: rebuild the whole record)
        changed: dict[str, set[int] | None] = {}
        cluster_changed = False
        config_changes: list[tuple[int, str]] = []
        sessions: list[str] = []
        acls_changed = False
        forced = False
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
            elif kind in ("reset", "confirmed"):
                if kind == "confirmed":
                    # Every topic is applied anew: roles held back until now are taken.
                    self._roles_confirmed = forced = True
                    log.info("broker %(broker_id)d confirmed by the controller: taking its partition roles",
                             {"broker_id": self._broker_id})
                snap: MetadataSnapshot = value
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
            if new is old and not forced:
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
        racks = {i: (r.rack, r.schema_registry_url) for i, r in brokers.items()}
        if live == self._live and racks == {i: (r.rack, r.schema_registry_url) for i, r in self._brokers.items()}:
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
            replaced = {p: pa for p in only if (pa := self._partition(data, p, self._held_back))
                        != old.partitions[p]}
            if not replaced:
                return old
            return TopicRecord(name=name, topic_id=a.topic_id, partitions={**old.partitions, **replaced},
                               configs=old.configs)
        old_parts = old.partitions if old is not None and old.topic_id == a.topic_id else {}
        parts: dict[int, PartitionAssignment] = {}
        same = len(old_parts) == len(a.partitions)
        for p in sorted(a.partitions):
            pa = self._partition(data, p, self._held_back)
            prev = old_parts.get(p)
            if prev is not None and prev == pa:
                parts[p] = prev
            else:
                parts[p] = pa
                same = False
        if old is not None and same and old.topic_id == a.topic_id and old.configs == data.configs:
            return old
        return TopicRecord(name=name, topic_id=a.topic_id, partitions=parts, configs=dict(data.configs))

    @property
    def _held_back(self) -> int | None:
        """The leader id shown as no leader (-1): this broker's own, until the controller confirmed it."""
        return None if self._roles_confirmed else self._broker_id

    @staticmethod
    def _partition(data: TopicData, p: int, held_back: int | None = None) -> PartitionAssignment:
        a = data.assignment
        s = data.states.get(p)
        return PartitionAssignment(
            replicas=list(a.partitions[p]),
            leader=(-1 if s.leader == held_back else s.leader) if s else -1, leader_epoch=s.leader_epoch if s else 0,
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

    def broker_schema_registry_url(self, broker_id: int) -> str | None:
        reg = self._brokers.get(broker_id)
        return reg.schema_registry_url if reg is not None else None

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
        except UNAVAILABLE as e:
            raise StoreUnavailable(f"ZooKeeper {self._connect}: {type(e).__name__}") from e

    def create_topic(self, record: TopicRecord) -> None:
        """The assignment znode and the topic config in one multi; the controller writes partition states."""
        name = record.name
        assignment = zl.TopicAssignment(
            topic_id=record.topic_id,
            partitions={p: list(a.replicas) for p, a in record.partitions.items()})
        with self._unavailable():
            create_topic_znodes(self.zk, record, assignment, self._request_timeout)
        log.info("created topic %(name)s (%(partitions)d partitions) in ZooKeeper",
                 {"name": name, "partitions": len(assignment.partitions)})

    def delete_topic(self, name: str) -> TopicRecord:
        """Mark the topic for deletion (/admin/delete_topics/<t>); the controller deletes it."""
        with self._unavailable():
            rec = self._topics.get(name)
            if rec is None:
                assignment, _ = read_assignment(self.zk, name)
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
            assignment = add_partition_assignments(self.zk, name, new)
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
        with self._unavailable():
            write_topic_configs(self.zk, name, configs, self._request_timeout)
            purge_config_changes(self.zk, self._request_timeout)
        base = self._topics.get(name)
        if base is None:
            assignment, _ = read_assignment(self.zk, name)
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
                return decode_configs(self.zk.get(path))
            except NoNodeError:
                return {}

    def set_entity_configs(self, resource_type: int, name: str, configs: dict[str, str]) -> None:
        """/config/brokers/<id|<default>>, /config/client-metrics/<n>, /config/groups/<g>; empty removes it."""
        if resource_type not in zl.CONFIG_ENTITY_PATHS:
            raise ValueError(f"resource type {resource_type} has no dynamic configs")
        path = zl.entity_config_path(resource_type, name)
        with self._unavailable():
            if write_entity_configs(self.zk, path, configs, self._request_timeout):
                purge_config_changes(self.zk, self._request_timeout)
                return
        raise StoreUnavailable(f"{path} kept changing; configs not written")

    def alter_client_quotas(self, changes: dict[QuotaEntity, dict[str, float | None]]) -> None:
        """Read-modify-write of each entity's znode, all in one multi (retried when it lost a race)."""
        with self._unavailable():
            paths = {entity: zl.quota_entity_path(entity) for entity in changes}
            for path in paths.values():
                ensure_quota_parents(self.zk, path)
        self._edit_entity_configs(
            {paths[e]: {k: None if v is None else zl.encode_quota_value(k, v) for k, v in ops.items()}
             for e, ops in changes.items()}, "client quotas")

    def _edit_entity_configs(self, changes: dict[str, dict[str, str | None]], what: str) -> None:
        """edit_entity_configs from a worker thread: StoreUnavailable when ZooKeeper is unreachable or the
        znodes kept changing."""
        with self._unavailable():
            if edit_entity_configs(self.zk, changes, self._request_timeout):
                purge_config_changes(self.zk, self._request_timeout)
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
            current = self._reader.read_acls()
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

    def _write_acls(self, patterns: list[ResourcePattern], edit: AclEdit) -> None:
        with self._unavailable():
            written = write_acls(self.zk, patterns, edit, self._request_timeout)
            if written is not None:
                purge_acl_changes(self.zk)
                # The caller (CreateAcls/DeleteAcls, then a request it authorizes) sees the change at once:
                # the written resources' entries replace theirs in the cache (the watch brings the same set).
                self._acls = [b for b in self._acls if b.pattern not in written] + [
                    AclBinding(p, entry_from_json(e)) for p, entries in written.items() for e in entries]
                self._post_updates([("acls", None, self._acls)])
                return
        raise StoreUnavailable("ACLs kept changing; not written")

    def read_scram_mechanisms(self, user: str) -> set[str]:
        path = zl.quota_entity_path((("user", user),))
        with self._unavailable():
            self.zk.sync(path)
            try:
                got = self.zk.get(path)
            except NoNodeError:
                return set()
        return set(scram_entries(decode_configs(got)))

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

    def allocate_producer_ids(self, count: int) -> int:
        """A block of ``count`` ids from /latest_producer_id_block (conditional update, bounded retry)."""
        if count < 1:
            raise ValueError("count must be positive")
        with self._unavailable():
            return allocate_producer_id_block(self.zk, self._broker_id, count)

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
                results = commit(tx, self._request_timeout)
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

    def read_reassignments(self, names: list[str]) -> dict[str, dict[int, Reassignment]]:
        # The assignment znodes as ZooKeeper has them after a sync (see MetadataStore.read_reassignments).
        out: dict[str, dict[int, Reassignment]] = {}
        with self._unavailable():
            self.zk.sync(zl.BROKER_TOPICS)  # one sync: the reads after it see every write committed until now
            for name in names:
                try:
                    assignment, _ = read_assignment(self.zk, name)
                except UnknownTopic:
                    continue
                moving = set(assignment.adding_replicas) | set(assignment.removing_replicas)
                out[name] = {i: (tuple(assignment.partitions.get(i, [])),
                                 tuple(assignment.adding_replicas.get(i, [])),
                                 tuple(assignment.removing_replicas.get(i, [])))
                             for i in sorted(moving)
                             if assignment.adding_replicas.get(i) or assignment.removing_replicas.get(i)}
        return out

    def alter_reassignments(self, moves: dict[tuple[str, int], list[int] | None]) -> None:
        """Write KIP-455 reassignments into the assignment znodes (None cancels one).

        For target replicas T of a partition whose original replicas are O (its replicas without the
        ones being added): replicas = T + (O - T), adding = T - O, removing = O - T.
        """
        by_topic: dict[str, dict[int, list[int] | None]] = {}
        for (t, p), target in moves.items():
            by_topic.setdefault(t, {})[p] = target
        with self._unavailable():
            write_reassignments(self.zk, by_topic)
        log.info("reassignments written: %(reassignments)s",
                 {"reassignments": {f'{t}-{p}': r for (t, p), r in sorted(moves.items())}})


def _call_each(fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> None:
    """Call ``fn`` for each argument tuple; a failing listener is logged and does not stop the rest."""
    for args in calls:
        try:
            fn(*args)
        except Exception:
            log.exception("metadata listener failed")


__all__ = ["ZkMetadataStore"]
