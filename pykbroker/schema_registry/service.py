"""The schema registry as a service of the broker (pykbroker.schema.registry.listener): this broker's copy of
the registry kept up with ``_schemas``, its writes when it leads ``_schemas``, and uvicorn serving the HTTP API
on the broker's event loop, in the broker's task group.

Every broker applies its replica of ``_schemas-0`` in offset order: a follower up to its high watermark (woken
by the replica manager when it moves), the leader, which is the registry's one writer, up to its log end. A
broker that becomes the leader replays the partition from the start before it plans any write, so it knows
every id handed out before (ids are never reused, even hard-deleted ones still in the log); a write is
appended with the leader epoch it was planned in and answered only once committed. A broker that is not the
leader forwards writes to the leader's registry URL, which each broker registers with its broker
registration (embedded metadata has one broker, the leader of everything)."""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.to_thread
import uvicorn

from pykbroker import tcp
from pykbroker.config import BrokerConfig, parse_schema_registry_listener, schema_registry_advertised_url
from pykbroker.logsetup import fields
from pykbroker.metadata.store import MetadataStore
from pykbroker.replica.replica_manager import Partition, ReplicaManager
from pykbroker.replica.topics import TopicManager

from . import errors as e
from .http_api import build_app
from .registry import Formats, Registry, Write, default_formats
from .security_api import RegistrySecurity
from .serde import noop_record
from .store import PARTITION, SchemasTopic

log = logging.getLogger("pykbroker.schema_registry")

SYNC_WAIT_S = 1.0  # a follower re-checks its replica at least this often (woken earlier by high watermark moves)
TOPIC_RETRY_S = 1.0
CLOSE_TIMEOUT_S = 5.0


