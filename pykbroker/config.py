"""Broker configuration: Kafka's ``server.properties`` names, types and defaults.

Users bring their Kafka habits and files, so the keys are Kafka's own.  A key
we do not know, or a value that does not parse, stops the broker at start with
a message naming the key: a typo silently ignored is a production incident
waiting to happen.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pykbroker.hints import NOT_IMPLEMENTED_HINT
from pykbroker.logsetup import fields, parse_levels
from pykbroker.security.acl_authorizer import AUTHORIZER_CLASS_NAMES, parse_super_users
from pykbroker.security.sasl.settings import check_config as check_sasl
from pykbroker.storage.log_config import LogConfig

log = logging.getLogger("pykbroker.config")

ENV_PREFIX = "PYKBROKER_"

LONG_MAX = 9223372036854775807


class ConfigError(ValueError):
    """An unknown key or an invalid value; the message names the key (INVALID_CONFIG on the wire)."""


class ConfigRequestError(ConfigError):
    """A config change Kafka answers with INVALID_REQUEST rather than INVALID_CONFIG (broker configs)."""


def _parse_bool(raw: str) -> bool:
    v = raw.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise ValueError(f"expected true or false, got {raw!r}")


def _parse_list(raw: str) -> list[str]:
    return [p.strip() for p in raw.split(",") if p.strip()]


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    type: str  # int, long, bool, string, list, double, password
    default: Any
    doc: str = ""
    validator: Callable[[Any], str | None] | None = None
    dynamic: bool = False
    # A Kafka key accepted with any valid value although it changes nothing on one broker with
    # embedded metadata (thread counts, replication and ZooKeeper tuning): why, for the README.
    no_effect: str = ""
    # For a value that asks for something pykbroker does not implement, why not; the broker then
    # refuses to start instead of silently doing something else (README "Settings not implemented").
    unsupported: Callable[[Any], str | None] | None = None

    def parse(self, raw: str) -> Any:
        raw = raw.strip()
        if self.type in ("int", "long"):
            try:
                value: Any = int(raw)
            except ValueError:
                raise ValueError(f"expected an integer ({self.type}), got {raw!r}") from None
            if self.type == "int" and not -(2**31) <= value < 2**31:
                raise ValueError(f"{value} is out of range for an int")
            if not -(2**63) <= value < 2**63:
                raise ValueError(f"{value} is out of range for a long")
        elif self.type == "bool":
            value = _parse_bool(raw)
        elif self.type == "list":
            value = _parse_list(raw)
        elif self.type == "double":
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"expected a number, got {raw!r}") from None
        else:
            value = raw
        if self.validator is not None:
            problem = self.validator(value)
            if problem:
                raise ValueError(problem)
        return value

    def render(self, value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, list):
            return ",".join(value)
        return str(value)


# --- plain parsing of single settings (the features that use them import these) ---

LOCAL_ENDPOINTS = "pykbroker.local.broker.endpoints"


def parse_metrics_listener(value: str) -> tuple[str, int]:
    """``http://host:port`` (or ``host:port``) → (host, port). Raises ValueError, saying why."""
    text = value.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme != "http":
        raise ValueError(f"pykbroker.metrics.listener must be http://host:port, not {value!r} (no TLS on the "
                         "metrics endpoint; put a proxy in front if it needs one)")
    if parts.path not in ("", "/", "/metrics") or parts.query:
        raise ValueError(f"pykbroker.metrics.listener {value!r}: the path is always /metrics")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None or not parts.hostname:
        raise ValueError(f"pykbroker.metrics.listener {value!r} needs a host and a port, e.g. http://0.0.0.0:9404")
    return parts.hostname, port


def parse_ip_overrides(raw: str) -> dict[str, int]:
    """``host1:10,1.2.3.4:20`` into {host: count}; the last colon separates (so IPv6 works)."""
    out: dict[str, int] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, count = item.rpartition(":")
        host = host.strip().strip("[]")
        if not sep or not host:
            raise ValueError(f"{item!r} is not of the form host:count")
        try:
            n = int(count.strip())
        except ValueError:
            raise ValueError(f"{item!r} is not of the form host:count") from None
        if n < 0:
            raise ValueError(f"{item!r}: the count must not be negative")
        out[host] = n
    return out


def parse_local_endpoints(items: list[str]) -> dict[int, tuple[str, int]]:
    """``id@host:port`` items -> {broker id: (host, port)}; ValueError naming a malformed item."""
    out: dict[int, tuple[str, int]] = {}
    for item in items:
        broker, at, address = item.partition("@")
        host, colon, port = address.rpartition(":")
        host = host.strip("[]")
        if not (at and colon and broker.strip().isdigit() and port.isdigit() and host and 0 < int(port) <= 65535):
            raise ValueError(f"{item!r} is not of the form BROKER_ID@host:port")
        out[int(broker)] = (host, int(port))
    return out


def at_least(n: int) -> Callable[[Any], str | None]:
    return lambda v: None if v >= n else f"value must be at least {n}"


def _valid_metrics_listener(value: Any) -> str | None:
    if not value:
        return None
    try:
        parse_metrics_listener(value)
    except ValueError as e:
        return str(e)
    return None


def _log_levels(value: Any) -> str | None:
    try:
        parse_levels(value)
    except ValueError as e:
        return str(e)
    return None


