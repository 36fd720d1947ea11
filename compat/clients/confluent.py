"""confluent-kafka (librdkafka), in process."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

from compat import scenario
from compat.clients import base
from compat.clients.base import ClientError, Delivery, Member, Msg, Record, retry_on

CLIENT_ID = "compat-confluent"


# Kafka's retriable errors of a group coordinator that is moving or still loading its partition.
_RETRIABLE_COORDINATOR_ERRORS = frozenset({"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS",
                                           "COORDINATOR_NOT_AVAILABLE"})


def to_client_error(e: BaseException) -> ClientError:
    err = e.args[0] if isinstance(e, KafkaException) and e.args else e
    if isinstance(err, KafkaError):
        return kafka_error(err)
    return ClientError("CLIENT_ERROR", repr(e))


def kafka_error(err: KafkaError) -> ClientError:
    code = err.code()
    if code > 0:
        return ClientError(base.error_name(code), err.str())
    if code == KafkaError._AUTO_OFFSET_RESET:
        # librdkafka's auto.offset.reset=error: the broker answered OFFSET_OUT_OF_RANGE.
        return ClientError("OFFSET_OUT_OF_RANGE", err.str())
    if code == KafkaError._MSG_TIMED_OUT:
        return ClientError("REQUEST_TIMED_OUT", err.str())
    return ClientError(err.name().lstrip("_"), err.str())


def security_conf(sasl: base.Sasl | None) -> dict[str, str]:
    """librdkafka's spelling of a SASL_PLAINTEXT identity (also kcat's -X options)."""
    if sasl is None:
        return {}
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": sasl.mechanism,
            "sasl.username": sasl.username, "sasl.password": sasl.password}


class ConfluentClient(base.Client):
    name = "confluent-kafka"
    # librdkafka 2.16 sends ConsumerGroupHeartbeat v1 only (v1 added the regex subscription);
    # Apache Kafka 3.8 advertises v0 only.
    api_versions_needed = {scenario.CONSUMER_GROUP_HEARTBEAT: 1}
    caps = frozenset({
        base.ADMIN, base.DESCRIBE_CONFIGS, base.DELETE_RECORDS, base.ASSIGN, base.GROUPS,
        base.GROUP_PROTOCOL_CONSUMER, base.COMMIT, base.TIMESTAMPS, base.LIST_OFFSETS, base.DESCRIBE_UNKNOWN,
        base.IDEMPOTENCE,
        base.TRANSACTIONS, base.TXN_OFFSETS, base.RESET_NONE, base.HEADERS, base.NULL_VALUES, base.BINARY,
        base.EMPTY_BYTES,
        base.ACKS0, base.MAX_MESSAGE_OVERRIDE, base.DELIVERY_OFFSETS,
        base.NULL_HEADER_VALUES, base.GROUP_ADMIN,
        base.ALTER_CONFIGS, base.INCREMENTAL_ALTER_CONFIGS, base.BROKER_CONFIGS, base.DESCRIBE_CLUSTER,
        # Not BROKER_DEFAULT_CONFIGS: confluent-kafka refuses a broker resource with an empty name.
        base.CLUSTER_AUTHORIZED_OPS, base.TOPIC_AUTHORIZED_OPS, base.GROUP_AUTHORIZED_OPS, base.ELECT_LEADERS,
        base.MAX_TIMESTAMP,
        base.EPOCH_VALIDATION, base.PUSH_TELEMETRY,
        # Not CONFIG_SYNONYMS: confluent-kafka keeps a config's synonyms in a dict by name, so a broker
        # setting's synonyms (the same name per source) collapse into one.
    })

    def __init__(self, bootstrap: str, sasl: base.Sasl | None = None) -> None:
        super().__init__(bootstrap, sasl)
        self._admin: AdminClient | None = None

    def _conf(self, **kw: Any) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, "client.id": CLIENT_ID, **security_conf(self.sasl), **kw}

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self._conf())
        return self._admin

    @staticmethod
    def _wait(futures: dict[Any, Any], timeout: float = 30.0) -> None:
        for f in futures.values():
            try:
                f.result(timeout=timeout)
            except KafkaException as e:
                raise to_client_error(e) from None

    # --- admin ---
    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     configs: dict[str, str] | None = None) -> None:
        nt = NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=configs or {})
        self._wait(self.admin.create_topics([nt], operation_timeout=20, request_timeout=30))

    def delete_topic(self, name: str) -> None:
        self._wait(self.admin.delete_topics([name], operation_timeout=20, request_timeout=30))

    def create_partitions(self, name: str, total: int) -> None:
        self._wait(self.admin.create_partitions([NewPartitions(name, total)], operation_timeout=20,
                                                request_timeout=30))

    def describe_topic(self, name: str) -> int:
        from confluent_kafka import TopicCollection

        fs = self.admin.describe_topics(TopicCollection([name]), request_timeout=30)
        try:
            desc = fs[name].result(timeout=30)
        except KafkaException as e:
            raise to_client_error(e) from None
        return len(desc.partitions)

    def partition_leaders(self, name: str) -> dict[int, int]:
        """{partition: leader broker id, -1 when it has none} as Metadata (DescribeTopics) shows them."""
        from confluent_kafka import TopicCollection

        fs = self.admin.describe_topics(TopicCollection([name]), request_timeout=30)
        try:
            desc = fs[name].result(timeout=30)
        except KafkaException as e:
            raise to_client_error(e) from None
        return {p.id: (p.leader.id if p.leader is not None else -1) for p in desc.partitions}

    def topic_configs(self, name: str) -> dict[str, str]:
        fs = self.admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)], request_timeout=30)
        try:
            (entries,) = (f.result(timeout=30) for f in fs.values())
        except KafkaException as e:
            raise to_client_error(e) from None
        return {k: v.value for k, v in entries.items()}

    def delete_records(self, topic: str, partition: int, before: int) -> int:
        fs = self.admin.delete_records([TopicPartition(topic, partition, before)], request_timeout=30,
                                       operation_timeout=20)
        try:
            (res,) = (f.result(timeout=30) for f in fs.values())
        except KafkaException as e:
            raise to_client_error(e) from None
        return int(res.low_watermark)

    def authenticate(self, timeout: float = 30.0) -> None:
        """librdkafka reports a refused authentication through error_cb (the request itself only fails
        with a transport error), so the check listens there."""
        errors: list[KafkaError] = []
        a = AdminClient(self._conf(error_cb=errors.append))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
            if auth:
                raise kafka_error(auth[0])
            try:
                a.list_topics(timeout=1)
                return
            except KafkaException:
                a.poll(0.1)  # serves error_cb
        raise ClientError("REQUEST_TIMED_OUT", f"neither metadata nor an authentication error in {timeout}s: "
                                               f"{[e.str() for e in errors][-3:]}")

    def metadata(self) -> dict[str, Any]:
        try:
            md = self.admin.list_topics(timeout=20)
        except KafkaException as e:
            raise to_client_error(e) from None
        return {"brokers": sorted(md.brokers), "topics": {t: len(m.partitions) for t, m in md.topics.items()
                                                          if m.error is None},
                "cluster_id": md.cluster_id, "controller": md.controller_id}

    # --- configs and cluster admin ---
    @staticmethod
    def _resource(rtype: str, name: str, **kw: Any) -> ConfigResource:
        types = {"topic": ResourceType.TOPIC, "broker": ResourceType.BROKER}
        if rtype not in types:
            raise base.NotSupportedByClient(f"{rtype} config resources")
        if not name:
            raise base.NotSupportedByClient("the cluster-wide default broker resource (an empty name)")
        return ConfigResource(types[rtype], name, **kw)

    def alter_configs(self, rtype: str, name: str, ops: list[tuple[str, str, str | None]], *,
                      incremental: bool = True, validate_only: bool = False) -> None:
        if incremental:
            entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType[op.upper()]) for op, k, v in ops]
            res = self._resource(rtype, name, incremental_configs=entries)
            fs = self.admin.incremental_alter_configs([res], validate_only=validate_only, request_timeout=30)
        else:
            assert all(op == "set" for op, _k, _v in ops), "AlterConfigs only sets configs"
            res = self._resource(rtype, name, set_config={k: v for _op, k, v in ops})
            fs = self.admin.alter_configs([res], validate_only=validate_only, request_timeout=30)
        self._wait(fs)

    def describe_configs(self, rtype: str, name: str, *, synonyms: bool = False) -> dict[str, base.ConfigValue]:
        # librdkafka always asks for synonyms; they are reported only when the scenario asks.
        fs = self.admin.describe_configs([self._resource(rtype, name)], request_timeout=30)
        try:
            (entries,) = (f.result(timeout=30) for f in fs.values())
        except KafkaException as e:
            raise to_client_error(e) from None
        return {k: base.ConfigValue(e.value, base.norm_source(e.source),
                                    [(sn, se.value, base.norm_source(se.source))
                                     for sn, se in (e.synonyms or {}).items()] if synonyms else [],
                                    e.is_read_only)
                for k, e in entries.items()}

    def describe_cluster(self, authorized_operations: bool = False) -> dict[str, Any]:
        try:
            d = self.admin.describe_cluster(include_authorized_operations=authorized_operations,
                                            request_timeout=30).result(timeout=30)
        except KafkaException as e:
            raise to_client_error(e) from None
        ops = d.authorized_operations
        return {"cluster_id": d.cluster_id, "controller": d.controller.id if d.controller is not None else -1,
                "brokers": sorted(n.id for n in d.nodes),
                "authorized_operations": None if ops is None else {o.name for o in ops}}

    def topic_authorized_operations(self, name: str) -> set[str] | None:
        from confluent_kafka import TopicCollection

        fs = self.admin.describe_topics(TopicCollection([name]), include_authorized_operations=True,
                                        request_timeout=30)
        try:
            d = fs[name].result(timeout=30)
        except KafkaException as e:
            raise to_client_error(e) from None
        ops = d.authorized_operations
        return None if ops is None else {o.name for o in ops}

    def group_authorized_operations(self, group: str) -> set[str] | None:
        fs = self.admin.describe_consumer_groups([group], include_authorized_operations=True, request_timeout=30)
        try:
            d = fs[group].result(timeout=30)
        except KafkaException as e:
            raise to_client_error(e) from None
        ops = d.authorized_operations
        return None if ops is None else {o.name for o in ops}

    def elect_leaders(self, topic: str, partitions: list[int]) -> dict[int, str | None]:
        from confluent_kafka import ElectionType

        try:
            # No request_timeout/operation_timeout: confluent-kafka 2.16.1's elect_leaders raises SystemError
            # ("more argument specifiers than keyword list entries") for either.
            res = self.admin.elect_leaders(ElectionType.PREFERRED,
                                           [TopicPartition(topic, p) for p in partitions]).result(timeout=30)
        except KafkaException as e:
            raise to_client_error(e) from None
        return {tp.partition: (None if err is None else to_client_error(err).name) for tp, err in res.items()}

    def max_timestamp_offset(self, topic: str, partition: int) -> tuple[int, int]:
        fs = self.admin.list_offsets({TopicPartition(topic, partition): OffsetSpec.max_timestamp()}, request_timeout=30)
        try:
            (res,) = (f.result(timeout=30) for f in fs.values())
        except KafkaException as e:
            raise to_client_error(e) from None
        return int(res.offset), int(res.timestamp)

    def push_telemetry(self, client_id: str, hold: float) -> str | None:
        # librdkafka (KIP-714) asks for its subscription when the broker offers telemetry, pushes every
        # interval while it runs and a last time when it is destroyed. The instance id is not exposed.
        p = Producer(self._conf(**{"client.id": client_id, "enable.metrics.push": True}))
        deadline = time.monotonic() + hold
        while time.monotonic() < deadline:
            p.poll(0.1)
        p.flush(10)
        del p
        return None

    def consume_validated(self, topic: str, partition: int, offset: int, count: int,
                          timeout: float = 30.0) -> list[Record]:
        c = Consumer(self._conf(**{
            "group.id": f"compat-unused-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
            "enable.auto.offset.store": False, "auto.offset.reset": "error", "fetch.wait.max.ms": 100,
        }))
        deadline = time.monotonic() + timeout
        out: list[Record] = []
        try:
            c.assign([TopicPartition(topic, partition, offset)])
            epoch = None
            while epoch is None and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is None:
                    continue
                if m.error():
                    raise kafka_error(m.error())
                epoch = m.leader_epoch()
                if epoch is None:
                    raise ClientError("CLIENT_ERROR", f"the record at {offset} carries no leader epoch")
            if epoch is None:
                raise ClientError("REQUEST_TIMED_OUT", f"no record at {offset} within {timeout}s")
            # A seek with a leader epoch makes librdkafka validate the position (OffsetForLeaderEpoch).
            c.seek(TopicPartition(topic, partition, offset, leader_epoch=epoch))
            while len(out) < count and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is None:
                    continue
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise kafka_error(m.error())
                out.append(_record(m))
        finally:
            c.close()
        return out

    # --- produce ---
    def produce(self, topic: str, msgs: list[Msg], *, acks: str = "all", compression: str = "none",
                idempotent: bool = False, timeout: float = 30.0) -> list[Delivery]:
        p = Producer(self._conf(**{
            "acks": {"all": "all", "1": "1", "0": "0"}[acks], "compression.type": compression,
            "enable.idempotence": idempotent, "linger.ms": 5, "message.max.bytes": 10_000_000,
            "message.timeout.ms": int(timeout * 1000) - 2000,
        }))
        out: list[Delivery | None] = [None] * len(msgs)
        errors: list[ClientError] = []

        def cb(i: int) -> Any:
            def on_delivery(err: KafkaError | None, m: Any) -> None:
                if err is not None:
                    errors.append(kafka_error(err))
                else:
                    off = m.offset()
                    out[i] = Delivery(m.partition(), off if off is not None and off >= 0 else -1)
            return on_delivery

        for i, m in enumerate(msgs):
            kw: dict[str, Any] = {"key": m.key, "value": m.value, "on_delivery": cb(i)}
            if m.headers:
                kw["headers"] = list(m.headers)
            if m.partition is not None:
                kw["partition"] = m.partition
            if m.timestamp is not None:
                kw["timestamp"] = m.timestamp
            while True:
                try:
                    p.produce(topic, **kw)
                    break
                except BufferError:
                    p.poll(0.1)
                except KafkaException as e:
                    raise to_client_error(e) from None
        left = p.flush(timeout)
        if errors:
            raise errors[0]
        if left:
            raise ClientError("REQUEST_TIMED_OUT", f"{left} messages undelivered after {timeout}s")
        return [d if d is not None else Delivery(-1, -1) for d in out]

    def _txn_producer(self, transactional_id: str, timeout: float) -> Producer:
        p = Producer(self._conf(**{"transactional.id": transactional_id, "linger.ms": 5,
                                   "transaction.timeout.ms": 60000}))
        try:
            p.init_transactions(timeout)
        except KafkaException as e:
            raise to_client_error(e) from None
        return p

    def produce_transactions(self, topic: str, txns: list[tuple[list[Msg], bool]], transactional_id: str,
                             timeout: float = 60.0) -> None:
        p = self._txn_producer(transactional_id, timeout)
        try:
            for msgs, commit in txns:
                p.begin_transaction()
                for m in msgs:
                    p.produce(topic, key=m.key, value=m.value, headers=list(m.headers) or None,
                              **({"partition": m.partition} if m.partition is not None else {}))
                p.flush(timeout)
                if commit:
                    p.commit_transaction(timeout)
                else:
                    p.abort_transaction(timeout)
        except KafkaException as e:
            raise to_client_error(e) from None

    def transactional_offsets(self, topic: str, msgs: list[Msg], transactional_id: str, group: str,
                              offsets_topic: str, offsets: dict[int, int], commit: bool,
                              timeout: float = 60.0) -> None:
        p = self._txn_producer(transactional_id, timeout)
        c = Consumer(self._conf(**{"group.id": group, "enable.auto.commit": False}))
        try:
            p.begin_transaction()
            for m in msgs:
                p.produce(topic, key=m.key, value=m.value)
            p.send_offsets_to_transaction([TopicPartition(offsets_topic, part, off) for part, off in offsets.items()],
                                          c.consumer_group_metadata(), timeout)
            if commit:
                p.commit_transaction(timeout)
            else:
                p.abort_transaction(timeout)
        except KafkaException as e:
            raise to_client_error(e) from None
        finally:
            c.close()

    # --- consume ---
    def consume(self, topic: str, partitions: list[int], *, start: int | str = "earliest", count: int,
                timeout: float = 20.0, isolation: str = "read_uncommitted", reset: str = "earliest",
                idle: float | None = None) -> list[Record]:
        c = Consumer(self._conf(**{
            "group.id": f"compat-unused-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
            "enable.auto.offset.store": False, "isolation.level": isolation,
            "auto.offset.reset": {"none": "error"}.get(reset, reset), "fetch.wait.max.ms": 100,
        }))
        off = {"earliest": OFFSET_BEGINNING, "latest": OFFSET_END}.get(start, start)  # type: ignore[call-overload]
        c.assign([TopicPartition(topic, p, off) for p in partitions])
        out: list[Record] = []
        deadline = time.monotonic() + timeout
        last = time.monotonic()
        try:
            while len(out) < count and time.monotonic() < deadline:
                if idle is not None and time.monotonic() - last > idle:
                    break
                m = c.poll(0.2)
                if m is None:
                    continue
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise kafka_error(m.error())
                last = time.monotonic()
                out.append(_record(m))
        finally:
            c.close()
        return out

    def list_offset(self, topic: str, partition: int, spec: int | str) -> int:
        s = {"earliest": OffsetSpec.earliest(), "latest": OffsetSpec.latest()}.get(spec) if isinstance(spec, str) \
            else OffsetSpec.for_timestamp(spec)
        fs = self.admin.list_offsets({TopicPartition(topic, partition): s}, request_timeout=30)
        try:
            (res,) = (f.result(timeout=30) for f in fs.values())
        except KafkaException as e:
            raise to_client_error(e) from None
        return int(res.offset)

    # --- groups ---
    def start_member(self, group: str, topics: list[str], *, protocol: str = "classic",
                     assignor: str = "roundrobin", reset: str = "earliest", auto_commit: bool = True,
                     session_timeout_ms: int = 10000) -> Member:
        conf = self._conf(**{
            "group.id": group, "auto.offset.reset": reset, "enable.auto.commit": auto_commit,
            "auto.commit.interval.ms": 200, "fetch.wait.max.ms": 100, "group.protocol": protocol,
        })
        if protocol == "classic":
            conf.update({"partition.assignment.strategy": assignor, "session.timeout.ms": session_timeout_ms,
                         "heartbeat.interval.ms": 500})
        return _ConfluentMember(Consumer(conf), topics, auto_commit)

    def commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """A commit outside any group membership, retried on the coordinator errors Kafka documents as
        retriable: librdkafka returns them from a manual commit instead of retrying, and a fresh Kafka gives
        NOT_COORDINATOR while it creates and loads ``__consumer_offsets`` for its first group."""
        c = Consumer(self._conf(**{"group.id": group, "enable.auto.commit": False}))

        def commit() -> None:
            try:
                c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
            except KafkaException as e:
                raise to_client_error(e) from None

        try:
            retry_on(_RETRIABLE_COORDINATOR_ERRORS, commit, timeout=15, interval=0.15)
        finally:
            c.close()

    def committed_offsets(self, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
        from confluent_kafka import ConsumerGroupTopicPartitions

        fs = self.admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])],
            request_timeout=30)
        try:
            (res,) = (f.result(timeout=30) for f in fs.values())
        except KafkaException as e:
            raise to_client_error(e) from None
        return {tp.partition: (tp.offset if tp.offset >= 0 else -1) for tp in res.topic_partitions}

    def list_groups(self) -> set[str]:
        try:
            res = self.admin.list_consumer_groups(request_timeout=30).result(timeout=30)
        except KafkaException as e:
            raise to_client_error(e) from None
        return {g.group_id for g in res.valid}

    def describe_group(self, group: str) -> dict[str, Any]:
        fs = self.admin.describe_consumer_groups([group], request_timeout=30)
        try:
            d = fs[group].result(timeout=30)
        except KafkaException as e:
            raise to_client_error(e) from None
        return {"state": base.norm_state(d.state.name), "members": len(d.members)}

    def delete_group(self, group: str) -> None:
        self._wait(self.admin.delete_consumer_groups([group], request_timeout=30))

    def close(self) -> None:
        self._admin = None


def _record(m: Any) -> Record:
    return Record(m.partition(), m.offset(), m.key(), m.value(),
                  [(k, v) for k, v in (m.headers() or [])], m.timestamp()[1], m.topic())


class _ConfluentMember(Member):
    def __init__(self, consumer: Consumer, topics: list[str], auto_commit: bool) -> None:
        super().__init__()
        self._c = consumer
        self._stop = threading.Event()
        self._auto_commit = auto_commit
        self._c.subscribe(topics)
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                m = self._c.poll(0.1)
                self._set_assignment([(tp.topic, tp.partition) for tp in self._c.assignment()])
                if m is None:
                    continue
                if m.error():
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        self.error = str(m.error())
                    if m.error().fatal() or m.error().code() == KafkaError._FATAL:  # e.g. KIP-848 refused
                        self.failed = True
                        return
                    continue
                self._add([_record(m)])
                if not self._auto_commit:
                    self._c.commit(message=m, asynchronous=False)
        except Exception as e:
            self.error = repr(e)
            self.failed = True
        finally:
            self._c.close()

    def close(self) -> None:
        self._stop.set()
        self._t.join(30)
