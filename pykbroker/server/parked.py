"""A handler's answer that is not ready yet: the request waits only for an acknowledgement condition.

A produce with acks=all waits for the ISR to reach its append, and with ``log.flush.on.ack`` for an fsync
covering it; everything else it does (checks, appends) is done in request order before it returns a
``Parked``.  The network edge may then process the connection's next requests while ``finish`` runs
(pykbroker/server/response_order.py keeps the answers in request order); callers that do not pipeline
simply await ``finish`` in place.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
# Covariant: a handler's Parked[ProduceResponse | None] is a Parked of some response body.
T_co = TypeVar("T_co", covariant=True)

# How a settled request reports: (answer, None), or (None, the exception ``finish`` would have raised).
Settled = Callable[[T | None, BaseException | None], None]


class Parked(Generic[T_co]):
    """The rest of a request's work: ``finish`` is awaited exactly once and gives its answer.

    ``replicated``: whether the wait includes other brokers (acks=all and the ISR), not just this broker's
    own fsync.  The network edge bounds the two differently (``ResponseOrder``): one fsync covers every
    request waiting for it, so reading on behind an fsync costs the disk nothing more, while each request
    read behind a replication wait is one more acknowledgement for the followers to bring.

    ``settle``, when given, is ``finish`` as a callback: ``settle(done)`` arranges for ``done(answer, None)``
    or ``done(None, error)`` to be called once, later, on the event loop (never inside ``settle``).  The
    network edge then answers from that callback, with no task per request (a produce that waits only for
    its fsync: pykbroker/replica/group_commit.py).  Whoever takes a ``Parked`` calls one of the two, once.

    ``long_poll``: a fetch waiting for data (min_bytes, max_wait), not for an acknowledgement.  It answers
    with what exists when it answers, so the requests after it may be processed first; one of them may be
    the produce that brings its data (a client that writes while it long-polls on one connection, as
    kafka-go's ``Conn`` does), which must not wait behind it."""

    __slots__ = ("finish", "long_poll", "replicated", "settle")

    def __init__(self, finish: Callable[[], Awaitable[T_co]], *, replicated: bool = True, long_poll: bool = False,
                 settle: Callable[[Settled[T_co]], None] | None = None) -> None:
        self.finish = finish
        self.replicated = replicated
        self.long_poll = long_poll
        self.settle = settle
