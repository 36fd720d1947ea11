"""Owns every partition log across the broker's ``log.dirs`` (Kafka's LogManager).

Per log dir it keeps Kafka's bookkeeping files: the ``.kafka_cleanshutdown`` marker
(present only between a clean shutdown and the next startup; its absence means logs
must be recovered) and the ``recovery-point-offset-checkpoint`` /
``log-start-offset-checkpoint`` files (text: version line, count line, then
``topic partition offset`` lines), always replaced atomically.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from pykbroker.storage.log import Log
from pykbroker.storage.log_config import LogConfig

__all__ = [
    "CLEAN_SHUTDOWN_FILE",
    "LOG_START_OFFSET_CHECKPOINT_FILE",
    "RECOVERY_POINT_CHECKPOINT_FILE",
    "LogManager",
    "parse_partition_dir_name",
    "read_offset_checkpoint",
    "write_offset_checkpoint",
]

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
RECOVERY_POINT_CHECKPOINT_FILE = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT_FILE = "log-start-offset-checkpoint"
DELETE_DIR_SUFFIX = "-delete"
FUTURE_DIR_SUFFIX = "-future"
STRAY_DIR_SUFFIX = "-stray"
METADATA_PARTITION_DIR = "__cluster_metadata-0"  # the KRaft metadata log is not ours to load
_CHECKPOINT_VERSION = 0


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


MAX_DIR_NAME_BYTES = 255


def delete_dir_name(topic: str, partition: int) -> str:
    """Kafka's ``<topic>-<partition>.<uuid>-delete``, the topic cut short so the name fits in 255 bytes.

    A legal topic name is up to 249 characters, so the full form can exceed the file-name limit.
    """
    suffix = f"-{partition}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"
    return topic[: MAX_DIR_NAME_BYTES - len(suffix)] + suffix


def parse_partition_dir_name(name: str) -> tuple[str, int] | None:
    """``<topic>-<partition>`` -> (topic, partition); topics may contain '-', so split on the last."""
    topic, sep, partition = name.rpartition("-")
    if not sep or not topic or not partition.isdigit() or partition != str(int(partition)):
        return None
    return topic, int(partition)


def read_offset_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """Parse a Kafka offset checkpoint file; a missing file is empty, a malformed one raises."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    lines = text.splitlines()
    if len(lines) < 2 or lines[0].strip() != str(_CHECKPOINT_VERSION):
        raise ValueError(f"{path}: unsupported checkpoint header")
    count = int(lines[1])
    entries = lines[2:]
    if len(entries) < count:
        raise ValueError(f"{path}: expected {count} entries, found {len(entries)}")
    out: dict[tuple[str, int], int] = {}
    for line in entries[:count]:
        parts = line.split()
        if len(parts) != 3:
            raise ValueError(f"{path}: malformed line {line!r}")
        out[(parts[0], int(parts[1]))] = int(parts[2])
    return out


