"""Idempotent producer and transactions (read_committed / read_uncommitted, offsets in a transaction)."""

from __future__ import annotations

import uuid
from collections import defaultdict

from compat import scenario as s
from compat.check import text_msgs
from compat.clients import base
from compat.clients.base import Client, Msg, wait_until


@s.scenario("producer.idempotent", "idempotence", needs=(base.IDEMPOTENCE,), apis=(*s.IDEMPOTENCE, 0, 1))
def test_idempotent(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=3)
    sent = [Msg(value=f"{k}:{i}".encode(), key=f"key-{k}".encode(), partition=k % 3)
            for i in range(40) for k in range(6)]
    client.produce(topic, sent, idempotent=True)
    got = client.consume(topic, [0, 1, 2], count=len(sent) + 1, idle=3.0, timeout=30)
    values = [r.value for r in got]
    assert len(values) == len(set(values)) == len(sent), "duplicates or losses with enable.idempotence"
    seqs: dict[bytes, list[int]] = defaultdict(list)
    for r in sorted(got, key=lambda r: (r.partition, r.offset)):
        assert r.key is not None and r.value is not None
        seqs[r.key].append(int(r.value.split(b":")[1]))
    for k, seq in seqs.items():
        assert seq == list(range(40)), f"{k!r}: out of order {seq}"


def _txn_id() -> str:
    return f"compat-txn-{uuid.uuid4().hex[:12]}"


@s.scenario("txn.commit-abort-isolation", "transactions", needs=(base.TRANSACTIONS,), apis=(*s.TRANSACTIONS, 0, 1))
def test_transactions(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=2)
    a = [m for p in range(2) for m in text_msgs(5, prefix=f"A{p}", partition=p, headers=False)]
    b = [m for p in range(2) for m in text_msgs(5, prefix=f"B{p}", partition=p, headers=False)]
    c = [m for p in range(2) for m in text_msgs(5, prefix=f"C{p}", partition=p, headers=False)]
    client.produce_transactions(topic, [(a, True), (b, False), (c, True)], _txn_id())

    committed = client.consume(topic, [0, 1], count=21, isolation="read_committed", idle=3.0, timeout=30)
    got = sorted((r.partition, r.offset, r.value) for r in committed)
    want_values = sorted(m.value or b"" for m in a + c)
    assert sorted(v or b"" for _, _, v in got) == want_values, "read_committed must see exactly the committed"
    uncommitted = client.consume(topic, [0, 1], count=31, isolation="read_uncommitted", idle=3.0, timeout=30)
    assert sorted(r.value or b"" for r in uncommitted) == sorted(m.value or b"" for m in a + b + c), \
        "read_uncommitted must see aborted records too"
    # Offsets only ever grow, and each transaction's marker takes an offset: the aborted records sit
    # between the two committed batches.
    for p in range(2):
        offs = [o for q, o, _ in got if q == p]
        assert offs == sorted(offs) and offs[0] == 0 and offs[5] > 5 + 5, f"partition {p} offsets {offs}"


@s.scenario("txn.offsets-in-transaction", "transactions", needs=(base.TXN_OFFSETS,),
            apis=(*s.TXN_OFFSETS, *s.COMMITS, 0), consumes=False)
def test_offsets_in_transaction(client: Client, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    src = new_topic(partitions=1)
    out = new_topic(partitions=1)
    helper.produce(src, text_msgs(10, partition=0))
    group = f"compat-txn-group-{uuid.uuid4().hex[:10]}"
    tid = _txn_id()
    client.transactional_offsets(out, text_msgs(3, prefix="t1", headers=False), tid, group, src, {0: 3}, True)
    wait_until(lambda: helper.committed_offsets(group, src, [0]) == {0: 3}, 20,
               what="the offset committed in the transaction to become visible")
    client.transactional_offsets(out, text_msgs(3, prefix="t2", headers=False), tid, group, src, {0: 7}, False)
    assert helper.committed_offsets(group, src, [0]) == {0: 3}, "an aborted transaction's offsets must not commit"


@s.scenario("txn.admin-describe", "transactions", needs=(base.TRANSACTIONS, base.TXN_ADMIN),
            apis=(*s.TRANSACTIONS, 61, 65, 66), consumes=False)
def test_transaction_admin(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    """ListTransactions, DescribeTransactions and DescribeProducers after a committed transaction."""
    topic = new_topic(partitions=1)
    tid = _txn_id()
    client.produce_transactions(topic, [(text_msgs(3, partition=0, headers=False), True)], tid)
    # Kafka answers EndTxn once the coordinator has logged PrepareCommit, and moves the transaction to
    # CompleteCommit after the markers are written: right after the commit it may still be listed as
    # PrepareCommit, and never as anything else.
    seen: list[str | None] = []

    def completed() -> bool:
        seen.append(client.list_transactions().get(tid))
        return seen[-1] == "completecommit"

    wait_until(completed, 20, what=f"{tid} to be listed as CompleteCommit")
    assert set(seen) <= {"preparecommit", "completecommit"}, f"{tid}: {seen}"
    assert client.describe_transaction(tid) == "completecommit"
    assert len(client.describe_producers(topic, 0)) == 1
