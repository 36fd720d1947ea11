"""Kafka's ZooKeeper layout: the paths and the JSON of each znode, with no I/O.

The same znodes and JSON shapes as Kafka's ZooKeeper mode (KafkaZkClient / ZkData), so
that an operator's zkCli habits carry over. pykbroker's own additions live under
``/pykbroker`` and are named as such.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

CLUSTER_ID = "/cluster/id"
BROKER_IDS = "/brokers/ids"
BROKER_TOPICS = "/brokers/topics"
BROKER_SEQID = "/brokers/seqid"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
CONFIG = "/config"
CONFIG_TOPICS = "/config/topics"
CONFIG_CHANGES = "/config/changes"
ADMIN = "/admin"
DELETE_TOPICS = "/admin/delete_topics"
REASSIGN_PARTITIONS = "/admin/reassign_partitions"
PREFERRED_REPLICA_ELECTION = "/admin/preferred_replica_election"
ISR_CHANGE_NOTIFICATION = "/isr_change_notification"
LOG_DIR_EVENT_NOTIFICATION = "/log_dir_event_notification"
LATEST_PRODUCER_ID_BLOCK = "/latest_producer_id_block"
# pykbroker's own: a broker asks the controller to move its leaderships away (ZooKeeper-mode
# Kafka does this with the ControlledShutdown request; here it is an ephemeral znode).
PYKB = "/pykbroker"
CONTROLLED_SHUTDOWN = "/pykbroker/controlled_shutdown"
# pykbroker's own: ElectLeaders requests for the controller (sequential election_<seq> znodes).
ELECTIONS = "/pykbroker/elections"
# /pykbroker/confirmed_brokers/<id>: the registration (broker epoch: its znode's czxid) the controller has
# taken into account for the controller epoch it names. A starting broker takes no partition role before it
# finds its own registration here: the controller first moved what the broker's previous run led.
CONFIRMED_BROKERS = "/pykbroker/confirmed_brokers"
ELECTION_PREFIX = "/pykbroker/elections/election_"
ISR_CHANGE_PREFIX = "/isr_change_notification/isr_change_"
CONFIG_CHANGE_PREFIX = "/config/changes/config_change_"

# ACLs (Kafka's ZooKeeper-era authorizer): literal ACLs in /kafka-acl/<ResourceType>/<name>, prefixed ones in
# /kafka-acl-extended/prefixed/<ResourceType>/<name>, each {"version":1,"acls":[...]}; a write adds a
# sequential change notification (literal: "Topic:name"; prefixed: JSON) that every broker watches.
ACL_LITERAL = "/kafka-acl"
ACL_PREFIXED = "/kafka-acl-extended/prefixed"
ACL_LITERAL_CHANGES = "/kafka-acl-changes"
ACL_PREFIXED_CHANGES = "/kafka-acl-extended-changes"
ACL_CHANGE_NODE = "acl_changes_"

# Created at first start of a cluster (Kafka's persistent paths plus ours).
PERSISTENT_PATHS = (
    BROKER_IDS, BROKER_TOPICS, BROKER_SEQID, CONFIG_CHANGES, CONFIG_TOPICS, "/config/brokers",
    "/config/users", "/config/clients", "/config/ips", "/config/client-metrics", "/config/groups",
    DELETE_TOPICS, ISR_CHANGE_NOTIFICATION, LOG_DIR_EVENT_NOTIFICATION, CONTROLLED_SHUTDOWN, ELECTIONS,
    CONFIRMED_BROKERS,
    ACL_LITERAL, ACL_PREFIXED, ACL_LITERAL_CHANGES, ACL_PREFIXED_CHANGES,
)


def acl_root(prefixed: bool) -> str:
    return ACL_PREFIXED if prefixed else ACL_LITERAL


def acl_resource_path(prefixed: bool, resource_type: str, name: str) -> str:
    """``resource_type`` is Kafka's directory name (``Topic``, ``Group``, ``TransactionalId``...)."""
    return f"{acl_root(prefixed)}/{resource_type}/{name}"