def write_offset_checkpoint(path: Path, offsets: Mapping[tuple[str, int], int]) -> None:
    """Atomically replace ``path``: write a temp file, fsync it, rename, fsync the dir."""
    lines = [str(_CHECKPOINT_VERSION), str(len(offsets))]
    lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(offsets.items())]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LogManager:
    """Creates, loads, checkpoints, retains and deletes the partition logs of this broker."""

    def __init__(
        self,
        log_dirs: list[Path],
        default_config: LogConfig,
        *,
        now_ms: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        if not log_dirs:
            raise ValueError("at least one log dir is required")
        self.log_dirs = [Path(d) for d in log_dirs]
        self.default_config = default_config
        self._now_ms = now_ms
        self._logs: dict[tuple[str, int], Log] = {}
        self._log_dir_of: dict[tuple[str, int], Path] = {}
        self._lock = threading.RLock()
        self._checkpoint_lock = threading.Lock()
        self._started = False

    # -- startup ---------------------------------------------------------------------------------

    def startup(self, config_for: Callable[[str], LogConfig] | None = None) -> None:
        """Load every partition log, recovering those of dirs without a clean-shutdown marker.

        ``config_for(topic)`` supplies per-topic configs (default: the default config).
        """
        started = time.monotonic()
        loaded = recovered = 0
        for log_dir in self.log_dirs:
            log_dir.mkdir(parents=True, exist_ok=True)
            marker = log_dir / CLEAN_SHUTDOWN_FILE
            clean = marker.exists()
            recovery_points = self._read_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT_FILE)
            start_offsets = self._read_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT_FILE)
            for entry in sorted(os.scandir(log_dir), key=lambda e: e.name):
                if not entry.is_dir():
                    continue
                path = Path(entry.path)
                if entry.name.endswith(DELETE_DIR_SUFFIX):
                    log.info("Finishing deletion of %s", path)
                    shutil.rmtree(path, ignore_errors=True)
                    continue
                if entry.name.endswith((FUTURE_DIR_SUFFIX, STRAY_DIR_SUFFIX)) or entry.name == METADATA_PARTITION_DIR:
                    continue
                tp = parse_partition_dir_name(entry.name)
                if tp is None:
                    continue
                with self._lock:
                    if tp in self._logs:
                        raise RuntimeError(f"duplicate log directories for {tp[0]}-{tp[1]}: {path}")
                config = config_for(tp[0]) if config_for is not None else self.default_config
                partition_log = Log.open(
                    path,
                    config,
                    recover=not clean,
                    now_ms=self._now_ms,
                    log_start_offset=start_offsets.get(tp),
                    recovery_point=recovery_points.get(tp),
                )
                with self._lock:
                    self._logs[tp] = partition_log
                    self._log_dir_of[tp] = log_dir
                loaded += 1
                recovered += 0 if clean else 1
            # Only remove the marker once everything it vouched for is loaded.
            if clean:
                marker.unlink()
                _fsync_dir(log_dir)
        self._started = True
        log.info(
            "Loaded %d partition log(s) from %d log dir(s) in %.0f ms (%d recovered after unclean shutdown)",
            loaded,
            len(self.log_dirs),
            (time.monotonic() - started) * 1000,
            recovered,
        )

    @staticmethod
    def _read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
        try:
            return read_offset_checkpoint(path)
        except (ValueError, OSError) as exc:
            # A bad checkpoint only costs a longer recovery / an earlier start offset.
            log.warning("Ignoring unreadable checkpoint %s: %s", path, exc)
            return {}

    # -- lookup / creation -----------------------------------------------------------------------

    def get_log(self, topic: str, partition: int) -> Log | None:
        with self._lock:
            return self._logs.get((topic, partition))

    def all_logs(self) -> dict[tuple[str, int], Log]:
        with self._lock:
            return dict(self._logs)

    def get_or_create_log(self, topic: str, partition: int, config: LogConfig) -> Log:
        """Existing log, or a new empty one in the log dir holding the fewest partitions."""
        tp = (topic, partition)
        with self._lock:
            existing = self._logs.get(tp)
            if existing is not None:
                return existing
            counts = dict.fromkeys(self.log_dirs, 0)
            for d in self._log_dir_of.values():
                counts[d] = counts.get(d, 0) + 1
            log_dir = min(self.log_dirs, key=lambda d: counts[d])
            log_dir.mkdir(parents=True, exist_ok=True)
            path = log_dir / f"{topic}-{partition}"
            partition_log = Log.open(path, config, recover=False, now_ms=self._now_ms)
            _fsync_dir(log_dir)
            self._logs[tp] = partition_log
            self._log_dir_of[tp] = log_dir
            log.info("Created log for partition %s-%d in %s", topic, partition, log_dir)
            return partition_log

    def delete_log(self, topic: str, partition: int) -> None:
        """Rename the dir to Kafka's ``<tp>.<uuid>-delete`` form, then remove it."""
        tp = (topic, partition)
        with self._lock:
            partition_log = self._logs.pop(tp, None)
            self._log_dir_of.pop(tp, None)
        if partition_log is None:
            return
        partition_log.close()
        target = partition_log.dir.with_name(delete_dir_name(topic, partition))
        try:
            os.rename(partition_log.dir, target)
            _fsync_dir(target.parent)
        except FileNotFoundError:
            return
        shutil.rmtree(target, ignore_errors=True)
        log.info("Deleted log for partition %s-%d", topic, partition)

    # -- background work -------------------------------------------------------------------------

    def run_retention(self) -> None:
        """Apply time/size/start-offset retention to every log (log.retention.check.interval.ms)."""
        now = self._now_ms()
        for tp, partition_log in self.all_logs().items():
            try:
                partition_log.apply_retention(now)
            except RuntimeError:  # closed concurrently (deleted)
                continue
            except OSError:
                log.exception("Retention failed for %s-%d", tp[0], tp[1])

    def expire_producers(self, now_ms: int, expiration_ms: int) -> int:
        """Forget idle producer ids (producer.id.expiration.ms) in every log; returns how many.

        Meant to run every producer.id.expiration.check.interval.ms.
        """
        removed = 0
        for partition_log in self.all_logs().values():
            removed += partition_log.remove_expired_producers(now_ms, expiration_ms)
        return removed

    def flush_dirty(self) -> None:
        """fsync logs whose flush.messages / flush.ms / roll says so (worker-thread safe)."""
        now = self._now_ms()
        for tp, partition_log in self.all_logs().items():
            if partition_log.needs_flush(now):
                try:
                    partition_log.flush()
                except OSError:
                    log.exception("Flush failed for %s-%d", tp[0], tp[1])

    def checkpoint(self) -> None:
        """Persist recovery points and log start offsets of every log dir atomically."""
        with self._checkpoint_lock:
            with self._lock:
                items = [(tp, self._log_dir_of[tp], lg) for tp, lg in self._logs.items()]
            for log_dir in self.log_dirs:
                if not log_dir.exists():
                    continue
                in_dir = [(tp, lg) for tp, d, lg in items if d == log_dir]
                write_offset_checkpoint(
                    log_dir / RECOVERY_POINT_CHECKPOINT_FILE, {tp: lg.recovery_point for tp, lg in in_dir}
                )
                write_offset_checkpoint(
                    log_dir / LOG_START_OFFSET_CHECKPOINT_FILE, {tp: lg.log_start_offset for tp, lg in in_dir}
                )

    def shutdown(self) -> None:
        """Flush and close all logs, checkpoint, then mark each log dir cleanly shut down."""
        logs = self.all_logs()
        for partition_log in logs.values():
            partition_log.flush()
        self.checkpoint()
        for partition_log in logs.values():
            partition_log.close()
        for log_dir in self.log_dirs:
            if log_dir.exists():
                (log_dir / CLEAN_SHUTDOWN_FILE).touch()
                with contextlib.suppress(OSError):
                    _fsync_dir(log_dir)
        log.info("Log manager shut down cleanly (%d logs)", len(logs))
