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
from itertools import pairwise

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

    def merge(self, other: Anomalies, prefix: str = "") -> None:
        for kind, n in other.counts.items():
            self.counts[prefix + kind] += n
            self.examples[prefix + kind].extend(other.examples[kind][:5 - len(self.examples[prefix + kind])])

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, object]:
        return {"counts": dict(self.counts), "examples": dict(self.examples)}


def check(acked: dict[bytes, tuple[int, int | None]], polls: dict[str, list[Record | str]],
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
        elif o is None or o < 0:
            # Acknowledged without an offset: librdkafka's idempotent producer reports the batches before one
            # the broker acknowledged as delivered too (their own answer was lost), with no offset to check.
            if all(pp != p for pp, _ in where[v]):
                out.add("inconsistent-offset", f"{v!r} acknowledged in partition {p}, read in {sorted(where[v])}")
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


# --- Transactions (read_committed consumers, transactional producers) -------------------------------------------
#
# A transaction's history: its producer (a transactional.id: that producer's transactions are sequential), its
# outcome as the client saw it ("committed", "aborted", or "unknown" when the client could not tell), the
# values it sent with their partitions, the records it read before writing (read-process-write: its input;
# the key-value workload: what a read_committed consumer of the written topic polled), the monotonic time the
# commit was asked for and the time the transaction ended, and the group offsets it committed with
# send_offsets_to_transaction. Every value is written once, by one transaction, so a value names its writer.

COMMITTED, ABORTED, UNKNOWN = "committed", "aborted", "unknown"
Seen = tuple[float, int, int, bytes]  # monotonic time of the poll, partition, offset, value


@dataclass
class Txn:
    id: str
    producer: str
    outcome: str
    writes: list[tuple[int, bytes]] = field(default_factory=list)  # (partition, value) in send order
    reads: list[Record] = field(default_factory=list)
    commit_at: float | None = None  # when commit_transaction was called
    ended: float = 0.0  # when the commit or abort returned
    offsets: dict[int, int] = field(default_factory=dict)  # group offsets committed in it: partition -> offset

    def as_dict(self) -> dict[str, object]:
        return {"id": self.id, "producer": self.producer, "outcome": self.outcome,
                "writes": [[p, v.decode()] for p, v in self.writes],
                "reads": [[p, o, v.decode()] for p, o, v in self.reads], "commit_at": self.commit_at,
                "ended": self.ended, "offsets": {str(p): o for p, o in self.offsets.items()}}


def _writers(txns: list[Txn]) -> dict[bytes, Txn]:
    return {v: t for t in txns for _, v in t.writes}


def aborted_reads(out: Anomalies, txns: list[Txn], seen: dict[str, list[Seen]],
                  final: dict[str, list[Record]]) -> None:
    """G1a: a read_committed consumer (or the final read) saw a record of a transaction that was aborted."""
    writer = _writers(txns)
    logs = [(f"the final read of {topic}", [(0.0, p, o, v) for p, o, v in records]) for topic, records in final.items()]
    for consumer, records in [*seen.items(), *logs]:
        for _, p, o, v in records:
            t = writer.get(v)
            if t is not None and t.outcome == ABORTED:
                out.add("G1a", f"{consumer} read {v!r} at {p}:{o}, written by aborted transaction {t.id}")


def intermediate_reads(out: Anomalies, txns: list[Txn], seen: dict[str, list[Seen]]) -> None:
    """G1b: a read_committed consumer saw a transaction's record before that transaction's commit was asked for,
    that is, a state of the log in which the transaction was still being written."""
    writer = _writers(txns)
    for consumer, records in seen.items():
        for at, p, o, v in records:
            t = writer.get(v)
            if t is None or t.outcome == ABORTED:
                continue  # not transactional, or G1a
            if t.commit_at is None or at < t.commit_at:
                out.add("G1b", f"{consumer} read {v!r} at {p}:{o} before transaction {t.id} asked to commit")


def torn_transactions(out: Anomalies, txns: list[Txn], final: dict[str, list[Record]]) -> None:
    """A transaction's records are all in the log or none is: some but not all is a torn transaction; none of a
    committed transaction's is a lost transaction."""
    present = {v for records in final.values() for _, _, v in records}
    for t in txns:
        if not t.writes:
            continue
        there = sum(1 for _, v in t.writes if v in present)
        if 0 < there < len(t.writes):
            out.add("torn-transaction", f"{t.id} ({t.outcome}): {there} of {len(t.writes)} records in the log")
        elif there == 0 and t.outcome == COMMITTED:
            out.add("lost-transaction", f"{t.id} committed, none of its {len(t.writes)} records in the log")


def dependency_cycles(out: Anomalies, txns: list[Txn], final: dict[str, list[Record]]) -> None:
    """G0 and G1c over the transactions' dependency graph.

    Edges: write-write, from each partition's order of committed records (the earlier record's transaction
    before the later's) and write-read, from the writer of a value to each transaction that read it. G0 is a
    cycle of write-write edges alone; G1c a cycle that needs a write-read edge. Two producers' concurrent
    transactions on the same partitions interleave their records in Kafka's design, which makes write cycles
    between them legitimate: the workloads give each producer partitions of its own (a rebalance hands a
    read-process-write partition over between transactions), so any cycle here is an anomaly.
    """
    writer = _writers(txns)
    ww: dict[str, set[str]] = defaultdict(set)
    wr: dict[str, set[str]] = defaultdict(set)
    by_partition: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
    for topic, records in final.items():
        for p, o, v in records:
            t = writer.get(v)
            if t is not None:
                by_partition[(topic, p)].append((o, t.id))
    for order in by_partition.values():
        order.sort()
        for (_, a), (_, b) in pairwise(order):
            if a != b:
                ww[a].add(b)
    for t in txns:
        for _, _, v in t.reads:
            w = writer.get(v)
            if w is not None and w.id != t.id:
                wr[w.id].add(t.id)
    for component in _cycles(ww):
        out.add("G0", f"write cycle among {sorted(component)[:8]}")
    both = {a: ww.get(a, set()) | wr.get(a, set()) for a in set(ww) | set(wr)}
    for component in _cycles(both):
        if any(b in component for a in component for b in wr.get(a, ())):  # then a cycle takes that edge
            out.add("G1c", f"write-read cycle among {sorted(component)[:8]}")


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with a cycle (more than one node, or a node with an edge to itself);
    Tarjan's algorithm, iterative so that long chains do not exhaust the stack."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    nodes = set(graph) | {b for bs in graph.values() for b in bs}
    for root in sorted(nodes):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                for _ in range(len(stack)):
                    x = stack.pop()
                    on_stack.discard(x)
                    component.add(x)
                    if x == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(component)
    return found


def group_offsets_forward(out: Anomalies, txns: list[Txn]) -> None:
    """A group's offsets committed in transactions never move backwards: per partition, in the order the commits
    returned, each offset is at least the previous one (a member taking a partition over after a rebalance
    starts from the committed offset, so it commits no lower)."""
    last: dict[int, tuple[int, str]] = {}
    for t in sorted((t for t in txns if t.outcome == COMMITTED), key=lambda t: t.ended):
        for p, o in sorted(t.offsets.items()):
            if p in last and o < last[p][0]:
                out.add("txn-offset-backwards", f"{t.id} committed {p}:{o} after {last[p][1]} committed {last[p][0]}")
            if p not in last or o >= last[p][0]:
                last[p] = (o, t.id)


def exactly_once(out: Anomalies, inputs: list[bytes], output: list[Record], txns: list[Txn]) -> None:
    """Read-process-write: each acknowledged input record's derived record (``<input>|<transaction>``) is in the
    committed output exactly once, and was written by a transaction that did not abort."""
    count: dict[bytes, int] = defaultdict(int)
    writer = _writers(txns)
    for p, o, v in output:
        source, sep, _ = v.rpartition(b"|")
        if not sep:
            out.add("eos-foreign", f"{v!r} at {p}:{o} is not a derived record")
            continue
        count[source] += 1
        t = writer.get(v)
        if t is None:
            out.add("eos-foreign", f"{v!r} at {p}:{o} was written by no recorded transaction")
    for v in inputs:
        n = count.get(v, 0)
        if n == 0:
            out.add("eos-missing", f"input {v!r} has no derived record in the committed output")
        elif n > 1:
            out.add("eos-duplicate", f"input {v!r} has {n} derived records in the committed output")


def check_transactions(txns: list[Txn], seen: dict[str, list[Seen]], final: dict[str, list[Record]],
                       inputs: list[bytes], output: list[Record]) -> Anomalies:
    """Every transactional check; ``final`` holds, per topic, every transactionally written topic's committed
    records (read with read_committed after the faults), ``output`` the read-process-write output topic's."""
    out = Anomalies()
    aborted_reads(out, txns, seen, final)
    intermediate_reads(out, txns, seen)
    torn_transactions(out, txns, final)
    dependency_cycles(out, txns, final)
    group_offsets_forward(out, txns)
    exactly_once(out, inputs, output, txns)
    return out


# --- Share groups ------------------------------------------------------------------------------------------------

Delivery = tuple[float, str, int, int]  # monotonic time, consumer, partition, offset


def share_deliveries(out: Anomalies, acked: dict[bytes, tuple[int, int]], delivered: list[Delivery],
                     accepted: list[Delivery]) -> None:
    """Share groups: every acknowledged record is delivered; a record whose acceptance the broker confirmed
    (ShareAcknowledge or ShareFetch acknowledgements answered without error) is never delivered again, and so
    never accepted twice."""
    got = {(p, o) for _, _, p, o in delivered}
    for v, (p, o) in acked.items():
        if (p, o) not in got:
            out.add("share-undelivered", f"{v!r} at {p}:{o} acknowledged by the broker, never delivered")
    first: dict[tuple[int, int], tuple[float, str]] = {}
    for at, consumer, p, o in sorted(accepted):
        if (p, o) in first:
            out.add("share-accepted-twice", f"{p}:{o} accepted by {first[(p, o)][1]} and again by {consumer}")
        else:
            first[(p, o)] = (at, consumer)
    for at, consumer, p, o in delivered:
        done = first.get((p, o))
        if done is not None and at > done[0]:
            out.add("share-redelivered", f"{p}:{o} delivered to {consumer} after {done[1]}'s acceptance was confirmed")
