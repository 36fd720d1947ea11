"""Which response of a connection may be written next: Kafka's per-connection ordering, with parking.

Kafka promises that the requests of one connection are processed in the order they were sent and answered
in that order.  A request whose in-order work is done and that now only waits for an acknowledgement (an
acks=all produce waiting for the ISR, a ``log.flush.on.ack`` fsync) is *parked*: the connection goes on
processing the next requests while it waits, and their responses queue behind it.  This object is that
queue, with no sockets and no tasks: the network edge asks it what to write and when to stop reading.

Every entry keeps the bytes its request reserved from the memory pool until its response is written, so
``queued.max.request.bytes`` still bounds what a pipelining connection holds.
"""

from __future__ import annotations

from collections import deque

from pykbroker.server.transmit import ResponseParts


class Slot:
    """One request read from the connection and not yet answered."""

    __slots__ = ("close_reason", "done", "forgotten", "long_poll", "replicated", "reserved", "response")

    def __init__(self, reserved: int, replicated: bool = False, long_poll: bool = False) -> None:
        self.reserved = reserved  # bytes reserved from the memory pool for the request
        self.replicated = replicated  # parked for other brokers (the ISR), not only for this one's fsync
        self.long_poll = long_poll  # a fetch parked until data arrives or its max_wait passes
        self.done = False  # processed: its response (or its close) is known
        self.response: bytes | ResponseParts | None = None  # None and no close_reason: nothing to write (acks=0)
        self.close_reason: str | None = None  # close the connection here instead of answering
        self.forgotten = False  # the connection is gone (``clear``): a late completion changes nothing


class ResponseOrder:
    """The unanswered requests of one connection, in the order they were read.

    The task that finds the head done takes it (``take``) and writes it; while it writes, nobody else may
    (``written`` ends that), so responses go out strictly in request order whichever task completes them.
    A close entry, once taken, stops everything after it: the responses before it have been written.
    """

    __slots__ = ("_slots", "_writing", "close_reason", "max_unanswered", "max_unanswered_bytes",
                 "max_unanswered_local", "parked", "parked_long_polls", "parked_replicated", "read_past_long_polls",
                 "unanswered_bytes")

    def __init__(self, max_unanswered: int, max_unanswered_bytes: int | None = None,
                 max_unanswered_local: int | None = None, *, read_past_long_polls: bool = True) -> None:
        # Requests read but not answered beyond which the connection stops reading (at least 1) while any
        # of them waits for other brokers: each request read on behind one is one more acknowledgement for
        # the followers to bring, and a reader that stops makes producers send fewer, larger requests ...
        self.max_unanswered = max(max_unanswered, 1)
        # ... and while they wait only for this broker's fsync, which one fsync gives them all: a reader that
        # stops there stops appending too, so a slow fsync would stall the partition for everyone reading it.
        self.max_unanswered_local = self.max_unanswered if max_unanswered_local is None else \
            max(max_unanswered_local, 1)
        # ... or their request bytes: many small acknowledgements may wait together (one fsync covers them
        # all), few large ones (an acks=all producer of 1 MB requests needs only a few to keep replication busy).
        self.max_unanswered_bytes = max_unanswered_bytes
        # Fetches waiting for data do not count against those limits (up to max_unanswered of them), so that
        # a connection reads on past them even at max_unanswered 1: a fetch waiting at the log end must not
        # keep the connection from reading the produce that would answer it.
        self.read_past_long_polls = read_past_long_polls
        self.parked_long_polls = 0
        self.unanswered_bytes = 0
        self._slots: deque[Slot] = deque()
        self._writing = False
        self.parked = 0  # entries still waiting for their acknowledgement
        self.parked_replicated = 0  # ... of which waiting for other brokers
        self.close_reason: str | None = None  # set when a close entry was taken: write nothing more

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def idle(self) -> bool:
        """Nothing unanswered and nothing being written."""
        return not self._slots and not self._writing

    @property
    def full(self) -> bool:
        """Read no further request until an answer is written (one unanswered request is always allowed)."""
        n = len(self._slots)
        if n and self.max_unanswered_bytes is not None and self.unanswered_bytes >= self.max_unanswered_bytes:
            return True
        polls = self.parked_long_polls if self.read_past_long_polls else 0
        if polls > self.max_unanswered:
            return True
        strict = self.parked_replicated or self.parked_long_polls
        return n - polls >= (self.max_unanswered if strict else self.max_unanswered_local)

    def _add(self, slot: Slot) -> Slot:
        self._slots.append(slot)
        self.unanswered_bytes += slot.reserved
        return slot

    def ready(self, response: bytes | ResponseParts | None, reserved: int) -> Slot:
        """A request processed in place: its response waits only for those before it."""
        slot = Slot(reserved)
        slot.done = True
        slot.response = response
        return self._add(slot)

    def closing(self, reason: str, reserved: int) -> Slot:
        """A request whose answer is to close the connection, once the responses before it are written."""
        slot = self.ready(None, reserved)
        slot.close_reason = reason
        return slot

    def park(self, reserved: int, *, replicated: bool = True, long_poll: bool = False) -> Slot:
        """A request waiting for its acknowledgement (``replicated``: from other brokers too, not only this
        one's fsync), or a fetch waiting for data (``long_poll``); ``complete`` or ``fail`` it later."""
        slot = Slot(reserved, replicated and not long_poll, long_poll)
        self.parked += 1
        self.parked_replicated += slot.replicated
        self.parked_long_polls += long_poll
        return self._add(slot)

    def complete(self, slot: Slot, response: bytes | ResponseParts | None) -> None:
        """A parked request's acknowledgement came: its response (None: none to write)."""
        if self._finish(slot):
            slot.response = response

    def fail(self, slot: Slot, reason: str) -> None:
        """A parked request ended in a connection close (fault injection, an internal error)."""
        if self._finish(slot):
            slot.close_reason = reason

    def _finish(self, slot: Slot) -> bool:
        if slot.forgotten:
            return False
        if slot.done:
            raise ValueError("a parked request was completed twice")
        slot.done = True
        self.parked -= 1
        self.parked_replicated -= slot.replicated
        self.parked_long_polls -= slot.long_poll
        return True

    def take(self) -> Slot | None:
        """The next entry to write, if the head is done and no other task is writing; else None.

        The caller writes it (a close entry: closes the connection instead) and then calls ``written``.
        """
        if self._writing or self.close_reason is not None or not self._slots or not self._slots[0].done:
            return None
        slot = self._slots.popleft()
        self.unanswered_bytes -= slot.reserved
        if slot.close_reason is not None:
            self.close_reason = slot.close_reason
        self._writing = True
        return slot

    def written(self) -> None:
        """The entry ``take`` gave is written (or its write failed): the next one may go."""
        self._writing = False

    def clear(self) -> int:
        """The connection is gone: forget every entry; the bytes they still hold reserved."""
        reserved = sum(s.reserved for s in self._slots)
        for s in self._slots:
            s.reserved = 0
            s.forgotten = True
        self._slots.clear()
        self.parked = 0
        self.parked_replicated = 0
        self.parked_long_polls = 0
        self.unanswered_bytes = 0
        return reserved
