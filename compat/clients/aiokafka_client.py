"""aiokafka, on an asyncio loop in a background thread (the scenarios call it synchronously)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import aiokafka.errors as aerr
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.structs import TopicPartition

from compat.clients import base
from compat.clients.base import ClientError, Delivery, Member, Msg, Record

CLIENT_ID = "compat-aiokafka"
ASSIGNORS = {"roundrobin": RoundRobinPartitionAssignor, "range": RangePartitionAssignor}
T = TypeVar("T")


def to_client_error(e: BaseException) -> ClientError:
    errno = getattr(e, "errno", None)
    if isinstance(errno, int) and errno > 0:
        return ClientError(base.error_name(errno), str(e)[:1000])
    if isinstance(e, aerr.KafkaTimeoutError | asyncio.TimeoutError):
        return ClientError("REQUEST_TIMED_OUT", str(e))
    return ClientError(type(e).__name__, str(e)[:1000])


def _check(code: int, what: str, message: str | None = None) -> None:
    if code:
        raise ClientError(base.error_name(code), message or what)


class AiokafkaClient(base.Client):
    name = "aiokafka"
    # aiokafka's admin client asks for metadata with an old Metadata version that auto-creates topics,
    # so it cannot ask about a topic that might not exist: no DESCRIBE_UNKNOWN.
    caps = frozenset({
        base.ADMIN, base.DESCRIBE_CONFIGS, base.DELETE_RECORDS, base.ASSIGN, base.GROUPS, base.COMMIT,
        base.TIMESTAMPS, base.LIST_OFFSETS, base.IDEMPOTENCE, base.TRANSACTIONS, base.TXN_OFFSETS,
        base.RESET_NONE, base.HEADERS, base.NULL_VALUES, base.BINARY,
        base.EMPTY_BYTES, base.ACKS0, base.MAX_MESSAGE_OVERRIDE,
        base.DELIVERY_OFFSETS, base.GROUP_ADMIN, base.ALTER_CONFIGS, base.DESCRIBE_CLUSTER,
    })

    def _kw(self) -> dict[str, Any]:
        """Connection settings for every client object: address, client id, SASL identity."""
        kw: dict[str, Any] = {"bootstrap_servers": self.bootstrap, "client_id": CLIENT_ID}
        if self.sasl is not None:
            kw.update(self.sasl.python_kwargs())
        return kw

    def __init__(self, bootstrap: str, sasl: base.Sasl | None = None) -> None:
        super().__init__(bootstrap, sasl)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="aiokafka-loop")
        self._thread.start()
        self._admin: AIOKafkaAdminClient | None = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise ClientError("REQUEST_TIMED_OUT", f"aiokafka call did not finish in {timeout}s") from None
        except aerr.KafkaError as e:
            raise to_client_error(e) from None

    async def _get_admin(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            a = AIOKafkaAdminClient(**self._kw(), request_timeout_ms=30000)
            await a.start()
            self._admin = a
        return self._admin

    def close(self) -> None:
        async def stop() -> None:
            if self._admin is not None:
                await self._admin.close()
                self._admin = None
        try:
            self.run(stop(), 10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)

    # --- admin ---
    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     configs: dict[str, str] | None = None) -> None:
        async def go() -> None:
            a = await self._get_admin()
            r = await a.create_topics([NewTopic(name, partitions, replication_factor, topic_configs=configs or {})],
                                      timeout_ms=20000)
            for t in r.topic_errors:
                _check(t[1], f"create {name}", t[2] if len(t) > 2 else None)
        self.run(go())

    def delete_topic(self, name: str) -> None:
        async def go() -> None:
            a = await self._get_admin()
            r = await a.delete_topics([name], timeout_ms=20000)
            for t in r.topic_error_codes:
                _check(t[1], f"delete {name}")
        self.run(go())

    def create_partitions(self, name: str, total: int) -> None:
        async def go() -> None:
            a = await self._get_admin()
            r = await a.create_partitions({name: NewPartitions(total)}, timeout_ms=20000)
            for t in r.topic_errors:
                _check(t[1], f"create partitions {name}", t[2])
        self.run(go())

    def describe_topic(self, name: str) -> int:
        async def go() -> int:
            a = await self._get_admin()
            (t,) = await a.describe_topics([name])
            _check(t["error_code"], f"describe {name}")
            return len(t["partitions"])
        return self.run(go())

    def topic_configs(self, name: str) -> dict[str, str]:
        async def go() -> dict[str, str]:
            a = await self._get_admin()
            (r,) = await a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
            (res,) = r.to_object()["resources"]
            _check(res["error_code"], f"describe configs {name}", res["error_message"])
            return {e["config_names"]: e["config_value"] for e in res["config_entries"]}
        return self.run(go())

    def delete_records(self, topic: str, partition: int, before: int) -> int:
        async def go() -> int:
            a = await self._get_admin()
            r = await a.delete_records({TopicPartition(topic, partition): RecordsToDelete(before)}, timeout_ms=20000)
            return int(r[TopicPartition(topic, partition)])
        return self.run(go())

    def authenticate(self, timeout: float = 30.0) -> None:
        base.authenticate_isolated(self, "aiokafka", timeout)

    def metadata(self) -> dict[str, Any]:
        async def go() -> dict[str, Any]:
            a = await self._get_admin()
            topics = await a.describe_topics()
            cluster = await a.describe_cluster()
            return {"brokers": sorted(b["node_id"] for b in cluster["brokers"]),
                    "topics": {t["topic"]: len(t["partitions"]) for t in topics if not t["error_code"]}}
        return self.run(go())

    # --- configs and cluster admin ---
    def alter_configs(self, rtype: str, name: str, ops: list[tuple[str, str, str | None]], *,
                      incremental: bool = True, validate_only: bool = False) -> None:
        if incremental:
            raise base.NotSupportedByClient("IncrementalAlterConfigs")
        if validate_only:
            raise base.NotSupportedByClient("AlterConfigs with validate_only")
        if rtype != "topic":
            raise base.NotSupportedByClient(f"altering {rtype} configs")
        assert all(op == "set" for op, _k, _v in ops), "AlterConfigs only sets configs"

        async def go() -> None:
            a = await self._get_admin()
            rs = await a.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name,
                                                       configs={k: v for _op, k, v in ops})])
            for r in rs:
                for res in r.to_object()["resources"]:
                    _check(res["error_code"], f"alter configs {name}", res["error_message"])
        self.run(go())

    def describe_cluster(self, authorized_operations: bool = False) -> dict[str, Any]:
        if authorized_operations:
            raise base.NotSupportedByClient("the cluster's authorized operations")

        async def go() -> dict[str, Any]:
            a = await self._get_admin()
            d = await a.describe_cluster()
            return {"cluster_id": d["cluster_id"], "controller": d["controller_id"],
                    "brokers": sorted(b["node_id"] for b in d["brokers"]), "authorized_operations": None}
        return self.run(go())

    # --- produce ---
    def _producer(self, **kw: Any) -> AIOKafkaProducer:
        return AIOKafkaProducer(**self._kw(), linger_ms=5,
                                max_request_size=10_000_000, **kw)

    def produce(self, topic: str, msgs: list[Msg], *, acks: str = "all", compression: str = "none",
                idempotent: bool = False, timeout: float = 30.0) -> list[Delivery]:
        async def go() -> list[Delivery]:
            p = self._producer(acks={"all": "all", "1": 1, "0": 0}[acks],
                               compression_type=None if compression == "none" else compression,
                               enable_idempotence=idempotent, request_timeout_ms=int(timeout * 1000) // 2)
            await p.start()
            try:
                futs = [await p.send(topic, value=m.value, key=m.key, partition=m.partition,
                                     timestamp_ms=m.timestamp, headers=list(m.headers) or None) for m in msgs]
                out = []
                for f in futs:
                    md = await f
                    if md is None:  # acks=0: no answer, no metadata
                        out.append(Delivery(-1, -1))
                        continue
                    out.append(Delivery(md.partition, md.offset if md.offset is not None and md.offset >= 0 else -1))
                return out
            finally:
                await p.stop()
        return self.run(go(), timeout + 10)

    def produce_transactions(self, topic: str, txns: list[tuple[list[Msg], bool]], transactional_id: str,
                             timeout: float = 60.0) -> None:
        async def go() -> None:
            p = self._producer(transactional_id=transactional_id, enable_idempotence=True)
            await p.start()
            try:
                for msgs, commit in txns:
                    await p.begin_transaction()
                    futs = [await p.send(topic, value=m.value, key=m.key, partition=m.partition,
                                         headers=list(m.headers) or None) for m in msgs]
                    for f in futs:
                        await f
                    if commit:
                        await p.commit_transaction()
                    else:
                        await p.abort_transaction()
            finally:
                await p.stop()
        self.run(go(), timeout)

    def transactional_offsets(self, topic: str, msgs: list[Msg], transactional_id: str, group: str,
                              offsets_topic: str, offsets: dict[int, int], commit: bool,
                              timeout: float = 60.0) -> None:
        async def go() -> None:
            p = self._producer(transactional_id=transactional_id, enable_idempotence=True)
            await p.start()
            try:
                await p.begin_transaction()
                for m in msgs:
                    await p.send(topic, value=m.value, key=m.key)
                tps = {TopicPartition(offsets_topic, k): v for k, v in offsets.items()}
                await p.send_offsets_to_transaction(tps, group)
                if commit:
                    await p.commit_transaction()
                else:
                    await p.abort_transaction()
            finally:
                await p.stop()
        self.run(go(), timeout)

    # --- consume ---
    def consume(self, topic: str, partitions: list[int], *, start: int | str = "earliest", count: int,
                timeout: float = 20.0, isolation: str = "read_uncommitted", reset: str = "earliest",
                idle: float | None = None) -> list[Record]:
        async def go() -> list[Record]:
            c = AIOKafkaConsumer(**self._kw(), group_id=None,
                                 enable_auto_commit=False, auto_offset_reset=reset, isolation_level=isolation,
                                 fetch_max_wait_ms=100, max_partition_fetch_bytes=2_000_000)
            await c.start()
            out: list[Record] = []
            try:
                tps = [TopicPartition(topic, p) for p in partitions]
                c.assign(tps)
                if start == "earliest":
                    await c.seek_to_beginning(*tps)
                elif start == "latest":
                    await c.seek_to_end(*tps)
                else:
                    for tp in tps:
                        c.seek(tp, int(start))
                deadline = time.monotonic() + timeout
                last = time.monotonic()
                while len(out) < count and time.monotonic() < deadline:
                    if idle is not None and time.monotonic() - last > idle:
                        break
                    batch = await c.getmany(timeout_ms=200)
                    for recs in batch.values():
                        out.extend(_record(r) for r in recs)
                        last = time.monotonic()
            finally:
                await c.stop()
            return out
        return self.run(go(), timeout + 15)

    def list_offset(self, topic: str, partition: int, spec: int | str) -> int:
        async def go() -> int:
            c = AIOKafkaConsumer(**self._kw(), group_id=None)
            await c.start()
            tp = TopicPartition(topic, partition)
            try:
                if spec == "earliest":
                    return int((await c.beginning_offsets([tp]))[tp])
                if spec == "latest":
                    return int((await c.end_offsets([tp]))[tp])
                r = (await c.offsets_for_times({tp: int(spec)}))[tp]
                return -1 if r is None else int(r.offset)
            finally:
                await c.stop()
        return self.run(go())

    # --- groups ---
    def start_member(self, group: str, topics: list[str], *, protocol: str = "classic",
                     assignor: str = "roundrobin", reset: str = "earliest", auto_commit: bool = True,
                     session_timeout_ms: int = 10000) -> Member:
        if protocol != "classic":
            raise base.NotSupportedByClient("group.protocol=consumer")
        def make() -> AIOKafkaConsumer:  # called on the loop: aiokafka binds to the running loop
            return AIOKafkaConsumer(**self._kw(), group_id=group,
                                    enable_auto_commit=auto_commit, auto_commit_interval_ms=200,
                                    auto_offset_reset=reset, partition_assignment_strategy=(ASSIGNORS[assignor],),
                                    session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=500,
                                    fetch_max_wait_ms=100)
        return _AioMember(self, make, topics, auto_commit)

    def commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        async def go() -> None:
            c = AIOKafkaConsumer(**self._kw(), group_id=group,
                                 enable_auto_commit=False)
            await c.start()
            try:
                c.assign([TopicPartition(topic, p) for p in offsets])
                await c.commit({TopicPartition(topic, p): o for p, o in offsets.items()})
            finally:
                await c.stop()
        self.run(go())

    def committed_offsets(self, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
        async def go() -> dict[int, int]:
            a = await self._get_admin()
            r = await a.list_consumer_group_offsets(group, partitions=[TopicPartition(topic, p) for p in partitions])
            return {tp.partition: (om.offset if om.offset is not None and om.offset >= 0 else -1)
                    for tp, om in r.items()}
        return self.run(go())

    def list_groups(self) -> set[str]:
        async def go() -> set[str]:
            a = await self._get_admin()
            return {g[0] for g in await a.list_consumer_groups()}
        return self.run(go())

    def describe_group(self, group: str) -> dict[str, Any]:
        async def go() -> dict[str, Any]:
            a = await self._get_admin()
            (resp,) = await a.describe_consumer_groups([group])
            (g,) = resp.to_object()["groups"]
            _check(g["error_code"], f"describe group {group}")
            return {"state": base.norm_state(g["state"]), "members": len(g["members"])}
        return self.run(go())


def _record(r: Any) -> Record:
    return Record(r.partition, r.offset, r.key, r.value, [(k, v) for k, v in (r.headers or [])], r.timestamp,
                  r.topic)


class _AioMember(Member):
    def __init__(self, client: AiokafkaClient, make: Callable[[], AIOKafkaConsumer], topics: list[str],
                 auto_commit: bool) -> None:
        super().__init__()
        self._client = client
        self._auto_commit = auto_commit
        self._stopping = False

        async def start() -> asyncio.Task[None]:
            self._c = make()
            await self._c.start()
            self._c.subscribe(topics)
            return asyncio.get_running_loop().create_task(self._run())

        self._task = client.run(start())

    async def _run(self) -> None:
        try:
            while not self._stopping:
                batch = await self._c.getmany(timeout_ms=100)
                self._set_assignment([(tp.topic, tp.partition) for tp in self._c.assignment()])
                recs = [_record(r) for rs in batch.values() for r in rs]
                if recs:
                    self._add(recs)
                    if not self._auto_commit:
                        await self._c.commit()
        except Exception as e:
            self.error = repr(e)
            self.failed = True

    def close(self) -> None:
        self._stopping = True

        async def stop() -> None:
            await asyncio.wait([self._task], timeout=10)
            await self._c.stop()
        self._client.run(stop(), 30)
