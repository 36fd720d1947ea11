"""Embedded metadata: one JSON document in the data directory, replaced atomically.

For a single broker with no ZooKeeper.  Writes are rare (admin operations) so
rewriting the whole document with write-temp, fsync, rename is simple and safe.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import json
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path

from pykbroker.logsetup import fields
from pykbroker.metadata.store import (
    ENTITY_RESOURCES,
    MetadataStorageError,
    MetadataStore,
    PartitionAssignment,
    QuotaEntity,
    TopicExists,
    TopicRecord,
    UnknownTopic,
)
from pykbroker.security.acl import AclBinding, AclBindingFilter, binding_from_json, binding_to_json
from pykbroker.security.sasl.scram import ScramCredential

log = logging.getLogger("pykbroker.metadata")

METADATA_FILE = "__pykbroker_metadata.json"
META_PROPERTIES = "meta.properties"
LOCK_FILE = ".lock"  # Kafka's name for the lock file of a log dir


class DataDirInUse(Exception):
    """Another process holds the data directory's lock: a broker runs on it."""


def lock_data_dir(data_dir: Path) -> int:
    """Lock ``<data_dir>/.lock`` for this process and return the descriptor that holds the lock (closing it
    releases it; so does the process's exit, however it ends).

    Why: the metadata file is rewritten whole, so a second broker or an offline tool (``pykbroker scram``)
    writing it beside a running broker would lose one side's changes; each is refused instead. A POSIX lock
    belongs to the process, so one process may open several stores over one directory (tests do).
    """
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            raise OSError(e.errno, f"cannot lock {data_dir / LOCK_FILE}: {e.strerror}") from None
        raise DataDirInUse(f"Failed to acquire lock on file {LOCK_FILE} in {data_dir}. A broker in another "
                           "process is using this directory.") from None
    return fd


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def random_cluster_id() -> str:
    """22-character URL-safe base64 of a random UUID, like Kafka's cluster ids."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class EmbeddedMetadataStore(MetadataStore):
    def __init__(self, data_dir: Path, broker_id: int, endpoints: list[tuple[str, str, int]]) -> None:
        super().__init__()
        self._dir = data_dir
        self._broker_id = broker_id
        self._endpoints = endpoints
        self._topics: dict[str, TopicRecord] = {}
        self._next_producer_id = 0
        self._client_quotas: dict[QuotaEntity, dict[str, float]] = {}
        self._scram: dict[str, dict[str, str]] = {}  # user -> mechanism -> Kafka credential string
        self._acls: list[AclBinding] = []  # in creation order, no duplicates
        # resource type -> entity name -> dynamic configs (brokers, client metrics, groups)
        self._entity_configs: dict[int, dict[str, dict[str, str]]] = {t: {} for t in ENTITY_RESOURCES}
        self.cluster_id = ""
        # Told when the store's files cannot be written (dir, reason): the broker takes the dir offline.
        self.on_storage_failure: Callable[[Path, str], object] | None = None
        self._lock_fd: int | None = None

    @classmethod
    def offline(cls, data_dir: Path) -> EmbeddedMetadataStore:
        """The metadata of a stopped broker's data directory, for offline tools (``pykbroker scram``); raises
        DataDirInUse while a broker runs on it. meta.properties is left to the broker's first start. Call
        close() to release the lock."""
        store = cls(data_dir, -1, [])
        data_dir.mkdir(parents=True, exist_ok=True)
        store._lock_fd = lock_data_dir(data_dir)
        try:
            store._load_document()
        except BaseException:
            store.close()
            raise
        return store

    @property
    def path(self) -> Path:
        return self._dir / METADATA_FILE

    def start(self) -> None:
        """Raises DataDirInUse when another process (a broker, ``pykbroker scram``) holds the directory."""
        self._dir.mkdir(parents=True, exist_ok=True)
        if self._lock_fd is None:
            self._lock_fd = lock_data_dir(self._dir)
        self._load_meta_properties()
        self._load_document()
        log.debug("metadata loaded", extra=fields(cluster_id=self.cluster_id, topics=len(self._topics)))

    def _load_document(self) -> None:
        if self.path.exists():
            doc = json.loads(self.path.read_text())
            self._topics = {t["name"]: TopicRecord.from_json(t) for t in doc.get("topics", [])}
            self._next_producer_id = int(doc.get("next_producer_id", 0))
            for rtype, entities in (doc.get("entity_configs") or {}).items():
                if int(rtype) in self._entity_configs:
                    self._entity_configs[int(rtype)] = {
                        str(n): {str(k): str(v) for k, v in c.items()} for n, c in entities.items() if c}
            self._client_quotas = _quotas_from_json(doc.get("client_quotas", []))
            self._scram = {str(u): {str(m): str(c) for m, c in creds.items()}
                           for u, creds in (doc.get("scram_credentials") or {}).items() if creds}
            self._acls = [binding_from_json(a) for a in doc.get("acls") or []]

    def _load_meta_properties(self) -> None:
        path = self._dir / META_PROPERTIES
        if path.exists():
            props = dict(
                line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and line[0] != "#"
            )
            self.cluster_id = props.get("cluster.id", "")
            stored_id = int(props.get("broker.id", self._broker_id))
            if stored_id != self._broker_id:
                raise RuntimeError(
                    f"broker.id {self._broker_id} does not match {stored_id} stored in {path}; "
                    "the data directory belongs to another broker"
                )
        if not self.cluster_id:
            self.cluster_id = random_cluster_id()
            text = f"version=0\ncluster.id={self.cluster_id}\nbroker.id={self._broker_id}\n"
            write_atomically(path, text.encode())

    def _persist(self) -> None:
        doc = {
            "version": 1,
            "topics": [t.to_json() for t in self._topics.values()],
            "next_producer_id": self._next_producer_id,
            "client_quotas": _quotas_to_json(self._client_quotas),
            "scram_credentials": self._scram,
            "acls": [binding_to_json(a) for a in self._acls],
            "entity_configs": {str(t): e for t, e in self._entity_configs.items() if e},
        }
        try:
            write_atomically(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())
        except OSError as e:  # the data dir is gone or broken: a log-dir failure, not a request's bug
            reason = f"writing the metadata store {self.path} failed: {e}"
            if self.on_storage_failure is not None:
                self.on_storage_failure(self._dir, reason)
            else:
                log.error("%(reason)s", {"reason": reason})
            raise MetadataStorageError(reason) from e

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def live_brokers(self) -> dict[int, list[tuple[str, str, int]]]:
        return {self._broker_id: self._endpoints}

    def controller_id(self) -> int:
        return self._broker_id

    def topics(self) -> dict[str, TopicRecord]:
        return self._topics

    def create_topic(self, record: TopicRecord) -> None:
        if record.name in self._topics:
            raise TopicExists(record.name)
        for a in record.partitions.values():
            a.leader = self._broker_id
            a.isr = [self._broker_id]
        self._topics[record.name] = record
        self._persist()
        self._notify(record.name, record)

    def delete_topic(self, name: str) -> TopicRecord:
        rec = self._topics.pop(name, None)
        if rec is None:
            raise UnknownTopic(name)
        self._persist()
        self._notify(name, None)
        return rec

    def add_partitions(self, name: str, new: dict[int, PartitionAssignment]) -> TopicRecord:
        rec = self._topics.get(name)
        if rec is None:
            raise UnknownTopic(name)
        for p, a in new.items():
            a.leader = self._broker_id
            a.isr = [self._broker_id]
            rec.partitions[p] = a
        self._persist()
        self._notify(name, rec)
        return rec

    def set_topic_configs(self, name: str, configs: dict[str, str]) -> TopicRecord:
        rec = self._topics.get(name)
        if rec is None:
            raise UnknownTopic(name)
        rec.configs = dict(configs)
        self._persist()
        self._notify(name, rec)
        return rec

    def client_quotas(self) -> dict[QuotaEntity, dict[str, float]]:
        return self._client_quotas

    def alter_client_quotas(self, changes: dict[QuotaEntity, dict[str, float | None]]) -> None:
        for entity, ops in changes.items():
            values = dict(self._client_quotas.get(entity, {}))
            for key, value in ops.items():
                if value is None:
                    values.pop(key, None)
                else:
                    values[key] = value
            if values:
                self._client_quotas[entity] = values
            else:
                self._client_quotas.pop(entity, None)
        self._persist()

    def entity_configs(self, resource_type: int) -> dict[str, dict[str, str]]:
        return self._entity_configs.get(resource_type, {})

    def set_entity_configs(self, resource_type: int, name: str, configs: dict[str, str]) -> None:
        if resource_type not in self._entity_configs:
            raise ValueError(f"resource type {resource_type} has no dynamic configs")
        entities = self._entity_configs[resource_type]
        if configs:
            entities[name] = dict(configs)
        else:
            entities.pop(name, None)
        self._persist()
        self._notify_config(resource_type, name)

    def scram_users(self) -> dict[str, dict[str, str]]:
        return self._scram

    def alter_scram_credentials(self, upserts: dict[tuple[str, str], ScramCredential],
                                deletions: list[tuple[str, str]]) -> None:
        for user, mech in deletions:
            creds = self._scram.get(user, {})
            creds.pop(mech, None)
            if not creds:
                self._scram.pop(user, None)
        for (user, mech), cred in upserts.items():
            self._scram.setdefault(user, {})[mech] = cred.to_kafka_string()
        self._persist()

    supports_acls = True

    def acls(self) -> list[AclBinding]:
        return list(self._acls)

    def create_acls(self, bindings: list[AclBinding]) -> None:
        known = set(self._acls)
        for b in bindings:
            if b not in known:
                known.add(b)
                self._acls.append(b)
        self._persist()
        self._notify_acls()

    def delete_acls(self, filters: list[AclBindingFilter]) -> list[list[AclBinding]]:
        matched = [[b for b in self._acls if f.matches(b)] for f in filters]
        gone = {b for m in matched for b in m}
        if gone:
            self._acls = [b for b in self._acls if b not in gone]
            self._persist()
            self._notify_acls()
        return matched

    def allocate_producer_ids(self, count: int) -> int:
        first = self._next_producer_id
        self._next_producer_id += count
        self._persist()
        return first


def _quotas_to_json(quotas: dict[QuotaEntity, dict[str, float]]) -> list[dict[str, object]]:
    return [{"entity": [list(part) for part in entity], "values": dict(sorted(values.items()))}
            for entity, values in sorted(quotas.items(), key=lambda kv: repr(kv[0]))]


def _quotas_from_json(doc: list[dict[str, object]]) -> dict[QuotaEntity, dict[str, float]]:
    out: dict[QuotaEntity, dict[str, float]] = {}
    for item in doc:
        parts = item["entity"]
        values = item["values"]
        assert isinstance(parts, list) and isinstance(values, dict)
        entity = tuple(sorted((str(t), None if n is None else str(n)) for t, n in parts))
        out[entity] = {str(k): float(v) for k, v in values.items()}
    return out
