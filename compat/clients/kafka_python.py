"""kafka-python, in process."""

from __future__ import annotations

import threading
import time
from typing import Any

import kafka
import kafka.errors as kerr
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import AlterConfigOp, ConfigResource, ConfigResourceType, KafkaAdminClient, OffsetSpec
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from kafka.structs import OffsetAndMetadata

from compat.clients import base
from compat.clients.base import ClientError, Delivery, Member, Msg, Record

CLIENT_ID = "compat-kafka-python"
# kafka-python up to this version drops bytes it reads together with the connection's end (kafka/net/
# transport.py: _sock_recv returns the data and the "socket disconnected" error, and _read_from_sock aborts
# without handing the data on), so a refused SASL authentication that the broker answers and then closes at
# once (Kafka closes connection.failed.authentication.delay.ms after the failure, right after the answer) is
# lost on a loaded machine: the client reconnects until "Unable to bootstrap" and never reports the refusal.
DROPS_DATA_BEFORE_CLOSE = (3, 0, 12)
ASSIGNORS = {"roundrobin": RoundRobinPartitionAssignor, "range": RangePartitionAssignor}


def to_client_error(e: BaseException) -> ClientError:
    errno = getattr(e, "errno", None)
    if isinstance(errno, int) and errno != 0:
        return ClientError(base.error_name(errno), str(e)[:1000])
    if isinstance(e, kerr.KafkaTimeoutError):
        return ClientError("REQUEST_TIMED_OUT", str(e))
    return ClientError(type(e).__name__, str(e)[:1000])