def encode_acl_entries(entries: list[dict[str, str]]) -> bytes:
    return json.dumps({"version": 1, "acls": entries}, separators=(",", ":")).encode()


def decode_acl_entries(data: bytes) -> list[dict[str, str]]:
    """The entries of an ACL znode; [] for an empty or unreadable one."""
    try:
        doc = json.loads(data.decode()) if data else {}
    except (UnicodeDecodeError, ValueError):
        return []
    acls = doc.get("acls") if isinstance(doc, dict) else None
    return [a for a in acls if isinstance(a, dict)] if isinstance(acls, list) else []


def encode_acl_change(prefixed: bool, resource_type: str, name: str) -> bytes:
    """The notification's data, as Kafka's literal and extended change stores write it."""
    if not prefixed:
        return f"{resource_type}:{name}".encode()
    return json.dumps({"version": 1, "resourceType": resource_type, "name": name, "patternType": "Prefixed"},
                      separators=(",", ":")).encode()

# ConfigResource types -> /config/<entity type>
CONFIG_ENTITY_PATHS = {4: "/config/brokers", 16: "/config/client-metrics", 32: "/config/groups"}
DEFAULT_BROKER_ENTITY = "<default>"  # /config/brokers/<default> holds the cluster-wide defaults
DEFAULT_ENTITY = "<default>"  # Kafka's ConfigEntityName.Default, for brokers and quota entities alike
# Client quota entities: /config/users/<u>, /config/clients/<c>, /config/users/<u>/clients/<c>, /config/ips/<ip>
CONFIG_USERS = "/config/users"
CONFIG_CLIENTS = "/config/clients"
CONFIG_IPS = "/config/ips"


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS}/{broker_id}"


def topic_path(topic: str) -> str:
    return f"{BROKER_TOPICS}/{topic}"


def partitions_path(topic: str) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions/{partition}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions/{partition}/state"


def topic_config_path(topic: str) -> str:
    return f"{CONFIG_TOPICS}/{topic}"


def delete_topic_path(topic: str) -> str:
    return f"{DELETE_TOPICS}/{topic}"


def controlled_shutdown_path(broker_id: int) -> str:
    return f"{CONTROLLED_SHUTDOWN}/{broker_id}"


def confirmed_broker_path(broker_id: int) -> str:
    return f"{CONFIRMED_BROKERS}/{broker_id}"


def encode_confirmation(broker_epoch: int, controller_epoch: int) -> bytes:
    return json.dumps({"version": 1, "broker_epoch": broker_epoch, "controller_epoch": controller_epoch},
                      separators=(",", ":")).encode()


def decode_confirmation(data: bytes) -> int:
    """The broker epoch a confirmation names; -1 for an unreadable one."""
    try:
        doc = json.loads(data.decode()) if data else {}
        return int(doc["broker_epoch"]) if isinstance(doc, dict) else -1
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        return -1


def entity_config_path(resource_type: int, name: str) -> str:
    """/config/brokers/<id>, /config/brokers/<default> (name ""), /config/client-metrics/<n>, /config/groups/<g>."""
    return f"{CONFIG_ENTITY_PATHS[resource_type]}/{name or DEFAULT_BROKER_ENTITY}"


# --- entity names in /config paths (Kafka's Sanitizer) -------------------------------------------

def sanitize(name: str) -> str:
    """Kafka's Sanitizer.sanitize: URL-encode (UTF-8), with '*' and ' ' percent-encoded too.

    Java's URLEncoder leaves letters, digits and ``.-*_`` alone; Kafka then turns ``*`` into
    ``%2A`` and the ``+`` for a space into ``%20``, so only letters, digits and ``.-_`` stay as is.
    """
    return quote(name, safe="").replace("~", "%7E")


def desanitize(name: str) -> str:
    return unquote(name)


QuotaParts = tuple[tuple[str, "str | None"], ...]


