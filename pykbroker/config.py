"""Broker configuration: Kafka's ``server.properties`` names, types and defaults.

Users bring their Kafka habits and files, so the keys are Kafka's own.  A key
we do not know, or a value that does not parse, stops the broker at start with
a message naming the key: a typo silently ignored is a production incident
waiting to happen.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pykbroker.storage.log_config import LogConfig

ENV_PREFIX = "PYKBROKER_"

LONG_MAX = 9223372036854775807


class ConfigError(ValueError):
    """An unknown key or an invalid value; the message names the key."""


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
    # Kafka keys we accept for compatibility but that do not change behaviour yet.
    inert: bool = False

    def parse(self, raw: str) -> Any:
        raw = raw.strip()
        if self.type in ("int", "long"):
            value: Any = int(raw)
            if self.type == "int" and not -(2**31) <= value < 2**31:
                raise ValueError(f"{value} is out of range for an int")
            if not -(2**63) <= value < 2**63:
                raise ValueError(f"{value} is out of range for a long")
        elif self.type == "bool":
            value = _parse_bool(raw)
        elif self.type == "list":
            value = _parse_list(raw)
        elif self.type == "double":
            value = float(raw)
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


def at_least(n: int) -> Callable[[Any], str | None]:
    return lambda v: None if v >= n else f"value must be at least {n}"


def one_of(*options: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in options else f"value must be one of {', '.join(options)}"


def _valid_policy(v: Any) -> str | None:
    parts = [p.strip() for p in (v if isinstance(v, list) else str(v).split(","))]
    if not parts or any(p not in ("delete", "compact") for p in parts):
        return "value must be a list of delete and/or compact"
    return None


def _valid_listeners(v: Any) -> str | None:
    for item in v:
        try:
            parse_listener(item)
        except ValueError as e:
            return str(e)
    return None


_D = ConfigDef
BROKER_CONFIG_DEFS: dict[str, ConfigDef] = {
    d.name: d
    for d in [
        _D("broker.id", "int", 0, "This broker's id.", at_least(-1)),
        _D("node.id", "int", -1, "Alias of broker.id (KRaft naming); -1 means use broker.id."),
        _D("listeners", "list", ["PLAINTEXT://127.0.0.1:9092"], "Addresses to listen on.", _valid_listeners),
        _D("advertised.listeners", "list", [], "Addresses given to clients; defaults to listeners.",
           _valid_listeners),
        _D("listener.security.protocol.map", "string",
           "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"),
        _D("inter.broker.listener.name", "string", "", inert=True),
        _D("log.dirs", "list", [], "Directories holding partition logs."),
        _D("log.dir", "string", "/tmp/kafka-logs", "Used when log.dirs is unset."),
        _D("zookeeper.connect", "string", "", "ZooKeeper connection string; empty means embedded metadata."),
        _D("zookeeper.session.timeout.ms", "int", 18000, inert=True),
        _D("zookeeper.connection.timeout.ms", "int", 18000, inert=True),
        _D("num.partitions", "int", 1, "Default partition count for new topics.", at_least(1)),
        _D("default.replication.factor", "int", 1, "Default replication factor.", at_least(1)),
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
        _D("log.flush.start.offset.checkpoint.interval.ms", "int", 60000, validator=at_least(0)),
        _D("log.segment.delete.delay.ms", "long", 60000, validator=at_least(0), dynamic=True),
        _D("log.cleanup.policy", "list", ["delete"], validator=_valid_policy, dynamic=True),
        _D("log.cleaner.enable", "bool", True),
        _D("log.cleaner.delete.retention.ms", "long", 86400000, dynamic=True),
        _D("log.cleaner.min.compaction.lag.ms", "long", 0, dynamic=True),
        _D("log.cleaner.max.compaction.lag.ms", "long", LONG_MAX, dynamic=True),
        _D("log.cleaner.min.cleanable.ratio", "double", 0.5, dynamic=True),
        _D("log.cleaner.backoff.ms", "long", 15000),
        _D("log.cleaner.threads", "int", 1, inert=True),
        _D("log.preallocate", "bool", False, dynamic=True),
        _D("log.message.timestamp.type", "string", "CreateTime",
           validator=one_of("CreateTime", "LogAppendTime"), dynamic=True),
        _D("log.message.timestamp.before.max.ms", "long", LONG_MAX, validator=at_least(0), dynamic=True),
        _D("log.message.timestamp.after.max.ms", "long", LONG_MAX, validator=at_least(0), dynamic=True),
        _D("log.message.timestamp.difference.max.ms", "long", LONG_MAX, dynamic=True),
        _D("message.max.bytes", "int", 1048588, validator=at_least(0), dynamic=True),
        _D("socket.request.max.bytes", "int", 104857600, validator=at_least(1)),
        _D("socket.send.buffer.bytes", "int", 102400),
        _D("socket.receive.buffer.bytes", "int", 102400),
        _D("connections.max.idle.ms", "long", 600000),
        _D("num.network.threads", "int", 3, inert=True),
        _D("num.io.threads", "int", 8, inert=True),
        _D("num.recovery.threads.per.data.dir", "int", 2, inert=True),
        _D("num.replica.fetchers", "int", 1, inert=True),
        _D("min.insync.replicas", "int", 1, validator=at_least(1), dynamic=True),
        _D("unclean.leader.election.enable", "bool", False, dynamic=True),
        _D("compression.type", "string", "producer",
           validator=one_of("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"), dynamic=True),
        _D("offsets.topic.num.partitions", "int", 50, validator=at_least(1)),
        _D("offsets.topic.replication.factor", "int", 3, validator=at_least(1)),
        _D("offsets.retention.minutes", "int", 10080, validator=at_least(1)),
        _D("offsets.topic.segment.bytes", "int", 104857600, validator=at_least(1)),
        _D("transaction.state.log.num.partitions", "int", 50, validator=at_least(1)),
        _D("transaction.state.log.replication.factor", "int", 3, validator=at_least(1)),
        _D("transaction.state.log.min.isr", "int", 2, validator=at_least(1)),
        _D("transaction.max.timeout.ms", "int", 900000, validator=at_least(1)),
        _D("transactional.id.expiration.ms", "int", 604800000, validator=at_least(1)),
        _D("producer.id.expiration.ms", "int", 86400000, validator=at_least(1)),
        _D("producer.id.expiration.check.interval.ms", "int", 600000, validator=at_least(1)),
        _D("group.initial.rebalance.delay.ms", "int", 3000),
        _D("group.min.session.timeout.ms", "int", 6000),
        _D("group.max.session.timeout.ms", "int", 1800000),
        _D("group.max.size", "int", 2147483647, validator=at_least(1)),
        # --- group coordinator ---
        _D("offsets.retention.check.interval.ms", "long", 600000, validator=at_least(1)),
        _D("offset.metadata.max.bytes", "int", 4096, validator=at_least(0)),
        _D("offsets.load.buffer.size", "int", 5242880, validator=at_least(1), inert=True),
        _D("offsets.commit.timeout.ms", "int", 5000, validator=at_least(1), inert=True),
        _D("group.coordinator.rebalance.protocols", "list", ["classic", "consumer"]),
        _D("group.consumer.session.timeout.ms", "int", 45000, validator=at_least(1)),
        _D("group.consumer.min.session.timeout.ms", "int", 45000, validator=at_least(1)),
        _D("group.consumer.max.session.timeout.ms", "int", 60000, validator=at_least(1)),
        _D("group.consumer.heartbeat.interval.ms", "int", 5000, validator=at_least(1)),
        _D("group.consumer.min.heartbeat.interval.ms", "int", 5000, validator=at_least(1)),
        _D("group.consumer.max.heartbeat.interval.ms", "int", 15000, validator=at_least(1)),
        _D("group.consumer.max.size", "int", 2147483647, validator=at_least(1)),
        _D("group.consumer.assignors", "list", ["uniform", "range"]),
        _D("group.consumer.migration.policy", "string", "bidirectional",
           validator=one_of("disabled", "downgrade", "upgrade", "bidirectional")),
        # --- end group coordinator ---
        _D("fetch.max.bytes", "int", 57671680, validator=at_least(1024)),
        _D("replica.lag.time.max.ms", "long", 30000),
        _D("request.timeout.ms", "int", 30000),
        _D("controlled.shutdown.enable", "bool", True, inert=True),
        _D("log.flush.on.ack", "bool", False,
           "pykbroker: fsync the log before acknowledging acks=1/all, so that a lone broker loses nothing "
           "acknowledged on power loss. Kafka itself relies on replication instead."),
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
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "min.insync.replicas": "min.insync.replicas",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
    "compression.type": "compression.type",
    "preallocate": "log.preallocate",
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

    def __init__(self, raw: Mapping[str, str] | None = None) -> None:
        self._values: dict[str, Any] = {k: d.default for k, d in BROKER_CONFIG_DEFS.items()}
        self._explicit: set[str] = set()
        for key, value in (raw or {}).items():
            self.set(key, value)
        self._check_consistency()

    def set(self, key: str, value: str) -> None:
        d = BROKER_CONFIG_DEFS.get(key)
        if d is None:
            raise ConfigError(f"unknown configuration {key!r}")
        try:
            self._values[key] = d.parse(value)
        except ValueError as e:
            raise ConfigError(f"invalid value {value!r} for configuration {key!r}: {e}") from None
        self._explicit.add(key)

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

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def is_explicit(self, key: str) -> bool:
        return key in self._explicit

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
    def listeners(self) -> list[Listener]:
        return [parse_listener(x) for x in self["listeners"]]

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
}


def validate_topic_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """Check topic configs as CreateTopics/AlterConfigs would; returns the normalised strings."""
    out: dict[str, str] = {}
    for key, value in configs.items():
        d = TOPIC_CONFIG_DEFS.get(key)
        if d is None:
            raise ConfigError(f"Unknown topic config name: {key}")
        if value is None:
            raise ConfigError(f"Null value not supported for topic configs: {key}")
        try:
            parsed = d.parse(value)
        except ValueError as e:
            raise ConfigError(f"Invalid value {value} for configuration {key}: {e}") from None
        rendered = d.render(parsed)
        assert rendered is not None
        out[key] = rendered
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
    )


def load_config(
    path: str | os.PathLike[str] | None,
    overrides: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> BrokerConfig:
    """File, then PYKBROKER_* environment, then ``--override key=value``; later wins."""
    raw: dict[str, str] = {}
    if path is not None:
        try:
            raw.update(parse_properties(Path(path).read_text()))
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e}") from None
    raw.update(settings_from_env(environ if environ is not None else os.environ))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--override {item!r} is not of the form key=value")
        k, v = item.split("=", 1)
        raw[k.strip()] = v
    return BrokerConfig(raw)
