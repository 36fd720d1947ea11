"""The campaign's transactional and share-group load, with real clients (confluent-kafka), light enough to run
beside the main producer and group (a few transactions a second):

- read-process-write: an idempotent producer feeds an input topic; two processors, each a read_committed member
  of one consumer group with a transactional producer of its own, write a derived record per input record to
  the same partition of an output topic and commit the group's offsets in the same transaction, aborting a
  seeded fraction of transactions on purpose; a group of two read_committed consumers reads the output;
- key-value transactions: two transactional producers, each owning half the partitions of a topic, write one
  record to each of several of their partitions per transaction (aborting a seeded fraction), after polling
  what a read_committed consumer of the whole topic returns, so that transactions read each other's writes;
- a share group of two consumers acknowledging (ACCEPT) every record an idempotent producer sends.

What each client saw goes to ``tests/nemesis/checker.py``'s transactional and share-group checks.
"""

from __future__ import annotations

import abc
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    AcknowledgeType,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    ShareConsumer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from tests.cluster.steady import read_all
from tests.nemesis.checker import (
    ABORTED,
    COMMITTED,
    UNKNOWN,
    Anomalies,
    Delivery,
    Record,
    Seen,
    Txn,
    check,
    check_transactions,
    share_deliveries,
)
from tests.nemesis.workload import Reader, Writer

PARTITIONS = 3  # of each topic here: the input, the output, the key-value and the share topic
KV_PARTITIONS = 6
ABORT_FRACTION = 0.2
PACE = 0.4  # seconds between a worker's transactions
CLIENT_TIMEOUT = 30.0
# Broker settings the share workload needs (on every broker).
SHARE_OVERRIDES = {"group.share.enable": "true", "share.coordinator.state.topic.num.partitions": "6"}


def _record(m: Any) -> Record:
    """A polled message as (partition, offset, value); confluent-kafka types them optional, a record has them."""
    p, o, v = m.partition(), m.offset(), m.value()
    assert p is not None and o is not None and v is not None
    return p, o, v


class Abandoned(Exception):
    """A client call that did not return in time: its producer is left to the thread waiting in it."""


def bounded(call: Callable[[], None], seconds: float) -> None:
    """Run ``call`` in a thread of its own and wait at most ``seconds``: librdkafka's send_offsets_to_transaction
    does not check its timeout and can wait forever once the group coordinator it cached left the metadata
    (a broker killed, then started again). Raises ``Abandoned`` then, or what ``call`` raised."""
    done = threading.Event()
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as e:  # handed to the caller
            raised.append(e)
        finally:
            done.set()

    threading.Thread(target=run, name="nemesis-bounded-call", daemon=True).start()
    if not done.wait(seconds):
        raise Abandoned(f"no answer in {seconds} s")
    if raised:
        raise raised[0]