def one_of(*options: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in options else f"value must be one of {', '.join(options)}"


def _topic_name_or_empty(value: Any) -> str | None:
    """A dead-letter topic setting: empty (none) or a legal topic name."""
    if not value or (re.fullmatch(r"[a-zA-Z0-9._-]{1,249}", value) and value not in (".", "..")):
        return None
    return "value must be a legal topic name"


def _authorizer_class(value: object) -> str | None:
    if value in ("", None) or value in AUTHORIZER_CLASS_NAMES:
        return None
    return ("only Kafka's ACL authorizers are implemented: " + ", ".join(sorted(AUTHORIZER_CLASS_NAMES))
            + " (or empty for none)")


def _super_users(value: object) -> str | None:
    try:
        parse_super_users(str(value or ""))
    except ValueError as e:
        return str(e)
    return None


def _valid_policy(v: Any) -> str | None:
    parts = [p.strip() for p in (v if isinstance(v, list) else str(v).split(","))]
    if not parts or any(p not in ("delete", "compact") for p in parts):
        return "value must be a list of delete and/or compact"
    return None


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
def parse_protocol_map(raw: str) -> dict[str, str]:
    """``listener.security.protocol.map``: ``NAME:PROTOCOL`` pairs; raises ValueError if malformed."""
    out: dict[str, str] = {}
    for item in _parse_list(raw):
        name, sep, proto = item.partition(":")
        if not sep or not name.strip() or proto.strip().upper() not in SECURITY_PROTOCOLS:
            raise ValueError(f"{item!r} is not of the form LISTENER:{'|'.join(SECURITY_PROTOCOLS)}")
        out[name.strip().upper()] = proto.strip().upper()
    return out


def _valid_protocol_map(v: Any) -> str | None:
    try:
        parse_protocol_map(v)
    except ValueError as e:
        return str(e)
    return None


ZK_DEFAULT_PORT = 2181


def parse_zk_connect(raw: str) -> tuple[list[tuple[str, int]], str]:
    """``host[:port][,host[:port]...][/chroot]`` -> servers and chroot ("" for none), as ZooKeeper's parser.

    Raises ValueError naming what is wrong.
    """
    text = raw.strip()
    slash = text.find("/")
    hosts_part, chroot = (text, "") if slash == -1 else (text[:slash], text[slash:])
    if chroot == "/":
        chroot = ""
    if chroot:
        if chroot.endswith("/") or "//" in chroot:
            raise ValueError(f"zookeeper.connect {raw!r}: the chroot {chroot!r} has an empty path element")
        if any(part in (".", "..") for part in chroot.split("/")[1:]):
            raise ValueError(f"zookeeper.connect {raw!r}: the chroot {chroot!r} has a relative path element")
    servers: list[tuple[str, int]] = []
    for item in hosts_part.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"zookeeper.connect {raw!r} is not of the form host:port[,host:port...][/chroot]")
        if item.startswith("["):  # [ipv6]:port
            host, _, rest = item[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port_text = item.partition(":")
        if not host:
            raise ValueError(f"zookeeper.connect {raw!r}: {item!r} names no host")
        if port_text and not port_text.isdigit():
            raise ValueError(f"zookeeper.connect {raw!r}: {item!r} has an invalid port")
        port = int(port_text) if port_text else ZK_DEFAULT_PORT
        if not 0 < port <= 65535:
            raise ValueError(f"zookeeper.connect {raw!r}: {item!r} has an invalid port")
        servers.append((host, port))
    return servers, chroot


def _valid_zk_connect(v: Any) -> str | None:
    if not v or not str(v).strip():
        return None  # empty: embedded metadata
    try:
        parse_zk_connect(str(v))
    except ValueError as e:
        return str(e)
    return None


def _valid_security_protocol(v: Any) -> str | None:
    if str(v).strip().upper() not in SECURITY_PROTOCOLS:
        return f"{v!r} is not one of {', '.join(SECURITY_PROTOCOLS)}"
    return None


def _valid_ibp_version(v: Any) -> str | None:
    """Kafka's MetadataVersion names as inter.broker.protocol.version takes them: 0.10.2, 2.8, 3.9-IV0."""
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?(-IV\d+)?", str(v).strip()):
        return f"{v!r} is not a Kafka version such as 3.9 or 3.9-IV0"
    return None


def _valid_listeners(v: Any) -> str | None:
    for item in v:
        try:
            parse_listener(item)
        except ValueError as e:
            return str(e)
    return None



INT_MAX = 2147483647
# Broker keys that may also be set for one listener as listener.name.<listener>.<key> (Kafka's prefix).
LISTENER_PREFIX = "listener.name."
LISTENER_CONFIGS: tuple[str, ...] = ("max.connections", "max.connection.creation.rate")
# SASL keys a listener may override (listener.name.<l>.<key>); the JAAS text also per mechanism:
# listener.name.<l>.<mechanism lower-case>.sasl.jaas.config (pykbroker.security.sasl.settings).
LISTENER_CONFIGS += ("sasl.enabled.mechanisms", "sasl.jaas.config", "connections.max.reauth.ms",
                     "sasl.server.max.receive.size")
# TLS keys a listener may override (pykbroker.security.tls).
SSL_CONFIGS: tuple[str, ...] = (
    "ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.password", "ssl.key.password",
    "ssl.keystore.certificate.chain", "ssl.keystore.key", "ssl.truststore.type", "ssl.truststore.location",
    "ssl.truststore.password", "ssl.truststore.certificates", "ssl.client.auth", "ssl.enabled.protocols",
    "ssl.protocol", "ssl.cipher.suites", "ssl.principal.mapping.rules", "ssl.endpoint.identification.algorithm")
LISTENER_CONFIGS += SSL_CONFIGS


def _valid_local_endpoints(v: Any) -> str | None:
    try:
        parse_local_endpoints(v)
    except ValueError as e:
        return str(e)
    return None


def _valid_ip_overrides(v: Any) -> str | None:
    try:
        parse_ip_overrides(v)
    except ValueError as e:
        return str(e)
    return None


_D = ConfigDef
BROKER_CONFIG_DEFS: dict[str, ConfigDef] = {
    d.name: d
    for d in [
        _D("broker.id", "int", 0, "This broker's id.", at_least(-1)),
        _D("broker.id.generation.enable", "bool", True, "Kafka: generate a broker id when broker.id is -1.",
           no_effect="ids are never generated: broker.id must be set (0 or more) with zookeeper.connect, and a "
           "broker.id of -1 is refused there"),
        _D("node.id", "int", -1, "Alias of broker.id (KRaft naming); -1 means use broker.id."),
        _D("listeners", "list", ["PLAINTEXT://127.0.0.1:9092"], "Addresses to listen on.", _valid_listeners),
        _D("advertised.listeners", "list", [], "Addresses given to clients; defaults to listeners.",
           _valid_listeners),
        _D("listener.security.protocol.map", "string",
           "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
           "Security protocol of each listener name; only PLAINTEXT listeners can be served.",
           _valid_protocol_map),
        _D("inter.broker.listener.name", "string", "", "The listener other brokers (followers) connect to. "
           "Set this or security.inter.broker.protocol, not both; with neither, the listener named PLAINTEXT, or "
           "else the first listener."),
        _D("security.inter.broker.protocol", "string", "PLAINTEXT", "Security protocol between brokers: the "
           "inter-broker listener is the listener named after it (PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL). "
           "Set this or inter.broker.listener.name, not both.", _valid_security_protocol),
        _D("control.plane.listener.name", "string", "", "Kafka: a listener of its own for controller-to-broker "
           "requests; when set it must name a listener other than the inter-broker one.",
           no_effect="the controller sends no requests to brokers (they follow ZooKeeper's state themselves), "
           "so there is no control-plane traffic to separate; the listener is served like any other"),
        _D("early.start.listeners", "string", "", "Kafka: listeners that may start before the authorizer is "
           "ready; when set, names listeners of 'listeners'.",
           no_effect="the authorizer is ready before any listener starts"),
        _D("inter.broker.protocol.version", "string", "3.9-IV0", "Kafka: the inter-broker protocol version of a "
           "rolling upgrade (for example 3.9 or 3.9-IV0).", _valid_ibp_version,
           no_effect="brokers of a pykbroker cluster speak every request version they implement to each other; "
           "there is no protocol-version step in an upgrade"),
        _D("log.dirs", "list", [], "Directories holding partition logs."),
        _D("log.dir", "string", "/tmp/kafka-logs", "Used when log.dirs is unset."),
        _D("zookeeper.connect", "string", "", "host:port[,host:port...][/chroot] of the ZooKeeper ensemble "
           "that coordinates a cluster; empty runs one broker with embedded metadata.", _valid_zk_connect),
        _D("zookeeper.session.timeout.ms", "int", 18000, "ZooKeeper session timeout.", at_least(1)),
        _D("zookeeper.connection.timeout.ms", "int", None, "How long to wait for the ZooKeeper connection at "
           "start; unset means zookeeper.session.timeout.ms.", at_least(1)),
        _D("zookeeper.max.in.flight.requests", "int", 10, validator=at_least(1),
           no_effect="kazoo pipelines every request on one connection"),
        _D("broker.rack", "string", None, "Rack of this broker: replica assignment spreads replicas over racks."),
        _D("num.partitions", "int", 1, "Default partition count for new topics.", at_least(1)),
        _D("default.replication.factor", "int", 1, "Default replication factor of new topics.", at_least(1)),
        _D("auto.create.topics.enable", "bool", True),
        _D("delete.topic.enable", "bool", True),
        _D("log.segment.bytes", "int", 1073741824, validator=at_least(14), dynamic=True),
        _D("log.roll.ms", "long", None, dynamic=True),
        _D("log.roll.hours", "int", 168, validator=at_least(1)),
        _D("log.roll.jitter.ms", "long", None, dynamic=True),
        _D("log.roll.jitter.hours", "int", 0, validator=at_least(0)),
        _D("log.retention.ms", "long", None, dynamic=True),
        _D("log.retention.minutes", "int", None),
        _D("log.retention.hours", "int", 168),
        _D("log.retention.bytes", "long", -1, dynamic=True),
        _D("log.retention.check.interval.ms", "long", 300000, validator=at_least(1)),
        _D("log.index.interval.bytes", "int", 4096, validator=at_least(0), dynamic=True),
        _D("log.index.size.max.bytes", "int", 10485760, validator=at_least(4), dynamic=True),
        _D("log.flush.interval.messages", "long", LONG_MAX, validator=at_least(1), dynamic=True),
        _D("log.flush.interval.ms", "long", None, dynamic=True),
        _D("log.flush.scheduler.interval.ms", "long", LONG_MAX),
        _D("log.flush.offset.checkpoint.interval.ms", "int", 60000, validator=at_least(0)),
        _D("log.flush.start.offset.checkpoint.interval.ms", "int", 60000, validator=at_least(0),
           no_effect="log start offsets are checkpointed with the recovery points, every "
                     "log.flush.offset.checkpoint.interval.ms"),
        _D("log.segment.delete.delay.ms", "long", 60000, validator=at_least(0), dynamic=True),
        _D("log.cleanup.policy", "list", ["delete"], validator=_valid_policy, dynamic=True),
        _D("log.cleaner.enable", "bool", True),
        _D("log.cleaner.delete.retention.ms", "long", 86400000, dynamic=True),
        _D("log.cleaner.min.compaction.lag.ms", "long", 0, dynamic=True),
        _D("log.cleaner.max.compaction.lag.ms", "long", LONG_MAX, dynamic=True),
        _D("log.cleaner.min.cleanable.ratio", "double", 0.5, dynamic=True),
        _D("log.cleaner.backoff.ms", "long", 15000),
        _D("log.cleaner.threads", "int", 1, validator=at_least(0), dynamic=True,
           no_effect="one cleaner task compacts the logs in turn; set log.cleaner.enable=false to stop it"),
        _D("log.preallocate", "bool", False, dynamic=True),
        _D("log.message.timestamp.type", "string", "CreateTime",
           validator=one_of("CreateTime", "LogAppendTime"), dynamic=True),
        _D("log.message.timestamp.before.max.ms", "long", LONG_MAX, validator=at_least(0), dynamic=True),
        _D("log.message.timestamp.after.max.ms", "long", LONG_MAX, validator=at_least(0), dynamic=True),
        _D("log.message.timestamp.difference.max.ms", "long", LONG_MAX, dynamic=True),
        _D("log.message.downconversion.enable", "bool", True, "Whether Fetch v0-3 (clients from before "
           "Kafka 0.11) get their data down-converted to message format v0/v1; false answers them "
           "UNSUPPORTED_VERSION.", dynamic=True),
        _D("message.max.bytes", "int", 1048588, validator=at_least(0), dynamic=True),
        _D("socket.request.max.bytes", "int", 104857600, validator=at_least(1)),
        _D("socket.send.buffer.bytes", "int", 102400),
        _D("socket.receive.buffer.bytes", "int", 102400),
        _D("connections.max.idle.ms", "long", 600000),
        _D("connection.failed.authentication.delay.ms", "int", 100, "After a failed SASL authentication the "
           "broker waits this long before it answers, then closes the connection (KIP-306: slows down password "
           "guessing).", at_least(0)),
        # --- SASL (pykbroker.security.sasl) ---
        _D("sasl.enabled.mechanisms", "list", ["GSSAPI"], "SASL mechanisms of SASL_* listeners: PLAIN, SCRAM-SHA-256, "
           "SCRAM-SHA-512. Kafka's default GSSAPI is not implemented: a broker with a SASL listener refuses to "
           "start until this is set."),
        _D("sasl.mechanism.inter.broker.protocol", "string", "GSSAPI", "SASL mechanism of inter-broker "
           "connections when the inter-broker listener is SASL_*."),
        _D("sasl.jaas.config", "password", None, "JAAS login module configuration (PlainLoginModule users, "
           "ScramLoginModule/PlainLoginModule username and password for inter-broker connections)."),
        _D("connections.max.reauth.ms", "long", 0, "KIP-368: SASL sessions last this long, then the client "
           "must re-authenticate; 0 disables.", at_least(0)),
        _D("sasl.server.max.receive.size", "int", 524288, "Largest request accepted before authentication.",
           at_least(1)),
        # --- end SASL ---
        # --- ACL authorizer (pykbroker.security.acl_authorizer) ---
        _D("authorizer.class.name", "string", "", "Authorizer: kafka.security.authorizer.AclAuthorizer or "
           "org.apache.kafka.metadata.authorizer.StandardAuthorizer (both: Kafka's ACL semantics); empty: none "
           "(everything allowed).", _authorizer_class),
        _D("super.users", "string", "", "Semicolon-separated principals allowed everything (User:admin;User:b).",
           _super_users),
        _D("allow.everyone.if.no.acl.found", "bool", False, "With an authorizer: allow an operation on a "
           "resource that has no ACL at all."),
        # --- end ACL authorizer ---
        # --- TLS (pykbroker.security.tls); each also settable as listener.name.<l>.<key> ---
        _D("ssl.keystore.type", "string", "JKS", "PEM or PKCS12 (JKS, Kafka's default, is not implemented).",
           one_of("JKS", "PKCS12", "PEM")),
        _D("ssl.keystore.location", "string", None, "Keystore file (PKCS12, or PEM with key and certificate chain)."),
        _D("ssl.keystore.password", "password", None, "Password of the keystore file."),
        _D("ssl.key.password", "password", None, "Password of the private key (PEM: of the encrypted key)."),
        _D("ssl.keystore.certificate.chain", "password", None, "Inline PEM certificate chain (ssl.keystore.type=PEM)."),
        _D("ssl.keystore.key", "password", None, "Inline PEM private key (ssl.keystore.type=PEM)."),
        _D("ssl.truststore.type", "string", "JKS", "PEM or PKCS12 (JKS is not implemented).",
           one_of("JKS", "PKCS12", "PEM")),
        _D("ssl.truststore.location", "string", None, "Truststore file: CA certificates clients are checked against."),
        _D("ssl.truststore.password", "password", None, "Password of the truststore file (PKCS12)."),
        _D("ssl.truststore.certificates", "password", None, "Inline PEM CA certificates (ssl.truststore.type=PEM)."),
        _D("ssl.client.auth", "string", "none", "required, requested or none: whether clients present certificates.",
           one_of("required", "requested", "none")),
        _D("ssl.enabled.protocols", "list", ["TLSv1.2", "TLSv1.3"], "TLS versions accepted (TLSv1.2, TLSv1.3)."),
        _D("ssl.protocol", "string", "TLSv1.3", "TLS protocol of the context (TLSv1.2 or TLSv1.3; TLS accepted).",
           one_of("TLS", "TLSv1.2", "TLSv1.3")),
        _D("ssl.cipher.suites", "list", [], "OpenSSL cipher names for TLSv1.2 (empty: OpenSSL's defaults)."),
        _D("ssl.principal.mapping.rules", "string", "DEFAULT", "Rules mapping a client certificate's subject DN "
           "to a principal name (Kafka's RULE:pattern/replacement/[LU] syntax)."),
        _D("ssl.endpoint.identification.algorithm", "string", "https", "https: the broker's own inter-broker "
           "connections check the peer's host name; empty: they do not."),
        # --- end TLS ---
        # --- connection limits and request memory ---
        _D("max.connections", "int", INT_MAX, "Connections the broker accepts at once; above it listeners "
           "stop accepting (also listener.name.X.max.connections).", at_least(0)),
        _D("max.connections.per.ip", "int", INT_MAX, "Connections allowed from one address; more are closed "
           "at once.", at_least(0)),
        _D("max.connections.per.ip.overrides", "string", "", "Per-address or per-host limits, host:count,...",
           _valid_ip_overrides),
        _D("max.connection.creation.rate", "int", INT_MAX, "New connections per second before accepting is "
           "throttled (also listener.name.X.max.connection.creation.rate).", at_least(0)),
        _D("queued.max.request.bytes", "long", -1, "Bytes of requests being read before the broker stops "
           "reading from sockets; -1 (or 0) means unbounded, as in Kafka."),
        _D("pykbroker.request.receive.timeout.ms", "long", 30000,
           "pykbroker: a request must arrive whole within this time of its first byte or the connection is "
           "closed (slow senders); 0 or -1 disables.", at_least(-1)),
        _D("pykbroker.max.inflight.requests.per.connection", "int", 5,
           "pykbroker: requests of one connection read and processed before they are answered, while earlier "
           "ones wait only for an acknowledgement and one of them waits for the ISR (acks=all). Responses "
           "still go out in request order. 1: each request is answered before the next is read. TLS "
           "listeners always use 1. An eager reader takes away the backpressure that makes producers batch, "
           "and each smaller request is one more acknowledgement for the followers (docs/performance.md, "
           "'acks=all and replication').", at_least(1)),
        _D("pykbroker.max.inflight.flush.requests.per.connection", "int", 1024,
           "pykbroker: as pykbroker.max.inflight.requests.per.connection, while the unanswered requests wait "
           "only for this broker's fsync (log.flush.on.ack), not for the ISR. One fsync covers them all, and a "
           "connection that stops reading stops appending, so a slow fsync would hold up the partition's "
           "consumers too: at 1,000 requests a second, 1024 rides out a one-second fsync (docs/performance.md, "
           "'Sharing the CPU'). The byte bound still applies. TLS listeners always use 1.", at_least(1)),
        _D("pykbroker.max.inflight.bytes.per.connection", "long", 4 * 1024 * 1024,
           "pykbroker: the connection also stops reading while its unanswered requests hold this many request "
           "bytes (a single request may be larger).", at_least(1)),
        # --- end connection limits ---
        _D("pykbroker.scheduler.slice.us", "int", 200,
           "pykbroker: the CPU time slice the serve process's threads ask Linux's scheduler for (sched_setattr, "
           "Linux 6.12+; threads started later inherit it; 0 leaves the slice the process started with, the "
           "kernel's default of 1.4 ms on 2 CPUs unless its parent set one). With a short slice a broker thread "
           "woken by a request runs before a CPU-bound neighbour's slice ends: beside two busy processes on 2 "
           "vCPUs the event loop's run-queue waits of 1 ms or more were a tenth of those with the kernel's "
           "slice, and e2e p99 with log.flush.on.ack was lower in 33 of 44 paired cells, with no throughput "
           "lost quiet (docs/performance.md, 'Sharing the CPU'). Where the kernel keeps no slice per thread, "
           "the default is a log line and a value set explicitly fails the start. 0 or 100-100000.",
           lambda v: None if v == 0 or 100 <= v <= 100_000 else "value must be 0 or between 100 and 100000"),
        _D("pykbroker.event.loop", "string", "asyncio",
           "pykbroker: the event loop that serves every connection: asyncio (Python's own) or uvloop (libuv; "
           "install it with pip install 'pykbroker[uvloop]'; a start with uvloop chosen and not installed fails, "
           "saying so). uvloop runs the same code for less CPU per request (docs/performance.md, 'CPU per "
           "request').", one_of("asyncio", "uvloop")),
        _D("pykbroker.gil.switch.interval.us", "int", 5000,
           "pykbroker: how long a thread waiting for Python's GIL lets the thread holding it run before asking "
           "for it (sys.setswitchinterval; 5000 is Python's own default). Where the C extension is not built, "
           "the fsync threads of log.flush.on.ack need the GIL after each fsync to hand the result to the event "
           "loop, and under CPU contention they often waited the whole interval: 500 cut that wait "
           "(docs/performance.md, 'Sharing the CPU'). The native fsync threads never take the GIL.",
           lambda v: None if 50 <= v <= 100_000 else "value must be between 50 and 100000"),
        _D("num.network.threads", "int", dynamic=True, default=3, validator=at_least(1),
           no_effect="one event loop serves every connection"),
        _D("num.io.threads", "int", dynamic=True, default=8, validator=at_least(1),
           no_effect="requests are handled on the event loop; fsyncs and compaction use worker threads"),
        _D("num.recovery.threads.per.data.dir", "int", dynamic=True, default=2, validator=at_least(1),
           no_effect="logs are loaded and recovered one after another"),
        _D("num.replica.fetchers", "int", 1, validator=at_least(1), dynamic=True),
        _D("min.insync.replicas", "int", 1, validator=at_least(1), dynamic=True),
        _D("unclean.leader.election.enable", "bool", False, dynamic=True),
        _D("compression.type", "string", "producer",
           validator=one_of("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"), dynamic=True),
        _D("offsets.topic.num.partitions", "int", 50, validator=at_least(1)),
        _D("offsets.topic.replication.factor", "int", 3, "With embedded metadata capped at 1; in a cluster, "
           "creation waits until this many brokers are live, as in Kafka.",
           at_least(1)),
        _D("offsets.retention.minutes", "int", 10080, validator=at_least(1)),
        _D("offsets.topic.segment.bytes", "int", 104857600, validator=at_least(1)),
        _D("transaction.state.log.num.partitions", "int", 50, validator=at_least(1)),
        _D("transaction.state.log.replication.factor", "int", 3, "With embedded metadata capped at 1; in a cluster, "
           "creation waits until this many brokers are live, as in Kafka.",
           at_least(1)),
        _D("transaction.state.log.min.isr", "int", 2, "Capped at the replication factor actually used.",
           at_least(1)),
        _D("transaction.max.timeout.ms", "int", 900000, validator=at_least(1)),
        _D("transactional.id.expiration.ms", "int", 604800000, validator=at_least(1)),
        _D("transaction.partition.verification.enable", "bool", True, dynamic=True),
        _D("producer.id.expiration.ms", "int", 86400000, validator=at_least(1), dynamic=True),
        _D("producer.id.expiration.check.interval.ms", "int", 600000, validator=at_least(1)),
        _D("group.initial.rebalance.delay.ms", "int", 3000),
        _D("group.min.session.timeout.ms", "int", 6000),
        _D("group.max.session.timeout.ms", "int", 1800000),
        _D("group.max.size", "int", 2147483647, validator=at_least(1)),
        # --- group coordinator ---
        _D("offsets.retention.check.interval.ms", "long", 600000, validator=at_least(1)),
        _D("offset.metadata.max.bytes", "int", 4096, validator=at_least(0)),
        _D("offsets.load.buffer.size", "int", 5242880, validator=at_least(1),
           no_effect="offsets partitions are read in fixed 4 MiB chunks"),
        _D("offsets.commit.timeout.ms", "int", 5000, "In a cluster, how long a group coordinator's write waits "
           "for the ISR to have it before answering.", at_least(1)),
        _D("group.coordinator.rebalance.protocols", "list", ["classic", "consumer"]),
        _D("group.consumer.session.timeout.ms", "int", 45000, validator=at_least(1)),
        _D("group.consumer.min.session.timeout.ms", "int", 45000, validator=at_least(1)),
        _D("group.consumer.max.session.timeout.ms", "int", 60000, validator=at_least(1)),
        _D("group.consumer.heartbeat.interval.ms", "int", 5000, validator=at_least(1)),
        _D("group.consumer.min.heartbeat.interval.ms", "int", 5000, validator=at_least(1),
           no_effect="group.consumer.heartbeat.interval.ms is not checked against it"),
        _D("group.consumer.max.heartbeat.interval.ms", "int", 15000, validator=at_least(1),
           no_effect="group.consumer.heartbeat.interval.ms is not checked against it"),
        _D("group.consumer.max.size", "int", 2147483647, validator=at_least(1)),
        _D("group.consumer.assignors", "list", ["uniform", "range"]),
        _D("group.consumer.migration.policy", "string", "bidirectional",
           validator=one_of("disabled", "downgrade", "upgrade", "bidirectional")),
        # --- end group coordinator ---
        # --- share groups (KIP-932; pykbroker/coordinator/share) ---
        _D("group.share.enable", "bool", False, "Serve share groups (KIP-932): advertise and answer the share "
           "APIs. Kafka 4.2 gates them on the share.version feature; pykbroker has no finalized features, so "
           "this static switch stands in for it (docs/queues.md)."),
        _D("group.share.record.lock.duration.ms", "int", 30000, "How long a share consumer holds the records "
           "it acquired before they are released for redelivery.", at_least(1)),
        _D("group.share.delivery.count.limit", "int", 5, "Deliveries of a record after which it is archived "
           "(and sent to the dead-letter topic, if any) instead of released.", at_least(1)),
        _D("group.share.partition.max.record.locks", "int", 2000, "In-flight records per share-partition: "
           "no records past start offset + this are acquired.", at_least(1)),
        _D("group.share.heartbeat.interval.ms", "int", 5000, validator=at_least(1)),
        _D("group.share.session.timeout.ms", "int", 45000, validator=at_least(1)),
        _D("group.share.max.size", "int", 200, "Members per share group.", at_least(1)),
        _D("pykbroker.dlq.topic", "string", "", "pykbroker: default of the topic config pykbroker.dlq.topic, the "
           "dead-letter topic of share groups reading a topic (docs/queues.md); empty: none.",
           _topic_name_or_empty),
        _D("share.coordinator.state.topic.num.partitions", "int", 50, validator=at_least(1)),
        _D("share.coordinator.state.topic.replication.factor", "int", 3, validator=at_least(1)),
        _D("share.coordinator.state.topic.segment.bytes", "int", 104857600, validator=at_least(14)),
        _D("share.coordinator.state.topic.min.isr", "int", 2, "Capped at the replication factor actually used.",
           at_least(1)),
        _D("share.coordinator.write.timeout.ms", "int", 5000, "How long the share coordinator waits for a state "
           "write to reach the ISR before answering it failed.", at_least(1)),
        # --- end share groups ---
        _D("fetch.max.bytes", "int", 57671680, validator=at_least(1024)),
        _D("max.incremental.fetch.session.cache.slots", "int", 1000, "Incremental fetch sessions (KIP-227) the "
           "broker keeps; 0 answers every client sessionless.", at_least(0)),
        # --- client quota enforcement (pykbroker.quotas) ---
        _D("quota.window.num", "int", 11, "Samples client quota rates are measured over.", at_least(1)),
        _D("quota.window.size.seconds", "int", 1, "Length of one client quota sample.", at_least(1)),
        _D("controller.quota.window.num", "int", 11, "Samples of the controller mutation quota (KIP-599): "
           "its token bucket holds this many windows of credit.", at_least(1)),
        _D("controller.quota.window.size.seconds", "int", 1, "Length of one controller mutation quota "
           "sample.", at_least(1)),
        # --- end client quota enforcement ---
        # --- client telemetry (KIP-714) ---
        _D("telemetry.max.bytes", "int", 1048576, "The largest metrics payload a client may push "
           "(PushTelemetry); larger ones get TELEMETRY_TOO_LARGE.", at_least(1)),
        _D("pykbroker.client.telemetry.enable", "string", "auto", "pykbroker: when ApiVersions advertises "
           "GetTelemetrySubscriptions and PushTelemetry (KIP-714), as a Kafka broker does only with a client "
           "telemetry reporter: auto (while a CLIENT_METRICS subscription exists), true (always), false (never).",
           one_of("auto", "true", "false")),
        # --- end client telemetry ---
        # --- observability (pykbroker.observability) ---
        _D("pykbroker.metrics.listener", "string", "", "pykbroker: where the Prometheus endpoint listens, as "
           "http://host:port (path /metrics); empty turns it off.", _valid_metrics_listener),
        _D("pykbroker.metrics.partition.series", "bool", True, "pykbroker: export Kafka's per-partition log "
           "gauges (size, segments, start/end offsets, high watermark, under-replicated); false exports them "
           "summed per topic, for brokers with thousands of partitions (each sample costs scrape time)."),
        _D("pykbroker.log.format", "string", "text", "pykbroker: log line format: text, logfmt or json.",
           one_of("text", "logfmt", "json")),
        _D("pykbroker.log.levels", "string", "", "pykbroker: levels of single loggers on top of --log-level, "
           "as logger=LEVEL pairs separated by commas (log4j's level names too), e.g. "
           "pykbroker.request=DEBUG,pykbroker.network=WARN; a logger's children inherit its level.",
           _log_levels),
        # --- end observability ---
        # --- cluster and replication (ZooKeeper mode) ---
        _D("pykbroker.local.broker.endpoints", "list", [], "pykbroker: brokers that are other processes of this "
           "host (serve --processes sets it), as BROKER_ID@host:port of their inter-broker listener on loopback; "
           "inter-broker connections to them go there instead of to their registered endpoint.",
           _valid_local_endpoints),
        _D("replica.lag.time.max.ms", "long", 30000, "A follower that has not caught up for this long leaves "
           "the ISR.", at_least(1)),
        _D("replica.fetch.max.bytes", "int", 1048576, validator=at_least(0)),
        _D("replica.fetch.response.max.bytes", "int", 10485760, validator=at_least(0)),
        _D("replica.fetch.min.bytes", "int", 1, validator=at_least(1)),
        _D("replica.fetch.wait.max.ms", "int", 500, validator=at_least(0)),
        _D("replica.fetch.backoff.ms", "int", 1000, validator=at_least(0)),
        _D("replica.socket.timeout.ms", "int", 30000, validator=at_least(1)),
        _D("replica.socket.receive.buffer.bytes", "int", 65536,
           no_effect="follower connections use the operating system's default receive buffer"),
        _D("replica.high.watermark.checkpoint.interval.ms", "long", 5000, validator=at_least(1)),
        _D("request.timeout.ms", "int", 30000, "Timeout of requests to other brokers.", at_least(1)),
        _D("controlled.shutdown.enable", "bool", True, "On SIGTERM, move this broker's leaderships to other "
           "replicas before stopping."),
        _D("controlled.shutdown.max.retries", "int", 3, validator=at_least(0)),
        _D("controlled.shutdown.retry.backoff.ms", "long", 5000, validator=at_least(0)),
        _D("auto.leader.rebalance.enable", "bool", True, "The controller moves leadership back to the preferred "
           "replica when a broker's imbalance exceeds leader.imbalance.per.broker.percentage."),
        _D("leader.imbalance.check.interval.seconds", "long", 300, validator=at_least(1)),
        _D("leader.imbalance.per.broker.percentage", "int", 10, validator=at_least(0)),
        # --- end cluster and replication ---
        _D("log.flush.on.ack", "bool", False,
           "pykbroker: fsync the log before acknowledging acks=1/all, so that a lone broker loses nothing "
           "acknowledged on power loss. Kafka itself relies on replication instead."),
        # --- delayed delivery (pykbroker/delay; docs/queues.md "Delayed delivery") ---
        _D("pykbroker.delay.enable", "bool", False,
           "pykbroker: hold records carrying a pykbroker.delay.ms or pykbroker.deliver.at.ms header, or produced "
           "to a topic with pykbroker.delay.ms, in __delayed_records until they fall due. Off: the headers are "
           "ordinary headers and the produce path pays nothing. In a ZooKeeper cluster, set it on every broker."),
        _D("pykbroker.delay.ms", "long", 0,
           "pykbroker: default delay of every record produced to a topic (topic config pykbroker.delay.ms "
           "overrides it); 0 delivers at once. Needs pykbroker.delay.enable.", at_least(0)),
        _D("pykbroker.delay.max.ms", "long", 604800000,
           "pykbroker: the longest delay a header or topic may ask for; a record asking more is refused with "
           "INVALID_RECORD.", at_least(1)),
        _D("pykbroker.delay.topic.replication.factor", "int", 3,
           "pykbroker: replication factor of __delayed_records; capped at the one broker with embedded metadata, "
           "in a cluster the topic is created once that many brokers are live.", at_least(1)),
        _D("pykbroker.delay.topic.min.isr", "int", 2,
           "pykbroker: min.insync.replicas of __delayed_records (capped at its replication factor).", at_least(1)),
        # --- end delayed delivery ---
        _D("pykbroker.fault.drop.produce.response", "int", 0,
           "Testing hook: drop the connection after appending but before answering this many Produce "
           "requests (0 disables)."),
    ]
}

# Kafka's topic-level configs: name -> (broker default key, type).
TOPIC_CONFIG_SYNONYMS: dict[str, str] = {
    "segment.bytes": "log.segment.bytes",
    "segment.ms": "log.roll.ms",
    "segment.jitter.ms": "log.roll.jitter.ms",
    "segment.index.bytes": "log.index.size.max.bytes",
    "index.interval.bytes": "log.index.interval.bytes",
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "message.timestamp.difference.max.ms": "log.message.timestamp.difference.max.ms",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "cleanup.policy": "log.cleanup.policy",
    "pykbroker.delay.ms": "pykbroker.delay.ms",
    "pykbroker.dlq.topic": "pykbroker.dlq.topic",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "min.insync.replicas": "min.insync.replicas",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
    "compression.type": "compression.type",
    "preallocate": "log.preallocate",
    "message.downconversion.enable": "log.message.downconversion.enable",
}

LISTENER_RE = re.compile(r"^(?P<name>[A-Za-z0-9_]+)://(?P<host>\[[^\]]*\]|[^:/]*):(?P<port>\d+)$")


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    host: str
    port: int


def parse_listener(text: str) -> Listener:
    m = LISTENER_RE.match(text.strip())
    if not m:
        raise ValueError(f"listener {text!r} is not of the form NAME://host:port")
    port = int(m["port"])
    if not 0 <= port <= 65535:
        raise ValueError(f"listener {text!r} has an invalid port")
    host = m["host"].strip("[]")
    return Listener(m["name"].upper(), host, port)


def _check_supported(d: ConfigDef, value: Any) -> None:
    reason = d.unsupported(value) if d.unsupported is not None else None
    if reason:
        raise ConfigError(f"{d.name} is not supported yet: {reason} ({NOT_IMPLEMENTED_HINT})")


# Kafka keys of features pykbroker does not have at all: named in the "unknown configuration" error.
_UNIMPLEMENTED_PREFIXES = {
    "ssl.": "of the ssl.* keys only those listed in docs/security.md are implemented",
    "sasl.kerberos.": "Kerberos (GSSAPI) is not implemented",
    "sasl.oauthbearer.": "OAUTHBEARER with an identity provider (sasl.oauthbearer.*) is not implemented: only "
                         "unsecured tokens are validated",
    "sasl.": "of SASL only PLAIN, SCRAM and unsecured OAUTHBEARER with sasl.jaas.config are implemented",
    "process.roles": "KRaft is not implemented: pykbroker uses ZooKeeper or embedded metadata",
    "controller.": "KRaft is not implemented: pykbroker uses ZooKeeper or embedded metadata (of the "
                   "controller.* keys only controller.quota.window.num/.size.seconds exist here)",
    "zookeeper.ssl": "TLS to ZooKeeper is not implemented",
    "zookeeper.set.acl": "ZooKeeper ACLs are not implemented",
}


def _with_source(message: str, source: str) -> str:
    """The message with where its key came from, before the README pointer that ends a refusal."""
    if message.endswith(f"{NOT_IMPLEMENTED_HINT})"):
        at = message.rfind(" (")
        return f"{message[:at]} (from {source}){message[at:]}"
    return f"{message} (from {source})"


def _unknown_key_hint(key: str) -> str:
    for prefix, why in _UNIMPLEMENTED_PREFIXES.items():
        if key.startswith(prefix):
            return f": a Kafka setting pykbroker does not implement ({why}; {NOT_IMPLEMENTED_HINT})"
    return ""


def parse_properties(text: str) -> dict[str, str]:
    """Parse the subset of java.util.Properties syntax that server.properties files use."""
    out: dict[str, str] = {}
    pending = ""
    for raw_line in text.splitlines():
        line = pending + raw_line.lstrip() if pending else raw_line.strip()
        pending = ""
        if not line or line.startswith(("#", "!")):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1]
            continue
        m = re.match(r"^((?:\\.|[^=:\s])+)\s*[=:\s]\s*(.*)$", line)
        if m:
            key, value = m.group(1), m.group(2)
        else:
            key, value = line, ""
        out[key.replace("\\", "")] = value.strip()
    return out


