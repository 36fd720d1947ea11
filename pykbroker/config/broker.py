"""Validated broker settings (:class:`BrokerConfig`) and how they are loaded: file, environment,
``--override``, then the dynamic layers from the metadata store.

Users bring their Kafka habits and files, so the keys are Kafka's own.  A key we do not know, or a
value that does not parse, stops the broker at start with a message naming the key: a typo silently
ignored is a production incident waiting to happen.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pykbroker.config.definitions import BROKER_CONFIG_DEFS, TOPIC_CONFIG_SYNONYMS, broker_config_synonyms
from pykbroker.config.parsing import (
    ENV_PREFIX,
    LISTENER_CONFIGS,
    LISTENER_PREFIX,
    SCHEMA_REGISTRY_LISTENER,
    SECURITY_PROTOCOLS,
    SSL_CONFIGS,
    ConfigError,
    Listener,
    check_supported,
    env_to_key,
    parse_listener,
    parse_protocol_map,
)
from pykbroker.hints import NOT_IMPLEMENTED_HINT
from pykbroker.logsetup import fields
from pykbroker.properties import parse_properties
from pykbroker.security.sasl.settings import check_config as check_sasl

log = logging.getLogger("pykbroker.config")

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


def unknown_key_hint(key: str) -> str:
    for prefix, why in _UNIMPLEMENTED_PREFIXES.items():
        if key.startswith(prefix):
            return f": a Kafka setting pykbroker does not implement ({why}; {NOT_IMPLEMENTED_HINT})"
    return ""


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
            raise ConfigError(f"unknown configuration {key!r}{unknown_key_hint(key)}")
        try:
            parsed = d.parse(value)
        except ValueError as e:
            raise ConfigError(f"invalid value {value!r} for configuration {key!r}: {e}") from None
        check_supported(d, parsed)
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
        registry = str(self["pykbroker.schema.registry.listener"] or "").strip()
        if self["pykbroker.schema.registry.authentication"] != "none" and not registry:
            raise ConfigError("configuration 'pykbroker.schema.registry.authentication' needs the schema registry: "
                              "set 'pykbroker.schema.registry.listener'")
        for listener, key in self._listener_values:
            if listener == SCHEMA_REGISTRY_LISTENER:
                if key not in SSL_CONFIGS:
                    raise ConfigError(f"configuration 'listener.name.{listener.lower()}.{key}': only ssl.* "
                                      "settings apply to the schema registry's https listener")
                if not registry.lower().startswith("https://"):
                    raise ConfigError(f"configuration 'listener.name.{listener.lower()}.{key}' applies to an https "
                                      "schema registry only: set 'pykbroker.schema.registry.listener' to "
                                      "https://host:port")
                continue
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
            check_supported(d, parsed[key])
        except (ValueError, ConfigError) as e:
            parsed.pop(key, None)
            log.error("a dynamic broker config is invalid and ignored: %(error)s",
                      {"error": e}, extra=fields(key=key, value=value))
            continue
        raw[key] = value
    return parsed, raw


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
