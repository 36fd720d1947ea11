"""The broker: wires configuration, metadata, logs, replicas and the network together.

Startup loads the metadata store and every local log (recovering those that
were not shut down cleanly), then opens the listeners.  Shutdown stops
reading requests, lets in-flight ones finish, flushes and closes the logs and
writes the clean-shutdown marker so the next start skips recovery.

With ``zookeeper.connect`` set the broker joins a cluster: the metadata store is
ZooKeeper (its watches arrive on the event loop through the store's poster), the
broker registers under /brokers/ids once its listeners are open, runs a controller
candidate and the replica fetchers, and on SIGTERM first asks the controller to
move its leaderships elsewhere (controlled shutdown).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from pykbroker import __version__
from pykbroker.config import (
    LOCAL_ENDPOINTS,
    BrokerConfig,
    effective_topic_config,
    log_config_for,
    parse_local_endpoints,
    parse_schema_registry_listener,
)
from pykbroker.coordinator.group.service import OFFSETS_TOPIC, GroupCoordinator
from pykbroker.coordinator.inter_broker import InterBrokerClients
from pykbroker.coordinator.share.service import ShareCoordinator
from pykbroker.coordinator.transaction.offsets import TxnOffsets
from pykbroker.coordinator.transaction.service import TXN_TOPIC, TransactionCoordinator
from pykbroker.coordinator.transaction.verification import TransactionVerification
from pykbroker.delay.service import DelayService
from pykbroker.logsetup import fields
from pykbroker.metadata.embedded import META_PROPERTIES, DataDirInUse, EmbeddedMetadataStore, write_atomically
from pykbroker.metadata.store import MetadataStore, StoreUnavailable, run_store
from pykbroker.observability.collector import Snapshot
from pykbroker.observability.endpoint import MetricsEndpoint
from pykbroker.quotas import QuotaManager
from pykbroker.replica.replica_manager import ReplicaManager
from pykbroker.replica.topics import TopicManager
from pykbroker.replication.client import BrokerClient
from pykbroker.schema_registry.security import SchemaRegistrySecurity
from pykbroker.schema_registry.service import SchemaRegistryService
from pykbroker.security.acl_authorizer import AclAuthorizer, parse_super_users
from pykbroker.security.sasl.client import on_connect_hook as sasl_on_connect_hook
from pykbroker.security.sasl.settings import inter_broker_credentials
from pykbroker.security.tls import TLS_PROTOCOLS, TlsConfigError, client_context, listener_tls
from pykbroker.server.allocator import RELEASE_INTERVAL_S, release_free_memory
from pykbroker.server.connection_quotas import quotas_from_config
from pykbroker.server.context import Services
from pykbroker.server.dispatcher import Dispatcher
from pykbroker.server.extra_services import BoundListener, ExtraService, StartedBroker
from pykbroker.server.metrics_snapshot import take_snapshot
from pykbroker.server.network import SocketServer, raise_nofile_limit
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
                log.exception("background task %(function)s failed", {"function": getattr(fn, '__name__', fn)})

    return loop


def _listener_tls(config: Any) -> dict[str, Any]:
    """Server TLS of the SSL/SASL_SSL listeners; a bad keystore or truststore stops the start."""
    try:
        return listener_tls(config)
    except TlsConfigError as e:
        raise StartupError(str(e)) from None


def _inter_broker_ssl_context(config: Any) -> Any:
    """The TLS client context of inter-broker connections when the inter-broker listener is SSL/SASL_SSL."""
    inter = config.inter_broker_listener
    if config.security_protocols.get(inter) not in TLS_PROTOCOLS:
        return None
    try:
        return client_context(config, inter)
    except TlsConfigError as e:
        raise StartupError(f"inter-broker TLS: {e}") from None


class StartupError(Exception):
    """The broker cannot start for a reason an operator must fix; told in one line, exit status 1."""


def _read_properties(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines()
                if "=" in line and not line.startswith("#"))


def _make_store(config: BrokerConfig, endpoints: list[tuple[str, str, int]]) -> MetadataStore:
    if not config["zookeeper.connect"].strip():
        return EmbeddedMetadataStore(config.log_dirs[0], config.broker_id, endpoints)
    from pykbroker.metadata.zookeeper import ZkMetadataStore  # kazoo is loaded only for a cluster

    return ZkMetadataStore(config, config.broker_id, endpoints, config["broker.rack"])


class Broker:
    def __init__(self, config: BrokerConfig, store: MetadataStore | None = None) -> None:
        self.config = config
        self.broker_id = config.broker_id
        # Other processes of this host (serve --processes): their inter-broker listener on loopback.
        self._local_brokers = parse_local_endpoints(config[LOCAL_ENDPOINTS])
        advertised = config.advertised_listeners
        self.log_manager = LogManager(config.log_dirs, log_config_for(config, {}))
        self.store = store or _make_store(config, [(a.name, a.host, a.port) for a in advertised])
        if isinstance(self.store, EmbeddedMetadataStore):  # its files live in the first log dir
            self.store.on_storage_failure = self.log_manager.mark_dir_offline
        self.cluster = self.store.is_cluster()
        self.controller: Any = None  # the controller candidate (cluster mode), started once registered
        self.replicas = ReplicaManager(self.broker_id, self.log_manager)
        self.topics = TopicManager(config, self.store, self.replicas)
        self.services = Services(config, self.store, self.replicas, self.topics, advertised,
                                 drop_produce_responses=config["pykbroker.fault.drop.produce.response"])
        self.store.add_listener(self._forget_deleted_topic_metrics)
        self.groups = GroupCoordinator(config, self.store, self.replicas, self.topics)
        self.services.groups = self.groups
        self.cleaner = LogCleaner(self.log_manager.all_logs, self._delete_retention_ms,
                                  self._topic_config)
        self.txn = TransactionCoordinator(config, self.store, self.replicas, self.topics)
        self.txn.txn_offsets = self.groups.txn_offsets = TxnOffsets(self.groups, verify=self.txn.verify_partition)
        self.services.txn_coordinator = self.txn
        self.services.append_hooks.register(TransactionVerification(self.services))
        # Client quotas are read from the store on every check, so changes apply without a restart.
        self.services.quotas = QuotaManager(self.store.client_quotas, samples=config["quota.window.num"],
                                            window_seconds=config["quota.window.size.seconds"],
                                            mutation_samples=config["controller.quota.window.num"],
                                            mutation_window_seconds=config["controller.quota.window.size.seconds"])
        self.delays: DelayService | None = None
        if config["pykbroker.delay.enable"]:  # delayed delivery (pykbroker/delay)
            self.delays = self.services.delays = DelayService(config, self.store, self.replicas, self.topics)
            self.services.append_hooks.register(self.delays)
        self.schema_registry: SchemaRegistryService | None = None
        self.schema_registry_security: SchemaRegistrySecurity | None = None
        if config["pykbroker.schema.registry.listener"]:  # Confluent's Schema Registry API (pykbroker/schema_registry)
            try:
                # SCRAM users and ACLs are the brokers'; the authorizer is set once it is loaded (_start_authorizer)
                self.schema_registry_security = SchemaRegistrySecurity.from_config(
                    config, self.store.scram_credentials, None,
                    https=parse_schema_registry_listener(config["pykbroker.schema.registry.listener"])[0] == "https")
                self.schema_registry = SchemaRegistryService(config, self.store, self.replicas, self.topics,
                                                             security=self.schema_registry_security)
                self.schema_registry.forward_verify = self.schema_registry_security.forward_context(config)
            except ValueError as e:  # TlsConfigError included: a keystore that cannot be loaded
                raise StartupError(str(e)) from None
        self.shares: ShareCoordinator | None = None
        if config["group.share.enable"]:  # share groups (pykbroker/coordinator/share)
            self.shares = self.services.shares = ShareCoordinator(config, self.store, self.replicas, self.topics,
                                                                  self.groups)
        self.dispatcher = Dispatcher(self.services)
        self.server = SocketServer(
            self.dispatcher.handle_pipelined,
            max_request_bytes=config["socket.request.max.bytes"],
            idle_timeout_ms=config["connections.max.idle.ms"],
            send_buffer=config["socket.send.buffer.bytes"],
            receive_buffer=config["socket.receive.buffer.bytes"],
            quotas=quotas_from_config(config, self.store.client_quotas),  # ip entities' connection_creation_rate
            queued_max_request_bytes=config["queued.max.request.bytes"],
            receive_timeout_ms=config["pykbroker.request.receive.timeout.ms"],
            max_inflight_requests=config["pykbroker.max.inflight.requests.per.connection"],
            max_inflight_bytes=config["pykbroker.max.inflight.bytes.per.connection"],
            max_inflight_local_requests=config["pykbroker.max.inflight.flush.requests.per.connection"],
            failed_authentication_delay_ms=config["connection.failed.authentication.delay.ms"],
            security_protocols=config.security_protocols,
            tls=_listener_tls(config),
        )
        self._stop = anyio.Event()
        self.bound_ports: list[int] = []
        self.metrics_port: int | None = None  # the bound port of pykbroker.metrics.listener
        # Registered by whoever starts the broker (the web console); run in the broker's task group.
        self.extra_services: list[ExtraService] = []
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
        self._start_store()
        if self.cluster:
            self._check_meta_properties()
        self.log_manager.startup(config_for=self._log_config_for)
        metadata_dir = self.log_manager.log_dirs[0]
        if self.log_manager.failure_channel.is_offline(metadata_dir):  # see _handle_log_dir_failures
            raise OSError(f"the metadata log dir {metadata_dir} failed to load: "
                          f"{self.log_manager.failure_channel.offline_dirs()[metadata_dir]}")
        if self.cluster:
            # Inter-broker SASL: the replica fetchers and coordinator clients log in on each new connection.
            BrokerClient.default_on_connect = sasl_on_connect_hook(inter_broker_credentials(self.config))
            BrokerClient.default_ssl_context = _inter_broker_ssl_context(self.config)
            self.replicas.set_cluster(self._inter_broker_endpoint, self._write_isr)
            self.txn.remote = InterBrokerClients(self._inter_broker_endpoint, client_id=f"broker-{self.broker_id}",
                                                 timeout_s=self.config["request.timeout.ms"] / 1000)
            if self.shares is not None:  # share-partition leaders reach share coordinators on other brokers
                self.shares.set_cluster(self._inter_broker_endpoint)
            if self.delays is not None:  # delayed records are forwarded to, and delivered by, other brokers
                self.delays.set_cluster(self._inter_broker_endpoint)
            self._remove_stray_logs()
        self.topics.load_all()
        self.groups.startup()  # creates __consumer_offsets, marks its partitions loading
        self.txn.startup()  # creates __transaction_state, marks its partitions loading
        if self.shares is not None:
            self.shares.startup()  # creates __share_group_state
        self.log_manager.startup_complete()  # partitions of a dir that failed to load stay offline
        if self.delays is not None:  # embedded: creates and replays __delayed_records before clients can produce
            self.delays.startup()  # (cluster: each partition is replayed when this broker becomes its leader)
        if self.schema_registry is not None:  # binds its listener (registered with the broker), creates _schemas
            self.schema_registry.startup()
        log.debug(
            "storage ready: %(partitions)d partitions of %(topics)d topics in %(log_dirs)s in %(elapsed_s).3fs",
            {"log_dirs": ','.join(str(d) for d in self.config.log_dirs),
             "partitions": len(self.replicas.partitions()), "topics": len(self.store.topics()),
             "elapsed_s": time.monotonic() - started},
        )

    def _start_store(self) -> None:
        self._start_store_only()
        self._start_authorizer()

    def _start_authorizer(self) -> None:
        """authorizer.class.name: an ACL authorizer whose index follows the store's ACLs."""
        if not self.config["authorizer.class.name"]:
            return
        if not self.store.supports_acls:
            raise StartupError("authorizer.class.name is set but ACL storage is not implemented for this "
                               "metadata store")

        authorizer = AclAuthorizer(parse_super_users(self.config["super.users"]),
                                   self.config["allow.everyone.if.no.acl.found"])
        self.store.add_acl_listener(authorizer.load)
        authorizer.load(self.store.acls())
        self.services.authorizer = authorizer
        if self.schema_registry_security is not None:
            self.schema_registry_security.authorizer = authorizer

    def _start_store_only(self) -> None:
        if not self.cluster:
            try:
                self.store.start()
            except DataDirInUse as e:
                raise StartupError(str(e)) from None
            return
        from pykbroker.metadata.zk_client import ZkConnectError  # kazoo is loaded only for a cluster

        log.info("connecting to ZooKeeper at %(zookeeper_connect)s",
                 {"zookeeper_connect": self.config['zookeeper.connect']})
        try:
            self.store.start()
        except ZkConnectError as e:
            self.store.close()
            raise StartupError(str(e)) from None
        log.info("connected to ZooKeeper", extra=fields(
            cluster_id=self.store.cluster_id, live_brokers=",".join(map(str, sorted(self.store.live_brokers()))),
            topics=len(self.store.topics())))

    def _check_meta_properties(self) -> None:
        """Each log dir belongs to one cluster and one broker id (Kafka's meta.properties check), so a
        wrong zookeeper.connect cannot make this broker delete its logs as strays of an empty cluster."""
        for log_dir in self.config.log_dirs:
            path = log_dir / META_PROPERTIES
            try:
                props = _read_properties(path) if path.exists() else {}
            except OSError as e:
                raise StartupError(f"cannot read {path}: {e}") from None
            stored_cluster = props.get("cluster.id", "").strip()
            if stored_cluster and stored_cluster != self.store.cluster_id:
                raise StartupError(
                    f"The Cluster ID {self.store.cluster_id} doesn't match stored clusterId {stored_cluster} in "
                    f"{path}. The broker is trying to join the wrong cluster. Configured zookeeper.connect may be "
                    "wrong.")
            stored_broker = props.get("broker.id", "").strip()
            if stored_broker and stored_broker != str(self.broker_id):
                raise StartupError(f"Configured broker.id {self.broker_id} doesn't match stored broker.id "
                                   f"{stored_broker} in {path}. If you moved your data, make sure your configured "
                                   "broker.id matches.")
            if not props:
                log_dir.mkdir(parents=True, exist_ok=True)
                write_atomically(path, f"version=0\ncluster.id={self.store.cluster_id}\n"
                                       f"broker.id={self.broker_id}\n".encode())

    def _remove_stray_logs(self) -> None:
        """Delete the local logs of partitions this broker no longer hosts: their topic was deleted (or
        reassigned away) while it was down."""
        for topic, index in self.topics.stray_logs():
            log.info("removing the log of %(topic)s-%(partition)d: this broker is no longer one of its replicas",
                     {"topic": topic, "partition": index})
            self.replicas.stop_replica(topic, index, delete=True)

    def _inter_broker_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        """Where followers fetch from: the broker's endpoint on inter.broker.listener.name (on loopback when
        the broker is another process of this host, pykbroker.local.broker.endpoints)."""
        for name, host, port in self.store.live_brokers().get(broker_id, ()):
            if name == self._inter_broker_listener:
                return self._local_brokers.get(broker_id, (host, port))
        return None

    @property
    def _inter_broker_listener(self) -> str:
        return self.config.inter_broker_listener

    def _write_isr(self, topic: str, index: int, leader_epoch: int, isr: list[int], zk_version: int
                   ) -> Awaitable[int]:
        return run_store(self.store, self.store.update_isr, topic, index, leader_epoch, isr, zk_version)

    async def _register(self) -> None:
        """Join the cluster once the listeners are open: /brokers/ids/<id>, then the controller candidate.

        Off the event loop: a restart right after kill -9 may wait there for the previous session's
        registration to expire, while ZooKeeper watches keep updating the caches.
        """
        from pykbroker.controller.controller import ZkController  # kazoo is loaded only for a cluster
        from pykbroker.metadata.zk_registration import DuplicateBrokerId

        try:
            await run_store(self.store, self.store.register_broker)  # type: ignore[attr-defined]
        except DuplicateBrokerId as e:
            raise StartupError(str(e)) from None
        except StoreUnavailable as e:
            raise StartupError(f"cannot register broker {self.broker_id} in ZooKeeper: {e}") from None
        log.info("registered broker %(broker_id)d in ZooKeeper", {"broker_id": self.broker_id})
        self.controller = ZkController(self.store.zk, self.broker_id, self.config)  # type: ignore[attr-defined]
        self.controller.start()

    def _leads_with_other_live_isr(self) -> list[tuple[str, int]]:
        """Partitions this broker leads that another live ISR member could lead (controlled shutdown)."""
        me = self.broker_id
        live = self.store.live_brokers()
        return [(name, i) for name, rec in self.store.topics().items() for i, a in rec.partitions.items()
                if a.leader == me and any(b != me and b in live for b in a.isr)]

    async def _controlled_shutdown(self) -> None:
        """Ask the controller to move this broker's leaderships away and wait, serving meanwhile, until
        none is left that another live ISR member could take (bounded, as Kafka's retries)."""
        bound = max(5.0, self.config["controlled.shutdown.max.retries"]
                    * self.config["controlled.shutdown.retry.backoff.ms"] / 1000)
        led = self._leads_with_other_live_isr()
        log.info("controlled shutdown: asking the controller to move %(leaderships)d leadership(s) away",
                 {"leaderships": len(led)})
        # The controller takes us out of the ISRs of the partitions we follow; fetching on would let
        # their leaders add us straight back.
        self.replicas.stop_fetching()
        try:
            await run_store(self.store, self.store.begin_controlled_shutdown)  # type: ignore[attr-defined]
        except StoreUnavailable as e:
            log.warning("controlled shutdown: ZooKeeper is not reachable (%(error)s); shutting down without it",
                        {"error": e})
            return
        if await self.topics.wait_until(lambda: not self._leads_with_other_live_isr(), bound):
            log.info("controlled shutdown: no leadership left that another replica can take")
        else:
            left = self._leads_with_other_live_isr()
            log.warning("controlled shutdown: %(leaderships)d leadership(s) not moved within %(bound).1f s "
                        "(%(partitions)s); shutting down anyway",
                        {"leaderships": len(left), "bound": bound,
                         "partitions": ', '.join((f'{t}-{i}' for t, i in sorted(left)[:10]))})

    async def _stop_controller(self) -> None:
        if self.controller is not None:
            log.info("stopping the controller")
            await anyio.to_thread.run_sync(self.controller.stop)
            self.controller = None

    def _log_config_for(self, topic: str) -> LogConfig:
        rec = self.store.topic(topic)
        return log_config_for(self.config, rec.configs if rec is not None else {})

    async def _open_listeners(self) -> list[tuple[Any, Any]]:
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
        return listeners

    async def run(self, *, handle_signals: bool = True) -> None:
        raise_nofile_limit()
        if self.cluster:  # ZooKeeper watches are delivered on this loop
            loop = asyncio.get_running_loop()

            def post(fn: Callable[[], None]) -> None:
                loop.call_soon_threadsafe(fn)

            self.store.set_poster(post)
        try:
            self.startup()
        except BaseException:
            if self.cluster:
                self.store.close()
            raise
        listeners = await self._open_listeners()
        if self.cluster:
            try:
                await self._register()
            except BaseException:
                for _, opened in listeners:
                    await opened.aclose()
                await self._stop_controller()
                self.log_manager.shutdown()
                self.store.close()
                raise
        metrics = self._start_metrics()
        await self._open_extra_services(listeners)
        async with anyio.create_task_group() as tg:
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
            for service in self.extra_services:
                tg.start_soon(service.serve)
            tg.start_soon(self.groups.run)  # loads offsets partitions, fires group timers
            if self.shares is not None:
                tg.start_soon(self.shares.run)  # replays __share_group_state, fires lock and session timers
            if self.config["log.cleaner.enable"]:  # log compaction
                tg.start_soon(_periodic(self.config["log.cleaner.backoff.ms"] / 1000, self.cleaner.run_once,
                                        thread=True))
            tg.start_soon(self.txn.run)  # loads transaction state, aborts timed-out transactions
            if self.delays is not None:
                tg.start_soon(self.delays.run)  # delivers the scheduled records as they fall due
            if self.schema_registry is not None:
                tg.start_soon(self.schema_registry.serve)  # keeps up with _schemas, serves the HTTP API
            if handle_signals:
                tg.start_soon(self._watch_signals)
            tg.start_soon(_periodic(RELEASE_INTERVAL_S, release_free_memory, thread=True))
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
            if self.cluster:
                tg.start_soon(self.replicas.run_replication, self.config)  # fetchers, ISR shrink, HW checkpoint
            log.info(f"pykbroker {__version__} started", extra=fields(
                broker_id=self.broker_id, cluster_id=self.store.cluster_id,
                log_dirs=",".join(str(d) for d in self.config.log_dirs),
                listeners=",".join(f"{lst.name}://{lst.host}:{p}" for (lst, _), p in zip(listeners, self.bound_ports,
                                                                                           strict=True)),
                advertised=",".join(f"{a.name}://{a.host}:{a.port}" for a in self.services.advertised),
                event_loop=type(asyncio.get_running_loop()).__module__.split(".")[0],  # asyncio or uvloop
                version=__version__))
            await self._stop.wait()
            log.debug("shutting down")
            if metrics is not None:
                await anyio.to_thread.run_sync(metrics.stop)
            for service in self.extra_services:
                await service.close()
            if self.schema_registry is not None:
                await self.schema_registry.close()
            if self.cluster and self.config["controlled.shutdown.enable"]:
                await self._controlled_shutdown()  # still serving: clients follow the moved leaders
            await self._stop_controller()
            serve_scope.cancel()
            # Close the listeners only once the accept loops have seen the cancellation: closing
            # first makes a pending accept() raise ClosedResourceError, failing the shutdown.
            await serve_done.wait()
            for _, listener in listeners:
                await listener.aclose()
            self.services.shutting_down.set()
            self.groups.shutdown()  # answers delayed JoinGroup/SyncGroup requests
            self.txn.shutdown()
            self.replicas.wake_all_waiters()  # fetches and acks=all produces
            self.server.begin_shutdown()
            await self.server.wait_drained(10.0)
            if self.txn.remote is not None:
                await self.txn.remote.close()
            if self.shares is not None:
                await self.shares.close()
            tg.cancel_scope.cancel()
        self.log_manager.shutdown()
        self.store.close()  # cluster mode: the session ends, /brokers/ids/<id> goes away
        log.info("shutdown complete")
        if self._fatal is not None:
            log.critical("exiting with status 1: %(fatal)s", {"fatal": self._fatal})
            raise SystemExit(1)

    def _forget_deleted_topic_metrics(self, name: str, record: Any) -> None:
        """A deleted topic's per-topic series go with it, as Kafka removes its BrokerTopicMetrics."""
        if record is None:
            self.services.stats.forget_topic(name)
            self.replicas.replication_bytes_in.pop(name, None)

    async def _open_extra_services(self, listeners: list[tuple[Any, Any]]) -> None:
        """Tell the registered services where the broker listens; one that cannot open stops the start."""
        if not self.extra_services:
            return
        protocols = self.config.security_protocols
        started = StartedBroker(self.broker_id, self.store.cluster_id, tuple(
            BoundListener(lst.name, protocols.get(lst.name, "PLAINTEXT"), lst.host, port)
            for (lst, _), port in zip(listeners, self.bound_ports, strict=True)), self.metrics_port)
        for service in self.extra_services:
            try:
                await service.open(started)
            except (OSError, ValueError) as e:
                raise StartupError(str(e)) from e

    def _start_metrics(self) -> MetricsEndpoint | None:
        """The Prometheus endpoint, when pykbroker.metrics.listener is set; scrapes read state on this loop."""
        listener = self.config["pykbroker.metrics.listener"]
        if not listener:
            return None
        token = anyio.lowlevel.current_token()

        def on_loop(fn: Callable[[], Snapshot]) -> Snapshot:
            return anyio.from_thread.run_sync(fn, token=token)

        endpoint = MetricsEndpoint(listener, lambda: take_snapshot(self.services, self.server, self.groups, self.txn,
                                                                  self.broker_id), on_loop)
        try:
            self.metrics_port = endpoint.start()
        except OSError as e:
            raise StartupError(f"cannot listen on pykbroker.metrics.listener={listener}: {e}") from e
        return endpoint

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
                    log.critical("shutting down: %(fatal)s", {"fatal": self._fatal})
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
                log.info("received %(signal)s, shutting down", {"signal": signal.Signals(signum).name})
                self.request_stop()
                return
