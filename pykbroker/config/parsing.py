"""Plain parsing of broker settings: the ConfigDef type, single values, listeners, properties files
and the environment. Nothing here knows which keys exist (that is :mod:`.definitions`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pykbroker.hints import NOT_IMPLEMENTED_HINT
from pykbroker.logsetup import parse_levels
from pykbroker.security.acl_authorizer import AUTHORIZER_CLASS_NAMES, parse_super_users

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


def _parse_http_listener(key: str, value: str, *, paths: tuple[str, ...], scheme_rule: str, path_rule: str,
                         example: str, https: bool = False, hint: str = "") -> tuple[str, str, int]:
    """``http://host:port`` (or ``host:port``; ``https://`` where ``https``) of an HTTP endpoint the broker serves
    → (scheme, host, port). Raises ValueError, saying why."""
    text = value.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in (("http", "https") if https else ("http",)):
        raise ValueError(f"{key} must be {scheme_rule}, not {value!r}{hint}")
    if parts.path not in paths or parts.query:
        raise ValueError(f"{key} {value!r}: {path_rule}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None or not parts.hostname:
        raise ValueError(f"{key} {value!r} needs a host and a port, e.g. {example}")
    return parts.scheme, parts.hostname, port


def parse_metrics_listener(value: str) -> tuple[str, int]:
    """``http://host:port`` (or ``host:port``) → (host, port). Raises ValueError, saying why."""
    _, host, port = _parse_http_listener(
        "pykbroker.metrics.listener", value, paths=("", "/", "/metrics"), path_rule="the path is always /metrics",
        scheme_rule="http://host:port", hint=" (no TLS on the metrics endpoint; put a proxy in front if it needs one)",
        example="http://0.0.0.0:9404")
    return host, port


def parse_console_listener(value: str) -> tuple[str, int]:
    """``http://host:port`` (or ``host:port``) of the web console → (host, port). Raises ValueError, saying why."""
    _, host, port = _parse_http_listener(
        "pykbroker.console.listener", value, paths=("", "/"), path_rule="the console is served at /, give no path",
        scheme_rule="http://host:port", hint=" (no TLS on the console; put a proxy in front if it needs one)",
        example="http://127.0.0.1:8080")
    return host, port


def parse_schema_registry_listener(value: str, key: str = "pykbroker.schema.registry.listener"
                                   ) -> tuple[str, str, int]:
    """``http://host:port`` or ``https://host:port`` of the schema registry → (scheme, host, port). Raises
    ValueError, saying why."""
    return _parse_http_listener(key, value, paths=("", "/"), https=True,
                                scheme_rule="http://host:port or https://host:port",
                                path_rule="the registry is served at /, give no path", example="http://0.0.0.0:8081")


def schema_registry_advertised_url(listener: str, advertised: str) -> str:
    """The registry URL other brokers forward writes to: the advertised listener, else the listener with a
    wildcard host replaced as the broker's advertised listeners replace it."""
    if advertised.strip():
        scheme, host, port = parse_schema_registry_listener(advertised, "pykbroker.schema.registry.advertised.listener")
    else:
        scheme, host, port = parse_schema_registry_listener(listener)
        if host in ("", "0.0.0.0", "::"):
            host = "::1" if host == "::" else "127.0.0.1"
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


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


def valid_metrics_listener(value: Any) -> str | None:
    if not value:
        return None
    try:
        parse_metrics_listener(value)
    except ValueError as e:
        return str(e)
    return None


def valid_console_listener(value: Any) -> str | None:
    if not value:
        return None
    try:
        parse_console_listener(value)
    except ValueError as e:
        return str(e)
    return None


def valid_schema_registry_listener(value: Any) -> str | None:
    if not value:
        return None
    try:
        parse_schema_registry_listener(value)
    except ValueError as e:
        return str(e)
    return None


def valid_log_levels(value: Any) -> str | None:
    try:
        parse_levels(value)
    except ValueError as e:
        return str(e)
    return None


def one_of(*options: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in options else f"value must be one of {', '.join(options)}"


def valid_topic_name_or_empty(value: Any) -> str | None:
    """A dead-letter topic setting: empty (none) or a legal topic name."""
    if not value or (re.fullmatch(r"[a-zA-Z0-9._-]{1,249}", value) and value not in (".", "..")):
        return None
    return "value must be a legal topic name"


def valid_authorizer_class(value: object) -> str | None:
    if value in ("", None) or value in AUTHORIZER_CLASS_NAMES:
        return None
    return ("only Kafka's ACL authorizers are implemented: " + ", ".join(sorted(AUTHORIZER_CLASS_NAMES))
            + " (or empty for none)")


def valid_super_users(value: object) -> str | None:
    try:
        parse_super_users(str(value or ""))
    except ValueError as e:
        return str(e)
    return None


def valid_policy(v: Any) -> str | None:
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


def valid_protocol_map(v: Any) -> str | None:
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


def valid_zk_connect(v: Any) -> str | None:
    if not v or not str(v).strip():
        return None  # empty: embedded metadata
    try:
        parse_zk_connect(str(v))
    except ValueError as e:
        return str(e)
    return None


def valid_security_protocol(v: Any) -> str | None:
    if str(v).strip().upper() not in SECURITY_PROTOCOLS:
        return f"{v!r} is not one of {', '.join(SECURITY_PROTOCOLS)}"
    return None


def valid_ibp_version(v: Any) -> str | None:
    """Kafka's MetadataVersion names as inter.broker.protocol.version takes them: 0.10.2, 2.8, 3.9-IV0."""
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?(-IV\d+)?", str(v).strip()):
        return f"{v!r} is not a Kafka version such as 3.9 or 3.9-IV0"
    return None


def valid_listeners(v: Any) -> str | None:
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
# The listener name whose ssl.* keys (listener.name.schema_registry.ssl.*) apply to the https schema registry
# listener only; it is not a Kafka listener, so it need not be in 'listeners'.
SCHEMA_REGISTRY_LISTENER = "SCHEMA_REGISTRY"


def valid_local_endpoints(v: Any) -> str | None:
    try:
        parse_local_endpoints(v)
    except ValueError as e:
        return str(e)
    return None


def valid_ip_overrides(v: Any) -> str | None:
    try:
        parse_ip_overrides(v)
    except ValueError as e:
        return str(e)
    return None


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


def check_supported(d: ConfigDef, value: Any) -> None:
    reason = d.unsupported(value) if d.unsupported is not None else None
    if reason:
        raise ConfigError(f"{d.name} is not supported yet: {reason} ({NOT_IMPLEMENTED_HINT})")


def env_to_key(name: str) -> str:
    """Map ``PYKBROKER_LOG_RETENTION_HOURS`` to ``log.retention.hours`` (Kafka image convention).

    ``___`` stands for ``-``, ``__`` for ``_`` and ``_`` for ``.``.
    """
    body = name[len(ENV_PREFIX):].lower()
    return body.replace("___", "\0").replace("__", "\1").replace("_", ".").replace("\0", "-").replace("\1", "_")


def settings_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {env_to_key(k): v for k, v in environ.items() if k.startswith(ENV_PREFIX) and len(k) > len(ENV_PREFIX)}
