"""``pykbroker txn list|describe``: transactions as their coordinators see them (ListTransactions asked of
every broker, as kafka-transactions does; DescribeTransactions asked of the transactional id's coordinator)."""

from __future__ import annotations

from typing import Any

import click

from ..connection import check
from ..session import Session, connection_options
from ..wire import TRANSACTION, ms, retriable

DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66
STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "PrepareEpochFence",
          "Dead")


@click.group("txn")
def txn() -> None:
    """Transactions: list them, describe one."""


@txn.command("list")
@click.option("--state", "states", multiple=True, type=click.Choice(STATES), help="only in this state (repeatable)")
@connection_options
def list_(states: tuple[str, ...], session: Session) -> None:
    """Transactional ids of every coordinator, with their producer id and state."""
    wire = session.wire
    docs: list[dict[str, Any]] = []
    body = {"state_filters": list(states), "producer_id_filters": [], "duration_filter": -1}
    for broker_id, address in sorted(wire.brokers().items()):
        def call(address: str = address) -> Any:
            _, response = wire.connect(address).request(LIST_TRANSACTIONS, body)
            retriable(response.error_code)
            return response

        response = wire.retrying(f"ListTransactions to broker {broker_id}", call)
        check(response.error_code, f"ListTransactions to broker {broker_id}")
        docs += [{"transactional_id": str(t.transactional_id), "producer_id": int(t.producer_id),
                  "state": str(t.transaction_state), "coordinator": broker_id} for t in response.transaction_states]
    docs.sort(key=lambda d: d["transactional_id"])
    session.out.emit(docs, ["TRANSACTIONAL-ID", "PRODUCER-ID", "STATE", "COORDINATOR"],
                     [[d["transactional_id"], d["producer_id"], d["state"], d["coordinator"]] for d in docs])


@txn.command("describe")
@click.argument("transactional_id")
@connection_options
def describe(transactional_id: str, session: Session) -> None:
    """A transaction's state, producer id and epoch, timeout, start time and partitions."""
    wire = session.wire

    def call() -> tuple[int, Any]:
        node, conn = wire.coordinator(transactional_id, TRANSACTION)
        _, response = conn.request(DESCRIBE_TRANSACTIONS, {"transactional_ids": [transactional_id]})
        state = response.transaction_states[0]
        retriable(state.error_code)
        return node, state

    node, t = wire.retrying(f"DescribeTransactions {transactional_id}", call)
    check(t.error_code, f"DescribeTransactions {transactional_id}")
    start = ms(t.transaction_start_time)
    doc: dict[str, Any] = {"transactional_id": transactional_id, "coordinator": node, "state": str(t.transaction_state),
           "producer_id": int(t.producer_id), "producer_epoch": int(t.producer_epoch),
           "timeout_ms": ms(t.transaction_timeout), "start_time_ms": start if start is not None and start >= 0
           else None,
           "partitions": sorted(({"topic": str(p.topic), "partition": int(i)} for p in t.topics for i in p.partitions),
                                key=lambda d: (d["topic"], d["partition"]))}
    if session.out.json:
        session.out.emit(doc)
        return
    session.out.fields([("TransactionalId", transactional_id), ("Coordinator", node), ("State", doc["state"]),
                        ("ProducerId", doc["producer_id"]), ("ProducerEpoch", doc["producer_epoch"]),
                        ("TimeoutMs", doc["timeout_ms"]), ("StartTimeMs", doc["start_time_ms"])])
    session.out.table(["TOPIC", "PARTITION"], [[p["topic"], p["partition"]] for p in doc["partitions"]])


COMMANDS = (txn,)