class KafkaPythonClient(base.Client):
    name = "kafka-python"
    caps = frozenset({
        base.ADMIN, base.DESCRIBE_CONFIGS, base.DELETE_RECORDS, base.ASSIGN, base.GROUPS, base.COMMIT,
        base.TIMESTAMPS, base.LIST_OFFSETS, base.DESCRIBE_UNKNOWN, base.IDEMPOTENCE, base.TRANSACTIONS,
        base.TXN_OFFSETS,
        base.RESET_NONE, base.HEADERS, base.NULL_VALUES, base.BINARY,
        base.EMPTY_BYTES, base.ACKS0, base.MAX_MESSAGE_OVERRIDE,
        base.DELIVERY_OFFSETS, base.GROUP_ADMIN, base.OFFSET_DELETE, base.TXN_ADMIN,
        base.ALTER_CONFIGS, base.INCREMENTAL_ALTER_CONFIGS, base.CONFIG_SYNONYMS, base.CLIENT_METRICS_CONFIGS,
        base.BROKER_CONFIGS,
        base.DESCRIBE_CLUSTER, base.CLUSTER_AUTHORIZED_OPS, base.DESCRIBE_TOPIC_PARTITIONS,
        base.TOPIC_AUTHORIZED_OPS, base.LOG_DIRS, base.ALTER_LOG_DIRS, base.ELECT_LEADERS, base.REASSIGNMENTS,
        base.MAX_TIMESTAMP, base.CLIENT_QUOTAS,
        # Not BROKER_DEFAULT_CONFIGS: kafka-python addresses broker resources by an integer broker id only,
        # so it cannot reach the cluster-wide default (resource name "").
    })

    def _kw(self) -> dict[str, Any]:
        """Connection settings for every client object: address, client id, SASL identity."""
        kw: dict[str, Any] = {"bootstrap_servers": self.bootstrap, "client_id": CLIENT_ID}
        if self.sasl is not None:
            kw.update(self.sasl.python_kwargs())
        return kw

    def __init__(self, bootstrap: str, sasl: base.Sasl | None = None) -> None:
        super().__init__(bootstrap, sasl)
        self._admin: KafkaAdminClient | None = None

    @property
    def admin(self) -> KafkaAdminClient:
        if self._admin is None:
            self._admin = KafkaAdminClient(**self._kw(),
                                           request_timeout_ms=30000)
        return self._admin

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    # --- admin ---
    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     configs: dict[str, str] | None = None) -> None:
        try:
            self.admin.create_topics({name: {"num_partitions": partitions, "replication_factor": replication_factor,
                                             "configs": configs or {}}}, timeout_ms=20000)
        except kerr.KafkaError as e:
            raise to_client_error(e) from None

    def delete_topic(self, name: str) -> None:
        try:
            self.admin.delete_topics([name], timeout_ms=20000)
        except kerr.KafkaError as e:
            raise to_client_error(e) from None

    def create_partitions(self, name: str, total: int) -> None:
        try:
            self.admin.create_partitions({name: total}, timeout_ms=20000)
        except kerr.KafkaError as e:
            raise to_client_error(e) from None

    def describe_topic(self, name: str) -> int:
        try:
            (t,) = self.admin.describe_topics([name])
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        if t["error_code"]:
            raise ClientError(base.error_name(t["error_code"]), f"describe {name}")
        return len(t["partitions"])

    def topic_configs(self, name: str) -> dict[str, str]:
        try:
            res = self.admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)], config_filter="all")
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        return {k: v["value"] for k, v in res["topic"][name].items()}

    def delete_records(self, topic: str, partition: int, before: int) -> int:
        try:
            res = self.admin.delete_records({TopicPartition(topic, partition): before}, timeout_ms=20000)
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        r = res[TopicPartition(topic, partition)]
        if r["error_code"]:
            raise ClientError(base.error_name(r["error_code"]))
        return int(r["low_watermark"])

    def authenticate(self, timeout: float = 30.0) -> None:
        version = tuple(int(x) for x in kafka.__version__.split(".")[:3] if x.isdigit())
        if version <= DROPS_DATA_BEFORE_CLOSE:
            raise base.NotSupportedByClient(
                f"reporting a refused SASL authentication: kafka-python {kafka.__version__} drops a response read "
                "together with the connection's close, as Kafka sends it (compat/README.md)")
        base.authenticate_isolated(self, "kafka", timeout)

    def metadata(self) -> dict[str, Any]:
        try:
            topics = self.admin.describe_topics()
            cluster = self.admin.describe_cluster()
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        return {"brokers": sorted(b["broker_id"] for b in cluster["brokers"]),
                "topics": {t["name"]: len(t["partitions"]) for t in topics if not t["error_code"]}}

    # --- configs and cluster admin ---
    def alter_configs(self, rtype: str, name: str, ops: list[tuple[str, str, str | None]], *,
                      incremental: bool = True, validate_only: bool = False) -> None:
        rt = ConfigResourceType[rtype.upper()]
        if rt is ConfigResourceType.BROKER and not name:
            raise base.NotSupportedByClient("the cluster-wide default broker resource")
        try:
            if incremental:
                res = ConfigResource(rt, name, configs={k: (AlterConfigOp[op.upper()], v) for op, k, v in ops})
                out = self.admin.alter_configs([res], validate_only=validate_only, raise_on_unknown=False,
                                               incremental=True)
            else:
                assert all(op == "set" for op, _k, _v in ops), "AlterConfigs only sets configs"
                res = ConfigResource(rt, name, configs={k: v for _op, k, v in ops})
                # alter_configs(incremental=False) first copies the resource's other dynamic configs into the
                # request, to keep them; AlterConfigs itself replaces them all, which is what is tested here.
                out = self.admin._manager.run(self.admin._send_alter_configs_requests, [res], validate_only, False)
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        for results in out.values():
            for result in results.values():
                if result != "OK":
                    raise _result_error(str(result))

    def describe_configs(self, rtype: str, name: str, *, synonyms: bool = False) -> dict[str, base.ConfigValue]:
        rt = ConfigResourceType[rtype.upper()]
        try:
            res = self.admin.describe_configs([ConfigResource(rt, name)], include_synonyms=synonyms,
                                              config_filter="all")
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        entries = res[rt.name.lower()][name]
        return {k: base.ConfigValue(v.get("value"), base.norm_source(v["config_source"]),
                                    [(x["name"], x.get("value"), base.norm_source(x["source"]))
                                     for x in v.get("synonyms") or []],
                                    v.get("read_only"))
                for k, v in entries.items()}

    def describe_cluster(self, authorized_operations: bool = False) -> dict[str, Any]:
        try:
            d = self.admin.describe_cluster()
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        # kafka-python always asks for the cluster's authorized operations; reported only when the
        # scenario asks, like the other clients.
        ops = d.get("authorized_operations")
        return {"cluster_id": d["cluster_id"], "controller": d.get("controller_id", -1),
                "brokers": sorted(b["broker_id"] for b in d["brokers"]),
                "authorized_operations": set(ops) if authorized_operations and ops is not None else None}

    def describe_topic_detail(self, name: str, authorized_operations: bool = False) -> dict[str, Any]:
        try:
            res = self.admin.describe_topic_partitions([name])
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        (t,) = res["topics"]
        if t["error_code"]:
            raise ClientError(base.error_name(t["error_code"]), f"describe {name}")
        return {"topic_id": str(t["topic_id"]) if t["topic_id"] is not None else None,
                "partitions": {p["partition_index"]: {"leader": p["leader_id"], "replicas": p["replica_nodes"],
                                                      "isr": p["isr_nodes"]} for p in t["partitions"]},
                "authorized_operations": base.ops_from_bits(t["topic_authorized_operations"])
                if authorized_operations else None}

    def topic_authorized_operations(self, name: str) -> set[str] | None:
        try:
            (t,) = self.admin.describe_topics([name])  # Metadata, always asking for authorized operations
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        if t["error_code"]:
            raise ClientError(base.error_name(t["error_code"]), f"describe {name}")
        ops = t.get("authorized_operations")
        return None if ops is None else set(ops)

    def describe_log_dirs(self, broker: int) -> dict[str, dict[str, Any]]:
        try:
            (res,) = self.admin.describe_log_dirs(brokers=[broker])
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        out = {}
        for d in res["log_dirs"]:
            replicas = {(t["name"], p["partition_index"]): {"size": p["partition_size"], "future": p["is_future_key"]}
                        for t in d["topics"] for p in t["partitions"]}
            out[d["log_dir"]] = {"error": base.error_name(d["error_code"]) if d["error_code"] else None,
                                 "replicas": replicas}
        return out

    def alter_replica_log_dir(self, topic: str, partition: int, broker: int, path: str) -> None:
        try:
            res = self.admin.alter_replica_log_dirs({(topic, partition, broker): path})
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        for err in res.values():
            if err is not kerr.NoError:
                raise ClientError(base.error_name(err.errno), f"alter replica log dir of {topic}-{partition}")

    def elect_leaders(self, topic: str, partitions: list[int]) -> dict[int, str | None]:
        try:
            r = self.admin.elect_leaders(0, {topic: partitions}, timeout_ms=20000, raise_errors=False)
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        if getattr(r, "error_code", 0):
            raise ClientError(base.error_name(r.error_code), "elect leaders")
        return {p.partition_id: (base.error_name(p.error_code) if p.error_code else None)
                for t in r.replica_election_results for p in t.partition_result}

    def alter_reassignments(self, topic: str, targets: dict[int, list[int] | None]) -> dict[int, str | None]:
        try:
            res = self.admin.alter_partition_reassignments({TopicPartition(topic, p): r for p, r in targets.items()},
                                                           timeout_ms=20000)
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        return {tp.partition: (None if err is None else base.error_name(err.errno)) for tp, err in res.items()}

    def list_reassignments(self, topic: str, partitions: list[int]) -> dict[int, dict[str, list[int]]]:
        try:
            res = self.admin.list_partition_reassignments({topic: partitions}, timeout_ms=20000)
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        return {tp.partition: {"replicas": v["replicas"], "adding": v["adding_replicas"],
                               "removing": v["removing_replicas"]} for tp, v in res.items()}

    # kafka-python 3.0.12 has the client-quota messages but no admin method for them: they are sent
    # through the admin client's own connection manager (kafka-python encodes and decodes them).
    def _send(self, request: Any) -> Any:
        manager = self.admin._manager

        async def go() -> Any:
            return await manager.send(request)

        return manager.run(go)

    def describe_client_quotas(self, entity: dict[str, str]) -> dict[str, float]:
        from kafka.protocol.admin.client_quotas import DescribeClientQuotasRequest as Req

        req = Req(components=[Req.ComponentData(entity_type=t, match_type=0, match=n) for t, n in entity.items()],
                  strict=True)
        try:
            resp = self._send(req)
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        if resp.error_code:
            raise ClientError(base.error_name(resp.error_code), resp.error_message or "describe client quotas")
        for entry in resp.entries or []:
            if {e.entity_type: e.entity_name for e in entry.entity} == entity:
                return {v.key: float(v.value) for v in entry.values}
        return {}

    def alter_client_quotas(self, entity: dict[str, str], quotas: dict[str, float | None],
                            validate_only: bool = False) -> None:
        from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest as Req

        entry = Req.EntryData(entity=[Req.EntryData.EntityData(entity_type=t, entity_name=n)
                                      for t, n in entity.items()],
                              ops=[Req.EntryData.OpData(key=k, value=0.0 if v is None else float(v), remove=v is None)
                                   for k, v in quotas.items()])
        try:
            resp = self._send(Req(entries=[entry], validate_only=validate_only))
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        for e in resp.entries:
            if e.error_code:
                raise ClientError(base.error_name(e.error_code), e.error_message or "alter client quotas")

    def max_timestamp_offset(self, topic: str, partition: int) -> tuple[int, int]:
        tp = TopicPartition(topic, partition)
        try:
            res = self.admin.list_partition_offsets({tp: OffsetSpec.MAX_TIMESTAMP})
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        off, ts = res[tp].offset, res[tp].timestamp
        return (-1 if off is None else int(off)), (-1 if ts is None else int(ts))

    # --- produce ---
    def _producer(self, **kw: Any) -> KafkaProducer:
        return KafkaProducer(**self._kw(), linger_ms=5,
                             max_request_size=10_000_000, **kw)

    def produce(self, topic: str, msgs: list[Msg], *, acks: str = "all", compression: str = "none",
                idempotent: bool = False, timeout: float = 30.0) -> list[Delivery]:
        p = self._producer(acks={"all": "all", "1": 1, "0": 0}[acks],
                           compression_type=None if compression == "none" else compression,
                           enable_idempotence=idempotent, request_timeout_ms=int(timeout * 1000) // 2,
                           **({"retries": 0} if acks == "0" else {}))
        try:
            futures = [p.send(topic, value=m.value, key=m.key, headers=list(m.headers), partition=m.partition,
                              timestamp_ms=m.timestamp) for m in msgs]
            p.flush(timeout)
            out = []
            for f in futures:
                md = f.get(timeout)
                out.append(Delivery(md.partition, md.offset if md.offset is not None and md.offset >= 0 else -1))
            return out
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        finally:
            p.close(timeout=5)

    def produce_transactions(self, topic: str, txns: list[tuple[list[Msg], bool]], transactional_id: str,
                             timeout: float = 60.0) -> None:
        p = self._producer(transactional_id=transactional_id, enable_idempotence=True)
        try:
            p.init_transactions()
            for msgs, commit in txns:
                p.begin_transaction()
                for m in msgs:
                    p.send(topic, value=m.value, key=m.key, headers=list(m.headers), partition=m.partition)
                p.flush(timeout)
                if commit:
                    p.commit_transaction()
                else:
                    p.abort_transaction()
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        finally:
            p.close(timeout=5)

    def transactional_offsets(self, topic: str, msgs: list[Msg], transactional_id: str, group: str,
                              offsets_topic: str, offsets: dict[int, int], commit: bool,
                              timeout: float = 60.0) -> None:
        p = self._producer(transactional_id=transactional_id, enable_idempotence=True)
        try:
            p.init_transactions()
            p.begin_transaction()
            for m in msgs:
                p.send(topic, value=m.value, key=m.key)
            tps = {TopicPartition(offsets_topic, part): OffsetAndMetadata(off, "", -1) for part, off in offsets.items()}
            p.send_offsets_to_transaction(tps, group)
            if commit:
                p.commit_transaction()
            else:
                p.abort_transaction()
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        finally:
            p.close(timeout=5)

    # --- consume ---
    def consume(self, topic: str, partitions: list[int], *, start: int | str = "earliest", count: int,
                timeout: float = 20.0, isolation: str = "read_uncommitted", reset: str = "earliest",
                idle: float | None = None) -> list[Record]:
        c = KafkaConsumer(**self._kw(), group_id=None,
                          enable_auto_commit=False, auto_offset_reset=reset, isolation_level=isolation,
                          fetch_max_wait_ms=100, max_partition_fetch_bytes=2_000_000)
        tps = [TopicPartition(topic, p) for p in partitions]
        out: list[Record] = []
        try:
            c.assign(tps)
            if start == "earliest":
                c.seek_to_beginning(*tps)
            elif start == "latest":
                c.seek_to_end(*tps)
            else:
                for tp in tps:
                    c.seek(tp, int(start))
            deadline = time.monotonic() + timeout
            last = time.monotonic()
            while len(out) < count and time.monotonic() < deadline:
                if idle is not None and time.monotonic() - last > idle:
                    break
                batch = c.poll(timeout_ms=200)
                for recs in batch.values():
                    out.extend(_record(r) for r in recs)
                    last = time.monotonic()
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        finally:
            c.close()
        return out

    def list_offset(self, topic: str, partition: int, spec: int | str) -> int:
        s = {"earliest": OffsetSpec.EARLIEST, "latest": OffsetSpec.LATEST}[spec] if isinstance(spec, str) else spec
        try:
            res = self.admin.list_partition_offsets({TopicPartition(topic, partition): s})
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        off = res[TopicPartition(topic, partition)].offset
        return -1 if off is None else int(off)

    # --- groups ---
    def start_member(self, group: str, topics: list[str], *, protocol: str = "classic",
                     assignor: str = "roundrobin", reset: str = "earliest", auto_commit: bool = True,
                     session_timeout_ms: int = 10000) -> Member:
        if protocol != "classic":
            raise base.NotSupportedByClient("group.protocol=consumer")
        c = KafkaConsumer(**self._kw(), group_id=group,
                          enable_auto_commit=auto_commit, auto_commit_interval_ms=200, auto_offset_reset=reset,
                          partition_assignment_strategy=[ASSIGNORS[assignor]],
                          session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=500, fetch_max_wait_ms=100)
        return _KafkaPythonMember(c, topics, auto_commit)

    def commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        c = KafkaConsumer(**self._kw(), group_id=group,
                          enable_auto_commit=False)
        try:
            c.commit({TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()})
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        finally:
            c.close()

    def committed_offsets(self, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
        try:
            res = self.admin.list_group_offsets({group: [TopicPartition(topic, p) for p in partitions]})
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        return {tp.partition: (om.offset if om.offset is not None and om.offset >= 0 else -1)
                for tp, om in res[group].items()}

    def list_groups(self) -> set[str]:
        try:
            return {g["group_id"] for g in self.admin.list_groups()}
        except kerr.KafkaError as e:
            raise to_client_error(e) from None

    def describe_group(self, group: str) -> dict[str, Any]:
        try:
            d = self.admin.describe_groups([group])[group]
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        if d.get("error"):
            raise to_client_error(d["error"]) if isinstance(d["error"], BaseException) else ClientError(str(d["error"]))
        return {"state": base.norm_state(d["group_state"]), "members": len(d["members"])}

    def delete_group(self, group: str) -> None:
        try:
            res = self.admin.delete_groups([group])
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        for item in (res.items() if isinstance(res, dict) else res):
            err = item[1]
            if isinstance(err, BaseException):
                raise to_client_error(err)
            if isinstance(err, int) and err:
                raise ClientError(base.error_name(err))

    def delete_committed_offsets(self, group: str, topic: str, partitions: list[int]) -> None:
        try:
            res = self.admin.delete_group_offsets(group, [TopicPartition(topic, p) for p in partitions])
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        for err in (res.values() if isinstance(res, dict) else []):
            if isinstance(err, BaseException):
                raise to_client_error(err)
            if isinstance(err, int) and err:
                raise ClientError(base.error_name(err))

    def list_transactions(self) -> dict[str, str]:
        try:
            res = self.admin.list_transactions()
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        out = {}
        for states in res.values():
            for t in states:
                out[t.transactional_id] = base.norm_state(getattr(t.state, "value", t.state))
        return out

    def describe_transaction(self, transactional_id: str) -> str:
        try:
            res = self.admin.describe_transactions([transactional_id])
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        d = res[transactional_id]
        return base.norm_state(getattr(d.state, "value", d.state))

    def describe_producers(self, topic: str, partition: int) -> list[int]:
        try:
            res = self.admin.describe_producers([TopicPartition(topic, partition)])
        except kerr.KafkaError as e:
            raise to_client_error(e) from None
        state = res[TopicPartition(topic, partition)]
        return [p.producer_id for p in state.active_producers]


def _result_error(text: str) -> ClientError:
    """kafka-python reports a resource's error as its text ("[Error 40] InvalidConfigurationError: ...")."""
    if text.startswith("[Error "):
        code = text[len("[Error "):].split("]", 1)[0]
        if code.isdigit():
            return ClientError(base.error_name(int(code)), text)
    return ClientError("CLIENT_ERROR", text)


def _record(r: Any) -> Record:
    return Record(r.partition, r.offset, r.key, r.value, [(k, v) for k, v in (r.headers or [])], r.timestamp,
                  r.topic)


def _learn_partitions(consumer: KafkaConsumer, topics: list[str], timeout: float = 15.0) -> None:
    """Have the consumer know every subscribed topic's partitions before its first poll().

    Why: kafka-python 3.0.12 rejoins when the partitions it sees differ from those of its last
    assignment, but it keeps that reason only in the comparison, which its own assignment clears.
    If a poll() gives up (its timeout) while that JoinGroup/SyncGroup round trip is in flight,
    later polls see nothing to rejoin and never finish the join: the member stays "rebalancing",
    sends no heartbeats and is expired by the coordinator (seen under load, any broker). A first
    assignment that already covers every partition leaves nothing for that check to find.
    """
    deadline = time.monotonic() + timeout
    while True:
        consumer.topics()  # a Metadata request; the group coordinator's listener records the partitions
        if all(consumer.partitions_for_topic(t) for t in topics) or time.monotonic() > deadline:
            return
        time.sleep(0.1)


class _KafkaPythonMember(Member):
    def __init__(self, consumer: KafkaConsumer, topics: list[str], auto_commit: bool) -> None:
        super().__init__()
        self._c = consumer
        self._auto_commit = auto_commit
        self._stop = threading.Event()
        self._c.subscribe(topics)
        _learn_partitions(consumer, topics)
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                batch = self._c.poll(timeout_ms=100)
                self._set_assignment([(tp.topic, tp.partition) for tp in self._c.assignment()])
                recs = [_record(r) for rs in batch.values() for r in rs]
                if recs:
                    self._add(recs)
                    if not self._auto_commit:
                        self._c.commit()
        except Exception as e:
            self.error = repr(e)
            self.failed = True
        finally:
            self._c.close()

    def close(self) -> None:
        self._stop.set()
        self._t.join(30)
