"""Kafka's partition leader election algorithms, and the ISR each election leaves.

All functions are pure: they take the assignment, the ISR and who is online and return the new
(leader, ISR) or None when no leader can be elected (the caller then leaves the partition as it
is, or offline). "Online" excludes brokers in controlled shutdown, as in Kafka's controller.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

NO_LEADER = -1


@dataclass(frozen=True)
class LeaderAndIsr:
    leader: int
    isr: list[int]


def offline_leader(assignment: Sequence[int], isr: Collection[int], online: Collection[int],
                   unclean: bool) -> int | None:
    """First online replica, in assignment order, that is in the ISR; with ``unclean``, any online replica."""
    for b in assignment:
        if b in online and b in isr:
            return b
    if unclean:
        for b in assignment:
            if b in online:
                return b
    return None


def reassignment_leader(target: Sequence[int], isr: Collection[int], online: Collection[int]) -> int | None:
    """First replica of the reassignment's target that is online and in the ISR."""
    return next((b for b in target if b in online and b in isr), None)


def preferred_leader(assignment: Sequence[int], isr: Collection[int], online: Collection[int]) -> int | None:
    """The first replica of the assignment, if it is online and in the ISR."""
    if assignment and assignment[0] in online and assignment[0] in isr:
        return assignment[0]
    return None


def controlled_shutdown_leader(assignment: Sequence[int], isr: Collection[int], online: Collection[int],
                               shutting_down: Collection[int]) -> int | None:
    """First replica in the ISR that is online (counting brokers shutting down) and not shutting down."""
    return next((b for b in assignment if b in online and b in isr and b not in shutting_down), None)


def elect_offline(assignment: Sequence[int], isr: Sequence[int], online: Collection[int],
                  unclean: bool) -> LeaderAndIsr | None:
    """Offline election: the ISR keeps its online members, or is just the leader after an unclean election."""
    leader = offline_leader(assignment, isr, online, unclean)
    if leader is None:
        return None
    if leader in isr:
        return LeaderAndIsr(leader, [b for b in isr if b in online])
    return LeaderAndIsr(leader, [leader])


def elect_reassignment(target: Sequence[int], isr: Sequence[int], online: Collection[int]) -> LeaderAndIsr | None:
    leader = reassignment_leader(target, isr, online)
    return None if leader is None else LeaderAndIsr(leader, list(isr))


def elect_preferred(assignment: Sequence[int], isr: Sequence[int], online: Collection[int]) -> LeaderAndIsr | None:
    leader = preferred_leader(assignment, isr, online)
    return None if leader is None else LeaderAndIsr(leader, list(isr))


def elect_controlled_shutdown(assignment: Sequence[int], isr: Sequence[int], online: Collection[int],
                              shutting_down: Collection[int]) -> LeaderAndIsr | None:
    leader = controlled_shutdown_leader(assignment, isr, online, shutting_down)
    if leader is None:
        return None
    return LeaderAndIsr(leader, [b for b in isr if b not in shutting_down])


def remove_from_isr(leader: int, isr: Sequence[int], removed: Collection[int]) -> LeaderAndIsr:
    """Take replicas out of the ISR as Kafka's controller does, one at a time, never emptying it.

    A removed leader leaves the partition without a leader. When every ISR member is removed, one
    stays (the old leader if it was in the ISR, else the first): it holds every committed record,
    so a clean election can pick it once it is back.
    """
    new_leader = NO_LEADER if leader in removed else leader
    kept = [b for b in isr if b not in removed]
    if not kept and isr:
        kept = [leader] if leader in isr else [isr[0]]
    return LeaderAndIsr(new_leader, kept)


def on_replicas_offline(assignment: Sequence[int], leader: int, isr: Sequence[int], live: Collection[int],
                        unclean: bool, eligible: Collection[int] | None = None) -> LeaderAndIsr | None:
    """The state after replicas went offline (broker death, or found offline at controller failover).

    ``live``: brokers that are up; ``eligible``: those that may become leader or stay in the ISR
    of a newly elected leader (live minus brokers in controlled shutdown; default ``live``). A
    partition whose leader is not live gets a new leader by offline election (from the eligible
    ISR; unclean only when allowed); if none can be elected it is left without a leader. Replicas
    that are not live leave the ISR (never emptying it). None when nothing changes.
    """
    candidates = live if eligible is None else eligible
    if leader == NO_LEADER or leader not in live:
        elected = elect_offline(assignment, isr, candidates, unclean)
        if elected is not None:
            return elected
    offline = [b for b in isr if b not in live]
    result = remove_from_isr(leader, isr, offline)
    if result.leader != NO_LEADER and result.leader not in live:
        result = LeaderAndIsr(NO_LEADER, result.isr)
    if result.leader == leader and result.isr == list(isr):
        return None
    return result
