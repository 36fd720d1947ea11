"""What the ZooKeeper metadata store reads, and how: watched, pipelined reads of Kafka's znodes
decoded into the updates its watcher thread hands to the event loop.

Watch events name a znode; :meth:`ZkMetadataReader.process` re-reads what a batch of them points
at in as few round trips as possible, re-arming the watches as it goes, and says what changed as
:data:`Update` records.  :meth:`ZkMetadataReader.load_all` reads everything (at start and after
each reconnection).  Unreadable znodes (a foreign writer?) are logged and skipped.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionClosedError, NoNodeError
from kazoo.protocol.paths import _prefix_root
from kazoo.protocol.serialization import Exists, GetChildren, GetData
from kazoo.protocol.states import WatchedEvent, ZnodeStat

from pykbroker.metadata import zk_layout as zl
from pykbroker.metadata.store import BROKER_RESOURCE, ENTITY_RESOURCES, QuotaEntity
from pykbroker.metadata.zk_client import scram_entries
from pykbroker.security.acl import (
    AclBinding,
    PatternType,
    ResourcePattern,
    entry_from_json,
    resource_type_from_name,
)

__all__ = ["MetadataSnapshot", "TopicData", "Update", "ZkMetadataReader", "decode_configs"]

log = logging.getLogger("pykbroker.metadata.zookeeper")  # the store's lines, wherever its code lives


@dataclass
class TopicData:
    """A topic's znodes: its assignment, the partition states and its config."""

    assignment: zl.TopicAssignment
    states: dict[int, zl.PartitionState] = field(default_factory=dict)
    configs: dict[str, str] = field(default_factory=dict)


@dataclass
class MetadataSnapshot:
    """Everything, read at start and after each reconnection."""

    topics: dict[str, TopicData]
    deleting: set[str]
    brokers: dict[int, zl.BrokerRegistration]
    controller: int
    entities: dict[int, dict[str, dict[str, str]]]
    quotas: dict[QuotaEntity, dict[str, float]]
    scram: dict[str, dict[str, str]] = field(default_factory=dict)  # user -> mechanism -> credential
    acls: list[AclBinding] = field(default_factory=list)


# Update records, applied in order on the loop:
# ("topic", name, TopicData)               a topic (re)appeared: assignment, states and config together
# ("gone", name, None)                     /brokers/topics/<t> is gone
# ("assignment", name, TopicAssignment)    the assignment znode changed
# ("states", name, {p: state | None})      partition states changed
# ("tconfig", name, configs)               /config/topics/<t> changed
# ("deleting", None, set[str])             children of /admin/delete_topics
# ("brokers", None, {id: registration})    every live broker
# ("controller", None, id)
# ("entities", resource_type, {name: configs})
# ("quotas", None, {entity: values})
# ("scram", None, {user: {mechanism: credential}})  SCRAM credentials in /config/users/<u>
# ("acls", None, [AclBinding])             every ACL (after a change notification)
# ("reset", None, MetadataSnapshot)
# ("session", None, "suspended" | "lost" | "connected")
Update = tuple[str, Any, Any]

_STATE_RE = re.compile(r"^/brokers/topics/([^/]+)/partitions/(\d+)/state$")
_TOPIC_RE = re.compile(r"^/brokers/topics/([^/]+)$")
_BROKER_RE = re.compile(r"^/brokers/ids/(\d+)$")
_TOPIC_CONFIG_RE = re.compile(r"^/config/topics/([^/]+)$")
_ENTITY_TYPE_BY_PATH = {p: t for t, p in zl.CONFIG_ENTITY_PATHS.items()}
_QUOTA_ROOTS = (zl.CONFIG_USERS, zl.CONFIG_CLIENTS, zl.CONFIG_IPS)


