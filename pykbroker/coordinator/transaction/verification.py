"""KIP-890 part 1: the partition leader checks that a transaction's first batch belongs to it.

Before a transactional batch opens a transaction on a partition (its producer has none ongoing
there), Kafka's leader asks the transaction coordinator (AddPartitionsToTxn v4+ with
``verify_only``) whether the partition was added to the producer's transaction, and refuses the
batch otherwise.  That closes the hole where a late retry of an aborted transaction's batch, or a
producer that skipped AddPartitionsToTxn, leaves an open transaction no marker will ever end,
pinning the last stable offset (``hanging transaction``).

On one broker the coordinator is local, so the question is a method call; it is asked and the
batch appended with no await in between, so no marker can slip in (Kafka needs a verification
guard in the producer state for that).  In a cluster the coordinator may be another broker: the
produce path then asks it first (:func:`verify_with_coordinator`, AddPartitionsToTxn v5) and the
answer is used at the append.  The group coordinator verifies a transaction's offsets partition the
same way before a TxnOffsetCommit (``offsets.TxnOffsets``).
``transaction.partition.verification.enable`` (default true, dynamic) turns it off.  Transactional
records in a Produce request without a transactional id are refused either way
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED), as Kafka's authorization refuses them.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from pykbroker.protocol.records import BatchHeader, parse_batch_header
from pykbroker.replica.append_hooks import AppendHook
from pykbroker.security.request import RequestContext
from pykbroker.storage.producer_state import ProducerStateError

if TYPE_CHECKING:
    from pykbroker.coordinator.services import CoordinatorServices
    from pykbroker.replica.replica_manager import Partition

_ATTR_TRANSACTIONAL = 0x10
PRODUCE_ABORTABLE_SINCE = 11  # Produce v11 knows TRANSACTION_ABORTABLE

# Coordinator-side conditions a producer from before KIP-890 would not retry correctly on Produce:
# Kafka answers NOT_ENOUGH_REPLICAS, which every producer retries without a metadata refresh.
_RETRIABLE = frozenset({ErrorCode.concurrent_transactions, ErrorCode.network_exception,
                        ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available,
                        ErrorCode.not_coordinator})


def produce_error(code: ErrorCode, produce_version: int) -> tuple[ErrorCode, str]:
    """The Produce error (and message) Kafka's leader answers for a failed verification."""
    if code == ErrorCode.producer_fenced:
        return ErrorCode.invalid_producer_epoch, "Producer's epoch is stale (transaction verification)"
    if code == ErrorCode.transaction_abortable:
        if produce_version >= PRODUCE_ABORTABLE_SINCE:
            return code, "Partition was not added to the transaction"
        code = ErrorCode.invalid_txn_state
    if code == ErrorCode.invalid_txn_state:
        return code, "Partition was not added to the transaction"
    if code in _RETRIABLE:
        return (ErrorCode.not_enough_replicas, "Unable to verify the partition has been added to the transaction. "
                f"Underlying error: {code.name.upper()}")
    return code, f"Transaction verification failed: {code.name.upper()}"


def opens_transaction(p: Partition, producer_id: int, producer_epoch: int) -> bool:
    """Whether a transactional batch of this producer would begin a transaction on ``p``: it has none
    open there at this epoch (an open one was verified when it began)."""
    entry = p.log.producer_state.last_entry(producer_id)
    return not (entry is not None and entry.current_txn_first_offset is not None and entry.epoch == producer_epoch)


def _needs_verification(svc: CoordinatorServices, p: Partition, header: BatchHeader,
                        transactional_id: str | None) -> bool:
    if not header.attributes & _ATTR_TRANSACTIONAL or transactional_id is None or header.producer_id < 0:
        return False
    if not svc.config["transaction.partition.verification.enable"]:
        return False
    return opens_transaction(p, header.producer_id, header.producer_epoch)


async def verify_with_coordinator(svc: CoordinatorServices, p: Partition, records: bytes,
                                  transactional_id: str) -> None:
    """Cluster mode, before the append: when the transaction's coordinator is another broker, ask it
    (AddPartitionsToTxn v5 ``verify_only``) and keep its answer for :func:`verify_transactional_batch`.

    The caller re-checks its leadership after this await; a marker that lands in between is caught
    by the partition's producer state, as on one broker.
    """
    tc = getattr(svc, "txn_coordinator", None)
    if tc is None or tc.remote is None:
        return
    try:
        header = parse_batch_header(records, 0)
    except Exception:  # malformed: the append's validation answers for it
        return
    if not _needs_verification(svc, p, header, transactional_id):
        return
    node = tc.coordinator_node(transactional_id)
    if node == svc.broker_id:
        return  # local: verify_transactional_batch asks the state machine
    key = (p.topic, p.index, header.producer_id, header.producer_epoch)
    if len(tc.remote_verified) > 10_000:  # answers of appends that failed before using them
        tc.remote_verified.clear()
    if node is None:
        tc.remote_verified[key] = ErrorCode.coordinator_not_available
        return
    tc.remote_verified[key] = await tc.remote.verify(node, transactional_id, header.producer_id,
                                                     header.producer_epoch, (p.topic, p.index))


def verify_transactional_batch(svc: CoordinatorServices, p: Partition, header: BatchHeader,
                               transactional_id: str | None, produce_version: int) -> None:
    """Raise :class:`ProducerStateError` if ``header`` would open a transaction the coordinator does
    not know of on this partition; return quietly when no verification is needed or it passed."""
    if not header.attributes & _ATTR_TRANSACTIONAL:
        return
    if transactional_id is None:
        # Kafka authorizes transactional writes by the request's transactional id; without one there
        # is nothing to authorize (or verify) them against, with or without verification.
        raise ProducerStateError(int(ErrorCode.transactional_id_authorization_failed),
                                 "Transactional records need the request's transactional id")
    if header.producer_id < 0:
        return
    if not svc.config["transaction.partition.verification.enable"]:
        return
    if not opens_transaction(p, header.producer_id, header.producer_epoch):
        return
    tc = getattr(svc, "txn_coordinator", None)
    if tc is None:
        code = ErrorCode.coordinator_not_available
    else:
        tp = (p.topic, p.index)
        asked = tc.remote_verified.pop((p.topic, p.index, header.producer_id, header.producer_epoch), None)
        code = asked if asked is not None else \
            tc.sm.verify_partitions(transactional_id, header.producer_id, header.producer_epoch, [tp])[tp]
    if code != ErrorCode.none:
        err, message = produce_error(code, produce_version)
        raise ProducerStateError(int(err), message)


class TransactionVerification(AppendHook):
    """KIP-890 on the produce path: a transactional batch that would begin a transaction on a partition
    must be in that transaction at its coordinator (asked before the append when it is another broker)."""

    def __init__(self, svc: CoordinatorServices) -> None:
        self.svc = svc

    def before_append(self, ctx: RequestContext, p: Partition, records: bytes,
                      transactional_id: str | None) -> Awaitable[None] | None:
        if transactional_id and self.svc.store.is_cluster():  # the coordinator may be another broker
            return verify_with_coordinator(self.svc, p, records, transactional_id)
        return None

    def check_batch(self, ctx: RequestContext, p: Partition, header: BatchHeader,
                    transactional_id: str | None) -> None:
        verify_transactional_batch(self.svc, p, header, transactional_id, ctx.version)
