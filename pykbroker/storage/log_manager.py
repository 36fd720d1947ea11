"""Owns every partition log across the broker's ``log.dirs`` (Kafka's LogManager).

Per log dir it keeps Kafka's bookkeeping files: the ``.kafka_cleanshutdown`` marker
(present only between a clean shutdown and the next startup; its absence means logs
must be recovered) and the ``recovery-point-offset-checkpoint`` /
``log-start-offset-checkpoint`` files (text: version line, count line, then
``topic partition offset`` lines), always replaced atomically.

Log dir failure (KIP-112): any OSError from a dir's files (ENOSPC, EIO, ...) takes the
whole dir offline, as Kafka does: its logs refuse every operation with
KAFKA_STORAGE_ERROR, the :class:`LogDirFailureChannel` queues the dir once for the
broker, which then closes the logs (:meth:`LogManager.handle_log_dir_failure`) and shuts
down if no dir is left.  Other dirs keep serving.  An offline dir gets no checkpoint and no
clean-shutdown marker, so the next start recovers it; a restart is what brings it back.
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
from dataclasses import dataclass
from pathlib import Path

from pykbroker.storage.log import KafkaStorageError, Log, out_of_descriptors
from pykbroker.storage.log_config import LogConfig

__all__ = [
    "CLEAN_SHUTDOWN_FILE",
    "LOG_START_OFFSET_CHECKPOINT_FILE",
    "RECOVERY_POINT_CHECKPOINT_FILE",
    "REPLICATION_OFFSET_CHECKPOINT_FILE",
    "LogDirFailureChannel",
    "LogManager",
    "LogMove",
    "ReplicaInfo",
    "parse_partition_dir_name",
    "read_offset_checkpoint",
    "write_offset_checkpoint",
]

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
RECOVERY_POINT_CHECKPOINT_FILE = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT_FILE = "log-start-offset-checkpoint"
# High watermarks (Kafka's name): written only once replication runs (cluster mode), read at startup.
REPLICATION_OFFSET_CHECKPOINT_FILE = "replication-offset-checkpoint"
DELETE_DIR_SUFFIX = "-delete"
FUTURE_DIR_SUFFIX = "-future"
STRAY_DIR_SUFFIX = "-stray"
METADATA_PARTITION_DIR = "__cluster_metadata-0"  # the KRaft metadata log is not ours to load
# In a moved log's dir from its rename into place until the original is retired (see complete_move).
MOVED_MARKER_FILE = ".pykbroker-moved"
_COPY_SKIP_SUFFIXES = (".tmp", ".swap", ".cleaned", ".deleted")
_APPEND_ONLY_SUFFIXES = (".log", ".txnindex")
_COPY_CHUNK = 1 << 20
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


def future_dir_name(topic: str, partition: int) -> str:
    """Kafka's ``<topic>-<partition>.<uuid>-future``: a log being built in its new log dir."""
    suffix = f"-{partition}.{uuid.uuid4().hex}{FUTURE_DIR_SUFFIX}"
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


@dataclass(frozen=True)
class ReplicaInfo:
    """One partition's log in a log dir, for DescribeLogDirs."""

    tp: tuple[str, int]
    size: int
    log_end_offset: int
    is_future: bool


@dataclass
class _Copied:
    ino: int
    size: int
    mtime_ns: int