def quota_entity_path(entity: QuotaParts) -> str:
    """The znode of a client quota entity ((type, name or None for the default), ...) as Kafka lays it out."""
    parts = dict(entity)

    def name(kind: str) -> str:
        value = parts[kind]
        return DEFAULT_ENTITY if value is None else sanitize(value)

    if set(parts) == {"user", "client-id"}:
        return f"{CONFIG_USERS}/{name('user')}/clients/{name('client-id')}"
    if set(parts) == {"user"}:
        return f"{CONFIG_USERS}/{name('user')}"
    if set(parts) == {"client-id"}:
        return f"{CONFIG_CLIENTS}/{name('client-id')}"
    if set(parts) == {"ip"}:
        ip = parts["ip"]
        return f"{CONFIG_IPS}/{DEFAULT_ENTITY if ip is None else ip}"
    raise ValueError(f"no ZooKeeper path for quota entity {entity!r}")


def quota_entity_from_path(path: str) -> QuotaParts | None:
    """The inverse of quota_entity_path (None for a path that is not a quota entity)."""
    def name(raw: str) -> str | None:
        return None if raw == DEFAULT_ENTITY else desanitize(raw)

    parts = path.strip("/").split("/")
    if len(parts) == 3 and parts[:2] == ["config", "users"]:
        return (("user", name(parts[2])),)
    if len(parts) == 5 and parts[:2] == ["config", "users"] and parts[3] == "clients":
        return (("client-id", name(parts[4])), ("user", name(parts[2])))
    if len(parts) == 3 and parts[:2] == ["config", "clients"]:
        return (("client-id", name(parts[2])),)
    if len(parts) == 3 and parts[:2] == ["config", "ips"]:
        return (("ip", None if parts[2] == DEFAULT_ENTITY else parts[2]),)
    return None


def config_change_entity(path: str) -> str:
    """The entity_path of a /config/changes notification: the znode path below /config."""
    return path[len(CONFIG) + 1:] if path.startswith(CONFIG + "/") else path.lstrip("/")


def parse_connect(connect: str) -> tuple[str, str]:
    """``h1:p1,h2:p2/chroot/path`` -> ("h1:p1,h2:p2", "/chroot/path") (chroot "" when none)."""
    connect = connect.strip()
    slash = connect.find("/")
    if slash < 0:
        return connect, ""
    hosts, chroot = connect[:slash], connect[slash:].rstrip("/")
    return hosts, chroot


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _loads(data: bytes) -> Any:
    return json.loads(data.decode()) if data else None


def _now_ms() -> str:
    return str(int(time.time() * 1000))


# --- Kafka's Uuid text form: URL-safe base64 without padding ------------------------------------

