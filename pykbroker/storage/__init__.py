"""Storage layer: segmented partition logs with Kafka's on-disk format."""

from pykbroker.storage.log import AppendResult, Log, OffsetOutOfRange, ReadResult
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.log_manager import LogManager

__all__ = ["AppendResult", "Log", "LogConfig", "LogManager", "OffsetOutOfRange", "ReadResult"]
