"""Incremental fetch sessions (KIP-227), sans-I/O.

A consumer with many partitions asks for all of them in every Fetch unless the broker keeps a
session: then each request names only the partitions whose fetch position changed (and those
it forgets), and each response carries only the partitions with something new (records, a
moved high watermark, last stable offset or log start offset, or an error).  The per-request
cost then follows what changes, not how many partitions a consumer has.

Epochs follow Kafka's FetchMetadata: 0 opens a session with a full request, -1 is a
sessionless full request (closing the session named, if any), and anything else is the next
incremental request of an existing session, whose epoch must be the one the broker expects
(the previous one plus one, wrapping from 2^31-1 to 1).  The cache is bounded by
``max.incremental.fetch.session.cache.slots`` sessions; when it is full a new session takes
the slot of one unused for ``min.incremental.fetch.session.eviction.ms``, else of a smaller
one, else the client gets no session (id 0) and keeps sending full requests.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.protocol.responses.fetch import PartitionData

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
_MAX_EPOCH = 2**31 - 1

# A partition is keyed by topic id (Fetch v13+) or by topic name (older versions).
PartitionKey = tuple[uuid.UUID | str, int]


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= _MAX_EPOCH else epoch + 1


@dataclass(slots=True)
class CachedPartition:
    """What the session knows of one partition: the client's last fetch position and what the
    broker last told it (so an unchanged partition can be left out of the response)."""

    topic: str | None
    topic_id: uuid.UUID
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    log_start_offset: int = -1
    sent_high_watermark: int = -2  # -2: never sent
    sent_last_stable_offset: int = -2
    sent_log_start_offset: int = -2

    def update(self, fp: Any) -> None:
        self.fetch_offset = int(fp.fetch_offset)
        self.partition_max_bytes = int(fp.partition_max_bytes)
        self.current_leader_epoch = int(getattr(fp, "current_leader_epoch", -1))
        self.last_fetched_epoch = int(getattr(fp, "last_fetched_epoch", -1))
        self.log_start_offset = int(getattr(fp, "log_start_offset", -1))

    def must_respond(self, entry: PartitionData) -> bool:
        """Whether this partition's response entry tells the client something new; records
        what was sent when it does."""
        changed = bool(
            entry["records"]
            or entry["error_code"] != ErrorCode.none
            or entry["high_watermark"] != self.sent_high_watermark
            or entry["last_stable_offset"] != self.sent_last_stable_offset
            or entry["log_start_offset"] != self.sent_log_start_offset
            or entry.get("diverging_epoch") is not None
        )
        if changed:
            self.remember(entry)
        return changed

    def remember(self, entry: PartitionData) -> None:
        self.sent_high_watermark = entry["high_watermark"]
        self.sent_last_stable_offset = entry["last_stable_offset"]
        self.sent_log_start_offset = entry["log_start_offset"]


@dataclass(slots=True)
class SessionTopic:
    """A topic of a session in the shape of a Fetch request's topic (for the fetch planner)."""

    topic: str | None
    topic_id: uuid.UUID
    partitions: list[CachedPartition]


@dataclass
class FetchSession:
    id: int
    epoch: int  # the epoch the next incremental request must carry
    by_id: bool
    created_ms: int
    last_used_ms: int
    # Insertion order is the order partitions are read in; those that returned data move to
    # the end, so a response capped by max_bytes does not starve the same partitions every time.
    partitions: dict[PartitionKey, CachedPartition] = field(default_factory=dict)

    def topics(self) -> list[SessionTopic]:
        """The session's partitions grouped by topic, in read order."""
        out: list[SessionTopic] = []
        last_key: uuid.UUID | str | None = None
        for (topic_key, _), cp in self.partitions.items():
            if not out or topic_key != last_key:  # a run per topic, as Kafka's response builds them
                out.append(SessionTopic(cp.topic, cp.topic_id, []))
                last_key = topic_key
            out[-1].partitions.append(cp)
        return out

    def apply(self, topics: Iterable[Any], forgotten: Iterable[Any], name_of: Callable[[uuid.UUID], str | None]
              ) -> None:
        """Add or update the partitions a request names, and drop the ones it forgets."""
        for t in forgotten:
            key: uuid.UUID | str = t.topic_id if self.by_id else t.topic
            for p in t.partitions:
                self.partitions.pop((key, int(p)), None)
        for t in topics:
            topic_id = getattr(t, "topic_id", None) or uuid.UUID(int=0)
            name = name_of(topic_id) if self.by_id else t.topic
            key = topic_id if self.by_id else t.topic
            for fp in t.partitions:
                pkey = (key, int(fp.partition))
                cp = self.partitions.get(pkey)
                if cp is None:
                    cp = CachedPartition(name, topic_id, int(fp.partition), 0, 0)
                    self.partitions[pkey] = cp
                cp.update(fp)

    def rotate(self, returned_data: list[PartitionKey]) -> None:
        for key in returned_data:
            cp = self.partitions.pop(key, None)
            if cp is not None:
                self.partitions[key] = cp


class FetchSessionError(Exception):
    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name)
        self.code = code


class FetchSessionCache:
    """The broker's sessions, bounded in number; the clock is injected for tests."""

    def __init__(self, max_slots: int, eviction_ms: int, now_ms: Callable[[], int],
                 rng: random.Random | None = None) -> None:
        self.max_slots = max_slots
        self.eviction_ms = eviction_ms
        self._now_ms = now_ms
        self._rng = rng or random.Random()
        self._sessions: dict[int, FetchSession] = {}
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def partitions(self) -> int:
        return sum(len(s.partitions) for s in self._sessions.values())

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def remove(self, session_id: int) -> None:
        self._sessions.pop(session_id, None)

    def incremental(self, session_id: int, epoch: int) -> FetchSession:
        """The session an incremental request continues; raises FetchSessionError."""
        session = self._sessions.get(session_id)
        if session is None:
            raise FetchSessionError(ErrorCode.fetch_session_id_not_found)
        if session.epoch != epoch:
            raise FetchSessionError(ErrorCode.invalid_fetch_session_epoch)
        session.last_used_ms = self._now_ms()
        return session

    def create(self, by_id: bool, size: int) -> FetchSession | None:
        """A new session for a full request of ``size`` partitions, or None without a free slot."""
        if self.max_slots <= 0:
            return None
        now = self._now_ms()
        if len(self._sessions) >= self.max_slots and not self._evict_for(size, now):
            return None
        session_id = 0
        while session_id == 0 or session_id in self._sessions:  # ids are random, as Kafka's
            session_id = self._rng.randint(1, _MAX_EPOCH)
        session = FetchSession(session_id, 1, by_id, now, now)
        self._sessions[session_id] = session
        return session

    def _evict_for(self, size: int, now: int) -> bool:
        stale = [s for s in self._sessions.values() if now - s.last_used_ms >= self.eviction_ms]
        if stale:
            victim = min(stale, key=lambda s: s.last_used_ms)
        else:
            smaller = [s for s in self._sessions.values() if len(s.partitions) < size]
            if not smaller:
                return False
            victim = min(smaller, key=lambda s: (len(s.partitions), s.last_used_ms))
        del self._sessions[victim.id]
        self.evictions += 1
        return True