def env_to_key(name: str) -> str:
    """Map ``PYKBROKER_LOG_RETENTION_HOURS`` to ``log.retention.hours`` (Kafka image convention).

    ``___`` stands for ``-``, ``__`` for ``_`` and ``_`` for ``.``.
    """
    body = name[len(ENV_PREFIX):].lower()
    return body.replace("___", "\0").replace("__", "\1").replace("_", ".").replace("\0", "-").replace("\1", "_")


def settings_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {env_to_key(k): v for k, v in environ.items() if k.startswith(ENV_PREFIX) and len(k) > len(ENV_PREFIX)}


class BrokerConfig:
    """Validated broker settings. Attribute access is by Kafka key: ``cfg["log.dirs"]``."""

    def __init__(self, raw: Mapping[str, str] | None = None, sources: Mapping[str, str] | None = None) -> None:
        # Effective values: defaults, then the static (file/env/override) values, then the dynamic
        # cluster default and the dynamic per-broker values from the metadata store (Kafka's order).
        self._values: dict[str, Any] = {k: d.default for k, d in BROKER_CONFIG_DEFS.items()}
        self._static: dict[str, Any] = {}
        self._static_raw: dict[str, str] = {}
        self._dynamic_default: dict[str, Any] = {}
        self._dynamic_broker: dict[str, Any] = {}
        self._dynamic_default_raw: dict[str, str] = {}
        self._dynamic_broker_raw: dict[str, str] = {}
        self._listener_values: dict[tuple[str, str], Any] = {}  # (LISTENER, key) -> value
        for key, value in (raw or {}).items():
            try:
                self.set(key, value)
            except ConfigError as e:  # say where the key came from: a file, a variable, an --override
                if sources is None or key not in sources:
                    raise
                raise ConfigError(_with_source(str(e), sources[key])) from None
        self._check_consistency()

    def set(self, key: str, value: str) -> None:
        if key.startswith(LISTENER_PREFIX) and self._set_for_listener(key, value):
            return
        d = BROKER_CONFIG_DEFS.get(key)
        if d is None:
            raise ConfigError(f"unknown configuration {key!r}{_unknown_key_hint(key)}")
        try:
            parsed = d.parse(value)
        except ValueError as e:
            raise ConfigError(f"invalid value {value!r} for configuration {key!r}: {e}") from None
        _check_supported(d, parsed)
        self._static[key] = parsed
        self._static_raw[key] = value.strip()
        self._recompute()

    def _set_for_listener(self, key: str, value: str) -> bool:
        """``listener.name.<listener>.<key>`` for the keys Kafka lets a listener override."""
        listener, _, base = key[len(LISTENER_PREFIX):].partition(".")
        if listener and base.partition(".")[2] == "sasl.jaas.config":  # <l>.<mechanism>.sasl.jaas.config
            self._listener_values[(listener.upper(), base.lower())] = value.strip()
            return True
        if base not in LISTENER_CONFIGS or not listener:
            return False
        try:
            self._listener_values[(listener.upper(), base)] = BROKER_CONFIG_DEFS[base].parse(value)
        except ValueError as e:
            raise ConfigError(f"invalid value {value!r} for configuration {key!r}: {e}") from None
        return True

    def listener_value(self, listener: str, key: str) -> Any:
        """A listener's own value of a LISTENER_CONFIGS key, or None when it has none."""
        return self._listener_values.get((listener.upper(), key))

    def no_effect_keys(self) -> list[str]:
        """Keys set explicitly that this broker accepts but that change nothing (for one start-up line)."""
        return sorted(k for k in self._static if BROKER_CONFIG_DEFS[k].no_effect)

    # --- dynamic broker configs (KIP-226) -------------------------------------------------------

    def apply_dynamic(self, per_broker: Mapping[str, str], cluster_default: Mapping[str, str]) -> list[str]:
        """Install the dynamic configs stored for this broker and for the cluster default.

        Values that no longer parse are skipped, as Kafka ignores invalid stored dynamic configs;
        returns the keys whose effective value changed.
        """
        before = dict(self._values)
        self._dynamic_broker, self._dynamic_broker_raw = _parse_dynamic(per_broker)
        self._dynamic_default, self._dynamic_default_raw = _parse_dynamic(cluster_default)
        self._recompute()
        return sorted(k for k, v in self._values.items() if before.get(k) != v)

    def _recompute(self) -> None:
        values = {k: d.default for k, d in BROKER_CONFIG_DEFS.items()}
        for layer in (self._static, self._dynamic_default, self._dynamic_broker):
            # A higher layer setting any of log.retention.{ms,minutes,hours} (and the other synonym
            # groups) hides the lower layers' synonyms, as Kafka's DynamicBrokerConfig does.
            for key in layer:
                for syn in broker_config_synonyms(key):
                    values[syn] = BROKER_CONFIG_DEFS[syn].default
            values.update(layer)
        self._values = values

    @property
    def dynamic_broker_configs(self) -> dict[str, str]:
        return dict(self._dynamic_broker_raw)

    @property
    def dynamic_default_configs(self) -> dict[str, str]:
        return dict(self._dynamic_default_raw)

    @property
    def static_configs(self) -> dict[str, str]:
        """The values set in the file, environment or --override, as written."""
        return dict(self._static_raw)

    @staticmethod
    def default_string(key: str) -> str | None:
        d = BROKER_CONFIG_DEFS[key]
        return d.render(d.default)

    def _check_consistency(self) -> None:
        names = [parse_listener(x).name for x in self["listeners"]]
        if len(set(names)) != len(names):
            raise ConfigError("configuration 'listeners' names a listener more than once")
        ports = [(parse_listener(x).host, parse_listener(x).port) for x in self["listeners"]]
        if len(set(ports)) != len(ports):
            raise ConfigError("configuration 'listeners' uses the same host and port twice")
        adv = {parse_listener(x).name for x in self["advertised.listeners"]}
        if not adv <= set(names):
            raise ConfigError("configuration 'advertised.listeners' names a listener not in 'listeners'")
        if self["message.max.bytes"] > self["socket.request.max.bytes"]:
            raise ConfigError("configuration 'message.max.bytes' must not exceed 'socket.request.max.bytes'")
        protocols = parse_protocol_map(self["listener.security.protocol.map"])
        for name in names:
            proto = protocols.get(name, name if name in SECURITY_PROTOCOLS else None)
            if proto is None:
                raise ConfigError(f"listener {name} has no entry in 'listener.security.protocol.map'")
            if proto not in SECURITY_PROTOCOLS:  # TLS: pykbroker.security.tls; SASL: pykbroker.security.sasl
                raise ConfigError(f"listener {name} uses unknown security protocol {proto}")
        inter = self.inter_broker_listener  # Kafka's rules, checked there
        control = self["control.plane.listener.name"].strip().upper()
        if control and control not in names:
            raise ConfigError(f"configuration 'control.plane.listener.name' names {control}, which is not in "
                              "'listeners'")
        if control and control == inter:
            raise ConfigError("configuration 'control.plane.listener.name', when set, must differ from the "
                              f"inter-broker listener ({inter})")
        early = {x.strip().upper() for x in self["early.start.listeners"].split(",") if x.strip()}
        if not early <= set(names):
            raise ConfigError(f"configuration 'early.start.listeners' names {', '.join(sorted(early - set(names)))}, "
                              "not in 'listeners'")
        if self["zookeeper.connect"].strip() and self.broker_id < 0:
            raise ConfigError(f"broker.id={self.broker_id} is refused with zookeeper.connect: broker id generation "
                              f"(broker.id.generation.enable) is not implemented, set broker.id to 0 or more "
                              f"({NOT_IMPLEMENTED_HINT})")
        self._check_tls_store_types(names)
        if self["pykbroker.delay.ms"] > 0 and not self["pykbroker.delay.enable"]:
            raise ConfigError("configuration 'pykbroker.delay.ms' needs 'pykbroker.delay.enable=true'")
        if self["zookeeper.connect"].strip() and any(a.port == 0 for a in self.advertised_listeners):
            raise ConfigError("configuration 'listeners' has port 0 (an ephemeral port), which cannot be registered "
                              "in ZooKeeper for other brokers and clients: give each listener its port")
        for listener, key in self._listener_values:
            if listener not in names:
                raise ConfigError(f"configuration 'listener.name.{listener.lower()}.{key}' names a listener "
                                  "not in 'listeners'")
        if 0 < self["queued.max.request.bytes"] < self["socket.request.max.bytes"]:
            raise ConfigError("configuration 'queued.max.request.bytes' must be at least "
                              "'socket.request.max.bytes' (or -1 for unbounded)")
        if self["max.connections.per.ip"] == 0 and not self["max.connections.per.ip.overrides"].strip():
            raise ConfigError("configuration 'max.connections.per.ip' can be 0 only if "
                              "'max.connections.per.ip.overrides' is set")
        try:
            check_sasl(self)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def _check_tls_store_types(self, names: list[str]) -> None:
        """JKS (Kafka's default store type) is refused where an SSL or SASL_SSL listener would read it."""
        protocols = self.security_protocols
        for name in names:
            if protocols.get(name) not in ("SSL", "SASL_SSL"):
                continue

            def value(key: str, listener: str = name) -> Any:
                own = self.listener_value(listener, key)
                return own if own is not None else self[key]

            stores = (("keystore", True),  # a TLS listener always needs its keystore
                      ("truststore", bool(value("ssl.truststore.location") or value("ssl.truststore.certificates"))))
            for store, used in stores:
                if used and str(value(f"ssl.{store}.type")).strip().upper() == "JKS":
                    raise ConfigError(f"ssl.{store}.type=JKS (Kafka's default) is refused for listener {name}: JKS "
                                      f"is not implemented, set ssl.{store}.type=PKCS12 or PEM "
                                      f"({NOT_IMPLEMENTED_HINT})")

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def is_explicit(self, key: str) -> bool:
        """Set statically (file, environment, --override)."""
        return key in self._static

    def items(self) -> Iterable[tuple[str, Any]]:
        return self._values.items()

    # Derived settings, with Kafka's precedence rules (ms > minutes > hours).
    @property
    def broker_id(self) -> int:
        node_id: int = self["node.id"]
        return node_id if node_id >= 0 else int(self["broker.id"])

    @property
    def log_dirs(self) -> list[Path]:
        dirs = self["log.dirs"] or [self["log.dir"]]
        return [Path(d) for d in dirs]

    @property
    def security_protocols(self) -> dict[str, str]:
        """Each listener's security protocol (listener.security.protocol.map; a listener named after a
        protocol, e.g. SSL, defaults to it)."""
        protocols = parse_protocol_map(self["listener.security.protocol.map"])
        return {lst.name: protocols.get(lst.name, lst.name if lst.name in SECURITY_PROTOCOLS else "PLAINTEXT")
                for lst in self.listeners}

    @property
    def listeners(self) -> list[Listener]:
        return [parse_listener(x) for x in self["listeners"]]

    @property
    def inter_broker_listener(self) -> str:
        """The listener other brokers connect to, by Kafka's rules: inter.broker.listener.name, or else the
        listener named after security.inter.broker.protocol; setting both is an error. With neither set,
        the PLAINTEXT listener, or else (unlike Kafka, which would refuse to start) the first listener."""
        names = [lst.name for lst in self.listeners]
        by_name = self["inter.broker.listener.name"].strip().upper()
        if by_name and self.is_explicit("security.inter.broker.protocol"):
            raise ConfigError("only one of 'inter.broker.listener.name' and 'security.inter.broker.protocol' "
                              "should be set")
        if by_name:
            if by_name not in names:
                raise ConfigError(f"configuration 'inter.broker.listener.name' names {by_name}, which is not in "
                                  f"'listeners' (listeners: {', '.join(names)})")
            return by_name
        protocol = self["security.inter.broker.protocol"].strip().upper()
        if self.is_explicit("security.inter.broker.protocol"):
            if protocol not in names:
                raise ConfigError(f"configuration 'security.inter.broker.protocol' is {protocol}: the inter-broker "
                                  f"listener is then the listener named {protocol}, which is not in 'listeners' "
                                  f"(listeners: {', '.join(names)}); name one that way, or set "
                                  "'inter.broker.listener.name' instead")
            if self.security_protocols.get(protocol) != protocol:
                raise ConfigError(f"configuration 'security.inter.broker.protocol' is {protocol}, but listener "
                                  f"{protocol} uses {self.security_protocols.get(protocol)} "
                                  "('listener.security.protocol.map'); set 'inter.broker.listener.name' instead")
            return protocol
        return protocol if protocol in names else names[0]

    @property
    def advertised_listeners(self) -> list[Listener]:
        adv = {parse_listener(x).name: parse_listener(x) for x in self["advertised.listeners"]}
        out = []
        for lst in self.listeners:
            a = adv.get(lst.name, lst)
            if a.host in ("", "0.0.0.0", "::"):
                a = Listener(a.name, "127.0.0.1" if a.host != "::" else "::1", a.port)
            out.append(a)
        return out

    @property
    def retention_ms(self) -> int:
        if self["log.retention.ms"] is not None:
            return int(self["log.retention.ms"])
        if self["log.retention.minutes"] is not None:
            return int(self["log.retention.minutes"]) * 60_000
        return int(self["log.retention.hours"]) * 3_600_000

    @property
    def roll_ms(self) -> int:
        if self["log.roll.ms"] is not None:
            return int(self["log.roll.ms"])
        return int(self["log.roll.hours"]) * 3_600_000

    @property
    def roll_jitter_ms(self) -> int:
        if self["log.roll.jitter.ms"] is not None:
            return int(self["log.roll.jitter.ms"])
        return int(self["log.roll.jitter.hours"]) * 3_600_000

    @property
    def flush_ms(self) -> int:
        if self["log.flush.interval.ms"] is not None:
            return int(self["log.flush.interval.ms"])
        return int(self["log.flush.scheduler.interval.ms"])

    def topic_default(self, topic_key: str) -> Any:
        """The broker-level default for a topic config, in the topic config's own form."""
        broker_key = TOPIC_CONFIG_SYNONYMS[topic_key]
        special = {
            "log.roll.ms": self.roll_ms,
            "log.roll.jitter.ms": self.roll_jitter_ms,
            "log.retention.ms": self.retention_ms,
            "log.flush.interval.ms": self.flush_ms,
        }
        if broker_key in special:
            return special[broker_key]
        return self[broker_key]