def uuid_to_kafka(u: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(u.bytes).decode().rstrip("=")


def uuid_from_kafka(text: str) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


# --- /cluster/id ----------------------------------------------------------------------------------

def encode_cluster_id(cluster_id: str) -> bytes:
    return _dumps({"version": "1", "id": cluster_id})


def decode_cluster_id(data: bytes) -> str:
    return str(_loads(data)["id"])


# --- /brokers/ids/<id> ----------------------------------------------------------------------------

@dataclass(frozen=True)
class BrokerRegistration:
    broker_id: int
    endpoints: tuple[tuple[str, str, int], ...]  # (listener name, host, port)
    security_protocols: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    rack: str | None = None
    # pykbroker's schema registry URL of this broker (a field Kafka's brokers ignore), None when it has none.
    schema_registry_url: str | None = None


SCHEMA_REGISTRY_FIELD = "pykbroker_schema_registry_url"


def encode_broker(reg: BrokerRegistration) -> bytes:
    first = reg.endpoints[0] if reg.endpoints else ("PLAINTEXT", "", -1)
    doc: dict[str, Any] = {
        "features": {},
        "listener_security_protocol_map": reg.security_protocols or {n: n for n, _, _ in reg.endpoints},
        "endpoints": [f"{n}://{h}:{p}" for n, h, p in reg.endpoints],
        "jmx_port": -1, "host": first[1], "port": first[2], "timestamp": _now_ms(), "version": 5,
    }
    if reg.rack is not None:
        doc["rack"] = reg.rack
    if reg.schema_registry_url is not None:
        doc[SCHEMA_REGISTRY_FIELD] = reg.schema_registry_url
    return _dumps(doc)


def decode_broker(broker_id: int, data: bytes) -> BrokerRegistration:
    doc = _loads(data)
    endpoints = []
    for ep in doc.get("endpoints", []):
        name, _, rest = ep.partition("://")
        host, _, port = rest.rpartition(":")
        endpoints.append((name, host.strip("[]"), int(port)))
    return BrokerRegistration(broker_id, tuple(endpoints), dict(doc.get("listener_security_protocol_map") or {}),
                              doc.get("rack"), _str_or_none(doc.get(SCHEMA_REGISTRY_FIELD)))


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


# --- /controller and /controller_epoch ------------------------------------------------------------

def encode_controller(broker_id: int) -> bytes:
    return _dumps({"version": 2, "brokerid": broker_id, "timestamp": _now_ms(), "kraftControllerEpoch": -1})


def decode_controller(data: bytes) -> int:
    doc = _loads(data)
    return int(doc["brokerid"]) if isinstance(doc, dict) else int(doc)


def encode_controller_epoch(epoch: int) -> bytes:
    return str(epoch).encode()


def decode_controller_epoch(data: bytes) -> int:
    return int(data.decode())


# --- /brokers/topics/<t> --------------------------------------------------------------------------

@dataclass
class TopicAssignment:
    topic_id: uuid.UUID
    partitions: dict[int, list[int]]
    adding_replicas: dict[int, list[int]] = field(default_factory=dict)
    removing_replicas: dict[int, list[int]] = field(default_factory=dict)


def encode_topic_assignment(a: TopicAssignment) -> bytes:
    return _dumps({
        "version": 3, "topic_id": uuid_to_kafka(a.topic_id),
        "partitions": {str(p): r for p, r in sorted(a.partitions.items())},
        "adding_replicas": {str(p): r for p, r in sorted(a.adding_replicas.items())},
        "removing_replicas": {str(p): r for p, r in sorted(a.removing_replicas.items())},
    })


def decode_topic_assignment(data: bytes) -> TopicAssignment:
    doc = _loads(data)
    tid = doc.get("topic_id")
    return TopicAssignment(
        topic_id=uuid_from_kafka(tid) if tid else uuid.UUID(int=0),
        partitions={int(p): [int(b) for b in r] for p, r in doc.get("partitions", {}).items()},
        adding_replicas={int(p): [int(b) for b in r] for p, r in (doc.get("adding_replicas") or {}).items()},
        removing_replicas={int(p): [int(b) for b in r] for p, r in (doc.get("removing_replicas") or {}).items()},
    )


# --- /brokers/topics/<t>/partitions/<p>/state -----------------------------------------------------

@dataclass
class PartitionState:
    leader: int
    leader_epoch: int
    isr: list[int]
    controller_epoch: int
    leader_recovery_state: int = 0
    zk_version: int = -1  # the znode's version when read; -1 when not read from ZooKeeper


def encode_partition_state(s: PartitionState) -> bytes:
    doc: dict[str, Any] = {"controller_epoch": s.controller_epoch, "leader": s.leader,
                           "version": 1, "leader_epoch": s.leader_epoch, "isr": list(s.isr)}
    if s.leader_recovery_state:
        doc["version"] = 2
        doc["leader_recovery_state"] = s.leader_recovery_state
    return _dumps(doc)


def decode_partition_state(data: bytes, zk_version: int = -1) -> PartitionState:
    doc = _loads(data)
    return PartitionState(int(doc["leader"]), int(doc["leader_epoch"]), [int(b) for b in doc["isr"]],
                          int(doc["controller_epoch"]), int(doc.get("leader_recovery_state", 0)), zk_version)


# --- /config/<entity type>/<name> -----------------------------------------------------------------

def encode_entity_config(configs: dict[str, str]) -> bytes:
    return _dumps({"version": 1, "config": dict(sorted(configs.items()))})


def decode_entity_config(data: bytes) -> dict[str, str]:
    doc = _loads(data)
    return {str(k): str(v) for k, v in ((doc or {}).get("config") or {}).items()}


def encode_config_change(entity_path: str) -> bytes:
    return _dumps({"version": 2, "entity_path": entity_path})


# --- /latest_producer_id_block --------------------------------------------------------------------

PRODUCER_ID_BLOCK_SIZE = 1000


def encode_producer_id_block(broker_id: int, start: int, end: int) -> bytes:
    return _dumps({"version": 1, "broker": broker_id, "block_start": str(start), "block_end": str(end)})


def decode_producer_id_block(data: bytes) -> tuple[int, int]:
    doc = _loads(data)
    return int(doc["block_start"]), int(doc["block_end"])


# --- /admin/reassign_partitions, /admin/preferred_replica_election, /isr_change_notification -----

def encode_reassignment(moves: dict[tuple[str, int], list[int]]) -> bytes:
    return _dumps({"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": r} for (t, p), r in sorted(moves.items())]})