class Transactional(abc.ABC):
    """A transactional producer whose every transaction ends with an outcome the client can vouch for: committed
    (commit_transaction returned), aborted (abort_transaction returned, or the commit was never asked for), or
    unknown (the commit was asked for and the client could not tell; a new producer with the same
    transactional.id then fences the old one)."""

    def __init__(self, bootstrap: str, transactional_id: str, name: str, seed: str, max_seconds: float) -> None:
        self.bootstrap = bootstrap
        self.transactional_id = transactional_id
        self.name = name
        self.rng = random.Random(seed)
        self.max_seconds = max_seconds
        self.txns: list[Txn] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"nemesis-{name}", daemon=True)
        self.producer: Producer | None = None

    def _new_producer(self, deadline: float) -> Producer | None:
        for _ in range(100):  # bounded: each try takes up to CLIENT_TIMEOUT or stops at the deadline
            if time.monotonic() > deadline:
                return None
            p = Producer({"bootstrap.servers": self.bootstrap, "broker.address.family": "v4",
                          "transactional.id": self.transactional_id, "client.id": f"nemesis-{self.name}",
                          "transaction.timeout.ms": 60000, "message.timeout.ms": 55000, "linger.ms": 5,
                          "request.timeout.ms": 10000, "retry.backoff.ms": 100,
                          "topic.metadata.refresh.interval.ms": 1000})
            try:
                p.init_transactions(CLIENT_TIMEOUT)
                return p
            except KafkaException as e:
                self.errors.append(f"init_transactions: {e.args[0].name()}")
                self._stop.wait(1.0)
        return None

    def _retrying(self, call: Callable[[], None]) -> None:
        """A transactional call again while it fails with a retriable error (the client says it may be)."""
        for attempt in range(4):
            try:
                call()
                return
            except KafkaException as e:
                err = e.args[0]
                if attempt == 3 or not err.retriable() or err.txn_requires_abort() or err.fatal():
                    raise
                self.errors.append(f"retrying: {err.name()}")

    def transact(self, txn: Txn, body: Callable[[Producer], None], commit: bool) -> None:
        """Begin, run ``body``, then commit or abort; ``txn`` gets the outcome and its times."""
        assert self.producer is not None
        p = self.producer
        try:
            p.begin_transaction()
            body(p)
            if commit:
                txn.commit_at = time.monotonic()
                self._retrying(lambda: p.commit_transaction(CLIENT_TIMEOUT))
                txn.outcome = COMMITTED
            else:
                self._retrying(lambda: p.abort_transaction(CLIENT_TIMEOUT))
                txn.outcome = ABORTED
        except Abandoned as e:  # the producer stays blocked: a new one fences it
            self.errors.append(f"{txn.id}: {e}")
            txn.outcome = ABORTED if txn.commit_at is None else UNKNOWN
            self.producer = None
        except (KafkaException, BufferError) as e:
            err = e.args[0] if isinstance(e, KafkaException) else None
            self.errors.append(f"{txn.id}: {err.name() if err is not None else 'queue full'}")
            txn.outcome = ABORTED if txn.commit_at is None else UNKNOWN
            if err is not None and err.txn_requires_abort() and not err.fatal():
                try:
                    self._retrying(lambda: p.abort_transaction(CLIENT_TIMEOUT))
                    txn.outcome = ABORTED
                except KafkaException as e2:
                    self.errors.append(f"{txn.id} abort: {e2.args[0].name()}")
                    self.producer = None
            else:
                self.producer = None  # fatal, or no telling where it stands: a new producer fences this one
        txn.ended = time.monotonic()
        self.txns.append(txn)

    def _main(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        try:
            for _ in range(1_000_000):
                if self._stop.is_set() or time.monotonic() > deadline:
                    break
                if self.producer is None:
                    self.producer = self._new_producer(deadline)
                    if self.producer is None:
                        break
                self.step()
                self._stop.wait(PACE)
        finally:
            try:
                self.close()
            except KafkaException as e:  # best effort: the worker is done either way
                self.errors.append(f"close: {e.args[0].name()}")

    @abc.abstractmethod
    def step(self) -> None:
        """One transaction of this worker's kind."""

    def close(self) -> None:
        if self.producer is not None:  # between transactions: nothing open, nothing outstanding
            self.producer.close()
            self.producer = None

    def start(self) -> Transactional:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(3 * CLIENT_TIMEOUT)

    def counts(self) -> dict[str, int]:
        out = {COMMITTED: 0, ABORTED: 0, UNKNOWN: 0}
        for t in self.txns:
            out[t.outcome] += 1
        return out


class Processor(Transactional):
    """Read-process-write: consume a batch (read_committed, in the group), write ``<input>|<transaction>`` to the
    output partition of the input's partition and the batch's next offsets to the group, in one transaction.
    After a transaction that did not commit, the consumer goes back to the group's committed offsets."""

    def __init__(self, bootstrap: str, source: str, sink: str, group: str, name: str, seed: str,
                 max_seconds: float) -> None:
        super().__init__(bootstrap, f"{group}-{name}", name, seed, max_seconds)
        self.source, self.sink = source, sink
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "broker.address.family": "v4", "group.id": group,
            "client.id": f"nemesis-{name}", "isolation.level": "read_committed", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": 10000, "heartbeat.interval.ms": 1000,
            "topic.metadata.refresh.interval.ms": 1000})
        self.consumer.subscribe([source])

    def step(self) -> None:
        records = [m for m in self.consumer.consume(50, 0.5) if m.error() is None]
        if not records:
            return
        txn = Txn(f"{self.name}-{len(self.txns) + 1}", self.transactional_id, ABORTED)
        txn.reads = [_record(m) for m in records]
        txn.writes = [(p, v + b"|" + txn.id.encode()) for p, _, v in txn.reads]
        for p, o, _ in txn.reads:
            txn.offsets[p] = max(txn.offsets.get(p, 0), o + 1)

        def body(producer: Producer) -> None:
            for p, v in txn.writes:
                producer.produce(self.sink, v, partition=p)
            offsets = [TopicPartition(self.source, p, o) for p, o in txn.offsets.items()]
            group = self.consumer.consumer_group_metadata()
            bounded(lambda: producer.send_offsets_to_transaction(offsets, group, CLIENT_TIMEOUT), CLIENT_TIMEOUT + 5)

        self.transact(txn, body, commit=self.rng.random() >= ABORT_FRACTION)
        if txn.outcome != COMMITTED:
            if self.producer is None:  # fence the old producer first: its pending offsets then settle
                self.producer = self._new_producer(time.monotonic() + 5 * CLIENT_TIMEOUT)
            self._rewind()

    def _rewind(self) -> None:
        """Back to the committed offsets (they wait for a pending transactional commit to settle)."""
        for _ in range(5):
            try:
                parts = self.consumer.assignment()
                for tp in self.consumer.committed(parts, timeout=CLIENT_TIMEOUT) if parts else []:
                    self.consumer.seek(TopicPartition(tp.topic, tp.partition,
                                                      tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))
                return
            except KafkaException as e:
                self.errors.append(f"rewind: {e.args[0].name()}")
        # No telling where the group stands: leave it, so that a rejoin starts from the committed offsets.
        self.consumer.unsubscribe()
        self.consumer.subscribe([self.source])

    def processed(self) -> set[bytes]:
        return {v for t in self.txns if t.outcome == COMMITTED for _, _, v in t.reads}

    def close(self) -> None:
        self.consumer.close()
        super().close()


