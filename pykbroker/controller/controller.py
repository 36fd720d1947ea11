"""The ZooKeeper-mode controller: elected through /controller, fenced by /controller_epoch.

Every broker runs one ZkController. The one that creates the ephemeral /controller znode (and
bumps /controller_epoch in the same multi) is active: it watches brokers, topics and the admin
znodes, elects partition leaders and writes partition states. Brokers learn the results from
their own watches on the state znodes (there are no LeaderAndIsr requests).

Threading: one "controller-event-thread" takes events from a queue and does every ZooKeeper call
synchronously. Kazoo watch and session callbacks only enqueue. Every write is a multi that starts
with check(/controller_epoch, <version we wrote>), so a controller that lost its election (a
zombie) cannot change anything; partition state writes are also conditional on the state's
version, so a leader's concurrent ISR change is never overwritten (:mod:`.partition_state_machine`,
which also applies the leader elections; this module decides when: election, events, topic
deletion, reassignments).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
)
from kazoo.protocol.states import EventType, KazooState, WatchedEvent

from pykbroker.config import BrokerConfig
from pykbroker.controller import election
from pykbroker.controller.context import ControllerContext, TopicInfo, TopicPartition
from pykbroker.controller.partition_state_machine import (
    MAX_MULTI_OPS,
    MAX_WRITE_ROUNDS,
    ControllerMoved,
    MultiFailed,
    NotActive,
    PartitionStateMachine,
    ZkOp,
)
from pykbroker.metadata import zk_layout as zl
from pykbroker.metadata.zk_layout import PartitionState

log = logging.getLogger("pykbroker.controller")

ELECTIONS = zl.ELECTIONS
FIRST_REBALANCE_DELAY_S = 5.0  # as Kafka: the first auto rebalance check 5 s after election

# Event kinds
ELECT, CONTROLLER_CHANGE, RESIGN, STOP = "elect", "controller_change", "resign", "stop"
BROKER_CHANGE, TOPIC_CHANGE, PARTITION_MODIFICATION = "broker_change", "topic_change", "partition_modification"
TOPIC_DELETION, ISR_CHANGE, CONTROLLED_SHUTDOWN = "topic_deletion", "isr_change", "controlled_shutdown"
ELECTION_REQUESTS, REBALANCE, LEGACY_REASSIGNMENT = "election_requests", "rebalance", "legacy_reassignment"
CONFIG_CHANGE = "config_change"

_CHILD_EVENTS = {
    zl.BROKER_IDS: BROKER_CHANGE, zl.BROKER_TOPICS: TOPIC_CHANGE, zl.DELETE_TOPICS: TOPIC_DELETION,
    zl.ISR_CHANGE_NOTIFICATION: ISR_CHANGE, zl.CONTROLLED_SHUTDOWN: CONTROLLED_SHUTDOWN, ELECTIONS: ELECTION_REQUESTS,
    zl.CONFIG_CHANGES: CONFIG_CHANGE,
}


def _is_session_event(event: WatchedEvent) -> bool:
    """A connection-state notification kazoo delivers to every pending watch, not a znode change."""
    return event.type == EventType.NONE or event.path is None


class ZkController(PartitionStateMachine):
    """A controller candidate sharing the broker's kazoo client (and so its session)."""

    def __init__(self, zk: KazooClient, broker_id: int, config: BrokerConfig) -> None:
        super().__init__(zk, broker_id, config)
        self._queue: queue.Queue[tuple[str, str]] = queue.Queue()
        self._pending: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._epoch = 0
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._next_rebalance = float("inf")
        self._controller_id = -1
        self._failures = 0  # handler failures in a row (back-off before re-electing)

    # --- public -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the event thread and run for controller."""
        self._zk.add_listener(self._on_session_state)
        self._thread = threading.Thread(target=self._run, name="controller-event-thread", daemon=True)
        self._thread.start()
        self._enqueue(ELECT)

    def stop(self, timeout: float = 10.0) -> None:
        """Resign (deleting /controller if we hold it) and end the event thread, within ``timeout``."""
        if self._thread is None:
            return
        self._stopped.set()
        self._zk.remove_listener(self._on_session_state)
        self._queue.put((STOP, ""))
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("controller event thread did not stop within %(timeout).1fs", {"timeout": timeout})
        self._thread = None

    def is_active(self) -> bool:
        return self._active

    @property
    def epoch(self) -> int:
        """The controller epoch this broker was last elected with (0: never)."""
        return self._epoch

    @property
    def controller_id(self) -> int:
        """The active controller as this candidate last saw it (-1: none)."""
        return self._controller_id

    @property
    def context(self) -> ControllerContext:
        """The active controller's view (read it only for tests and diagnostics)."""
        return self._ctx

    # --- callbacks from kazoo threads: enqueue only ---------------------------------------------

    def _enqueue(self, kind: str, arg: str = "") -> None:
        if self._stopped.is_set():
            return
        with self._lock:
            if (kind, arg) in self._pending:
                return
            self._pending.add((kind, arg))
        self._queue.put((kind, arg))

    def _on_session_state(self, state: str) -> None:
        if self._stopped.is_set():
            return
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            if self._active:
                log.warning("ZooKeeper session %(state)s: controller %(broker_id)d stops acting",
                            {"state": state.lower(), "broker_id": self.broker_id})
            self._active = False  # at once, before the event thread sees anything
            stop = False
            with self._lock:
                self._pending.clear()
                while True:
                    try:
                        stop |= self._queue.get_nowait()[0] == STOP
                    except queue.Empty:
                        break
            if stop:
                self._queue.put((STOP, ""))
            self._enqueue(RESIGN)
        elif state == KazooState.CONNECTED:
            self._enqueue(ELECT)

    # Every watch first drops session events: when the connection drops, kazoo calls each pending watch
    # once with an event of type NONE and no path. The session listener (``_on_session_state``) handles
    # that: it resigns, and the election after the reconnection re-reads everything with fresh watches.

    def _watch_controller(self, event: WatchedEvent) -> None:
        if not _is_session_event(event):
            self._enqueue(CONTROLLER_CHANGE)

    def _watch_children(self, event: WatchedEvent) -> None:
        kind = None if _is_session_event(event) else _CHILD_EVENTS.get(event.path)
        if kind is not None:
            self._enqueue(kind)

    def _watch_topic(self, event: WatchedEvent) -> None:
        if not _is_session_event(event) and event.type in (EventType.CHANGED, EventType.CREATED):
            self._enqueue(PARTITION_MODIFICATION, event.path.rsplit("/", 1)[-1])

    def _watch_preferred(self, event: WatchedEvent) -> None:
        if not _is_session_event(event):
            self._enqueue(ELECTION_REQUESTS)

    def _watch_reassign(self, event: WatchedEvent) -> None:
        if not _is_session_event(event):
            self._enqueue(LEGACY_REASSIGNMENT)

    # --- the event thread ---------------------------------------------------------------------

    def _run(self) -> None:
        handlers: dict[str, Callable[[str], None]] = {
            ELECT: lambda _: self._elect(), CONTROLLER_CHANGE: lambda _: self._on_controller_change(),
            RESIGN: lambda _: self._resign(), BROKER_CHANGE: lambda _: self._on_broker_change(),
            TOPIC_CHANGE: lambda _: self._on_topic_change(), PARTITION_MODIFICATION: self._on_partition_modification,
            TOPIC_DELETION: lambda _: self._on_topic_deletion(), ISR_CHANGE: lambda _: self._on_isr_change(),
            CONTROLLED_SHUTDOWN: lambda _: self._on_controlled_shutdown(),
            ELECTION_REQUESTS: lambda _: self._on_election_requests(), REBALANCE: lambda _: self._on_rebalance(),
            LEGACY_REASSIGNMENT: lambda _: self._on_legacy_reassignment(),
            CONFIG_CHANGE: lambda _: self._on_config_change(),
        }
        while True:
            wait = None
            if self._active and self._next_rebalance != float("inf"):
                wait = max(0.0, self._next_rebalance - time.monotonic())
            try:
                kind, arg = self._queue.get(timeout=wait)
            except queue.Empty:
                kind, arg = REBALANCE, ""
            with self._lock:
                self._pending.discard((kind, arg))
            if kind == STOP:
                self._safely(lambda: self._resign(delete_znode=True))
                return
            if not self._active and kind not in (ELECT, CONTROLLER_CHANGE, RESIGN):
                continue
            self._safely(lambda k=kind, a=arg: handlers[k](a))

    def _safely(self, fn: Callable[..., None]) -> None:
        try:
            fn()
            self._failures = 0
        except NotActive:
            return
        except ControllerMoved as e:
            log.error("controller %(broker_id)d epoch %(controller_epoch)d is no longer the controller (%(error)s): "
                      "resigning",
                      {"broker_id": self.broker_id, "controller_epoch": self._ctx.epoch, "error": e})
            self._resign(zombie=True)
            self._enqueue(CONTROLLER_CHANGE)
        except Exception as e:
            if self._stopped.is_set():
                return
            was_active = self._active
            log.warning("controller %(broker_id)d: %(cause)s: %(error)r",
                        {"broker_id": self.broker_id, "cause": 'reloading' if was_active else 'election failed',
                         "error": e},
                        exc_info=not isinstance(e, KazooException))
            self._resign()
            # Re-run the election (which reloads everything) after a pause growing with each failure
            # in a row; a lost session re-enqueues it from the session listener as well.
            self._failures += 1
            if not self._stopped.wait(min(10.0, 0.25 * 2 ** min(self._failures, 6))) and self._zk.connected:
                self._enqueue(ELECT)

    # --- election -----------------------------------------------------------------------------

    def _session_id(self) -> int | None:
        cid = self._zk.client_id
        return int(cid[0]) if cid else None

    def _read_epoch(self) -> tuple[int, int]:
        for _ in range(3):
            try:
                data, stat = self._get(zl.CONTROLLER_EPOCH)
                return zl.decode_controller_epoch(data), int(stat.version)
            except NoNodeError:
                try:
                    self._wait(self._zk.create_async(zl.CONTROLLER_EPOCH, zl.encode_controller_epoch(0)))
                except NodeExistsError:
                    pass
        raise KazooException("cannot read /controller_epoch")

    def _elect(self) -> None:
        """Become the controller if nobody is; otherwise watch /controller."""
        if self._active or self._stopped.is_set():
            return
        for _ in range(5):
            stat = self._exists(zl.CONTROLLER, watch=self._watch_controller)
            epoch, epoch_version = self._read_epoch()
            t = self._zk.transaction()
            if stat is not None:
                data, stat = self._get(zl.CONTROLLER)
                holder = zl.decode_controller(data)
                if holder != self.broker_id or stat.ephemeralOwner != self._session_id():
                    if holder != self._controller_id:
                        log.info("broker %(broker_id)d: the controller is broker %(holder)d",
                                 {"broker_id": self.broker_id, "holder": holder})
                    self._controller_id = holder
                    return
                # Still ours from before a connection loss: take it up again with a new epoch.
                t.check(zl.CONTROLLER, stat.version)
            else:
                t.create(zl.CONTROLLER, zl.encode_controller(self.broker_id), ephemeral=True)
            t.set_data(zl.CONTROLLER_EPOCH, zl.encode_controller_epoch(epoch + 1), version=epoch_version)
            results = self._wait(t.commit_async())
            if not any(isinstance(r, Exception) for r in results):
                self._ctx = ControllerContext(epoch=epoch + 1, epoch_zk_version=int(results[1].version))
                break
        else:
            return
        self._exists(zl.CONTROLLER, watch=self._watch_controller)
        self._epoch = self._ctx.epoch
        self._controller_id = self.broker_id
        self._active = True
        log.info("broker %(broker_id)d is the controller, epoch %(controller_epoch)d",
                 {"broker_id": self.broker_id, "controller_epoch": self._epoch})
        started = time.monotonic()
        self._on_elected()
        log.info("controller %(broker_id)d epoch %(controller_epoch)d: failover done in %(elapsed_s).3fs",
                 {"broker_id": self.broker_id, "controller_epoch": self._epoch,
                  "elapsed_s": time.monotonic() - started})

    def _on_controller_change(self) -> None:
        stat = self._exists(zl.CONTROLLER, watch=self._watch_controller)
        if self._active:
            if stat is not None and stat.ephemeralOwner == self._session_id():
                return
            log.warning("controller %(broker_id)d epoch %(controller_epoch)d: /controller is no longer ours, "
                        "resigning",
                        {"broker_id": self.broker_id, "controller_epoch": self._ctx.epoch})
            self._resign()
        self._elect()

    def _resign(self, delete_znode: bool = False, zombie: bool = False) -> None:
        if self._active:
            log.info("controller %(broker_id)d epoch %(controller_epoch)d resigns",
                     {"broker_id": self.broker_id, "controller_epoch": self._ctx.epoch})
        self._active = False
        self._controller_id = -1
        self._ctx = ControllerContext()
        self._next_rebalance = float("inf")
        if (delete_znode or zombie) and self._zk.connected:
            try:
                data, stat = self._get(zl.CONTROLLER)
                if zl.decode_controller(data) == self.broker_id and stat.ephemeralOwner == self._session_id():
                    self._wait(self._zk.delete_async(zl.CONTROLLER, version=stat.version))
            except Exception as e:
                log.debug("controller %(broker_id)d: could not delete /controller: %(error)r",
                          {"broker_id": self.broker_id, "error": e})

    # --- loading everything on election -------------------------------------------------------

    def _on_elected(self) -> None:
        for path in (*_CHILD_EVENTS, zl.CONFIG_TOPICS, zl.CONFIRMED_BROKERS):
            self._wait(self._zk.ensure_path_async(path))
        self._ctx.live_brokers, self._ctx.broker_czxid = self._read_brokers()
        for topic in self._children(zl.BROKER_TOPICS, watch=self._watch_children):
            self._load_topic(topic)
        shutting = {int(c) for c in self._children(zl.CONTROLLED_SHUTDOWN, watch=self._watch_children) if c.isdigit()}
        self._ctx.shutting_down = shutting & set(self._ctx.live_brokers)
        log.info("controller %(broker_id)d epoch %(controller_epoch)d: live brokers %(live_brokers)s, %(topics)d "
                 "topics, %(partitions)d partitions",
                 {"broker_id": self.broker_id, "controller_epoch": self._ctx.epoch,
                  "live_brokers": sorted(self._ctx.live_brokers), "topics": len(self._ctx.topics),
                  "partitions": len(self._ctx.states)})
        self._on_topic_deletion()
        unconfirmed = self._unconfirmed(sorted(self._ctx.live_brokers))
        if unconfirmed:
            # Registered again since the last controller confirmed them (restarted while no controller watched,
            # e.g. the old controller itself): they lost their state, so their previous run's leaderships and ISR
            # places go first, as for a broker seen restarting.
            log.info("controller %(broker_id)d epoch %(controller_epoch)d: brokers %(brokers)s restarted "
                     "unconfirmed", {"broker_id": self.broker_id, "controller_epoch": self._ctx.epoch,
                                     "brokers": unconfirmed})
            self._reconcile(self._ctx.partitions(), f"brokers {unconfirmed} restarted unconfirmed",
                            live=set(self._ctx.live_brokers) - set(unconfirmed))
        self._reconcile(self._ctx.partitions(), "controller failover")
        for b in sorted(self._ctx.shutting_down):
            self._controlled_shutdown(b)
        self._check_reassignments(self._ctx.reassigning())
        self._on_legacy_reassignment()
        self._on_isr_change()
        self._on_election_requests()
        self._on_config_change()
        self._confirm_brokers(sorted(self._ctx.live_brokers))
        if self._config["auto.leader.rebalance.enable"]:
            self._next_rebalance = time.monotonic() + min(
                FIRST_REBALANCE_DELAY_S, float(self._config["leader.imbalance.check.interval.seconds"]))

    def _read_brokers(self) -> tuple[dict[int, str | None], dict[int, int]]:
        ids = [c for c in self._children(zl.BROKER_IDS, watch=self._watch_children) if c.lstrip("-").isdigit()]
        reads = self._get_many([zl.broker_path(int(c)) for c in ids])
        racks: dict[int, str | None] = {}
        czxids: dict[int, int] = {}
        for c in ids:
            got = reads[zl.broker_path(int(c))]
            if got is None:
                continue
            data, stat = got
            try:
                racks[int(c)] = zl.decode_broker(int(c), data).rack
            except (ValueError, KeyError, TypeError):
                racks[int(c)] = None
            czxids[int(c)] = int(stat.czxid)
        return racks, czxids

    def _load_topic(self, topic: str) -> bool:
        """Read a topic's assignment (watching it) and the states of partitions not known yet."""
        try:
            data, stat = self._get(zl.topic_path(topic), watch=self._watch_topic)
        except NoNodeError:
            self._ctx.remove_topic(topic)
            return False
        try:
            a = zl.decode_topic_assignment(data)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            log.error("topic %(topic)s: unreadable assignment znode (%(error)r); ignored", {"topic": topic, "error": e})
            return False
        version = int(stat.version)
        if a.topic_id.int == 0:
            # Written by a tool that predates topic ids (KIP-516): the controller gives it one.
            a.topic_id = uuid.uuid4()
            try:
                version = int(self._multi([ZkOp("set", zl.topic_path(topic), zl.encode_topic_assignment(a),
                                               version)])[0].version)
                log.info("topic %(topic)s: assigned topic id %(topic_id)s",
                         {"topic": topic, "topic_id": zl.uuid_to_kafka(a.topic_id)})
            except MultiFailed:
                return self._load_topic_again(topic)
        old = self._ctx.topics.get(topic)
        self._ctx.topics[topic] = TopicInfo(a.topic_id, a.partitions, a.adding_replicas, a.removing_replicas,
                                            version)
        if old is not None:
            for p in set(old.replicas) - set(a.partitions):
                self._ctx.states.pop((topic, p), None)
        unknown = [(topic, p) for p in sorted(a.partitions) if (topic, p) not in self._ctx.states]
        self._refresh_states(unknown)
        return True

    def _load_topic_again(self, topic: str) -> bool:
        """The assignment changed while we gave it a topic id: its watch brings the new one."""
        self._enqueue(PARTITION_MODIFICATION, topic)
        return False

    # --- events -------------------------------------------------------------------------------

    def _on_broker_change(self) -> None:
        racks, czxids = self._read_brokers()
        old = self._ctx.broker_czxid
        dead = sorted(set(old) - set(czxids))
        bounced = sorted(b for b in set(old) & set(czxids) if old[b] != czxids[b])
        new = sorted(set(czxids) - set(old))
        if dead or bounced:
            log.info("controller %(broker_id)d: brokers gone %(dead)s, restarted %(bounced)s",
                     {"broker_id": self.broker_id, "dead": dead, "bounced": bounced})
            for b in dead:
                self._ctx.shutting_down.discard(b)
                self._ctx.live_brokers.pop(b, None)
            # A restarted broker lost its state: its leaderships and ISR memberships go first.
            self._reconcile(self._ctx.partitions(), f"brokers {dead + bounced} offline",
                            live=set(self._ctx.live_brokers) - set(bounced))
        if new or bounced:
            log.info("controller %(controller_id)d: brokers started %(brokers)s",
                     {"controller_id": self.broker_id, "brokers": sorted(new + bounced)})
        self._ctx.live_brokers, self._ctx.broker_czxid = racks, czxids
        self._ctx.shutting_down &= set(racks)
        if new or bounced or dead:
            self._reconcile(self._ctx.partitions(), "broker change")
        self._confirm_brokers(sorted(new + bounced))

    def _unconfirmed(self, brokers: list[int]) -> list[int]:
        """The brokers whose confirmation does not name their current registration (its czxid)."""
        reads = self._get_many([zl.confirmed_broker_path(b) for b in brokers])
        out = []
        for b in brokers:
            got = reads[zl.confirmed_broker_path(b)]
            if got is None or zl.decode_confirmation(got[0]) != self._ctx.broker_czxid.get(b):
                out.append(b)
        return out

    def _confirm_brokers(self, brokers: list[int]) -> None:
        """Tell each (re)started broker that its registration is taken into account: the leaderships and ISR
        places of its previous run are already moved (the reconcile above), so it may now take the roles the
        partition states give it. Until then it takes none (pykbroker.metadata.zookeeper)."""
        for b in brokers:
            czxid = self._ctx.broker_czxid.get(b)
            if czxid is None:
                continue
            path = zl.confirmed_broker_path(b)
            data = zl.encode_confirmation(czxid, self._ctx.epoch)
            stat = self._exists(path)
            self._multi([ZkOp("create", path, data)] if stat is None else [ZkOp("set", path, data, -1)])
            log.info("controller %(broker_id)d: broker %(broker)d confirmed (broker epoch %(broker_epoch)d)",
                     {"broker_id": self.broker_id, "broker": b, "broker_epoch": czxid})

    def _on_topic_change(self) -> None:
        children = set(self._children(zl.BROKER_TOPICS, watch=self._watch_children))
        for gone in sorted(set(self._ctx.topics) - children):
            log.info("topic %(gone)s: assignment znode removed", {"gone": gone})
            self._ctx.remove_topic(gone)
        added = sorted(children - set(self._ctx.topics))
        for topic in added:
            self._load_topic(topic)
        if added:
            self._reconcile([tp for t in added for tp in self._ctx.partitions_of(t)], "new topic")

    def _on_partition_modification(self, topic: str) -> None:
        if topic in self._ctx.deleting or not self._load_topic(topic):
            return
        tps = self._ctx.partitions_of(topic)
        self._reconcile(tps, "partition modification")
        self._check_reassignments([tp for tp in tps if self._ctx.topics[topic].is_reassigning(tp[1])])

    def _on_config_change(self) -> None:
        """A config change may have enabled unclean.leader.election.enable (topic or broker default): as
        Kafka's controller, give leaderless partitions that election now rather than at the next broker change."""
        self._children(zl.CONFIG_CHANGES, watch=self._watch_children)
        leaderless = [tp for tp, s in self._ctx.states.items() if s.leader not in self._ctx.live_brokers]
        if leaderless:
            self._reconcile(leaderless, "config change")

    def _on_isr_change(self) -> None:
        children = sorted(self._children(zl.ISR_CHANGE_NOTIFICATION, watch=self._watch_children))
        if not children:
            return
        paths = [f"{zl.ISR_CHANGE_NOTIFICATION}/{c}" for c in children]
        named: set[TopicPartition] = set()
        for got in self._get_many(paths).values():
            if got is not None:
                try:
                    named.update(zl.decode_partition_list(got[0]))
                except (ValueError, KeyError, TypeError):
                    pass
        self._refresh_states(sorted(named))
        self._delete_znodes(paths)
        self._check_reassignments([tp for tp in sorted(named) if tp[0] in self._ctx.topics
                                   and self._ctx.topics[tp[0]].is_reassigning(tp[1])])
        # A broker shutting down may now have another ISR member to hand its leaderships to.
        for b in sorted(self._ctx.shutting_down):
            self._controlled_shutdown(b, [tp for tp in named if (s := self._ctx.states.get(tp)) and s.leader == b])

    def _delete_znodes(self, paths: list[str]) -> None:
        """Fenced deletes, batched; znodes already gone are skipped."""
        todo = list(paths)
        for _ in range(len(todo) + MAX_WRITE_ROUNDS):
            if not todo:
                return
            chunk = todo[:MAX_MULTI_OPS - 1]
            try:
                self._multi([ZkOp("delete", p) for p in chunk])
            except MultiFailed as f:
                if not isinstance(f.error, NoNodeError | NodeExistsError):
                    raise f.error from None
                todo.remove(chunk[f.index])
                continue
            del todo[:len(chunk)]

    def _on_topic_deletion(self) -> None:
        children = sorted(self._children(zl.DELETE_TOPICS, watch=self._watch_children))
        if not children:
            return
        if not self._config["delete.topic.enable"]:
            log.info("controller %(broker_id)d: topic deletion is disabled (delete.topic.enable=false); dropping "
                     "requests %(children)s",
                     {"broker_id": self.broker_id, "children": children})
            self._delete_znodes([zl.delete_topic_path(t) for t in children])
            return
        for topic in children:
            self._delete_topic(topic)

    def _delete_topic(self, topic: str) -> None:
        started = time.monotonic()
        if topic in self._ctx.topics:
            self._ctx.deleting.add(topic)
            tps = self._ctx.partitions_of(topic)

            def offline(state: PartitionState | None) -> PartitionState | None:
                if state is None or state.leader == election.NO_LEADER:
                    return None
                return self._next_state(state, election.NO_LEADER, state.isr)

            self._write_states({tp: offline for tp in tps}, f"topic {topic} deletion")
        paths: list[str] = []  # leaves first
        try:
            for p in self._children(zl.partitions_path(topic)):
                base = f"{zl.partitions_path(topic)}/{p}"
                paths.extend(f"{base}/{c}" for c in self._children(base))
                paths.append(base)
            paths.append(zl.partitions_path(topic))
        except NoNodeError:
            pass
        for path in (zl.topic_path(topic), zl.topic_config_path(topic)):
            if self._exists(path) is not None:
                paths.append(path)
        # Stray children (anything else under the topic znode) must go before it.
        try:
            extra = [f"{zl.topic_path(topic)}/{c}" for c in self._children(zl.topic_path(topic)) if c != "partitions"]
            paths[:0] = extra
        except NoNodeError:
            pass
        paths.append(zl.delete_topic_path(topic))
        self._delete_znodes(paths)
        self._ctx.remove_topic(topic)
        log.info("topic %(topic)s deleted (%(paths)d znodes) in %(elapsed_s).3fs",
                 {"topic": topic, "paths": len(paths), "elapsed_s": time.monotonic() - started})

    def _on_controlled_shutdown(self) -> None:
        requested = {int(c) for c in self._children(zl.CONTROLLED_SHUTDOWN, watch=self._watch_children)
                     if c.isdigit()}
        requested &= set(self._ctx.live_brokers)
        started = sorted(requested - self._ctx.shutting_down)
        ended = sorted(self._ctx.shutting_down - requested)
        self._ctx.shutting_down = requested
        for b in started:
            log.info("controller %(controller_id)d: broker %(broker_id)d is shutting down",
                     {"controller_id": self.broker_id, "broker_id": b})
            self._controlled_shutdown(b)
        if ended:
            log.info("controller %(broker_id)d: brokers %(ended)s no longer shutting down",
                     {"broker_id": self.broker_id, "ended": ended})
            self._reconcile(self._ctx.partitions(), "broker back from controlled shutdown")

    def _on_election_requests(self) -> None:
        children = sorted(self._children(ELECTIONS, watch=self._watch_children))
        for child in children:
            path = f"{ELECTIONS}/{child}"
            try:
                data, _ = self._get(path)
                doc = zl._loads(data) or {}
                kind = int(doc.get("election_type", 0))
                raw = doc.get("partitions")
                tps = None if raw is None else [(str(e["topic"]), int(e["partition"])) for e in raw]
            except NoNodeError:
                continue
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                log.error("election request %(child)s unreadable (%(error)r); dropped", {"child": child, "error": e})
                self._delete_znodes([path])
                continue
            self._run_election(kind, tps, f"election request {child}")
            self._delete_znodes([path])
        if self._exists(zl.PREFERRED_REPLICA_ELECTION, watch=self._watch_preferred) is not None:
            try:
                data, _ = self._get(zl.PREFERRED_REPLICA_ELECTION)
                tps = zl.decode_partition_list(data)
            except NoNodeError:
                return
            except (ValueError, KeyError, TypeError, AttributeError):
                tps = []
            self._run_election(0, tps, "preferred replica election request")
            self._delete_znodes([zl.PREFERRED_REPLICA_ELECTION])

    def _on_rebalance(self) -> None:
        interval = float(self._config["leader.imbalance.check.interval.seconds"])
        self._next_rebalance = time.monotonic() + interval
        if not self._config["auto.leader.rebalance.enable"]:
            return
        threshold = self._config["leader.imbalance.per.broker.percentage"] / 100
        online = self._ctx.online()
        for broker in sorted(online):
            ratio, others = self._ctx.preferred_imbalance(broker)
            if ratio <= threshold:
                continue
            candidates = [tp for tp in others if not self._ctx.topics[tp[0]].is_reassigning(tp[1])
                          and broker in self._ctx.states[tp].isr]
            if candidates:
                log.info("controller %(controller_id)d: broker %(broker_id)d leads %(percent).0f%% fewer of its "
                         "preferred partitions than it should; preferred elections for %(elections)d",
                         {"controller_id": self.broker_id, "broker_id": broker, "percent": ratio * 100,
                          "elections": len(candidates)})
                self._run_election(0, candidates, "auto leader rebalance")

    def _check_reassignments(self, tps: list[TopicPartition]) -> None:
        """Complete the reassignments whose target replicas are all in the ISR (KIP-455)."""
        by_topic: dict[str, list[TopicPartition]] = {}
        for tp in tps:
            if self._ctx.reassignment_complete(tp):
                by_topic.setdefault(tp[0], []).append(tp)
        for topic, done in sorted(by_topic.items()):
            for i in range(0, len(done), MAX_MULTI_OPS - 2):
                self._complete_reassignments(topic, done[i:i + MAX_MULTI_OPS - 2])

    def _complete_reassignments(self, topic: str, tps: list[TopicPartition]) -> None:
        for _ in range(MAX_WRITE_ROUNDS):
            info = self._ctx.topics.get(topic)
            if info is None:
                return
            online = self._ctx.online()
            ops: list[ZkOp] = []
            planned: list[tuple[TopicPartition, PartitionState]] = []
            final = TopicInfo(info.topic_id, {p: list(r) for p, r in info.replicas.items()},
                              dict(info.adding), dict(info.removing), info.zk_version)
            for tp in tps:
                state = self._ctx.states.get(tp)
                if state is None or not info.is_reassigning(tp[1]) or not self._ctx.reassignment_complete(tp):
                    continue
                target = info.target(tp[1])
                leader = state.leader
                if leader not in target or leader not in online:
                    e = election.elect_reassignment(target, state.isr, online)
                    if e is None:
                        log.warning("%(topic)s-%(partition)d: reassignment to %(target)s waits: no target replica is "
                                    "online and in the isr %(isr)s",
                                    {"topic": tp[0], "partition": tp[1], "target": target, "isr": state.isr})
                        continue
                    leader = e.leader
                new = self._next_state(state, leader, [b for b in state.isr if b in target])
                planned.append((tp, new))
                ops.append(ZkOp("set", zl.partition_state_path(*tp), zl.encode_partition_state(new), state.zk_version))
                final.replicas[tp[1]] = target
                final.adding.pop(tp[1], None)
                final.removing.pop(tp[1], None)
            if not planned:
                return
            assignment = zl.TopicAssignment(final.topic_id, final.replicas, final.adding, final.removing)
            ops.append(ZkOp("set", zl.topic_path(topic), zl.encode_topic_assignment(assignment), info.zk_version))
            try:
                results = self._multi(ops)
            except MultiFailed as f:
                if not isinstance(f.error, BadVersionError):
                    raise f.error from None
                if f.index == len(ops) - 1:
                    self._load_topic(topic)
                else:
                    self._refresh_states([planned[f.index][0]])
                continue
            for (tp, new), r in zip(planned, results, strict=False):
                old = self._ctx.states.get(tp)
                self._ctx.states[tp] = replace(new, zk_version=int(r.version))
                self._log_change(tp, old, self._ctx.states[tp], "reassignment completed")
                log.info("%(topic)s-%(partition)d: reassignment completed, replicas %(replicas)s",
                         {"topic": tp[0], "partition": tp[1], "replicas": final.replicas[tp[1]]})
            final.zk_version = int(results[-1].version)
            self._ctx.topics[topic] = final
            return

    # --- Kafka's legacy /admin/reassign_partitions --------------------------------------------

    def _on_legacy_reassignment(self) -> None:
        """Start the reassignments an old tool wrote to /admin/reassign_partitions, then drop the znode.

        They become KIP-455 reassignments in the assignment znodes and complete like those.
        """
        if self._exists(zl.REASSIGN_PARTITIONS, watch=self._watch_reassign) is None:
            return
        try:
            moves = zl.decode_reassignment(self._get(zl.REASSIGN_PARTITIONS)[0])
        except NoNodeError:
            return
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            log.error("/admin/reassign_partitions unreadable (%(error)r); dropped", {"error": e})
            moves = {}
        by_topic: dict[str, dict[int, list[int]]] = {}
        for (topic, p), target in moves.items():
            by_topic.setdefault(topic, {})[p] = target
        for topic, targets in sorted(by_topic.items()):
            self._start_reassignments(topic, targets)
        self._delete_znodes([zl.REASSIGN_PARTITIONS])

    def _start_reassignments(self, topic: str, targets: dict[int, list[int]]) -> None:
        for _ in range(MAX_WRITE_ROUNDS):
            info = self._ctx.topics.get(topic)
            if info is None or topic in self._ctx.deleting:
                log.warning("reassignment of unknown topic %(topic)s ignored", {"topic": topic})
                return
            new = TopicInfo(info.topic_id, {p: list(r) for p, r in info.replicas.items()},
                            {p: list(r) for p, r in info.adding.items()},
                            {p: list(r) for p, r in info.removing.items()}, info.zk_version)
            for p, target in sorted(targets.items()):
                if p not in info.replicas or not target or len(set(target)) != len(target):
                    log.warning("reassignment of %(topic)s-%(partition)d to %(target)s ignored: no such partition or "
                                "bad replicas",
                                {"topic": topic, "partition": p, "target": target})
                    continue
                original = [b for b in info.replicas[p] if b not in info.adding.get(p, [])]
                new.adding.pop(p, None)
                new.removing.pop(p, None)
                new.replicas[p] = list(target) if target == original else \
                    list(target) + [b for b in original if b not in target]
                if target != original:
                    if adding := [b for b in target if b not in original]:
                        new.adding[p] = adding
                    if removing := [b for b in original if b not in target]:
                        new.removing[p] = removing
            if (new.replicas, new.adding, new.removing) == (info.replicas, info.adding, info.removing):
                return
            assignment = zl.TopicAssignment(new.topic_id, new.replicas, new.adding, new.removing)
            try:
                results = self._multi([ZkOp("set", zl.topic_path(topic), zl.encode_topic_assignment(assignment),
                                           info.zk_version)])
            except MultiFailed as f:
                if not isinstance(f.error, BadVersionError):
                    raise f.error from None
                self._load_topic(topic)
                continue
            new.zk_version = int(results[0].version)
            self._ctx.topics[topic] = new
            log.info("topic %(topic)s: reassignments started %(targets)s",
                     {"topic": topic, "targets": {p: new.target(p) for p in sorted(targets) if p in new.replicas}})
            tps = self._ctx.partitions_of(topic)
            self._reconcile(tps, "reassignment")
            self._check_reassignments([tp for tp in tps if new.is_reassigning(tp[1])])
            return
