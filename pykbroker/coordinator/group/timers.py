"""Keyed timers for the sans-I/O coordinator: schedule, cancel, and fire what is due."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable


class Timers:
    """A heap of (deadline, key); scheduling a key again replaces its previous timer."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Hashable]] = []
        self._live: dict[Hashable, tuple[int, int, Callable[[], None]]] = {}
        self._seq = itertools.count()

    def schedule(self, key: Hashable, deadline_ms: int, fn: Callable[[], None]) -> None:
        seq = next(self._seq)
        self._live[key] = (deadline_ms, seq, fn)
        heapq.heappush(self._heap, (deadline_ms, seq, key))

    def cancel(self, key: Hashable) -> None:
        self._live.pop(key, None)

    def is_scheduled(self, key: Hashable) -> bool:
        return key in self._live

    def deadline(self, key: Hashable) -> int | None:
        entry = self._live.get(key)
        return entry[0] if entry else None

    def next_deadline(self) -> int | None:
        while self._heap:
            deadline, seq, key = self._heap[0]
            live = self._live.get(key)
            if live is not None and live[1] == seq:
                return deadline
            heapq.heappop(self._heap)
        return None

    def fire_due(self, now_ms: int) -> int:
        """Run every timer whose deadline has passed; returns how many ran."""
        fired = 0
        while self._heap and self._heap[0][0] <= now_ms:
            _deadline, seq, key = heapq.heappop(self._heap)
            live = self._live.get(key)
            if live is None or live[1] != seq:
                continue
            del self._live[key]
            live[2]()
            fired += 1
        return fired

    def __len__(self) -> int:
        return len(self._live)