class KeyValueWriter(Transactional):
    """Poll what a read_committed consumer of the whole topic returns (the transaction's reads), then write one
    record ``<transaction>-<partition>`` to each of two or more of this producer's own partitions."""

    def __init__(self, bootstrap: str, topic: str, own: list[int], name: str, seed: str, max_seconds: float) -> None:
        super().__init__(bootstrap, f"{topic}-{name}", name, seed, max_seconds)
        self.topic, self.own = topic, own
        self.seen: list[Seen] = []
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "broker.address.family": "v4", "group.id": f"{topic}-{name}-reads",
            "client.id": f"nemesis-{name}-reads", "isolation.level": "read_committed",
            "enable.auto.commit": False, "topic.metadata.refresh.interval.ms": 1000})
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(KV_PARTITIONS)])

    def step(self) -> None:
        reads: list[Record] = []
        for m in self.consumer.consume(100, 0.2):
            if m.error() is None:
                p, o, v = _record(m)
                reads.append((p, o, v))
                self.seen.append((time.monotonic(), p, o, v))
        txn = Txn(f"{self.name}-{len(self.txns) + 1}", self.transactional_id, ABORTED, reads=reads)
        parts = self.rng.sample(self.own, self.rng.randint(2, len(self.own)))
        txn.writes = [(p, f"{txn.id}-{p}".encode()) for p in sorted(parts)]

        def body(producer: Producer) -> None:
            for p, v in txn.writes:
                producer.produce(self.topic, v, partition=p)

        self.transact(txn, body, commit=self.rng.random() >= ABORT_FRACTION)

    def close(self) -> None:
        self.consumer.close()
        super().close()