class ZkMetadataReader:
    """The store's reads of ZooKeeper, made on its watcher thread (and once by ``start``).

    Every read re-arms its one-shot watch with ``watch``; ``watched_topics`` is the watcher thread's
    view of the topics it watches, compared with each change of ``/brokers/topics``.
    """

    def __init__(self, client: Callable[[], KazooClient], watch: Callable[[WatchedEvent], None],
                 request_timeout: float) -> None:
        self._client = client
        self._watch = watch
        self._request_timeout = request_timeout
        self.watched_topics: dict[str, zl.TopicAssignment] = {}

    @property
    def zk(self) -> KazooClient:
        return self._client()

    # --- watch events -> updates ------------------------------------------------------------------

    def process(self, batch: list[tuple[str, str]]) -> list[Update]:
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
        out: list[Update] = []
        if brokers:
            out.append(("brokers", None, self._read_brokers()))
        if controller:
            out.append(("controller", None, self._read_controller()))
        if topics_children:
            names = set(self.zk.get_children(zl.BROKER_TOPICS, watch=self._watch))
            new = sorted(names - self.watched_topics.keys())
            for name in sorted(self.watched_topics.keys() - names):
                del self.watched_topics[name]
                out.append(("gone", name, None))
            for name, data in self._read_topics(new).items():
                self.watched_topics[name] = data.assignment
                out.append(("topic", name, data))
            topic_nodes -= set(new)
        if topic_nodes:
            out.extend(self._reread_topics(sorted(n for n in topic_nodes if n in self.watched_topics), states))
            # a topic skipped before (unreadable assignment) or re-created after its deletion was seen
            unknown = sorted(n for n in topic_nodes if n not in self.watched_topics)
            for name, data in self._read_topics(unknown).items():
                self.watched_topics[name] = data.assignment
                out.append(("topic", name, data))
        if topic_configs:
            known = sorted(n for n in topic_configs if n in self.watched_topics)
            read = self._get_many([zl.topic_config_path(n) for n in known])
            for name in known:
                out.append(("tconfig", name, decode_configs(read[zl.topic_config_path(name)])))
        if states:
            wanted = [(t, p) for t, ps in sorted(states.items()) if t in self.watched_topics
                      for p in sorted(ps) if p in self.watched_topics[t].partitions]
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
            out.append(("acls", None, self.read_acls()))
        return out

    def _reread_topics(self, names: list[str], states: dict[str, set[int]]) -> list[Update]:
        """Assignment znodes that changed: gone, replaced (new topic id) or repartitioned/reassigned."""
        out: list[Update] = []
        read = self._get_many([zl.topic_path(n) for n in names])
        replaced: list[str] = []
        for name in names:
            got = read[zl.topic_path(name)]
            if got is None:
                self.watched_topics.pop(name, None)
                out.append(("gone", name, None))
                continue
            assignment = _decode_assignment(name, got)
            if assignment is None:
                continue  # unreadable (a foreign writer?): keep what we have rather than drop the topic
            old = self.watched_topics[name]
            if assignment.topic_id != old.topic_id:
                replaced.append(name)
                continue
            self.watched_topics[name] = assignment
            out.append(("assignment", name, assignment))
            added = set(assignment.partitions) - set(old.partitions)
            if added:
                states.setdefault(name, set()).update(added)
        for name, data in self._read_topics(replaced).items():
            self.watched_topics[name] = data.assignment
            out.append(("topic", name, data))
        return out

    # --- reads ----------------------------------------------------------

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

    def _read_topics(self, names: Iterable[str]) -> dict[str, TopicData]:
        names = list(names)
        if not names:
            return {}
        read = self._get_many([zl.topic_path(n) for n in names] + [zl.topic_config_path(n) for n in names])
        topics: dict[str, TopicData] = {}
        for name in names:
            assignment = _decode_assignment(name, read[zl.topic_path(name)])
            if assignment is not None:
                topics[name] = TopicData(assignment, configs=decode_configs(read[zl.topic_config_path(name)]))
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
            configs = decode_configs(read[f"{root}/{n}"])
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
            values = zl.decode_quota_values(decode_configs(read[path]))
            if entity is not None and values:
                out[tuple(sorted(entity))] = values
        return out

    def load_all(self) -> MetadataSnapshot:
        """Everything, with watches (at start and after each reconnection)."""
        zk = self.zk
        names = sorted(zk.get_children(zl.BROKER_TOPICS, watch=self._watch))
        topics = self._read_topics(names)
        self.watched_topics = {n: d.assignment for n, d in topics.items()}
        deleting = set(zk.get_children(zl.DELETE_TOPICS, watch=self._watch))
        return MetadataSnapshot(
            topics=topics, deleting=deleting, brokers=self._read_brokers(), controller=self._read_controller(),
            entities={t: self._read_entities(t) for t in ENTITY_RESOURCES}, quotas=self._read_quotas(),
            scram=self._read_scram(), acls=self.read_acls())

    def read_acls(self) -> list[AclBinding]:
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
            creds = scram_entries(decode_configs(read[path]))
            if creds:
                out[zl.desanitize(u)] = creds
        return out


def _known_resource_type(name: str) -> bool:
    try:
        resource_type_from_name(name)
    except KeyError:
        return False
    return True


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


def decode_configs(got: tuple[bytes, ZnodeStat] | None) -> dict[str, str]:
    if got is None or not got[0]:
        return {}
    try:
        return zl.decode_entity_config(got[0])
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("ignoring unreadable config %(response)r", {"response": got[0][:200]})
        return {}
