"""The server-side assignors of KIP-848 consumer groups (Kafka's UniformAssignor and RangeAssignor).

Each maps the members, the subscribed topics and the current assignment to a target assignment;
a group uses the one most of its members ask for, else the first of ``group.consumer.assignors``.
"""

from __future__ import annotations

import uuid

from pykbroker.coordinator.group.consumer_group import Assignment, ConsumerMember

__all__ = ["ASSIGNORS", "Subscriptions", "Topics", "range_assign", "uniform_assign"]

Topics = dict[str, tuple[uuid.UUID, int]]  # name -> (id, partition count)


Subscriptions = dict[str, set[str]]  # member id -> subscribed topic names (regexes already resolved)


def _member_topics(m: ConsumerMember, topics: Topics, subscriptions: Subscriptions | None) -> list[str]:
    names = subscriptions.get(m.member_id, set()) if subscriptions is not None else set(m.subscribed_names)
    return sorted(set(names) & set(topics))


def range_assign(members: dict[str, ConsumerMember], topics: Topics, current: dict[str, Assignment],
                 subscriptions: Subscriptions | None = None) -> dict[str, Assignment]:
    out: dict[str, Assignment] = {mid: {} for mid in members}
    by_topic: dict[str, list[str]] = {}
    for mid, m in members.items():
        for t in _member_topics(m, topics, subscriptions):
            by_topic.setdefault(t, []).append(mid)
    for t, mids in by_topic.items():
        tid, n = topics[t]
        mids = sorted(mids)
        per, extra = divmod(n, len(mids))
        start = 0
        for i, mid in enumerate(mids):
            k = per + (1 if i < extra else 0)
            if k:
                out[mid][tid] = set(range(start, start + k))
            start += k
    return out


def uniform_assign(members: dict[str, ConsumerMember], topics: Topics, current: dict[str, Assignment],
                   subscriptions: Subscriptions | None = None) -> dict[str, Assignment]:
    """Balanced and sticky: members keep what they had, up to their share; the rest goes to the least loaded."""
    out: dict[str, Assignment] = {mid: {} for mid in members}
    subs = {mid: set(_member_topics(m, topics, subscriptions)) for mid, m in members.items()}
    ids = {topics[t][0]: t for t in topics}
    all_parts: list[tuple[str, uuid.UUID, int]] = []
    for t in sorted({t for s in subs.values() for t in s}):
        tid, n = topics[t]
        all_parts.extend((t, tid, p) for p in range(n))
    eligible = sorted(mid for mid in members if subs[mid])
    if not eligible:
        return out
    base, extra = divmod(len(all_parts), len(eligible))
    counts = dict.fromkeys(members, 0)
    taken: set[tuple[uuid.UUID, int]] = set()
    keepable: dict[str, list[tuple[uuid.UUID, int]]] = {}
    for mid in eligible:
        keepable[mid] = sorted(
            ((tid, p) for tid, ps in current.get(mid, {}).items() for p in ps
             if tid in ids and ids[tid] in subs[mid] and p < topics[ids[tid]][1]),
            key=lambda x: (str(x[0]), x[1]))

    def take(mid: str, tid: uuid.UUID, p: int) -> None:
        out[mid].setdefault(tid, set()).add(p)
        taken.add((tid, p))
        counts[mid] += 1

    for mid in eligible:
        for tid, p in keepable[mid]:
            if counts[mid] >= base:
                break
            if (tid, p) not in taken:
                take(mid, tid, p)
    for mid in eligible:
        if extra <= 0:
            break
        for tid, p in keepable[mid]:
            if (tid, p) not in taken:
                take(mid, tid, p)
                extra -= 1
                break
    for t, tid, p in all_parts:
        if (tid, p) in taken:
            continue
        cands = [mid for mid in eligible if t in subs[mid]]
        if cands:
            take(min(cands, key=lambda x: (counts[x], x)), tid, p)
    return out


ASSIGNORS = {"uniform": uniform_assign, "range": range_assign}