class ShareWorker:
    """ShareConsumers of one share group, polled in turn from one thread, acknowledging every record ACCEPT
    explicitly; an acceptance counts as confirmed when commit_sync answers without error for its partition."""

    def __init__(self, bootstrap: str, topic: str, group: str, *, members: int = 2, max_seconds: float) -> None:
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.members = members
        self.max_seconds = max_seconds
        self.delivered: list[Delivery] = []
        self.accepted: list[Delivery] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemesis-share", daemon=True)

    def _run(self) -> None:
        consumers = {f"share-{i}": ShareConsumer({
            "bootstrap.servers": self.bootstrap, "broker.address.family": "v4", "group.id": self.group,
            "client.id": f"nemesis-share-{i}", "share.acknowledgement.mode": "explicit", "max.poll.records": 50,
            "socket.timeout.ms": 10000}) for i in range(1, self.members + 1)}
        for c in consumers.values():
            c.subscribe([self.topic])
        deadline = time.monotonic() + self.max_seconds
        try:
            for _ in range(10_000_000):
                if self._stop.is_set() or time.monotonic() > deadline:
                    break
                for name, c in consumers.items():
                    self._round(name, c)
        finally:
            for c in consumers.values():
                try:
                    c.close()
                except Exception as e:  # best effort: the consumer is done either way
                    self.errors.append(f"close: {e}")

    def _round(self, name: str, c: ShareConsumer) -> None:
        try:
            msgs = c.poll(0.3)
        except KafkaException as e:
            self.errors.append(f"poll: {e.args[0].name()}")
            return
        mine: list[tuple[int, int]] = []
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    self.errors.append(f"{name}: {err.name()}")
                continue
            p, o, _ = _record(m)
            self.delivered.append((time.monotonic(), name, p, o))
            c.acknowledge(m, AcknowledgeType.ACCEPT)
            mine.append((p, o))
        if not mine:
            return
        try:
            result = c.commit_sync(CLIENT_TIMEOUT)
        except KafkaException as e:  # not confirmed: these may come back
            self.errors.append(f"commit_sync: {e.args[0].name()}")
            return
        failed = {tp.partition for tp, err in result.items() if err is not None}
        if failed:
            self.errors.append(f"{name}: acknowledgements refused for partitions {sorted(failed)}")
        now = time.monotonic()
        self.accepted += [(now, name, p, o) for p, o in mine if p not in failed]

    def start(self) -> ShareWorker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(3 * CLIENT_TIMEOUT)


class CommittedPositions:
    """A read-process-write group's committed offsets, for the drain after the faults. An input counts as done
    once a committed transaction processed it, or once the group's committed offset is past it: a transaction
    whose commit the client could not confirm (outcome unknown) may have committed after all, and then no
    transaction will ever process its inputs again. Which of those happened is for the checks over the output
    read back (each acknowledged input once in the committed output), not for the wait."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int) -> None:
        self.topic, self.partitions = topic, partitions
        # read_committed: OffsetFetch with require_stable, so a pending transactional commit settles first.
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                                  "isolation.level": "read_committed", "broker.address.family": "v4"})

    def not_passed(self, waiting: dict[bytes, tuple[int, int]]) -> dict[bytes, tuple[int, int]]:
        """The inputs of ``waiting`` (value -> partition, offset) the group's committed offsets have not passed."""
        if not waiting:
            return waiting
        try:
            got = self.consumer.committed([TopicPartition(self.topic, p) for p in range(self.partitions)],
                                          timeout=10)
        except KafkaException:
            return waiting
        passed = {tp.partition: tp.offset for tp in got if tp.error is None and tp.offset >= 0}
        return {v: (p, o) for v, (p, o) in waiting.items() if o is None or o < 0 or o >= passed.get(p, -1)}

    def close(self) -> None:
        self.consumer.close()