# Topic configs and their parsers (validated on CreateTopics / AlterConfigs).
TOPIC_CONFIG_DEFS: dict[str, ConfigDef] = {
    "segment.bytes": _D("segment.bytes", "int", None, validator=at_least(14)),
    "segment.ms": _D("segment.ms", "long", None, validator=at_least(1)),
    "segment.jitter.ms": _D("segment.jitter.ms", "long", None, validator=at_least(0)),
    "segment.index.bytes": _D("segment.index.bytes", "int", None, validator=at_least(4)),
    "index.interval.bytes": _D("index.interval.bytes", "int", None, validator=at_least(0)),
    "retention.ms": _D("retention.ms", "long", None, validator=at_least(-1)),
    "retention.bytes": _D("retention.bytes", "long", None),
    "max.message.bytes": _D("max.message.bytes", "int", None, validator=at_least(0)),
    "message.timestamp.type": _D("message.timestamp.type", "string", None,
                                 validator=one_of("CreateTime", "LogAppendTime")),
    "message.timestamp.difference.max.ms": _D("message.timestamp.difference.max.ms", "long", None,
                                              validator=at_least(0)),
    "message.timestamp.before.max.ms": _D("message.timestamp.before.max.ms", "long", None,
                                          validator=at_least(0)),
    "message.timestamp.after.max.ms": _D("message.timestamp.after.max.ms", "long", None,
                                         validator=at_least(0)),
    "flush.messages": _D("flush.messages", "long", None, validator=at_least(1)),
    "flush.ms": _D("flush.ms", "long", None, validator=at_least(0)),
    "file.delete.delay.ms": _D("file.delete.delay.ms", "long", None, validator=at_least(0)),
    "cleanup.policy": _D("cleanup.policy", "list", None, validator=_valid_policy),
    "delete.retention.ms": _D("delete.retention.ms", "long", None, validator=at_least(0)),
    "min.compaction.lag.ms": _D("min.compaction.lag.ms", "long", None, validator=at_least(0)),
    "max.compaction.lag.ms": _D("max.compaction.lag.ms", "long", None, validator=at_least(1)),
    "min.cleanable.dirty.ratio": _D("min.cleanable.dirty.ratio", "double", None),
    "min.insync.replicas": _D("min.insync.replicas", "int", None, validator=at_least(1)),
    "unclean.leader.election.enable": _D("unclean.leader.election.enable", "bool", None),
    "compression.type": _D("compression.type", "string", None,
                           validator=one_of("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")),
    "preallocate": _D("preallocate", "bool", None),
    "message.downconversion.enable": _D("message.downconversion.enable", "bool", None),
    "pykbroker.delay.ms": _D("pykbroker.delay.ms", "long", None, validator=at_least(0)),
    "pykbroker.dlq.topic": _D("pykbroker.dlq.topic", "string", None, validator=_topic_name_or_empty),
}


