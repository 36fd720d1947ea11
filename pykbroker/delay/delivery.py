"""Delivery state of one ``__delayed_records`` partition led by this broker (cluster mode; sans-I/O).

In a cluster every ``__delayed_records`` partition is delivered by its leader alone. Its deliveries are
stamped with a producer id that belongs to the *partition* (not to the broker) and a producer epoch that
is the partition's leader epoch, so the target's producer state fences a deposed leader as soon as the
new one has delivered, and a new leader can finish its predecessor's last delivery to each target by
re-sending exactly that batch (same id, epoch and sequence): the target answers it as a duplicate if it
was appended, and appends it if not. Only then does the new leader start its own epoch at sequence 0.

Per target partition there is at most one delivery in flight (its intent written, its append not yet
acknowledged), which is what makes "the last intent of each target" enough to settle a takeover.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from pykbroker.delay.serde import Entry, Intent, ProducerSequence

# Deliveries in a cluster use this base plus the __delayed_records partition; above the broker-owned ids
# of the single-broker mode (2**62 + broker.id), and like them never handed out to clients.
CLUSTER_PRODUCER_ID_BASE = (1 << 62) + (1 << 32)
MAX_PRODUCER_EPOCH = 32766  # producer epochs are int16; Short.MAX_VALUE is reserved by Kafka
SEQ_MOD = 1 << 31

DELIVERED, RETRY, FENCED = "delivered", "retry", "fenced"

Target = tuple[str, int]


def producer_id_for(partition: int) -> int:
    return CLUSTER_PRODUCER_ID_BASE + partition


def producer_epoch_for(leader_epoch: int) -> int:
    """The leader epoch as a producer epoch (clamped: past 32766 leader changes fencing stops working)."""
    return min(max(leader_epoch, 0), MAX_PRODUCER_EPOCH)


def outcome(code: ErrorCode) -> str:
    """What a target's answer to a delivery means: appended (now or before), try again, or fenced."""
    if code in (ErrorCode.none, ErrorCode.duplicate_sequence_number):
        return DELIVERED
    if code in (ErrorCode.invalid_producer_epoch, ErrorCode.producer_fenced):
        return FENCED  # a newer leader of the __delayed_records partition delivers to this target now
    return RETRY


def forward_error(code: ErrorCode | None) -> ErrorCode:
    """What a producer is answered when forwarding its delayed records failed with ``code`` (None: the
    leader of ``__delayed_records`` could not be reached). Always a code producers retry: NOT_ENOUGH_REPLICAS
    when nothing was written there, REQUEST_TIMED_OUT when it may have been."""
    if code == ErrorCode.none:
        return code
    if code is None or code in (ErrorCode.request_timed_out, ErrorCode.not_enough_replicas_after_append,
                                ErrorCode.network_exception):
        return ErrorCode.request_timed_out
    return ErrorCode.not_enough_replicas


@dataclass
class Delivery:
    """One batch of entries on its way to a target; ``offset_before`` is -1 when the target is remote."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    offset_before: int
    entries: list[Entry]

    @property
    def target(self) -> Target:
        return self.topic, self.partition

    def intent(self) -> Intent:
        return Intent(self.topic, self.partition, self.base_sequence, self.offset_before,
                      tuple(e.uid for e in self.entries), self.producer_id, self.producer_epoch)


@dataclass
class Ownership:
    """A ``__delayed_records`` partition this broker leads in ``leader_epoch``."""

    index: int
    leader_epoch: int
    loaded: bool = False
    inflight: dict[Target, Delivery] = field(default_factory=dict)
    next_sequence: dict[Target, int] = field(default_factory=dict)
    # The last scheduled-whole idempotent batch per (producer id, target): a forwarded retry of it is a duplicate.
    sequences: dict[tuple[int, str, int], ProducerSequence] = field(default_factory=dict)

    @property
    def producer_id(self) -> int:
        return producer_id_for(self.index)

    @property
    def producer_epoch(self) -> int:
        return producer_epoch_for(self.leader_epoch)

    def resume(self, it: Intent) -> None:
        """A replayed intent of this very producer id and epoch (the same leader epoch loaded again, or
        epochs past the clamp): this epoch's sequences continue after it, as the target expects."""
        if it.producer_id == self.producer_id and it.producer_epoch == self.producer_epoch:
            self.next_sequence[(it.topic, it.partition)] = (it.base_sequence + len(it.uids)) % SEQ_MOD

    def settle(self, it: Intent, entries: list[Entry]) -> Delivery:
        """A predecessor's last delivery to a target, still unconfirmed: re-sent as it was."""
        d = Delivery(it.topic, it.partition, it.producer_id, it.producer_epoch, it.base_sequence, it.offset_before,
                     entries)
        self.inflight[d.target] = d
        return d

    def begin(self, topic: str, partition: int, entries: list[Entry], offset_before: int) -> Delivery:
        """A new delivery in this epoch: the target's next sequence numbers."""
        target = (topic, partition)
        if target in self.inflight:
            raise ValueError(f"a delivery to {topic}-{partition} is already in flight")
        seq = self.next_sequence.get(target, 0)
        d = Delivery(topic, partition, self.producer_id, self.producer_epoch, seq, offset_before, entries)
        self.next_sequence[target] = (seq + len(entries)) % SEQ_MOD
        self.inflight[target] = d
        return d

    def abort(self, d: Delivery) -> None:
        """Its intent could not be written: nothing was sent, so its sequence numbers are used again."""
        if self.inflight.get(d.target) is d:
            del self.inflight[d.target]
            if d.producer_epoch == self.producer_epoch and d.producer_id == self.producer_id:
                self.next_sequence[d.target] = d.base_sequence

    def finish(self, d: Delivery) -> None:
        if self.inflight.get(d.target) is d:
            del self.inflight[d.target]

    def is_duplicate(self, seq: ProducerSequence) -> bool:
        known = self.sequences.get((seq.producer_id, seq.topic, seq.partition))
        return known is not None and (known.epoch, known.base_sequence, known.last_offset_delta) == (
            seq.epoch, seq.base_sequence, seq.last_offset_delta)

    def record_sequence(self, seq: ProducerSequence) -> None:
        self.sequences[(seq.producer_id, seq.topic, seq.partition)] = seq