class SideLoad:
    """The transactional and share-group workloads of one seed: topics, clients, the drain after the faults,
    the checks and what to write down."""

    def __init__(self, bootstrap: str, tag: str, seed: int, max_seconds: float) -> None:
        self.bootstrap = bootstrap
        self.tag = tag
        self.source, self.sink = f"nemesis-in-{tag}", f"nemesis-out-{tag}"
        self.kv, self.shared = f"nemesis-kv-{tag}", f"nemesis-share-{tag}"
        self.share_group = f"nemesis-share-{tag}"
        admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
        topics = [NewTopic(t, KV_PARTITIONS if t == self.kv else PARTITIONS, 3)
                  for t in (self.source, self.sink, self.kv, self.shared)]
        for f in admin.create_topics(topics).values():
            f.result(timeout=CLIENT_TIMEOUT)
        res = ConfigResource(ConfigResource.Type.GROUP, self.share_group, incremental_configs=[
            ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([res])[res].result(timeout=CLIENT_TIMEOUT)
        self.feed = Writer(bootstrap, self.source, f"{tag}-in", rate=20, max_seconds=max_seconds)
        self.share_feed = Writer(bootstrap, self.shared, f"{tag}-share", rate=20, max_seconds=max_seconds)
        group = f"nemesis-rpw-{tag}"
        self.positions = CommittedPositions(bootstrap, group, self.source, PARTITIONS)
        self.processors = [Processor(bootstrap, self.source, self.sink, group, f"processor-{i}", f"{seed}-p{i}",
                                     max_seconds) for i in (1, 2)]
        half = KV_PARTITIONS // 2
        self.kv_writers = [KeyValueWriter(bootstrap, self.kv, list(range(i * half, (i + 1) * half)), f"kv-{i + 1}",
                                          f"{seed}-kv{i}", max_seconds) for i in (0, 1)]
        self.output_readers = [Reader(bootstrap, self.sink, f"nemesis-out-{tag}", f"output-{i}",
                                      max_seconds=max_seconds, settings={"isolation.level": "read_committed"})
                               for i in (1, 2)]
        self.sharer = ShareWorker(bootstrap, self.shared, self.share_group, max_seconds=max_seconds)
        self.final: dict[str, list[Record]] = {}

    def start(self) -> SideLoad:
        self.feed.start()
        self.share_feed.start()
        workers: list[Transactional | Reader | ShareWorker] = [*self.processors, *self.kv_writers,
                                                               *self.output_readers, self.sharer]
        for w in workers:
            w.start()
        return self

    def stop_feeds(self) -> int:
        """Stop the producers feeding the input and share topics; the count of records still unreported."""
        unreported = self.feed.stop_and_flush() + self.share_feed.stop_and_flush()
        self._place_offsetless_share_acks()
        return unreported

    def _place_offsetless_share_acks(self) -> None:
        """librdkafka may acknowledge a record without its offset (a retried batch the leader had already
        written). The share checks match deliveries by partition and offset, so such records are looked up in
        the share topic once, after the feed stopped; one not found there keeps its missing offset and is
        reported as never delivered."""
        missing = [v for v, (_, o) in self.share_feed.acked.items() if o is None or o < 0]
        if not missing:
            return
        places = read_all(self.bootstrap, self.shared, PARTITIONS, timeout=120)
        for v in missing:
            found = places.get(v)
            if found:
                self.share_feed.acked[v] = found[0]

    def drained(self) -> bool:
        """Whether every acknowledged input went through a committed transaction and every acknowledged share
        record was delivered."""
        return not self._unprocessed() and set(self.share_feed.acked.values()) <= {
            (p, o) for _, _, p, o in self.sharer.delivered}

    def _unprocessed(self) -> dict[bytes, tuple[int, int]]:
        """Acknowledged inputs no committed transaction processed and the group's offsets have not passed."""
        done: set[bytes] = set()
        for p in self.processors:
            done |= p.processed()
        return self.positions.not_passed({v: po for v, po in self.feed.acked.items() if v not in done})

    def pending(self) -> dict[str, Any]:
        """What the drain still waits for: acknowledged inputs no committed transaction processed, acknowledged
        share records never delivered (a few of each, with their partition and offset)."""
        delivered = {(p, o) for _, _, p, o in self.sharer.delivered}
        inputs = sorted(self._unprocessed().values())
        share = sorted(po for po in self.share_feed.acked.values() if po not in delivered)
        return {"unprocessed_inputs": len(inputs), "unprocessed_examples": inputs[:10],
                "undelivered_share_records": len(share), "undelivered_examples": share[:10]}

    def stop(self) -> None:
        workers: list[Transactional | Reader | ShareWorker] = [*self.processors, *self.kv_writers,
                                                               *self.output_readers, self.sharer]
        for w in workers:  # every one told first, so that they wind down together
            w._stop.set()
        for w in workers:
            w.stop()
        self.feed.close()  # no client may outlive the cluster's network (see campaign.run)
        self.positions.close()
        self.share_feed.close()

    def read_final(self) -> None:
        for topic in (self.sink, self.kv):
            parts = KV_PARTITIONS if topic == self.kv else PARTITIONS
            self.final[topic] = [(p, o, v) for v, places in read_all(self.bootstrap, topic, parts, timeout=120).items()
                                 for p, o in places]

    def txns(self) -> list[Txn]:
        return [t for w in (*self.processors, *self.kv_writers) for t in w.txns]

    def seen(self) -> dict[str, list[Seen]]:
        out = {w.name: w.seen for w in self.kv_writers}
        for r in self.output_readers:
            records = [x for x in r.polls if not isinstance(x, str)]
            out[r.name] = [(at, p, o, v) for at, (p, o, v) in zip(r.polled_at, records, strict=True)]
        return out

    def check(self) -> Anomalies:
        out = check_transactions(self.txns(), self.seen(), self.final, list(self.feed.acked), self.final[self.sink])
        share_deliveries(out, self.share_feed.acked, self.sharer.delivered, self.sharer.accepted)
        # The output topic's readers are a consumer group too: the main checks over their polls and commits.
        out.merge(check({}, {r.name: r.polls for r in self.output_readers},
                        {r.name: r.commits for r in self.output_readers}, self.final[self.sink]), prefix="output-")
        return out

    def report(self) -> dict[str, Any]:
        return {
            "input_acknowledged": len(self.feed.acked),
            "transactions": {w.name: w.counts() for w in (*self.processors, *self.kv_writers)},
            "transaction_errors": {w.name: w.errors[:10] for w in (*self.processors, *self.kv_writers)},
            "output_records": len(self.final.get(self.sink, [])), "kv_records": len(self.final.get(self.kv, [])),
            "share_acknowledged": len(self.share_feed.acked), "share_delivered": len(self.sharer.delivered),
            "share_accepted": len(self.sharer.accepted), "share_errors": self.sharer.errors[:10],
            "feed_errors": (self.feed.errors + self.share_feed.errors)[:10],
        }

    def observations(self) -> dict[str, Any]:
        return {
            "transactions": [t.as_dict() for t in self.txns()],
            "read_committed": {name: [[at, p, o, v.decode()] for at, p, o, v in records]
                               for name, records in self.seen().items()},
            "input_acked": {v.decode(): list(po) for v, po in self.feed.acked.items()},
            "share_acked": {v.decode(): list(po) for v, po in self.share_feed.acked.items()},
            "share_delivered": [list(d) for d in self.sharer.delivered],
            "share_accepted": [list(d) for d in self.sharer.accepted],
            "final_transactional": {t: [[p, o, v.decode()] for p, o, v in records]
                                    for t, records in self.final.items()},
        }
