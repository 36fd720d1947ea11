"""The campaign's checks, after Jepsen's Kafka workload (its published list of anomalies), as plain functions
over what the clients observed: nothing here talks to a broker, so each check is tested on made-up histories.

Observations:
- ``acked``: value -> (partition, offset) the producer's delivery report gave (acks=all, idempotent);
- ``polls``: per consumer, the records it polled in order, with an ``assigned`` marker at every rebalance
  (a consumer may legitimately go back to its group's committed offset then);
- ``commits``: per consumer, the offsets it committed successfully, in order, with the same markers;
- ``final``: every record of the topic, read from the beginning after the faults by a fresh consumer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

Record = tuple[int, int, bytes]  # partition, offset, value
ASSIGNED = "assigned"  # a rebalance marker in a consumer's polls or commits


@dataclass
class Anomalies:
    """Per anomaly, a few examples (the counts are exact)."""

    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def add(self, kind: str, example: str) -> None:
        self.counts[kind] += 1
        if len(self.examples[kind]) < 5:
            self.examples[kind].append(example)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, object]:
        return {"counts": dict(self.counts), "examples": dict(self.examples)}


def check(acked: dict[bytes, tuple[int, int]], polls: dict[str, list[Record | str]],
          commits: dict[str, list[tuple[int, int] | str]], final: list[Record]) -> Anomalies:
    out = Anomalies()
    at: dict[tuple[int, int], bytes] = {}
    where: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for p, o, v in final:
        if (p, o) in at and at[(p, o)] != v:
            out.add("inconsistent-offset", f"{p}:{o} read as {at[(p, o)]!r} and {v!r}")
        at[(p, o)] = v
        where[v].append((p, o))
    for v, places in where.items():
        if len(places) > 1:
            out.add("duplicate", f"{v!r} at {sorted(places)}")
    for v, (p, o) in acked.items():
        if v not in where:
            out.add("lost-write", f"{v!r} acknowledged at {p}:{o}, never read")
        elif at.get((p, o)) != v:
            out.add("inconsistent-offset", f"{v!r} acknowledged at {p}:{o}, read there: {at.get((p, o))!r}")
    offsets_of: dict[int, list[int]] = defaultdict(list)
    for p, o in at:
        offsets_of[p].append(o)
    for p in offsets_of:
        offsets_of[p].sort()
    for consumer, seen in polls.items():
        _check_polls(out, consumer, seen, at, offsets_of)
    for consumer, done in commits.items():
        _check_commits(out, consumer, done)
    return out


def _check_polls(out: Anomalies, consumer: str, seen: list[Record | str], at: dict[tuple[int, int], bytes],
                 offsets_of: dict[int, list[int]]) -> None:
    last: dict[int, int] = {}
    for item in seen:
        if isinstance(item, str):  # a rebalance: positions start again from the committed offsets
            last.clear()
            continue
        p, o, v = item
        if at.get((p, o), v) != v:
            out.add("inconsistent-offset", f"{consumer} polled {v!r} at {p}:{o}, the log has {at[(p, o)]!r}")
        prev = last.get(p)
        if prev is not None:
            if o <= prev:
                out.add("nonmonotonic-poll", f"{consumer} polled {p}:{o} after {p}:{prev}")
            elif o > prev + 1 and _exists_between(offsets_of.get(p, []), prev, o):
                out.add("poll-skip", f"{consumer} polled {p}:{o} right after {p}:{prev}")
        last[p] = o


def _exists_between(offsets: list[int], lo: int, hi: int) -> bool:
    """Whether the final log holds an offset strictly between ``lo`` and ``hi`` (``offsets`` sorted)."""
    from bisect import bisect_right

    i = bisect_right(offsets, lo)
    return i < len(offsets) and offsets[i] < hi


def _check_commits(out: Anomalies, consumer: str, done: list[tuple[int, int] | str]) -> None:
    last: dict[int, int] = {}
    for item in done:
        if isinstance(item, str):
            continue  # a rebalance does not allow a commit to go back: the group's offset stays
        p, o = item
        if p in last and o < last[p]:
            out.add("commit-backwards", f"{consumer} committed {p}:{o} after {p}:{last[p]}")
        last[p] = max(o, last.get(p, o))
