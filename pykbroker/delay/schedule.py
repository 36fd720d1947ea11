"""The sans-I/O core of delayed delivery: when a record is due, and which records are due now.

:func:`due_times` reads the delay headers (and the topic's default delay) of a produced batch's
records; :class:`Schedule` keeps the records waiting in ``__delayed_records`` as a heap ordered by
``(due_ms, uid)`` and hands out the due ones in that order. Neither touches a socket, a log or a clock:
the service (:mod:`pykbroker.delay.service`) passes ``now`` in.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence

from pykbroker.delay.serde import Entry
from pykbroker.protocol.records import INVALID_RECORD, InvalidRecords, Record

DELAY_HEADER = "pykbroker.delay.ms"
DELIVER_AT_HEADER = "pykbroker.deliver.at.ms"
# Both header names start with this: a batch without it anywhere in its bytes has no delay header.
HEADER_PREFIX = b"pykbroker.de"

_MAX_DIGITS = 19  # a long's worth of decimal digits


def _parse_ms(name: str, raw: bytes | None) -> tuple[int | None, str | None]:
    """ASCII decimal, no sign, no spaces: the value, or Kafka-style ``record_errors`` text."""
    if raw is None or not raw or len(raw) > _MAX_DIGITS or not raw.isdigit():
        shown = "null" if raw is None else repr(raw[:32].decode("ascii", "replace"))
        return None, f"header {name} must be ASCII decimal milliseconds, got {shown}"
    return int(raw), None


def due_times(records: Sequence[Record], *, default_delay_ms: int, now_ms: int, log_append_time: bool,
              max_delay_ms: int) -> list[int | None]:
    """Each record's due time (epoch ms), or None when it is to be appended now.

    ``pykbroker.deliver.at.ms`` (absolute) wins over ``pykbroker.delay.ms`` (relative), which wins over
    the topic's default delay. Relative delays count from the record's timestamp (the append time on
    LogAppendTime topics, or when the producer sent none). A due time not after ``now_ms`` means now.
    A malformed value, or one asking for more than ``max_delay_ms`` from now, raises INVALID_RECORD
    with one ``record_errors`` entry per bad record (the whole batch is refused, as Kafka refuses a
    batch with one bad record).
    """
    out: list[int | None] = []
    errors: list[tuple[int, str]] = []
    for i, r in enumerate(records):
        base = now_ms if log_append_time or r.timestamp < 0 else r.timestamp
        due: int | None = base + default_delay_ms if default_delay_ms > 0 else None
        absolute: int | None = None
        for name, raw in r.headers:
            if name == DELAY_HEADER:
                ms, problem = _parse_ms(name, raw)
                if problem:
                    errors.append((i, problem))
                elif ms is not None:
                    due = base + ms
            elif name == DELIVER_AT_HEADER:
                ms, problem = _parse_ms(name, raw)
                if problem:
                    errors.append((i, problem))
                else:
                    absolute = ms
        if absolute is not None:
            due = absolute
        if due is not None and due - now_ms > max_delay_ms:
            errors.append((i, f"record is due in {due - now_ms} ms, more than pykbroker.delay.max.ms "
                              f"({max_delay_ms})"))
        out.append(due if due is not None and due > now_ms else None)
    if errors:
        raise InvalidRecords(INVALID_RECORD, f"{len(errors)} record(s) with an invalid delay: {errors[0][1]}",
                             errors)
    return out


class Schedule:
    """Entries waiting for their due time, handed out in ``(due_ms, uid)`` order.

    A heap of sort keys plus a map uid -> entry; removing an entry only drops it from the map and the
    heap skips such stale keys lazily, so both add and remove are O(log n) at most.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int]] = []
        self._entries: dict[int, Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, uid: int) -> bool:
        return uid in self._entries

    def add(self, entry: Entry) -> bool:
        """Schedule ``entry`` (again: a no-op); True when it is now the earliest (the timer must wake)."""
        if entry.uid in self._entries:
            return False
        self._entries[entry.uid] = entry
        heapq.heappush(self._heap, entry.sort_key)
        return self._heap[0] == entry.sort_key

    def add_all(self, entries: Iterable[Entry]) -> bool:
        earliest = False
        for e in entries:
            earliest = self.add(e) or earliest
        return earliest

    def discard(self, uid: int) -> Entry | None:
        return self._entries.pop(uid, None)

    def get(self, uid: int) -> Entry | None:
        return self._entries.get(uid)

    def discard_where(self, pred: Callable[[Entry], bool]) -> int:
        """Drop every entry ``pred`` selects (a partition no longer led here); how many. O(n)."""
        gone = [uid for uid, e in self._entries.items() if pred(e)]
        for uid in gone:
            del self._entries[uid]
        return len(gone)

    def _trim(self) -> None:
        heap, entries = self._heap, self._entries
        while heap:
            due, uid = heap[0]
            e = entries.get(uid)
            if e is not None and e.due_ms == due:
                return
            heapq.heappop(heap)

    def next_due(self) -> int | None:
        """The earliest due time, or None when nothing is waiting."""
        self._trim()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int, limit: int) -> list[Entry]:
        """Remove and return up to ``limit`` entries due at ``now_ms``, earliest first.

        The caller delivers them and, if that fails, puts them back with :meth:`add_all`.
        """
        out: list[Entry] = []
        heap, entries = self._heap, self._entries
        while heap and len(out) < limit:
            due, uid = heap[0]
            e = entries.get(uid)
            if e is None or e.due_ms != due:
                heapq.heappop(heap)
                continue
            if due > now_ms:
                break
            heapq.heappop(heap)
            del entries[uid]
            out.append(e)
        return out