# Short documentation of each topic config (DescribeConfigs v3+ with include_documentation).
_TOPIC_CONFIG_DOCS = {
    "segment.bytes": "Size of one log segment file; a new segment is rolled when the next batch would not fit.",
    "segment.ms": "Time after which a segment is rolled even if not full, so that retention can delete it.",
    "segment.jitter.ms": "Largest random amount subtracted from segment.ms, to spread segment rolls over time.",
    "segment.index.bytes": "Size of the offset and time index files preallocated for each segment.",
    "index.interval.bytes": "Bytes of batches between two entries of the offset index.",
    "retention.ms": "Age after which a segment is deleted (with the delete cleanup policy); -1 keeps data forever.",
    "retention.bytes": "Largest size of a partition before its oldest segments are deleted; -1 means no limit.",
    "max.message.bytes": "Largest record batch the topic accepts, after compression.",
    "message.timestamp.type": "CreateTime keeps the producer's timestamps; LogAppendTime replaces them with the "
                              "broker's time of append.",
    "message.timestamp.difference.max.ms": "Deprecated: largest difference between a CreateTime timestamp and "
                                           "the broker's clock.",
    "message.timestamp.before.max.ms": "How far in the past a CreateTime timestamp may be.",
    "message.timestamp.after.max.ms": "How far in the future a CreateTime timestamp may be.",
    "flush.messages": "Records appended between two forced fsyncs of the log.",
    "flush.ms": "Time between two forced fsyncs of the log.",
    "file.delete.delay.ms": "Time a deleted segment's files are kept before being removed from disk.",
    "cleanup.policy": "delete (retention by time and size), compact (keep the latest record per key) or both.",
    "delete.retention.ms": "Time tombstones are kept in a compacted topic, so consumers can see the delete.",
    "min.compaction.lag.ms": "Minimum age of a record before compaction may remove it.",
    "max.compaction.lag.ms": "Maximum time a record may stay uncompacted.",
    "min.cleanable.dirty.ratio": "Share of uncompacted bytes above which the log is compacted.",
    "min.insync.replicas": "Replicas that must have a batch for an acks=all produce to succeed.",
    "unclean.leader.election.enable": "Whether a replica outside the ISR may become leader (data loss).",
    "compression.type": "Codec batches are stored in; producer keeps the producer's.",
    "preallocate": "Whether segment files are preallocated on disk when rolled.",
    "message.downconversion.enable": "Whether old Fetch versions (v0-3) get this topic's data converted to "
                                     "message format v0/v1, or UNSUPPORTED_VERSION.",
    "pykbroker.dlq.topic": "pykbroker: where share groups reading this topic append records they reject or that "
                           "reach the delivery count limit, unless the group sets pykbroker.share.dlq.topic "
                           "(docs/queues.md); empty: none.",
    "pykbroker.delay.ms": "pykbroker: records produced to this topic are delivered this many milliseconds after "
                          "their timestamp (docs/queues.md, Delayed delivery); 0 delivers at once.",
}
TOPIC_CONFIG_DEFS = {k: dataclasses.replace(d, doc=_TOPIC_CONFIG_DOCS.get(k, d.doc))
                     for k, d in TOPIC_CONFIG_DEFS.items()}


