"""Per-topic effective log settings, named and defaulted as Kafka's topic configs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["TOPIC_CONFIG_FIELDS", "LogConfig"]

_LONG_MAX = 9223372036854775807


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Effective log configuration of one topic; times in ms, sizes in bytes."""

    segment_bytes: int = 1073741824
    segment_ms: int = 604800000
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10485760
    index_interval_bytes: int = 4096
    retention_ms: int = 604800000  # -1 = unlimited
    retention_bytes: int = -1  # -1 = unlimited
    max_message_bytes: int = 1048588
    message_timestamp_type: str = "CreateTime"  # or "LogAppendTime"
    flush_messages: int = _LONG_MAX
    flush_ms: int = _LONG_MAX
    file_delete_delay_ms: int = 60000
    cleanup_policy: str = "delete"  # "delete" | "compact" | "compact,delete"
    preallocate: bool = False
    compression_type: str = "producer"  # or uncompressed, gzip, snappy, lz4, zstd: the codec batches are stored in
    message_timestamp_before_max_ms: int = _LONG_MAX
    message_timestamp_after_max_ms: int = _LONG_MAX
    message_timestamp_difference_max_ms: int = _LONG_MAX  # deprecated by KIP-937; used when before/after unset

    @property
    def timestamp_before_max_ms(self) -> int:
        """Oldest accepted CreateTime, as ``now - this``: before.max.ms, else the legacy difference.max.ms."""
        if self.message_timestamp_before_max_ms != _LONG_MAX:
            return self.message_timestamp_before_max_ms
        return self.message_timestamp_difference_max_ms

    @property
    def timestamp_after_max_ms(self) -> int:
        """Newest accepted CreateTime, as ``now + this``: after.max.ms, else the legacy difference.max.ms."""
        if self.message_timestamp_after_max_ms != _LONG_MAX:
            return self.message_timestamp_after_max_ms
        return self.message_timestamp_difference_max_ms

    @property
    def delete_enabled(self) -> bool:
        """Whether time/size retention applies (``delete`` is in cleanup.policy)."""
        return "delete" in (p.strip() for p in self.cleanup_policy.split(","))

    @property
    def compact_enabled(self) -> bool:
        return "compact" in (p.strip() for p in self.cleanup_policy.split(","))

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    def with_properties(self, props: Mapping[str, str | None]) -> LogConfig:
        """Overlay Kafka topic config properties (``segment.bytes`` ...) on this config.

        Unknown names are ignored (they belong to other layers); ``None`` values mean
        "use this config's value".  Raises ``ValueError`` for unparsable values.
        """
        changes: dict[str, object] = {}
        for name, value in props.items():
            field_name = TOPIC_CONFIG_FIELDS.get(name)
            if field_name is None or value is None:
                continue
            current = getattr(self, field_name)
            if isinstance(current, bool):
                lowered = value.strip().lower()
                if lowered not in ("true", "false"):
                    raise ValueError(f"{name} must be true or false, got {value!r}")
                changes[field_name] = lowered == "true"
            elif isinstance(current, int):
                changes[field_name] = int(value)
            else:
                changes[field_name] = value.strip()
        return dataclasses.replace(self, **changes) if changes else self  # type: ignore[arg-type]


# Kafka topic config name -> LogConfig field.
TOPIC_CONFIG_FIELDS: dict[str, str] = {
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "segment.jitter.ms": "segment_jitter_ms",
    "segment.index.bytes": "segment_index_bytes",
    "index.interval.bytes": "index_interval_bytes",
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "max.message.bytes": "max_message_bytes",
    "message.timestamp.type": "message_timestamp_type",
    "flush.messages": "flush_messages",
    "flush.ms": "flush_ms",
    "file.delete.delay.ms": "file_delete_delay_ms",
    "cleanup.policy": "cleanup_policy",
    "preallocate": "preallocate",
    "compression.type": "compression_type",
    "message.timestamp.before.max.ms": "message_timestamp_before_max_ms",
    "message.timestamp.after.max.ms": "message_timestamp_after_max_ms",
    "message.timestamp.difference.max.ms": "message_timestamp_difference_max_ms",
}