class LogMove:
    """A partition's log being copied into a ``-future`` dir in another log dir.

    The copy runs in rounds (:meth:`copy_round`) off the event loop while the log keeps
    serving: segment files only grow (or are replaced whole, by the cleaner, or deleted, by
    retention), so a round copies the bytes added since the last one, recopies replaced
    files and deletes files gone from the source.  The active segment's indexes change in
    place through their mapping and are copied only in the final round, which runs under the
    log's exclusive hold (:meth:`LogManager.complete_move`).
    """

    def __init__(self, tp: tuple[str, int], source: Log, target_dir: Path, future_dir: Path) -> None:
        self.tp = tp
        self.source = source
        self.target_dir = target_dir
        self.future_dir = future_dir
        self.cancelled = False
        self._files: dict[str, _Copied] = {}
        self._lock = threading.Lock()

    def copy_round(self, *, final: bool = False, volatile: Mapping[str, int] | None = None,
                   budget: int | None = None) -> int:
        """Bring the future dir up to date; returns the bytes copied (stops early past ``budget``).

        ``volatile`` maps files that change in place (the active segment's indexes) to the bytes
        of them in use: left out unless ``final``, then copied that far (not the preallocation).
        Outside the final round every file written is fsynced, so the final round has little
        left to sync.  Raises OSError (FileNotFoundError if the source log was deleted).
        """
        volatile = volatile or {}
        with self._lock:
            src = self.source.dir
            current: dict[str, os.stat_result] = {}
            for entry in os.scandir(src):
                if entry.is_file(follow_symlinks=False) and not entry.name.endswith(_COPY_SKIP_SUFFIXES):
                    try:
                        current[entry.name] = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:  # deleted since the listing: nothing to copy
                        continue
            for name in [n for n in self._files if n not in current]:
                (self.future_dir / name).unlink(missing_ok=True)
                del self._files[name]
            copied = 0
            for name, st in sorted(current.items()):
                if budget is not None and copied >= budget:
                    break
                prev = self._files.get(name)
                start = 0
                end = st.st_size
                if name in volatile:
                    if not final:
                        continue
                    end = min(end, volatile[name])
                elif prev is not None and prev.ino == st.st_ino and prev.size <= st.st_size and \
                        name.endswith(_APPEND_ONLY_SUFFIXES):
                    start = prev.size
                    if start == st.st_size:
                        continue
                elif prev is not None and (prev.ino, prev.size, prev.mtime_ns) == (st.st_ino, st.st_size,
                                                                                    st.st_mtime_ns):
                    continue
                if budget is not None and name not in volatile and name.endswith(_APPEND_ONLY_SUFFIXES):
                    end = min(end, start + budget - copied)  # the next round goes on from here
                try:
                    copied += self._copy(src / name, self.future_dir / name, start, end, sync=not final)
                except FileNotFoundError:
                    if not src.is_dir():
                        raise  # the source log itself is gone (deleted topic)
                    # The file went between the listing and the copy (an older producer snapshot
                    # deleted at a roll, a segment removed by retention): what is gone is not copied.
                    (self.future_dir / name).unlink(missing_ok=True)
                    self._files.pop(name, None)
                    continue
                self._files[name] = _Copied(st.st_ino, end, st.st_mtime_ns)
            if final:
                for name in self._files:
                    fd = os.open(self.future_dir / name, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                _fsync_dir(self.future_dir)
            return copied

    @staticmethod
    def _copy(src: Path, dst: Path, start: int, end: int, *, sync: bool) -> int:
        flags = os.O_WRONLY | os.O_CREAT | (0 if start else os.O_TRUNC)
        in_fd = os.open(src, os.O_RDONLY)
        try:
            out_fd = os.open(dst, flags, 0o644)
            try:
                if start:
                    os.ftruncate(out_fd, start)  # drop whatever an interrupted round left past it
                pos = start
                while pos < end:
                    chunk = os.pread(in_fd, min(_COPY_CHUNK, end - pos), pos)
                    if not chunk:  # the source shrank meanwhile: the next round recopies it
                        break
                    os.pwrite(out_fd, chunk, pos)
                    pos += len(chunk)
                if sync:
                    os.fsync(out_fd)
            finally:
                os.close(out_fd)
        finally:
            os.close(in_fd)
        return end - start

    def copied_bytes(self) -> int:
        with self._lock:
            return sum(c.size for n, c in self._files.items() if n.endswith(".log"))

    def copied_end_offset(self) -> int:
        """How far the future log reaches: the base offset of the first segment not yet copied whole."""
        with self._lock:
            copied = {n: c.size for n, c in self._files.items()}
        for seg in self.source.segments:
            if copied.get(seg.log_path.name, -1) < seg.size:
                return seg.base_offset
        return self.source.log_end_offset


class LogDirFailureChannel:
    """Which log dirs failed, and a queue of those the broker has not handled yet (Kafka's
    LogDirFailureChannel).

    Any thread may report a failure; only the first report of a dir is queued, so a burst
    of errors from one dir is handled once.  ``wakeup`` (if set) is called after queueing;
    it must not block.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offline: dict[Path, str] = {}
        self._pending: list[Path] = []
        self.wakeup: Callable[[], None] | None = None

    def maybe_add_offline_log_dir(self, log_dir: Path, reason: str) -> bool:
        """Record ``log_dir`` as offline; True if this is news (it was then queued)."""
        with self._lock:
            if log_dir in self._offline:
                return False
            self._offline[log_dir] = reason
            self._pending.append(log_dir)
        log.error("Log dir %(log_dir)s is offline: %(reason)s", {"log_dir": log_dir, "reason": reason})
        wakeup = self.wakeup
        if wakeup is not None:
            wakeup()
        return True

    def is_offline(self, log_dir: Path) -> bool:
        with self._lock:
            return log_dir in self._offline

    def offline_dirs(self) -> dict[Path, str]:
        """Offline dir -> the failure that took it offline."""
        with self._lock:
            return dict(self._offline)

    def take_pending(self) -> list[Path]:
        """The dirs that went offline since the last call, oldest first."""
        with self._lock:
            pending, self._pending = self._pending, []
            return pending


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
        self.failure_channel = LogDirFailureChannel()
        self._offline_tps: dict[tuple[str, int], Path] = {}  # logs closed because their dir failed
        # While a dir that failed at startup may hold a partition we did not load, creating an
        # unknown partition elsewhere would fork its history (Kafka: isNew=false): refuse until
        # the broker has opened every partition it already had (see startup_complete).
        self._refuse_unknown = False
        self._moves: dict[tuple[str, int], LogMove] = {}  # AlterReplicaLogDirs in progress
        self._retired: list[Path] = []  # original dirs of completed moves, to delete
        # High watermarks from each dir's replication-offset-checkpoint at startup, and the
        # source of the ones to write (set by the replica manager once replication runs).
        self._checkpointed_hws: dict[tuple[str, int], int] = {}
        self.high_watermarks: Callable[[], Mapping[tuple[str, int], int]] | None = None

    # -- startup ---------------------------------------------------------------------------------

    def startup(self, config_for: Callable[[str], LogConfig] | None = None) -> None:
        """Load every partition log, recovering those of dirs without a clean-shutdown marker.

        ``config_for(topic)`` supplies per-topic configs (default: the default config).
        """
        started = time.monotonic()
        loaded = recovered = 0
        try:
            self._finish_interrupted_moves()
        except OSError as exc:  # the dirs themselves are checked (and taken offline) below
            log.warning("Could not finish interrupted log dir moves: %(error)s", {"error": exc})
        for log_dir in self.log_dirs:
            try:
                n_loaded, n_recovered = self._load_dir(log_dir, config_for)
            except OSError as exc:
                # Kafka: a dir that cannot be loaded is offline; the broker runs on the others.
                self._drop_dir_logs(log_dir)
                self.failure_channel.maybe_add_offline_log_dir(log_dir, f"loading failed: {exc}")
                self._refuse_unknown = True
                continue
            loaded += n_loaded
            recovered += n_recovered
        if not self.online_dirs():
            raise OSError(f"no usable log dir: all of {', '.join(map(str, self.log_dirs))} failed to load "
                          f"({'; '.join(f'{d}: {r}' for d, r in self.failure_channel.offline_dirs().items())})")
        self._started = True
        log.info(
            "Loaded %(loaded)d partition log(s) from %(log_dirs)d log dir(s) in %(elapsed_ms).0f ms (%(recovered)d "
            "recovered after unclean shutdown)",
            {"loaded": loaded, "log_dirs": len(self.log_dirs), "elapsed_ms": (time.monotonic() - started) * 1000,
             "recovered": recovered},
        )

    def startup_complete(self) -> None:
        """Every partition the broker already had is open (or known offline): new ones may be created."""
        self._refuse_unknown = False

    def _drop_dir_logs(self, log_dir: Path) -> list[tuple[str, int]]:
        """Forget and release the logs of a failed dir; returns their partitions."""
        with self._lock:
            tps = [tp for tp, d in self._log_dir_of.items() if d == log_dir]
            logs = [self._logs.pop(tp) for tp in tps]
            for tp in tps:
                del self._log_dir_of[tp]
                self._offline_tps[tp] = log_dir
        for lg in logs:
            lg.release()
        return tps

    def _load_dir(self, log_dir: Path, config_for: Callable[[str], LogConfig] | None) -> tuple[int, int]:
        loaded = recovered = 0
        log_dir.mkdir(parents=True, exist_ok=True)
        marker = log_dir / CLEAN_SHUTDOWN_FILE
        clean = marker.exists()
        recovery_points = self._read_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT_FILE)
        start_offsets = self._read_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT_FILE)
        self._checkpointed_hws.update(self._read_checkpoint(log_dir / REPLICATION_OFFSET_CHECKPOINT_FILE))
        for entry in sorted(os.scandir(log_dir), key=lambda e: e.name):
            if not entry.is_dir():
                continue
            path = Path(entry.path)
            if entry.name.endswith(DELETE_DIR_SUFFIX):
                log.info("Finishing deletion of %(path)s", {"path": path})
                shutil.rmtree(path, ignore_errors=True)
                continue
            if entry.name.endswith(FUTURE_DIR_SUFFIX):
                # A move (AlterReplicaLogDirs) that did not complete; the original is intact.
                log.info("Deleting the unfinished future log %(path)s", {"path": path})
                shutil.rmtree(path, ignore_errors=True)
                continue
            if entry.name.endswith(STRAY_DIR_SUFFIX) or entry.name == METADATA_PARTITION_DIR:
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
            self._attach(partition_log)
            with self._lock:
                self._logs[tp] = partition_log
                self._log_dir_of[tp] = log_dir
            loaded += 1
            recovered += 0 if clean else 1
        # Only remove the marker once everything it vouched for is loaded.
        if clean:
            marker.unlink()
            _fsync_dir(log_dir)
        return loaded, recovered

    @staticmethod
    def _read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
        try:
            return read_offset_checkpoint(path)
        except (ValueError, OSError) as exc:
            # A bad checkpoint only costs a longer recovery / an earlier start offset.
            log.warning("Ignoring unreadable checkpoint %(path)s: %(error)s", {"path": path, "error": exc})
            return {}

    def _finish_interrupted_moves(self) -> None:
        """A moved log that was renamed into place still has its marker: the copies elsewhere are stale."""
        for log_dir in self.log_dirs:
            if not log_dir.is_dir():
                continue
            for marker in sorted(log_dir.glob(f"*/{MOVED_MARKER_FILE}")):
                tp = parse_partition_dir_name(marker.parent.name)
                if tp is None:
                    continue
                for other in self.log_dirs:
                    stale = other / marker.parent.name
                    if other != log_dir and stale.is_dir():
                        log.info("Deleting %(stale)s: the log was moved to %(log_dir)s before the broker stopped",
                                 {"stale": stale, "log_dir": log_dir})
                        target = stale.with_name(delete_dir_name(*tp))
                        os.rename(stale, target)
                        _fsync_dir(other)
                        shutil.rmtree(target, ignore_errors=True)
                marker.unlink()
                _fsync_dir(marker.parent)

    # -- lookup / creation -----------------------------------------------------------------------

    def get_log(self, topic: str, partition: int) -> Log | None:
        with self._lock:
            return self._logs.get((topic, partition))

    def all_logs(self) -> dict[tuple[str, int], Log]:
        with self._lock:
            return dict(self._logs)

    def log_dir_of(self, topic: str, partition: int) -> Path | None:
        with self._lock:
            return self._log_dir_of.get((topic, partition))

    def find_log_dir(self, path: str) -> Path | None:
        """The configured log dir that ``path`` names (compared as absolute paths), or None."""
        wanted = os.path.abspath(path)
        for d in self.log_dirs:
            if os.path.abspath(d) == wanted:
                return d
        return None

    def replicas_by_dir(self) -> dict[Path, list[ReplicaInfo]]:
        """Every log per log dir, with moves in progress as future replicas in their target dir."""
        with self._lock:
            items = [(tp, self._log_dir_of[tp], lg) for tp, lg in self._logs.items()]
            moves = list(self._moves.values())
        out: dict[Path, list[ReplicaInfo]] = {}
        for tp, d, lg in items:
            out.setdefault(d, []).append(ReplicaInfo(tp, lg.size_bytes, lg.log_end_offset, False))
        for mv in moves:
            out.setdefault(mv.target_dir, []).append(
                ReplicaInfo(mv.tp, mv.copied_bytes(), mv.copied_end_offset(), True))
        return out

    # -- moving a log between log dirs (AlterReplicaLogDirs) --------------------------------------

    def future_target(self, topic: str, partition: int) -> Path | None:
        """The log dir a move of this partition in progress goes to."""
        with self._lock:
            mv = self._moves.get((topic, partition))
            return mv.target_dir if mv is not None else None

    def start_move(self, topic: str, partition: int, target_dir: Path) -> LogMove:
        """Create the future log dir in ``target_dir`` and register the move.

        Raises :class:`KafkaStorageError` if the target dir cannot be written (it goes offline).
        """
        tp = (topic, partition)
        with self._lock:
            source = self._logs.get(tp)
            if source is None:
                raise KeyError(tp)
            if tp in self._moves:
                raise RuntimeError(f"{topic}-{partition} is already being moved")
            future = target_dir / future_dir_name(topic, partition)
            try:
                future.mkdir(parents=True)
                _fsync_dir(target_dir)
            except OSError as exc:
                self.mark_dir_offline(target_dir, f"creating the future log of {topic}-{partition} failed: {exc}")
                raise KafkaStorageError(f"creating the future log of {topic}-{partition} failed: {exc}") from exc
            mv = LogMove(tp, source, target_dir, future)
            self._moves[tp] = mv
        log.info("Moving %(topic)s-%(partition)d from %(source_dir)s to %(target_dir)s",
                 {"topic": topic, "partition": partition, "source_dir": source.dir.parent, "target_dir": target_dir})
        return mv

    def abandon_move(self, mv: LogMove) -> None:
        """Forget a move and delete its future log (the original keeps serving)."""
        with self._lock:
            registered = self._moves.get(mv.tp) is mv
            if registered:
                del self._moves[mv.tp]
        if not registered and mv.cancelled:
            return  # abandoned already
        mv.cancelled = True
        shutil.rmtree(mv.future_dir, ignore_errors=True)
        log.info("Stopped moving %(topic)s-%(partition)d to %(target_dir)s; it stays in %(source_dir)s",
                 {"topic": mv.tp[0], "partition": mv.tp[1], "target_dir": mv.target_dir,
                  "source_dir": mv.source.dir.parent})

    def complete_move(self, mv: LogMove, config: LogConfig) -> Log:
        """Copy what is left, swap the moved log in and retire the original; returns the new log.

        Runs with the source log held :meth:`~Log.exclusive`, so nothing is appended, read or
        flushed meanwhile.  The commit point is the rename of the fsynced future dir to
        ``<topic>-<partition>`` in the target dir; it carries a marker until the original is
        renamed for deletion, so a crash in between keeps the moved copy
        (:meth:`_finish_interrupted_moves`).  Before the rename a crash leaves the original
        intact and the ``-future`` dir is deleted at the next start.
        """
        source = mv.source
        topic, partition = mv.tp
        paused = time.monotonic()
        with source.exclusive():
            source.snapshot_for_move()
            try:
                mv.copy_round(final=True, volatile=source.active_indexes())
                final = mv.target_dir / source.dir.name
                (mv.future_dir / MOVED_MARKER_FILE).touch()
                _fsync_dir(mv.future_dir)
                os.rename(mv.future_dir, final)
                _fsync_dir(mv.target_dir)
            except OSError as exc:
                self.abandon_move(mv)
                self.mark_dir_offline(mv.target_dir, f"moving {topic}-{partition} failed: {exc}")
                raise KafkaStorageError(f"moving {topic}-{partition} to {mv.target_dir} failed: {exc}") from exc
            try:
                new = Log.open(final, config, recover=False, now_ms=self._now_ms,
                               log_start_offset=source.log_start_offset, recovery_point=source.log_end_offset)
            except (OSError, ValueError) as exc:
                # Undo the commit, or a restart would prefer the copy over what is appended next.
                try:
                    os.rename(final, mv.future_dir)
                    _fsync_dir(mv.target_dir)
                except OSError:
                    self.mark_dir_offline(source.dir.parent, f"moving {topic}-{partition} failed: {exc}")
                self.abandon_move(mv)
                self.mark_dir_offline(mv.target_dir, f"opening the moved log of {topic}-{partition} failed: {exc}")
                raise KafkaStorageError(f"opening the moved log of {topic}-{partition} failed: {exc}") from exc
            # Committed: from here on the moved copy is the log.
            new.leader_epoch = source.leader_epoch
            self._attach(new)
            with self._lock:
                self._moves.pop(mv.tp, None)
                self._logs[mv.tp] = new
                self._log_dir_of[mv.tp] = mv.target_dir
            source.superseded()
        pause_ms = (time.monotonic() - paused) * 1000
        old_dir = source.dir
        retired = old_dir.with_name(delete_dir_name(topic, partition))
        try:
            os.rename(old_dir, retired)
            _fsync_dir(old_dir.parent)
        except OSError as exc:
            # The moved copy still has its marker, so a restart deletes the original.
            self.mark_dir_offline(old_dir.parent, f"retiring {old_dir} after its move failed: {exc}")
            return new
        with contextlib.suppress(OSError):
            (final / MOVED_MARKER_FILE).unlink()
        self._retired.append(retired)
        log.info("Moved %(topic)s-%(partition)d to %(target_dir)s (%(copied_bytes)d bytes copied; the log was paused "
                 "for %(pause_ms).1f ms for the last copy and the swap)",
                 {"topic": topic, "partition": partition, "target_dir": mv.target_dir,
                  "copied_bytes": mv.copied_bytes(), "pause_ms": pause_ms})
        return new

    def delete_retired(self) -> None:
        """Remove the original dirs of completed moves (slow: run off the event loop)."""
        while self._retired:
            shutil.rmtree(self._retired.pop(), ignore_errors=True)

    # -- lookup / creation -----------------------------------------------------------------------

    def get_or_create_log(self, topic: str, partition: int, config: LogConfig) -> Log:
        """Existing log, or a new empty one in the online log dir holding the fewest partitions.

        Raises :class:`KafkaStorageError` for a partition whose dir is offline, or when no dir
        is online (creating it there would fork its history), and when creating the log fails
        (that dir then goes offline).
        """
        tp = (topic, partition)
        with self._lock:
            existing = self._logs.get(tp)
            if existing is not None:
                return existing
            offline_dir = self._offline_tps.get(tp)
            if offline_dir is not None:
                raise KafkaStorageError(f"the log dir {offline_dir} of {topic}-{partition} is offline")
            if self._refuse_unknown:
                raise KafkaStorageError(
                    f"cannot create a log for {topic}-{partition}: it may be in an offline log dir")
            online = self.online_dirs()
            if not online:
                raise KafkaStorageError(f"cannot create a log for {topic}-{partition}: every log dir is offline")
            counts = dict.fromkeys(online, 0)
            for d in self._log_dir_of.values():
                if d in counts:
                    counts[d] += 1
            log_dir = min(online, key=lambda d: counts[d])
            path = log_dir / f"{topic}-{partition}"
            try:
                log_dir.mkdir(parents=True, exist_ok=True)
                partition_log = Log.open(path, config, recover=False, now_ms=self._now_ms)
                _fsync_dir(log_dir)
            except OSError as exc:
                if out_of_descriptors(exc):
                    # Out of file descriptors is the process's limit, not the disk's failure: this
                    # partition stays offline, the log dir and every other partition carry on.
                    raise KafkaStorageError(
                        f"creating the log of {topic}-{partition} failed: {exc} (each partition holds one "
                        f"open file; raise the broker's open-file limit, ulimit -n)") from exc
                self.mark_dir_offline(log_dir, f"creating the log of {topic}-{partition} failed: {exc}")
                raise KafkaStorageError(f"creating the log of {topic}-{partition} failed: {exc}") from exc
            self._attach(partition_log)
            self._logs[tp] = partition_log
            self._log_dir_of[tp] = log_dir
            log.debug("Created log for partition %(topic)s-%(partition)d in %(log_dir)s",
                      {"topic": topic, "partition": partition, "log_dir": log_dir})
            return partition_log

    def checkpointed_high_watermark(self, topic: str, partition: int) -> int | None:
        """The high watermark the last replication-offset-checkpoint held for the partition."""
        return self._checkpointed_hws.get((topic, partition))

    def checkpoint_high_watermarks(self) -> bool:
        """Write each online dir's replication-offset-checkpoint from :attr:`high_watermarks`.

        Worker-thread safe.  Returns False when a dir could not be written (it goes offline).
        """
        source = self.high_watermarks
        if source is None:
            return True
        hws = dict(source())
        ok = True
        with self._checkpoint_lock:
            with self._lock:
                dirs = dict(self._log_dir_of)
            for log_dir in self.online_dirs():
                if not log_dir.exists():
                    continue
                in_dir = {tp: hw for tp, hw in hws.items() if dirs.get(tp) == log_dir}
                try:
                    write_offset_checkpoint(log_dir / REPLICATION_OFFSET_CHECKPOINT_FILE, in_dir)
                except OSError as exc:
                    ok = False
                    if out_of_descriptors(exc):
                        log.error("writing the high watermark checkpoint in %(log_dir)s failed: %(error)s",
                                  {"log_dir": log_dir, "error": exc})
                    else:
                        self.mark_dir_offline(log_dir, f"writing the high watermark checkpoint failed: {exc}")
        return ok

    def delete_log(self, topic: str, partition: int) -> None:
        """Rename the dir to Kafka's ``<tp>.<uuid>-delete`` form, then remove it."""
        tp = (topic, partition)
        with self._lock:
            move = self._moves.get(tp)
        if move is not None:
            self.abandon_move(move)
        with self._lock:
            partition_log = self._logs.pop(tp, None)
            self._log_dir_of.pop(tp, None)
            # A log in an offline dir is only forgotten: its files are not to be touched now.
            self._offline_tps.pop(tp, None)
        if partition_log is None:
            return
        try:
            partition_log.close(snapshot=False)  # deleted anyway: no snapshot, nothing to trim for
        except OSError:
            partition_log.release()
        target = partition_log.dir.with_name(delete_dir_name(topic, partition))
        try:
            os.rename(partition_log.dir, target)
            _fsync_dir(target.parent)
        except FileNotFoundError:
            return
        shutil.rmtree(target, ignore_errors=True)
        log.debug("Deleted log for partition %(topic)s-%(partition)d", {"topic": topic, "partition": partition})

    # -- log dir failure --------------------------------------------------------------------------

    def online_dirs(self) -> list[Path]:
        return [d for d in self.log_dirs if not self.failure_channel.is_offline(d)]

    def is_offline(self, topic: str, partition: int) -> bool:
        """Whether this partition's log was in a dir that failed."""
        with self._lock:
            tp = (topic, partition)
            if tp in self._offline_tps:
                return True
            lg = self._logs.get(tp)
            return lg is not None and lg.offline

    def _attach(self, partition_log: Log) -> None:
        partition_log.on_storage_error = self._on_log_failure

    def _on_log_failure(self, partition_log: Log, reason: str) -> None:
        self.mark_dir_offline(partition_log.dir.parent, reason)

    def mark_dir_offline(self, log_dir: Path, reason: str) -> bool:
        """Take ``log_dir`` offline now (any thread, never blocks on a log): every log in it
        refuses further operations at once; the broker's handler closes them later.
        Returns False if it already was offline."""
        if not self.failure_channel.maybe_add_offline_log_dir(log_dir, reason):
            return False
        with self._lock:
            logs = [lg for tp, lg in self._logs.items() if self._log_dir_of.get(tp) == log_dir]
        for lg in logs:
            lg.offline = True
        return True

    def handle_log_dir_failure(self, log_dir: Path) -> list[tuple[str, int]]:
        """Close the logs of a failed dir without writing to it (Kafka's handleLogDirFailure).

        Blocking (waits for the logs' locks): run it off the event loop.  Returns the
        partitions that went offline.
        """
        tps = self._drop_dir_logs(log_dir)
        log.error(
            "Stopped serving %(partitions)d partition(s) in offline log dir %(log_dir)s; %(online_dirs)d log dir(s) "
            "still online",
            {"partitions": len(tps), "log_dir": log_dir, "online_dirs": len(self.online_dirs())},
        )
        return tps

    # -- background work -------------------------------------------------------------------------

    def run_retention(self) -> None:
        """Apply time/size/start-offset retention to every log (log.retention.check.interval.ms)."""
        now = self._now_ms()
        for tp, partition_log in self.all_logs().items():
            try:
                partition_log.apply_retention(now)
            except RuntimeError:  # closed concurrently (deleted)
                continue
            except KafkaStorageError:  # its dir is now offline; reported already
                continue
            except OSError:
                log.exception("Retention failed for %(topic)s-%(partition)d", {"topic": tp[0], "partition": tp[1]})

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
                except (KafkaStorageError, RuntimeError):  # dir offline (reported) / log deleted
                    continue
                except OSError:
                    log.exception("Flush failed for %(topic)s-%(partition)d", {"topic": tp[0], "partition": tp[1]})

    def checkpoint(self) -> bool:
        """Persist recovery points and log start offsets of every online log dir atomically.

        A dir whose checkpoint cannot be written goes offline.  Returns True if every online
        dir was checkpointed.
        """
        ok = True
        with self._checkpoint_lock:
            with self._lock:
                items = [(tp, self._log_dir_of[tp], lg) for tp, lg in self._logs.items()]
            for log_dir in self.online_dirs():
                if not log_dir.exists():
                    continue
                in_dir = [(tp, lg) for tp, d, lg in items if d == log_dir]
                try:
                    write_offset_checkpoint(
                        log_dir / RECOVERY_POINT_CHECKPOINT_FILE, {tp: lg.recovery_point for tp, lg in in_dir}
                    )
                    write_offset_checkpoint(
                        log_dir / LOG_START_OFFSET_CHECKPOINT_FILE, {tp: lg.log_start_offset for tp, lg in in_dir}
                    )
                except OSError as exc:
                    ok = False
                    if out_of_descriptors(exc):  # the next checkpoint interval tries again
                        log.error("writing offset checkpoints in %(log_dir)s failed: %(error)s",
                                  {"log_dir": log_dir, "error": exc})
                    else:
                        self.mark_dir_offline(log_dir, f"writing offset checkpoints failed: {exc}")
                    continue
                for _, lg in in_dir:
                    try:
                        lg.checkpoint_leader_epochs()  # a failure takes the dir offline
                    except (KafkaStorageError, RuntimeError):
                        ok = False
                        break
        return ok

    def shutdown(self) -> None:
        """Flush and close all logs, checkpoint, then mark each online log dir cleanly shut down.

        A dir that failed (before or during shutdown) gets no marker, so the next start
        recovers its logs.
        """
        logs = self.all_logs()
        for partition_log in logs.values():
            with contextlib.suppress(KafkaStorageError, RuntimeError):
                partition_log.flush()
        self.checkpoint()
        self.checkpoint_high_watermarks()
        for tp, partition_log in logs.items():
            if partition_log.offline:
                partition_log.release()
                continue
            try:
                partition_log.close()
            except OSError as exc:
                partition_log.release()
                self.mark_dir_offline(self._log_dir_of.get(tp, partition_log.dir.parent),
                                      f"closing {partition_log.dir.name} failed: {exc}")
        with self._lock:
            offline_logs = [lg for lg in self._logs.values() if lg.offline]
        for partition_log in offline_logs:
            partition_log.release()
        clean = 0
        for log_dir in self.online_dirs():
            if log_dir.exists():
                try:
                    (log_dir / CLEAN_SHUTDOWN_FILE).touch()
                except OSError as exc:
                    log.warning("Could not write the clean-shutdown marker in %(log_dir)s (%(error)s): it will be "
                                "recovered at the next start",
                                {"log_dir": log_dir, "error": exc})
                    continue
                clean += 1
                with contextlib.suppress(OSError):
                    _fsync_dir(log_dir)
        offline = self.failure_channel.offline_dirs()
        if offline:
            log.warning("Log manager shut down (%(logs)d logs); offline log dir(s) left for recovery: "
                        "%(offline_dirs)s",
                        {"logs": len(logs), "offline_dirs": ', '.join(map(str, offline))})
        else:
            log.info("Log manager shut down cleanly (%(logs)d logs)", {"logs": len(logs)})