_TIERED = "tiered storage (KIP-405) is not implemented"
_LEVELS = "per-codec compression levels are not implemented (batches keep the producer's compression)"
# Kafka 3.9 topic configs pykbroker does not implement: CreateTopics and AlterConfigs refuse them with
# INVALID_CONFIG and this reason instead of storing a setting that would change nothing.
KAFKA_TOPIC_CONFIGS_NOT_IMPLEMENTED: dict[str, str] = {
    "compression.gzip.level": _LEVELS,
    "compression.lz4.level": _LEVELS,
    "compression.zstd.level": _LEVELS,
    "local.retention.ms": _TIERED,
    "local.retention.bytes": _TIERED,
    "remote.storage.enable": _TIERED,
    "remote.log.copy.disable": _TIERED,
    "remote.log.delete.on.disable": _TIERED,
    "message.format.version": "only the v2 record batch format is stored",
    "follower.replication.throttled.replicas": "replication throttling is not implemented (no followers)",
    "leader.replication.throttled.replicas": "replication throttling is not implemented (no followers)",
}


def _refuse_nulls(configs: Mapping[str, str | None], kind: str) -> None:
    """Kafka's message for null values in a topic's or group's configs."""
    nulls = [k for k, v in configs.items() if v is None]
    if nulls:
        raise ConfigError(f"Null value not supported for {kind} configs: {','.join(nulls)}")