class SchemaRegistryService:
    """The registry of this broker: a ``RegistryBackend`` for the HTTP app, and the server that serves it."""

    def __init__(self, config: BrokerConfig, store: MetadataStore, replicas: ReplicaManager, topics: TopicManager,
                 *, security: RegistrySecurity | None = None, formats: Formats | None = None) -> None:
        self.config = config
        self.store = store
        self.replicas = replicas
        self.broker_id = replicas.broker_id
        self.cluster = store.is_cluster()
        self.topic = SchemasTopic(config, store, replicas, topics)
        self.registry = Registry(str(config["pykbroker.schema.registry.compatibility.level"]),
                                 formats or default_formats())
        self.max_request_bytes = int(config["pykbroker.schema.registry.max.request.bytes"])
        self.listener = str(config["pykbroker.schema.registry.listener"])
        self.scheme, self.host, self.port = parse_schema_registry_listener(self.listener)
        self.security = security
        self.ssl: ssl.SSLContext | None = None
        if self.scheme == "https":
            if security is None:
                raise ValueError("pykbroker.schema.registry.listener: https needs the registry's TLS settings, "
                                 "which this broker was started without")
            self.ssl = security.ssl_context(config)
        self.forward_verify: ssl.SSLContext | bool = True
        self.url = ""
        self._lock = anyio.Lock()
        self._writer_epoch: int | None = None  # the leader epoch the registry was replayed as the writer in
        self._source: Partition | None = None  # the replica the registry was applied from
        self._sock: socket.socket | None = None
        self._server: _Server | None = None
        self._done = anyio.Event()
        self.ready = anyio.Event()  # set after the first catch-up with the local replica

    # --- start ---------------------------------------------------------------------------------------------

    def startup(self) -> None:
        """Before the broker registers: bind the listener (its URL goes into the registration), and with
        embedded metadata create ``_schemas``."""
        sock = tcp.listen(self.host, self.port, f"pykbroker.schema.registry.listener={self.listener}")
        self._sock = sock
        self.port = sock.getsockname()[1]
        listener = f"{self.scheme}://{f'[{self.host}]' if ':' in self.host else self.host}:{self.port}"
        self.url = schema_registry_advertised_url(
            listener, str(self.config["pykbroker.schema.registry.advertised.listener"] or ""))
        self.store.schema_registry_url = self.url
        if not self.cluster:
            self.topic.ensure()

    # --- RegistryBackend -----------------------------------------------------------------------------------

    def is_writer(self) -> bool:
        p = self.topic.partition()
        return p is not None and p.is_leader

    def has_replica(self) -> bool:
        p = self.topic.partition()
        return p is not None and (p is self._source or p.is_leader)

    def writer_url(self) -> str | None:
        leader = self.topic.leader_id()
        if leader is None:
            return None
        if leader == self.broker_id:
            return self.url
        return self.store.broker_schema_registry_url(leader)

    async def write(self, plan: Callable[[Registry], Write]) -> Any:
        p = self.topic.partition()
        if p is None or not p.is_leader:
            raise e.NotWriter
        async with self._lock:
            epoch = p.leader_epoch
            await self._catch_up_as_writer(p)
            if self.topic.partition() is not p or not p.is_leader or p.leader_epoch != epoch:
                raise e.NotWriter
            w = plan(self.registry)
            if not w.records:
                return w.result
            base = self.topic.append(p, epoch, w.records)
            for i, (key, value) in enumerate(w.records):
                self.registry.apply(base + i, key, value)
            try:
                await self.topic.wait_committed(p)
            except e.RegistryError:
                self._writer_epoch = None  # what was applied may not survive: replay before the next write
                raise
            return w.result

    # --- keeping up with _schemas ---------------------------------------------------------------------------

    async def _read(self, p: Partition, start: int, end: int) -> None:
        entries = await anyio.to_thread.run_sync(SchemasTopic.read, p, start, end)
        for offset, key, value in entries:
            self.registry.apply(offset, key, value)
        self.registry.next_offset = max(self.registry.next_offset, end)

    async def _catch_up_as_writer(self, p: Partition) -> None:
        """Under the lock: the whole log applied (replayed from the start in a new leader epoch)."""
        epoch = p.leader_epoch
        if self._writer_epoch != epoch or self._source is not p:
            self.registry.reset()
            self._source = p
            self._writer_epoch = None
            await self._read(p, 0, p.log.log_end_offset)
            if self.topic.partition() is not p or not p.is_leader or p.leader_epoch != epoch:
                return
            self._writer_epoch = epoch
            log.info("schema registry: writer in leader epoch %(leader_epoch)d of %(topic)s-%(partition)d after "
                     "replaying it to offset %(offset)d (%(subjects)d subjects, highest id %(max_id)d)",
                     {"leader_epoch": epoch, "topic": self.topic.name, "partition": PARTITION,
                      "offset": p.log.log_end_offset, "subjects": len(self.registry.subjects),
                      "max_id": self.registry.max_id})
            if self.cluster:
                try:  # marks the new epoch in the log; committing it commits what the last leader left
                    key, value = noop_record()
                    self.registry.apply(self.topic.append(p, epoch, [(key, value)]), key, value)
                except e.RegistryError as exc:
                    log.info("schema registry: no NOOP record in the new epoch: %(error)s", {"error": exc.message})
        elif self.registry.next_offset < p.log.log_end_offset:
            await self._read(p, self.registry.next_offset, p.log.log_end_offset)

    async def _sync(self) -> None:
        async with self._lock:
            p = self.topic.partition()
            if p is None:
                if self._source is not None:  # no longer a replica: forward everything
                    self.registry.reset()
                    self._source, self._writer_epoch = None, None
                return
            if p.is_leader:
                await self._catch_up_as_writer(p)
                return
            if self._writer_epoch is not None or self._source is not p or p.high_watermark < self.registry.next_offset:
                self.registry.reset()
                self._source, self._writer_epoch = p, None
            hw = p.high_watermark
            if self.registry.next_offset < hw:
                await self._read(p, self.registry.next_offset, hw)

    async def _ensure_topic(self) -> None:
        """Cluster: create ``_schemas`` once enough brokers are live (until then writes answer 50004)."""
        for _ in range(1_000_000_000):  # until the topic exists; one attempt a second
            if await self.topic.ensure_async():
                return
            await anyio.sleep(TOPIC_RETRY_S)

    async def _keep_up(self) -> None:
        tps = [(self.topic.name, PARTITION)]
        waiters = self.replicas.fetch_waiters  # notified when the high watermark moves or the role changes
        for _ in range(1_000_000_000_000):  # the broker's lifetime; each round bounded by SYNC_WAIT_S
            woken = anyio.Event()
            waiters.register(tps, woken)  # before the catch-up: a move during it is not missed
            try:
                try:
                    await self._sync()
                except e.RegistryError as exc:
                    log.warning("schema registry: cannot catch up with %(topic)s: %(error)s",
                                {"topic": self.topic.name, "error": exc.message})
                except Exception as exc:  # a failed log dir, a log truncated under the read: next round
                    log.warning("schema registry: cannot catch up with %(topic)s: %(error)r",
                                {"topic": self.topic.name, "error": exc})
                    async with self._lock:  # replay from the start next time
                        self.registry.reset()
                        self._source, self._writer_epoch = None, None
                self.ready.set()
                with anyio.move_on_after(SYNC_WAIT_S):
                    await woken.wait()
            finally:
                waiters.unregister(tps, woken)

    # --- serving ---------------------------------------------------------------------------------------------

    async def serve(self) -> None:
        """Keep up with ``_schemas`` and serve the API (once caught up with the local replica, so that a
        restarted broker answers with everything it had)."""
        assert self._sock is not None, "startup() first"
        app = build_app(self, security=self.security)
        cfg = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", server_header=False,
                             proxy_headers=False, limit_concurrency=1000, timeout_keep_alive=30)
        cfg.load()
        cfg.ssl = self.ssl
        server = _Server(cfg)
        self._server = server
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)  # its start and stop lines repeat ours
        try:
            async with anyio.create_task_group() as tg:
                if self.cluster:
                    tg.start_soon(self._ensure_topic)
                tg.start_soon(self._keep_up)
                with anyio.move_on_after(60):  # a large _schemas: serve anyway after a minute, catching up
                    await self.ready.wait()
                log.info("schema registry listening on %(listener)s", {"listener": self.listener},
                         extra=fields(advertised=self.url, topic=self.topic.name))
                await server.serve(sockets=[self._sock])
                tg.cancel_scope.cancel()
        finally:
            await app.state.close()
            self._done.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            with anyio.move_on_after(CLOSE_TIMEOUT_S):
                await self._done.wait()
        if self._sock is not None:
            self._sock.close()


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the broker owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