def decode_reassignment(data: bytes) -> dict[tuple[str, int], list[int]]:
    doc = _loads(data) or {}
    return {(str(e["topic"]), int(e["partition"])): [int(b) for b in e["replicas"]]
            for e in doc.get("partitions", [])}


def encode_partition_list(partitions: list[tuple[str, int]]) -> bytes:
    return _dumps({"version": 1, "partitions": [{"topic": t, "partition": p} for t, p in partitions]})


def decode_partition_list(data: bytes) -> list[tuple[str, int]]:
    doc = _loads(data) or {}
    return [(str(e["topic"]), int(e["partition"])) for e in doc.get("partitions", [])]


# --- /pykbroker/elections/election_<seq> (ElectLeaders for the controller) -------------------------

PREFERRED_ELECTION = 0
UNCLEAN_ELECTION = 1


def encode_election_request(partitions: list[tuple[str, int]], election_type: int) -> bytes:
    return _dumps({"version": 1, "election_type": election_type,
                   "partitions": [{"topic": t, "partition": p} for t, p in partitions]})


def decode_election_request(data: bytes) -> tuple[int, list[tuple[str, int]]]:
    doc = _loads(data) or {}
    return int(doc.get("election_type", 0)), [(str(e["topic"]), int(e["partition"]))
                                               for e in doc.get("partitions", [])]


# --- client quota values (stored as strings, as Kafka's ZooKeeper admin writes them) -------------

# Kafka stores LONG/INT quota keys as whole numbers and DOUBLE keys as Java's Double.toString.
_WHOLE_QUOTA_KEYS = frozenset({"producer_byte_rate", "consumer_byte_rate", "connection_creation_rate"})


def encode_quota_value(key: str, value: float) -> str:
    if key in _WHOLE_QUOTA_KEYS:
        return str(int(value + 1e-6))
    return repr(float(value))


def decode_quota_values(configs: dict[str, str]) -> dict[str, float]:
    """The numeric quota entries of an entity's config (SCRAM credentials and the like are skipped)."""
    out: dict[str, float] = {}
    for k, v in configs.items():
        try:
            out[k] = float(v)
        except ValueError:
            continue
    return out


# --- KIP-455 reassignment in the assignment znode ------------------------------------------------

def reassign_partition(assignment: TopicAssignment, p: int, target: list[int] | None) -> None:
    """Apply one KIP-455 move (or cancellation, target None) to an assignment, in place."""
    current = assignment.partitions[p]
    adding = assignment.adding_replicas.get(p, [])
    original = [b for b in current if b not in adding]
    if target is None:
        assignment.partitions[p] = original
        assignment.adding_replicas.pop(p, None)
        assignment.removing_replicas.pop(p, None)
        return
    target = list(dict.fromkeys(target))
    assignment.partitions[p] = target + [b for b in original if b not in target]
    add = [b for b in target if b not in original]
    remove = [b for b in original if b not in target]
    if add:
        assignment.adding_replicas[p] = add
    else:
        assignment.adding_replicas.pop(p, None)
    if remove:
        assignment.removing_replicas[p] = remove
    else:
        assignment.removing_replicas.pop(p, None)
