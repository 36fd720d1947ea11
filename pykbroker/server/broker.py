"""The broker: wires configuration, metadata, logs, replicas and the network together.

Startup loads the metadata store and every local log (recovering those that
were not shut down cleanly), then opens the listeners.  Shutdown stops
reading requests, lets in-flight ones finish, flushes and closes the logs and
writes the clean-shutdown marker so the next start skips recovery.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.abc

from pykbroker import __version__
from pykbroker.config import BrokerConfig, effective_topic_config, log_config_for
from pykbroker.coordinator.group.service import OFFSETS_TOPIC, GroupCoordinator
from pykbroker.coordinator.transaction.offsets import TxnOffsets
from pykbroker.coordinator.transaction.service import TXN_TOPIC, TransactionCoordinator
from pykbroker.metadata.embedded import EmbeddedMetadataStore
from pykbroker.metadata.store import MetadataStore
from pykbroker.server.connection_quotas import quotas_from_config
from pykbroker.server.context import Services
from pykbroker.server.dispatcher import Dispatcher
from pykbroker.server.network import SocketServer, raise_nofile_limit
from pykbroker.server.replica_manager import ReplicaManager
from pykbroker.server.topics import TopicManager
from pykbroker.storage.cleaner import LogCleaner
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.log_manager import LogManager

log = logging.getLogger("pykbroker.broker")


def _periodic(
    interval_s: float, fn: Callable[[], Any], *, thread: bool = False
) -> Callable[[], Coroutine[Any, Any, None]]:
    async def loop() -> None:
        while True:
            await anyio.sleep(interval_s)
            try:
                if thread:
                    await anyio.to_thread.run_sync(fn)
                else:
                    fn()
            except Exception:
                log.exception("background task %s failed", getattr(fn, "__name__", fn))

    return loop


class Broker:
    def __init__(self, config: BrokerConfig, store: MetadataStore | None = None) -> None:
        self.config = config
        self.broker_id = config.broker_id
        advertised = config.advertised_listeners
        self.log_manager = LogManager(config.log_dirs, log_config_for(config, {}))
        self.store = store or EmbeddedMetadataStore(
            config.log_dirs[0], self.broker_id, [(a.name, a.host, a.port) for a in advertised]
        )
        self.replicas = ReplicaManager(self.broker_id, self.log_manager)
        self.topics = TopicManager(config, self.store, self.replicas)
        self.services = Services(config, self.store, self.replicas, self.topics, advertised,
                                 drop_produce_responses=config["pykbroker.fault.drop.produce.response"])
        self.groups = GroupCoordinator(config, self.store, self.replicas, self.topics)
        self.services.groups = self.groups
        self.cleaner = LogCleaner(self.log_manager.all_logs, self._delete_retention_ms,
                                  self._topic_config)
        self.txn = TransactionCoordinator(config, self.store, self.replicas, self.topics)
        self.txn.txn_offsets = self.groups.txn_offsets = TxnOffsets(self.groups)
        self.services.txn_coordinator = self.txn
        self.dispatcher = Dispatcher(self.services)
        self.server = SocketServer(
            self.dispatcher.handle,
            max_request_bytes=config["socket.request.max.bytes"],
            idle_timeout_ms=config["connections.max.idle.ms"],
            send_buffer=config["socket.send.buffer.bytes"],
            receive_buffer=config["socket.receive.buffer.bytes"],
            quotas=quotas_from_config(config),
            queued_max_request_bytes=config["queued.max.request.bytes"],
            receive_timeout_ms=config["pykbroker.request.receive.timeout.ms"],
        )
        self._stop = anyio.Event()
        self.bound_ports: list[int] = []
        self._fatal: str | None = None  # why the broker must exit non-zero (all log dirs failed)
        self._dir_failure = anyio.Event()

    def _topic_config(self, topic: str) -> dict[str, Any]:  # compaction settings for the cleaner
        rec = self.store.topic(topic)
        return effective_topic_config(self.config, rec.configs if rec else {})

    def _delete_retention_ms(self, topic: str) -> int:  # for the log cleaner
        rec = self.store.topic(topic)
        return int(effective_topic_config(self.config, rec.configs if rec else {})["delete.retention.ms"])

    def request_stop(self) -> None:
        self._stop.set()

    def startup(self) -> None:
        started = time.monotonic()
        self.store.start()
        self.log_manager.startup(config_for=self._log_config_for)
        metadata_dir = self.log_manager.log_dirs[0]
        if self.log_manager.failure_channel.is_offline(metadata_dir):  # see _handle_log_dir_failures
            raise OSError(f"the metadata log dir {metadata_dir} failed to load: "
                          f"{self.log_manager.failure_channel.offline_dirs()[metadata_dir]}")
        self.topics.load_all()
        self.groups.startup()  # creates __consumer_offsets, marks its partitions loading
        self.txn.startup()  # creates __transaction_state, marks its partitions loading
        self.log_manager.startup_complete()  # partitions of a dir that failed to load stay offline
        log.debug(
            "storage ready log_dirs=%s partitions=%d topics=%d in %.3fs",
            ",".join(str(d) for d in self.config.log_dirs), len(self.replicas.partitions()),
            len(self.store.topics()), time.monotonic() - started,
        )

    def _log_config_for(self, topic: str) -> LogConfig:
        rec = self.store.topic(topic)
        return log_config_for(self.config, rec.configs if rec is not None else {})

    async def run(self, *, handle_signals: bool = True) -> None:
        raise_nofile_limit()
        self.startup()
        async with anyio.create_task_group() as tg:
            listeners: list[tuple[Any, Any]] = []
            for lst in self.config.listeners:
                try:
                    listener = await anyio.create_tcp_listener(local_host=lst.host or None, local_port=lst.port,
                                                               reuse_port=False)
                except OSError as e:  # say which listener: the bare errno names no address
                    for _, opened in listeners:
                        await opened.aclose()
                    # Nothing was served: close the logs cleanly, so the next start need not recover them.
                    self.log_manager.shutdown()
                    self.store.close()
                    raise OSError(e.errno, f"listener {lst.name}://{lst.host}:{lst.port}: {e.strerror}") from None
                listeners.append((lst, listener))
                port = listener.extra(anyio.abc.SocketAttribute.local_port)
                self.bound_ports.append(port)
            serve_scope = anyio.CancelScope()
            serve_done = anyio.Event()

            async def serve_all() -> None:
                try:
                    with serve_scope:
                        async with anyio.create_task_group() as accept_group:
                            for lst, listener in listeners:  # connections are served in tg
                                accept_group.start_soon(self.server.serve_listener, listener, lst.name, tg)
                finally:
                    serve_done.set()

            tg.start_soon(serve_all)
            tg.start_soon(self.groups.run)  # loads offsets partitions, fires group timers
            if self.config["log.cleaner.enable"]:  # log compaction
                tg.start_soon(_periodic(self.config["log.cleaner.backoff.ms"] / 1000, self.cleaner.run_once,
                                        thread=True))
            tg.start_soon(self.txn.run)  # loads transaction state, aborts timed-out transactions
            if handle_signals:
                tg.start_soon(self._watch_signals)
            tg.start_soon(_periodic(self.config["producer.id.expiration.check.interval.ms"] / 1000,
                                    self._expire_producers))
            tg.start_soon(_periodic(self.config["log.retention.check.interval.ms"] / 1000,
                                    self.log_manager.run_retention))
            tg.start_soon(_periodic(min(self.config.flush_ms, 1000) / 1000, self.log_manager.flush_dirty,
                                    thread=True))
            tg.start_soon(_periodic(self.config["log.flush.offset.checkpoint.interval.ms"] / 1000 or 60,
                                    self.log_manager.checkpoint))
            tg.start_soon(self._handle_log_dir_failures)
            tg.start_soon(self.replicas.run_log_dir_moves)  # AlterReplicaLogDirs
            log.info(
                "pykbroker %s started broker_id=%d cluster_id=%s log_dirs=%s listeners=%s advertised=%s",
                __version__, self.broker_id, self.store.cluster_id, ",".join(str(d) for d in self.config.log_dirs),
                ",".join(f"{lst.name}://{lst.host}:{p}" for (lst, _), p in zip(listeners, self.bound_ports,
                                                                                 strict=True)),
                ",".join(f"{a.name}://{a.host}:{a.port}" for a in self.services.advertised),
            )
            await self._stop.wait()
            log.debug("shutting down")
            serve_scope.cancel()
            # Close the listeners only once the accept loops have seen the cancellation: closing
            # first makes a pending accept() raise ClosedResourceError, failing the shutdown.
            await serve_done.wait()
            for _, listener in listeners:
                await listener.aclose()
            self.services.shutting_down.set()
            self.groups.shutdown()  # answers delayed JoinGroup/SyncGroup requests
            self.txn.shutdown()
            self.replicas.fetch_waiters.notify_all()
            self.server.begin_shutdown()
            await self.server.wait_drained(10.0)
            tg.cancel_scope.cancel()
        self.log_manager.shutdown()
        self.store.close()
        log.info("shutdown complete")
        if self._fatal is not None:
            log.critical("exiting with status 1: %s", self._fatal)
            raise SystemExit(1)

    async def _handle_log_dir_failures(self) -> None:
        """Take the partitions of each failed log dir offline (Kafka's LogDirFailureHandler).

        Failures are reported from any thread; one on the event loop wakes this task at once,
        one from a worker thread (flush, cleaner) within half a second.  If no log dir is left,
        or the first one (which holds the metadata store) failed, the broker shuts down and
        exits non-zero, as Kafka does.
        """
        channel = self.log_manager.failure_channel
        loop_thread = threading.get_ident()

        def wakeup() -> None:
            if threading.get_ident() == loop_thread:
                self._dir_failure.set()

        channel.wakeup = wakeup
        metadata_dir = self.log_manager.log_dirs[0]
        while True:
            for log_dir in channel.take_pending():
                tps = await anyio.to_thread.run_sync(self.log_manager.handle_log_dir_failure, log_dir)
                self.replicas.on_log_dir_offline(tps)
                for topic, index in tps:  # the coordinators resign these partitions (NOT_COORDINATOR)
                    if topic == OFFSETS_TOPIC:
                        self.groups.manager.unload(index)
                    elif topic == TXN_TOPIC:
                        self.txn.sm.unload(index)
                online = self.log_manager.online_dirs()
                if not online or log_dir == metadata_dir:
                    self._fatal = (f"log dir {log_dir} failed and no log dir is left online" if not online else
                                   f"the metadata log dir {log_dir} failed")
                    log.critical("shutting down: %s", self._fatal)
                    self.request_stop()
                    return
            self._dir_failure = anyio.Event()
            with anyio.move_on_after(0.5):
                await self._dir_failure.wait()

    def _expire_producers(self) -> None:
        self.log_manager.expire_producers(int(time.time() * 1000), self.config["producer.id.expiration.ms"])

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("received %s, shutting down", signal.Signals(signum).name)
                self.request_stop()
                return