def validate_topic_configs(configs: Mapping[str, str | None], broker: BrokerConfig | None = None) -> dict[str, str]:
    """Check topic configs as CreateTopics/AlterConfigs would; returns the normalised strings.

    With ``broker``, the combination with the broker's defaults is checked too (Kafka's
    LogConfig.validateValues: min.compaction.lag.ms must not exceed max.compaction.lag.ms).
    """
    _refuse_nulls(configs, "topic")
    out: dict[str, str] = {}
    for key, value in configs.items():
        d = TOPIC_CONFIG_DEFS.get(key)
        if d is None:
            why = KAFKA_TOPIC_CONFIGS_NOT_IMPLEMENTED.get(key)
            if why:
                raise ConfigError(f"{key} is not supported yet: {why} ({NOT_IMPLEMENTED_HINT})")
            raise ConfigError(f"Unknown topic config name: {key}")
        assert value is not None
        try:
            parsed = d.parse(value)
        except ValueError as e:
            raise ConfigError(f"Invalid value {value} for configuration {key}: {e}") from None
        _check_supported(d, parsed)
        rendered = d.render(parsed)
        assert rendered is not None
        out[key] = rendered
    if broker is not None:
        eff = effective_topic_config(broker, out)
        lo, hi = eff["min.compaction.lag.ms"], eff["max.compaction.lag.ms"]
        if lo > hi:
            raise ConfigError(f"conflict topic config setting min.compaction.lag.ms ({lo}) > "
                              f"max.compaction.lag.ms ({hi})")
        if eff["pykbroker.delay.ms"] > 0 and not broker["pykbroker.delay.enable"]:
            raise ConfigError("pykbroker.delay.ms needs the broker setting pykbroker.delay.enable=true")
        if eff["pykbroker.delay.ms"] > broker["pykbroker.delay.max.ms"]:
            raise ConfigError(f"pykbroker.delay.ms {eff['pykbroker.delay.ms']} exceeds the broker's "
                              f"pykbroker.delay.max.ms {broker['pykbroker.delay.max.ms']}")
    return out


def topic_config_default(key: str) -> str | None:
    """Kafka's own default of a topic config (the schema default, not this broker's), as a string."""
    d = BROKER_CONFIG_DEFS[TOPIC_CONFIG_SYNONYMS[key]]
    if key == "retention.ms":
        return "604800000"
    if key == "segment.ms":
        return "604800000"
    if key == "segment.jitter.ms":
        return "0"
    return d.render(d.default)


# --- dynamic broker configs (KIP-226) ---------------------------------------------------------------

# Kafka's synonym groups among broker keys (DynamicBrokerConfig.brokerConfigSynonyms): the first that
# is set wins; a dynamic layer setting any of them hides the lower layers' values of all of them.
_BROKER_SYNONYM_GROUPS = (
    ("log.roll.ms", "log.roll.hours"),
    ("log.roll.jitter.ms", "log.roll.jitter.hours"),
    ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
)


def broker_config_synonyms(name: str) -> list[str]:
    """Kafka's synonyms of a broker key, in precedence order (including the key itself)."""
    if name == "log.flush.interval.ms":  # log.flush.scheduler.interval.ms stands in as its default
        return ["log.flush.interval.ms", "log.flush.scheduler.interval.ms"]
    for group in _BROKER_SYNONYM_GROUPS:
        if name in group:
            return list(group)
    return [name]


# Keys Kafka can change at runtime but that pykbroker reads only at start: altering them is refused
# rather than stored without effect (README "Settings not implemented").
BROKER_DYNAMIC_NOT_APPLIED: dict[str, str] = {
    k: "pykbroker applies it only at start; change it in server.properties and restart"
    for k in ("max.connections", "max.connections.per.ip", "max.connections.per.ip.overrides",
              "max.connection.creation.rate", "listeners", "advertised.listeners",
              "listener.security.protocol.map", "log.cleaner.backoff.ms")
}
# Kafka accepts these only per broker (resource name = the broker id), not as the cluster default.
_PER_BROKER_ONLY = frozenset({"listeners", "advertised.listeners", "listener.security.protocol.map"})
_THREAD_POOLS = ("num.io.threads", "num.network.threads", "num.replica.fetchers",
                 "num.recovery.threads.per.data.dir")


def _kafka_set(names: Iterable[str]) -> str:
    return "Set(" + ", ".join(sorted(names)) + ")"


def validate_dynamic_broker_configs(broker: BrokerConfig, props: Mapping[str, str | None],
                                    per_broker: bool) -> dict[str, str]:
    """Check a broker's (or the cluster default's) whole dynamic config as Kafka's DynamicBrokerConfig
    does; returns the normalised strings. Raises ConfigRequestError where Kafka answers INVALID_REQUEST
    (its KAFKA-13609), and ConfigError (INVALID_CONFIG, the code of a rejected config) for a key pykbroker
    does not implement, which Kafka would store.
    """
    nulls = [k for k, v in props.items() if v is None]
    if nulls:
        raise ConfigRequestError(f"Null value not supported for : {', '.join(nulls)}")
    unknown = [k for k in props if k not in BROKER_CONFIG_DEFS]
    if unknown:  # Kafka stores any key; pykbroker refuses what it cannot honour, as Kafka refuses a bad config
        key = sorted(unknown)[0]
        raise ConfigError(f"Unknown broker config {key}{_unknown_key_hint(key)}: pykbroker stores no "
                          "broker config it does not implement")
    static = [k for k in props if not BROKER_CONFIG_DEFS[k].dynamic and k not in BROKER_DYNAMIC_NOT_APPLIED]
    if static:
        raise ConfigRequestError(f"Cannot update these configs dynamically: {_kafka_set(static)}")
    not_applied = [k for k in props if k in BROKER_DYNAMIC_NOT_APPLIED]
    if not_applied:
        k = sorted(not_applied)[0]
        raise ConfigRequestError(f"{k} cannot be updated dynamically on pykbroker yet: "
                                 f"{BROKER_DYNAMIC_NOT_APPLIED[k]} ({NOT_IMPLEMENTED_HINT})")
    if not per_broker:
        per = [k for k in props if k in _PER_BROKER_ONLY]
        if per:
            raise ConfigRequestError("Cannot update these configs at default cluster level, broker id must be "
                                     f"specified: {_kafka_set(per)}")
    out: dict[str, str] = {}
    for key, value in props.items():
        d = BROKER_CONFIG_DEFS[key]
        assert value is not None
        try:
            parsed = d.parse(value)
        except ValueError as e:
            raise ConfigRequestError(f"Invalid value {value} for configuration {key}: {e}") from None
        try:
            _check_supported(d, parsed)
        except ConfigError as e:
            raise ConfigRequestError(str(e)) from None
        if key in _THREAD_POOLS and parsed != broker[key]:
            current = broker[key]
            what = f"Dynamic thread count update validation failed for {key}={value}"
            if parsed < current / 2:
                raise ConfigRequestError(f"{what}, value should be at least half the current value {current}")
            if parsed > current * 2:
                raise ConfigRequestError(f"{what}, value should not be greater than double the current value "
                                         f"{current}")
        rendered = d.render(parsed)
        assert rendered is not None
        out[key] = rendered
    return out


