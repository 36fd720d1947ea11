"""Topic configs: their definitions, validation on CreateTopics/AlterConfigs, and the effective
values (override, else the broker's default) a partition's log is opened with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pykbroker.config.broker import BrokerConfig
from pykbroker.config.definitions import BROKER_CONFIG_DEFS, TOPIC_CONFIG_SYNONYMS
from pykbroker.config.parsing import (
    ConfigDef,
    ConfigError,
    at_least,
    check_supported,
    one_of,
    valid_policy,
    valid_topic_name_or_empty,
)
from pykbroker.hints import NOT_IMPLEMENTED_HINT
from pykbroker.storage.log_config import LogConfig

_D = ConfigDef


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
    "cleanup.policy": _D("cleanup.policy", "list", None, validator=valid_policy),
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
    "pykbroker.dlq.topic": _D("pykbroker.dlq.topic", "string", None, validator=valid_topic_name_or_empty),
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


def refuse_nulls(configs: Mapping[str, str | None], kind: str) -> None:
    """Kafka's message for null values in a topic's or group's configs."""
    nulls = [k for k, v in configs.items() if v is None]
    if nulls:
        raise ConfigError(f"Null value not supported for {kind} configs: {','.join(nulls)}")


def validate_topic_configs(configs: Mapping[str, str | None], broker: BrokerConfig | None = None) -> dict[str, str]:
    """Check topic configs as CreateTopics/AlterConfigs would; returns the normalised strings.

    With ``broker``, the combination with the broker's defaults is checked too (Kafka's
    LogConfig.validateValues: min.compaction.lag.ms must not exceed max.compaction.lag.ms).
    """
    refuse_nulls(configs, "topic")
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
        check_supported(d, parsed)
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
