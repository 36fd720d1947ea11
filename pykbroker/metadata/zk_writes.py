"""The ZooKeeper metadata store's writes, znode by znode (Kafka's KafkaZkClient and AdminZkClient).

Read-modify-writes conditional on the znode version and multis carrying their change
notification (``/config/changes``, the ACL change parents, ``/isr_change_notification``), retried a
bounded number of times when they lose a race; and the purge of old notifications that nothing
else would remove.  Blocking calls, made from worker threads; the caller turns ZooKeeper being
unreachable into StoreUnavailable and updates its caches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError, NotEmptyError

from pykbroker.metadata import zk_layout as zl
from pykbroker.metadata.store import (
    PartitionAssignment,
    StaleState,
    StoreUnavailable,
    TopicExists,
    TopicRecord,
    UnknownTopic,
)
from pykbroker.metadata.zk_client import UNAVAILABLE, WRITE_RETRIES, commit
from pykbroker.metadata.zk_layout import reassign_partition
from pykbroker.security.acl import PatternType, ResourcePattern, resource_type_name

__all__ = [
    "AclEdit",
    "add_partition_assignments",
    "allocate_producer_id_block",
    "create_topic_znodes",
    "ensure_quota_parents",
    "purge_acl_changes",
    "purge_config_changes",
    "read_assignment",
    "write_acls",
    "write_entity_configs",
    "write_reassignments",
    "write_topic_configs",
]

log = logging.getLogger("pykbroker.metadata.zookeeper")  # the store's lines, wherever its code lives

# Config change notifications: Kafka's brokers delete them after 15 minutes.
_CONFIG_CHANGE_EXPIRY_S = 15 * 60
_KEEP_CONFIG_CHANGES = 20
_PURGE_BATCH = 500

# A resource's ACL entries as read -> as they are to be written.
AclEdit = Callable[[list[dict[str, str]], ResourcePattern], list[dict[str, str]]]


def read_assignment(zk: KazooClient, name: str) -> tuple[zl.TopicAssignment, int]:
    try:
        data, stat = zk.get(zl.topic_path(name))
    except NoNodeError:
        raise UnknownTopic(name) from None
    return zl.decode_topic_assignment(data), stat.version


def _config_node_op(zk: KazooClient, tx: Any, path: str, configs: dict[str, str]) -> None:
    """Add to a multi: write an entity config znode (create it when missing)."""
    if zk.exists(path) is None:
        tx.create(path, zl.encode_entity_config(configs))
    else:
        tx.set_data(path, zl.encode_entity_config(configs))


def create_topic_znodes(zk: KazooClient, record: TopicRecord, assignment: zl.TopicAssignment, timeout: float) -> None:
    """The assignment znode and the topic config in one multi; TopicExists when either is there."""
    name = record.name
    if zk.exists(zl.delete_topic_path(name)) is not None:
        raise TopicExists(f"Topic '{name}' is marked for deletion.")
    tx = zk.transaction()
    _config_node_op(zk, tx, zl.topic_config_path(name), record.configs)
    tx.create(zl.topic_path(name), zl.encode_topic_assignment(assignment))
    try:
        commit(tx, timeout)
    except NodeExistsError:
        raise TopicExists(name) from None
    except NoNodeError:  # /config/topics/<t> vanished between exists() and the multi
        raise TopicExists(name) from None


def add_partition_assignments(zk: KazooClient, name: str, new: dict[int, PartitionAssignment]) -> zl.TopicAssignment:
    """Rewrite the assignment znode, conditional on its version. StaleState if a partition exists."""
    for _ in range(WRITE_RETRIES):
        assignment, version = read_assignment(zk, name)
        clash = sorted(set(new) & set(assignment.partitions))
        if clash:
            raise StaleState(f"topic {name} already has partitions {clash}")
        for p, a in new.items():
            assignment.partitions[p] = list(a.replicas)
        try:
            zk.set(zl.topic_path(name), zl.encode_topic_assignment(assignment), version=version)
        except BadVersionError:
            continue
        break
    else:
        raise StoreUnavailable(f"the assignment of {name} kept changing; partitions not added")
    return assignment


def write_topic_configs(zk: KazooClient, name: str, configs: dict[str, str], timeout: float) -> None:
    """/config/topics/<t> and its change notification, in one multi checking that the topic exists."""
    path = zl.topic_config_path(name)
    tx = zk.transaction()
    tx.check(zl.topic_path(name), -1)  # the topic exists
    _config_node_op(zk, tx, path, configs)
    tx.create(zl.CONFIG_CHANGE_PREFIX, zl.encode_config_change(zl.config_change_entity(path)),
              sequence=True)
    try:
        commit(tx, timeout)
    except NoNodeError:
        raise UnknownTopic(name) from None


def write_entity_configs(zk: KazooClient, path: str, configs: dict[str, str], timeout: float) -> bool:
    """An entity config znode (empty configs remove it) and its change notification, in one multi;
    False when it kept losing races."""
    for _ in range(WRITE_RETRIES):
        tx = zk.transaction()
        exists = zk.exists(path) is not None
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
            commit(tx, timeout)
        except (NodeExistsError, NoNodeError, NotEmptyError):
            continue
        return True
    return False


def ensure_quota_parents(zk: KazooClient, path: str) -> None:
    """/config/users/<u>/clients/<c> needs /config/users/<u> (an empty config) and .../clients."""
    parts = path.split("/")
    if len(parts) != 6:  # "", config, users, <u>, clients, <c>
        return
    user = "/".join(parts[:4])
    for p, data in ((user, zl.encode_entity_config({})), (user + "/clients", b"")):
        try:
            zk.create(p, data)
        except NodeExistsError:
            pass


def write_acls(zk: KazooClient, patterns: list[ResourcePattern], edit: AclEdit,
               timeout: float) -> dict[ResourcePattern, list[dict[str, str]]] | None:
    """Each resource's ACL znode as ``edit`` makes it (version-checked; deleted when left empty) with a
    change notification per resource, in one multi; the entries written per resource, or None when it
    kept losing races."""
    for _ in range(WRITE_RETRIES):
        tx = zk.transaction()
        written: dict[ResourcePattern, list[dict[str, str]]] = {}  # each resource's entries now
        for pattern in patterns:
            prefixed = pattern.pattern_type == PatternType.PREFIXED
            rtype = resource_type_name(pattern.resource_type)
            parent = f"{zl.acl_root(prefixed)}/{rtype}"
            path = zl.acl_resource_path(prefixed, rtype, pattern.name)
            zk.ensure_path(parent)
            try:
                data, stat = zk.get(path)
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
            commit(tx, timeout)
        except (BadVersionError, NodeExistsError, NoNodeError):
            continue
        return written
    return None


def purge_acl_changes(zk: KazooClient) -> None:
    """Keep the newest ACL change notifications only: brokers re-read every ACL on any notification."""
    try:
        for root in (zl.ACL_LITERAL_CHANGES, zl.ACL_PREFIXED_CHANGES):
            children = sorted(zk.get_children(root))
            for c in children[:-_KEEP_CONFIG_CHANGES][:_PURGE_BATCH]:
                zk.delete_async(f"{root}/{c}")
    except (KazooException, *UNAVAILABLE):
        log.debug("purging old ACL change notifications failed", exc_info=True)


def purge_config_changes(zk: KazooClient, timeout: float) -> None:
    """Delete /config/changes notifications older than 15 minutes, as Kafka's brokers do.

    pykbroker's brokers watch the config znodes themselves, so nothing else would ever remove
    the notifications it writes for Kafka's tools. Best effort, bounded per call.
    """
    try:
        children = sorted(zk.get_children(zl.CONFIG_CHANGES))
        if len(children) <= _KEEP_CONFIG_CHANGES:
            return
        oldest = children[:-_KEEP_CONFIG_CHANGES][:_PURGE_BATCH]
        stats = [(c, zk.exists_async(f"{zl.CONFIG_CHANGES}/{c}")) for c in oldest]
        cutoff_ms = (time.time() - _CONFIG_CHANGE_EXPIRY_S) * 1000
        for c, ar in stats:
            stat = ar.get(timeout=timeout)
            if stat is None:
                continue
            if stat.ctime >= cutoff_ms:
                break  # sequence order is age order: the rest are younger
            zk.delete_async(f"{zl.CONFIG_CHANGES}/{c}")
    except (KazooException, *UNAVAILABLE):
        log.debug("purging old config change notifications failed", exc_info=True)


def allocate_producer_id_block(zk: KazooClient, broker_id: int, count: int) -> int:
    """The first id of a block of ``count`` from /latest_producer_id_block (conditional update, bounded retry)."""
    path = zl.LATEST_PRODUCER_ID_BLOCK
    for _ in range(WRITE_RETRIES * 5):
        try:
            data, stat = zk.get(path)
        except NoNodeError:
            data, stat = b"", None
        if data:
            _, end = zl.decode_producer_id_block(data)
            start = end + 1
        else:
            start = 0
        if start + count - 1 > 2**63 - 1:
            raise StoreUnavailable("producer ids are exhausted")
        block = zl.encode_producer_id_block(broker_id, start, start + count - 1)
        try:
            if stat is None:
                zk.create(path, block)
            else:
                zk.set(path, block, version=stat.version)
        except (BadVersionError, NodeExistsError):
            continue
        return start
    raise StoreUnavailable("could not allocate a producer id block: too much contention")


def write_reassignments(zk: KazooClient, by_topic: dict[str, dict[int, list[int] | None]]) -> None:
    """KIP-455 reassignments into each topic's assignment znode (None cancels one), version-checked."""
    for topic, parts in sorted(by_topic.items()):
        for _ in range(WRITE_RETRIES):
            assignment, version = read_assignment(zk, topic)
            for p, target in parts.items():
                if p not in assignment.partitions:
                    raise UnknownTopic(f"{topic}-{p}")
                reassign_partition(assignment, p, target)
            try:
                zk.set(zl.topic_path(topic), zl.encode_topic_assignment(assignment), version=version)
            except BadVersionError:
                continue
            break
        else:
            raise StoreUnavailable(f"the assignment of {topic} kept changing; reassignment not written")