def _parse_dynamic(props: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    parsed: dict[str, Any] = {}
    raw: dict[str, str] = {}
    for key, value in props.items():
        d = BROKER_CONFIG_DEFS.get(key)
        if d is None or not d.dynamic:
            log.error("dynamic broker config %(key)s is not dynamic here; it is ignored", {"key": key})
            continue
        try:
            parsed[key] = d.parse(value)
            _check_supported(d, parsed[key])
        except (ValueError, ConfigError) as e:
            parsed.pop(key, None)
            log.error("a dynamic broker config is invalid and ignored: %(error)s",
                      {"error": e}, extra=fields(key=key, value=value))
            continue
        raw[key] = value
    return parsed, raw


# --- group configs (KIP-848: ConfigResource type GROUP) ----------------------------------------------

# Group config -> the broker config that supplies its default.
GROUP_CONFIG_SYNONYMS: dict[str, str] = {
    "consumer.session.timeout.ms": "group.consumer.session.timeout.ms",
    "consumer.heartbeat.interval.ms": "group.consumer.heartbeat.interval.ms",
    "share.session.timeout.ms": "group.share.session.timeout.ms",
    "share.heartbeat.interval.ms": "group.share.heartbeat.interval.ms",
    "share.record.lock.duration.ms": "group.share.record.lock.duration.ms",
    "share.delivery.count.limit": "group.share.delivery.count.limit",
}
GROUP_CONFIG_DEFS: dict[str, ConfigDef] = {
    "consumer.session.timeout.ms": _D(
        "consumer.session.timeout.ms", "int", None,
        "The timeout to detect client failures when using the consumer group protocol.", at_least(1)),
    "consumer.heartbeat.interval.ms": _D(
        "consumer.heartbeat.interval.ms", "int", None,
        "The heartbeat interval given to the members.", at_least(1)),
    # Share groups (KIP-932, docs/queues.md).
    "share.session.timeout.ms": _D(
        "share.session.timeout.ms", "int", None, "The timeout to detect share group member failures.", at_least(1)),
    "share.heartbeat.interval.ms": _D(
        "share.heartbeat.interval.ms", "int", None, "The heartbeat interval given to share group members.",
        at_least(1)),
    "share.record.lock.duration.ms": _D(
        "share.record.lock.duration.ms", "int", None, "The record acquisition lock duration.", at_least(1)),
    "share.delivery.count.limit": _D(
        "share.delivery.count.limit", "int", None, "Deliveries after which a record is archived.", at_least(1)),
    "share.auto.offset.reset": _D(
        "share.auto.offset.reset", "string", "latest", "Where a share group starts on a partition with no "
        "state: latest or earliest.", one_of("latest", "earliest")),
    "share.isolation.level": _D(
        "share.isolation.level", "string", "read_uncommitted", "read_committed acquires records up to the last "
        "stable offset only, and never records of aborted transactions.",
        one_of("read_uncommitted", "read_committed")),
    "pykbroker.share.dlq.topic": _D(
        "pykbroker.share.dlq.topic", "string", "", "pykbroker extension: the dead-letter topic that rejected "
        "records and records past the delivery count limit are appended to (docs/queues.md); empty: the "
        "topic's pykbroker.dlq.topic, if any.", _topic_name_or_empty),
}


def effective_group_config(broker: BrokerConfig, overrides: Mapping[str, str]) -> dict[str, Any]:
    """Each group config's value for a group: its own, else the broker's synonym, else the default."""
    out: dict[str, Any] = {}
    for k, d in GROUP_CONFIG_DEFS.items():
        if k in overrides:
            out[k] = d.parse(overrides[k])
        elif k in GROUP_CONFIG_SYNONYMS:
            out[k] = broker[GROUP_CONFIG_SYNONYMS[k]]
        else:
            out[k] = d.default
    return out


def validate_group_configs(broker: BrokerConfig, configs: Mapping[str, str | None]) -> dict[str, str]:
    """Kafka's GroupConfig.validate; ConfigError (INVALID_CONFIG) with Kafka's messages."""
    _refuse_nulls(configs, "group")
    out: dict[str, str] = {}
    for key, value in configs.items():
        d = GROUP_CONFIG_DEFS.get(key)
        if d is None:
            raise ConfigError(f"Unknown group config name: {key}")
        assert value is not None
        try:
            out[key] = str(d.parse(value))
        except ValueError as e:
            raise ConfigError(f"Invalid value {value} for configuration {key}: {e}") from None
        problem = d.validator(d.parse(value)) if d.validator is not None else None
        if problem:
            raise ConfigError(f"Invalid value {value} for configuration {key}: {problem}")
    eff = effective_group_config(broker, out)
    hb, session = eff["consumer.heartbeat.interval.ms"], eff["consumer.session.timeout.ms"]
    for ms, key, lo_key, hi_key in (
            (hb, "consumer.heartbeat.interval.ms", "group.consumer.min.heartbeat.interval.ms",
             "group.consumer.max.heartbeat.interval.ms"),
            (session, "consumer.session.timeout.ms", "group.consumer.min.session.timeout.ms",
             "group.consumer.max.session.timeout.ms")):
        if ms < broker[lo_key]:
            raise ConfigError(f"{key} must be greater than or equal to {lo_key}")
        if ms > broker[hi_key]:
            raise ConfigError(f"{key} must be less than or equal to {hi_key}")
    if session <= hb:
        raise ConfigError("consumer.session.timeout.ms must be greater than consumer.heartbeat.interval.ms")
    if eff["share.session.timeout.ms"] <= eff["share.heartbeat.interval.ms"]:
        raise ConfigError("share.session.timeout.ms must be greater than share.heartbeat.interval.ms")
    return out


# --- client metrics subscriptions (KIP-714: ConfigResource type CLIENT_METRICS) ----------------------

CLIENT_METRICS_CONFIG_DEFS: dict[str, ConfigDef] = {
    "metrics": _D("metrics", "list", [], "Subscription metrics list"),
    "interval.ms": _D("interval.ms", "int", 300000, "Push interval in milliseconds"),
    "match": _D("match", "list", [], "Client match pattern list"),
}
CLIENT_MATCH_PARAMS = frozenset({"client_instance_id", "client_id", "client_software_name",
                                 "client_software_version", "client_source_address", "client_source_port"})


def validate_client_metrics_configs(name: str, configs: Mapping[str, str | None]) -> dict[str, str]:
    """Kafka's ClientMetricsConfigs.validate: ConfigRequestError (INVALID_REQUEST) or ConfigError."""
    if not name:
        raise ConfigRequestError("Subscription name can't be empty")
    for key in configs:
        if key not in CLIENT_METRICS_CONFIG_DEFS:
            raise ConfigRequestError(f"Unknown client metrics configuration: {key}")
    out: dict[str, str] = {}
    for key, value in configs.items():
        if value is None:
            raise ConfigError(f"Null value not supported for client metrics configs: {key}")
        d = CLIENT_METRICS_CONFIG_DEFS[key]
        try:
            parsed = d.parse(value)
        except ValueError as e:
            raise ConfigError(f"Invalid value {value} for configuration {key}: {e}") from None
        if key == "interval.ms" and not 100 <= parsed <= 3600000:
            raise ConfigRequestError(f"Invalid value {parsed} for interval.ms, interval must be between 100 and "
                                     "3600000 (1 hour)")
        if key == "match":
            for pattern in parsed:
                parts = pattern.split("=")
                if len(parts) != 2 or parts[0].strip() not in CLIENT_MATCH_PARAMS:
                    raise ConfigError(f"Illegal client matching pattern: {pattern}")
                try:
                    re.compile(parts[1].strip())
                except re.error:
                    raise ConfigError(f"Illegal client matching pattern: {pattern}") from None
        out[key] = value
    return out


# --- IncrementalAlterConfigs operations ---------------------------------------------------------------

OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
_OP_NAMES = {OP_SET: "SET", OP_DELETE: "DELETE", OP_APPEND: "APPEND", OP_SUBTRACT: "SUBTRACT"}


def apply_incremental_ops(current: Mapping[str, str], ops: Iterable[tuple[str, int, str | None]],
                          definition: Callable[[str], ConfigDef | None],
                          default: Callable[[str], str | None]) -> dict[str, str]:
    """Apply SET/DELETE/APPEND/SUBTRACT to a resource's stored configs, as Kafka's controller does.

    APPEND and SUBTRACT work on LIST configs only (INVALID_CONFIG otherwise) and start from the
    stored value, else the config's default; APPEND skips values already present.
    """
    out = dict(current)
    for name, op, value in ops:
        if op not in _OP_NAMES:
            raise ConfigRequestError(f"Unknown operations type {op}")
        if op == OP_SET:
            assert value is not None
            out[name] = value
        elif op == OP_DELETE:
            out.pop(name, None)
        else:
            d = definition(name)
            if d is None or d.type != "list":
                raise ConfigError(f"Can't {_OP_NAMES[op]} to key {name} because its type is not LIST.")
            old = out.get(name)
            if old is None:
                old = default(name)
            parts = [p for p in (old or "").split(",") if p]
            for item in (value or "").split(","):
                if op == OP_APPEND:
                    if item not in parts:
                        parts.append(item)
                elif item in parts:
                    parts.remove(item)
            out[name] = ",".join(parts)
    return out


def effective_topic_config(broker: BrokerConfig, overrides: Mapping[str, str]) -> dict[str, Any]:
    """Every topic config with its effective (parsed) value: override, else broker default."""
    out: dict[str, Any] = {}
    for key, d in TOPIC_CONFIG_DEFS.items():
        if key in overrides:
            out[key] = d.parse(overrides[key])
        else:
            out[key] = broker.topic_default(key)
    return out


def log_config_for(broker: BrokerConfig, overrides: Mapping[str, str]) -> LogConfig:
    eff = effective_topic_config(broker, overrides)
    policy = eff["cleanup.policy"]
    return LogConfig(
        segment_bytes=eff["segment.bytes"],
        segment_ms=eff["segment.ms"],
        segment_jitter_ms=eff["segment.jitter.ms"],
        segment_index_bytes=eff["segment.index.bytes"],
        index_interval_bytes=eff["index.interval.bytes"],
        retention_ms=eff["retention.ms"],
        retention_bytes=eff["retention.bytes"],
        max_message_bytes=eff["max.message.bytes"],
        message_timestamp_type=eff["message.timestamp.type"],
        flush_messages=eff["flush.messages"],
        flush_ms=eff["flush.ms"],
        file_delete_delay_ms=eff["file.delete.delay.ms"],
        cleanup_policy=",".join(policy),
        preallocate=eff["preallocate"],
        compression_type=eff["compression.type"],
        message_timestamp_before_max_ms=eff["message.timestamp.before.max.ms"],
        message_timestamp_after_max_ms=eff["message.timestamp.after.max.ms"],
        message_timestamp_difference_max_ms=eff["message.timestamp.difference.max.ms"],
    )


def load_config(
    path: str | os.PathLike[str] | None,
    overrides: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> BrokerConfig:
    """File, then PYKBROKER_* environment, then ``--override key=value``; later wins."""
    raw: dict[str, str] = {}
    sources: dict[str, str] = {}
    if path is not None:
        try:
            from_file = parse_properties(Path(path).read_text())
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e}") from None
        raw.update(from_file)
        sources.update(dict.fromkeys(from_file, f"config file {path}"))
    env = environ if environ is not None else os.environ
    for name in env:
        if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX):
            raw[env_to_key(name)] = env[name]
            sources[env_to_key(name)] = f"environment variable {name}"
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--override {item!r} is not of the form key=value")
        k, v = item.split("=", 1)
        raw[k.strip()] = v
        sources[k.strip()] = f"--override {k.strip()}=..."
    return BrokerConfig(raw, sources)
