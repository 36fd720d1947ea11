"""Authorization enforcement per API (Kafka's KafkaApis checks), driven through the dispatcher with a fake
authorizer: each family is refused with Kafka's code and shape, and allowed once the ACL is granted."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.protocol.framing import FrameDecoder
from pykbroker.protocol.records import build_batch
from pykbroker.security.authorizer import AUTHORIZED_OPERATIONS_OMITTED, AclOperation, ResourceType
from pykbroker.security.principal import KafkaPrincipal
from pykbroker.security.session import Session
from pykbroker.server.broker import Broker
from tests.unit.test_dispatcher import call as call_anonymous
from tests.unit.test_dispatcher import frame_for

ALICE = KafkaPrincipal("User", "alice")
Op, RT = AclOperation, ResourceType
ZERO = datetime.timedelta(0)


class FakeAuthorizer:
    """ALLOW rules as (operation, resource type, name or '*'); ALL grants every operation.  Counts calls."""

    def __init__(self) -> None:
        self.rules: set[tuple[AclOperation, ResourceType, str]] = set()
        self.calls = 0

    def allow(self, op: AclOperation, rtype: ResourceType, name: str = "*") -> None:
        self.rules.add((op, rtype, name))

    def authorize(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
                  resource_type: ResourceType, name: str) -> bool:
        if principal.name == "ANONYMOUS":  # the test's own setup requests: a super user
            return True
        self.calls += 1
        assert principal == ALICE and host == "10.0.0.7"
        implied = {operation, Op.ALL}
        if operation == Op.DESCRIBE:  # as Kafka: READ/WRITE/DELETE/ALTER imply DESCRIBE
            implied |= {Op.READ, Op.WRITE, Op.DELETE, Op.ALTER}
        if operation == Op.DESCRIBE_CONFIGS:
            implied.add(Op.ALTER_CONFIGS)
        return any((o, resource_type, n) in self.rules for o in implied for n in (name, "*"))

    def authorize_by_resource_type(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
                                   resource_type: ResourceType) -> bool:
        self.calls += 1
        return any(o in (operation, Op.ALL) and r == resource_type for o, r, _ in self.rules)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(BrokerConfig({"log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0",
                             "transaction.state.log.num.partitions": "1", "offsets.topic.num.partitions": "1",
                             "group.initial.rebalance.delay.ms": "0"}))
    b.startup()
    anyio.run(b.txn._load, 0)
    anyio.run(b.groups._load, 0)
    call_anonymous(b, 19, 7, {"topics": [{"name": n, "num_partitions": 1, "replication_factor": 1,
                                          "assignments": [], "configs": []} for n in ("t", "secret")],
                              "timeout": 1000})
    try:
        yield b
    finally:
        b.log_manager.shutdown()


@pytest.fixture
def auth(broker: Broker) -> FakeAuthorizer:
    a = FakeAuthorizer()
    broker.services.authorizer = a
    return a


def call(b: Broker, api_key: int, version: int, body: dict[str, Any]) -> Any:
    """One request as User:alice from 10.0.0.7."""
    from pykbroker.protocol import codec

    session = Session(peer="10.0.0.7:5555", principal=ALICE)
    out = anyio.run(b.dispatcher.handle, frame_for(api_key, version, body), session)
    assert out is not None
    dec = FrameDecoder(1 << 30)
    dec.feed(out)
    payload = dec.next_frame()
    assert payload is not None
    flexible = codec.is_flexible(api_key, version) and api_key != 18
    return codec.decode_response(api_key, version, payload, 5 if flexible else 4)


def _batch(**kw: Any) -> bytes:
    return build_batch([(None, b"v", [])], timestamp_ms=1_700_000_000_000, **kw)


def produce(b: Broker, topics: list[str], txn_id: str | None = None, batch: bytes | None = None) -> dict[str, int]:
    resp = call(b, 0, 9, {"acks": 1, "timeout": 1000, "transactional_id": txn_id, "topic_data": [
        {"name": n, "partition_data": [{"index": 0, "records": batch or _batch()}]} for n in topics]})
    return {r.name: int(r.partition_responses[0].error_code) for r in resp.responses}


def fetch_body(topic: str, replica_id: int = -1) -> dict[str, Any]:
    return {"replica_id": replica_id, "max_wait": ZERO, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
                {"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                                                 "current_leader_epoch": -1, "last_fetched_epoch": -1,
                                                 "log_start_offset": -1}]}],
            "forgotten_topics_data": [], "rack_id": ""}


# --- produce / fetch / offsets ------------------------------------------------------------------


def test_no_authorizer_allows_everything(broker: Broker) -> None:
    assert broker.services.authorizer is None
    assert produce(broker, ["t"]) == {"t": ErrorCode.none}
    md = call(broker, 3, 12, {"topics": None, "allow_auto_topic_creation": False,
                              "include_topic_authorized_operations": True})
    assert {t.name for t in md.topics} >= {"t", "secret"}
    assert all(t.topic_authorized_operations != 0 for t in md.topics)


def test_produce_needs_write_on_each_topic_before_existence(broker: Broker, auth: FakeAuthorizer) -> None:
    auth.allow(Op.WRITE, RT.TOPIC, "t")
    assert produce(broker, ["t", "secret", "missing"]) == {
        "t": ErrorCode.none, "secret": ErrorCode.topic_authorization_failed,
        "missing": ErrorCode.topic_authorization_failed}
    # Each topic is asked once per request, not once per partition or record.
    auth.calls = 0
    call(broker, 0, 9, {"acks": 1, "timeout": 1000, "transactional_id": None, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": _batch()}, {"index": 1, "records": _batch()}]}]})
    assert auth.calls == 1


def test_transactional_produce_needs_write_on_the_transactional_id(broker: Broker, auth: FakeAuthorizer) -> None:
    auth.allow(Op.WRITE, RT.TOPIC)
    txn = _batch(producer_id=5, producer_epoch=0, base_sequence=0, is_transactional=True)
    # The whole request is refused, every partition carrying the code.
    assert produce(broker, ["t", "secret"], "tx", txn) == {
        "t": ErrorCode.transactional_id_authorization_failed,
        "secret": ErrorCode.transactional_id_authorization_failed}
    assert produce(broker, ["t"], None, txn) == {"t": ErrorCode.transactional_id_authorization_failed}
    auth.allow(Op.WRITE, RT.TRANSACTIONAL_ID, "tx")
    # Authorized: on to the transaction checks (this producer never began one).
    assert produce(broker, ["t"], "tx", txn)["t"] != ErrorCode.transactional_id_authorization_failed


def test_fetch_needs_read_and_replica_fetch_cluster_action(broker: Broker, auth: FakeAuthorizer) -> None:
    assert produce_anonymous(broker, "t") == ErrorCode.none
    denied = call(broker, 1, 12, fetch_body("t"))
    assert denied.responses[0].partitions[0].error_code == ErrorCode.topic_authorization_failed
    missing = call(broker, 1, 12, fetch_body("missing"))
    assert missing.responses[0].partitions[0].error_code == ErrorCode.topic_authorization_failed
    auth.allow(Op.READ, RT.TOPIC, "t")
    ok = call(broker, 1, 12, fetch_body("t")).responses[0].partitions[0]
    assert ok.error_code == ErrorCode.none and ok.records
    follower = call(broker, 1, 12, fetch_body("t", replica_id=1)).responses[0].partitions[0]
    assert follower.error_code == ErrorCode.topic_authorization_failed
    # By topic id (v13+): an unknown id stays UNKNOWN_TOPIC_ID; a known one is refused without READ.
    secret = broker.store.topic("secret")
    assert secret is not None
    for topic_id, code in ((secret.topic_id, ErrorCode.topic_authorization_failed),
                           (uuid.uuid4(), ErrorCode.unknown_topic_id)):
        body = fetch_body("")
        body["topics"][0]["topic_id"] = topic_id
        got = call(broker, 1, 13, body).responses[0].partitions[0]
        assert got.error_code == code


def produce_anonymous(b: Broker, topic: str) -> int:
    resp = call_anonymous(b, 0, 9, {"acks": 1, "timeout": 1000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": _batch()}]}]})
    return int(resp.responses[0].partition_responses[0].error_code)


def test_list_offsets_delete_records_and_epochs(broker: Broker, auth: FakeAuthorizer) -> None:
    def list_offsets() -> int:
        r = call(broker, 2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": "t", "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}]}]})
        return int(r.topics[0].partitions[0].error_code)

    def delete_records() -> int:
        r = call(broker, 21, 2, {"topics": [{"name": "t", "partitions": [{"partition_index": 0, "offset": 0}]}],
                                 "timeout": 1000})
        return int(r.topics[0].partitions[0].error_code)

    def epochs() -> int:
        r = call(broker, 23, 4, {"replica_id": -1, "topics": [{"topic": "t", "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}]}]})
        return int(r.topics[0].partitions[0].error_code)

    assert list_offsets() == delete_records() == epochs() == ErrorCode.topic_authorization_failed
    auth.allow(Op.DESCRIBE, RT.TOPIC, "t")
    assert list_offsets() == epochs() == ErrorCode.none
    assert delete_records() == ErrorCode.topic_authorization_failed
    auth.allow(Op.DELETE, RT.TOPIC, "t")
    assert delete_records() == ErrorCode.none


# --- metadata ------------------------------------------------------------------------------------


def test_metadata_hides_and_refuses_topics(broker: Broker, auth: FakeAuthorizer) -> None:
    auth.allow(Op.DESCRIBE, RT.TOPIC, "t")
    all_topics = call(broker, 3, 10, {"topics": None, "allow_auto_topic_creation": False,
                                      "include_topic_authorized_operations": True,
                                      "include_cluster_authorized_operations": True})
    assert [t.name for t in all_topics.topics] == ["t"]
    assert all_topics.topics[0].topic_authorized_operations == 1 << int(Op.DESCRIBE)
    assert all_topics.cluster_authorized_operations == 0  # no DESCRIBE on the cluster
    named = call(broker, 3, 12, {"topics": [{"name": "secret", "topic_id": None},
                                            {"name": "nowhere", "topic_id": None}],
                                 "allow_auto_topic_creation": True})
    assert [(t.name, t.error_code) for t in named.topics] == [
        ("secret", ErrorCode.topic_authorization_failed), ("nowhere", ErrorCode.topic_authorization_failed)]
    assert broker.store.topic("nowhere") is None
    # DESCRIBE but no CREATE: auto-creation is refused.
    auth.allow(Op.DESCRIBE, RT.TOPIC, "auto")
    refused = call(broker, 3, 12, {"topics": [{"name": "auto", "topic_id": None}],
                                   "allow_auto_topic_creation": True})
    assert refused.topics[0].error_code == ErrorCode.topic_authorization_failed
    auth.allow(Op.CREATE, RT.TOPIC, "auto")
    created = call(broker, 3, 12, {"topics": [{"name": "auto", "topic_id": None}],
                                   "allow_auto_topic_creation": True})
    # Created by this request: LEADER_NOT_AVAILABLE with no partitions, as Kafka answers it.
    assert created.topics[0].error_code == ErrorCode.leader_not_available and broker.store.topic("auto") is not None


def test_describe_topic_partitions_and_cluster(broker: Broker, auth: FakeAuthorizer) -> None:
    auth.allow(Op.DESCRIBE, RT.TOPIC, "t")
    listed = call(broker, 75, 0, {"topics": [], "response_partition_limit": 100, "cursor": None})
    assert [t.name for t in listed.topics] == ["t"]
    named = call(broker, 75, 0, {"topics": [{"name": "secret"}, {"name": "t"}], "response_partition_limit": 100,
                                 "cursor": None})
    assert [(t.name, t.error_code) for t in named.topics] == [
        ("t", ErrorCode.none), ("secret", ErrorCode.topic_authorization_failed)]
    cluster = call(broker, 60, 1, {"include_cluster_authorized_operations": True, "endpoint_type": 1})
    assert cluster.error_code == ErrorCode.none and cluster.cluster_authorized_operations == 0
    auth.allow(Op.DESCRIBE, RT.CLUSTER)
    cluster = call(broker, 60, 1, {"include_cluster_authorized_operations": True, "endpoint_type": 1})
    assert cluster.cluster_authorized_operations == 1 << int(Op.DESCRIBE)


# --- groups ---------------------------------------------------------------------------------------


def _commit(b: Broker, topic: str = "t") -> list[int]:
    r = call(b, 8, 8, {"group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "",
                       "group_instance_id": None, "topics": [{"name": topic, "partitions": [
                           {"partition_index": 0, "committed_offset": 1, "committed_leader_epoch": -1,
                            "committed_metadata": ""}]}]})
    return [int(p.error_code) for t in r.topics for p in t.partitions]


def test_group_apis_need_group_acls(broker: Broker, auth: FakeAuthorizer) -> None:
    found = call(broker, 10, 4, {"key_type": 0, "coordinator_keys": ["g"]})
    assert found.coordinators[0].error_code == ErrorCode.group_authorization_failed
    join = call(broker, 11, 9, {"group_id": "g", "session_timeout": 10_000, "rebalance_timeout": 10_000,
                                "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
                                "protocols": [{"name": "range", "metadata": b""}], "reason": None})
    assert join.error_code == ErrorCode.group_authorization_failed and join.protocol_name is None
    beat = call(broker, 12, 4, {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": None})
    assert beat.error_code == ErrorCode.group_authorization_failed
    sync = call(broker, 14, 5, {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": None,
                                "protocol_type": "consumer", "protocol_name": "range", "assignments": []})
    assert sync.error_code == ErrorCode.group_authorization_failed
    leave = call(broker, 13, 5, {"group_id": "g", "members": [{"member_id": "m", "group_instance_id": None,
                                                                "reason": None}]})
    assert leave.error_code == ErrorCode.group_authorization_failed
    assert _commit(broker) == [ErrorCode.group_authorization_failed]

    auth.allow(Op.READ, RT.GROUP, "g")
    assert call(broker, 10, 4, {"key_type": 0, "coordinator_keys": ["g"]}).coordinators[0].error_code == 0
    assert _commit(broker) == [ErrorCode.topic_authorization_failed]  # READ on the topic too
    assert _commit(broker, "missing") == [ErrorCode.topic_authorization_failed]
    auth.allow(Op.READ, RT.TOPIC, "t")
    assert _commit(broker) == [ErrorCode.none]

    # OffsetFetch: DESCRIBE on the group (READ implies it), topics filtered by DESCRIBE.
    named = call(broker, 9, 9, {"groups": [{"group_id": "g", "member_id": None, "member_epoch": -1,
                                            "topics": [{"name": "t", "partition_indexes": [0]},
                                                       {"name": "secret", "partition_indexes": [0]}]},
                                           {"group_id": "other", "member_id": None, "member_epoch": -1,
                                            "topics": None}],
                                "require_stable": False})
    g, other = named.groups
    assert other.error_code == ErrorCode.group_authorization_failed
    offsets = {(t.name, p.error_code, p.committed_offset) for t in g.topics for p in t.partitions}
    assert offsets == {("t", 0, 1), ("secret", ErrorCode.topic_authorization_failed, -1)}
    every = call(broker, 9, 9, {"groups": [{"group_id": "g", "member_id": None, "member_epoch": -1,
                                            "topics": None}], "require_stable": False})
    assert [t.name for t in every.groups[0].topics] == ["t"]
    old = call(broker, 9, 5, {"group_id": "other", "topics": None, "require_stable": False})
    assert old.error_code == ErrorCode.group_authorization_failed
    # v1 has no top-level error: every requested partition carries it.
    v1 = call(broker, 9, 1, {"group_id": "other", "topics": [{"name": "t", "partition_indexes": [0]}]})
    assert [(t.name, p.error_code) for t in v1.topics for p in t.partitions] == [
        ("t", ErrorCode.group_authorization_failed)]
    join_v5 = call(broker, 11, 5, {"group_id": "other", "session_timeout": 10_000, "rebalance_timeout": 10_000,
                                   "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
                                   "protocols": [{"name": "range", "metadata": b""}]})
    assert join_v5.error_code == ErrorCode.group_authorization_failed and join_v5.protocol_name == ""
    assert join_v5.generation_id == -1 and join_v5.member_id == ""


def test_group_admin_apis(broker: Broker, auth: FakeAuthorizer) -> None:
    auth.allow(Op.READ, RT.GROUP, "g")
    auth.allow(Op.READ, RT.TOPIC, "t")
    assert _commit(broker) == [ErrorCode.none]
    auth.rules.discard((Op.READ, RT.GROUP, "g"))

    listed = call(broker, 16, 4, {"states_filter": []})
    assert listed.error_code == ErrorCode.none and listed.groups == ()
    auth.allow(Op.DESCRIBE, RT.GROUP, "g")
    assert [g.group_id for g in call(broker, 16, 4, {"states_filter": []}).groups] == ["g"]
    described = call(broker, 15, 5, {"groups": ["g", "h"], "include_authorized_operations": True})
    assert [(d.group_id, d.error_code) for d in described.groups] == [
        ("g", ErrorCode.none), ("h", ErrorCode.group_authorization_failed)]
    assert described.groups[0].authorized_operations == 1 << int(Op.DESCRIBE)
    assert described.groups[1].authorized_operations == AUTHORIZED_OPERATIONS_OMITTED

    def offset_delete() -> tuple[int, list[int]]:
        r = call(broker, 47, 0, {"group_id": "g", "topics": [{"name": "secret", "partitions": [
            {"partition_index": 0}]}]})
        return int(r.error_code), [int(p.error_code) for t in r.topics for p in t.partitions]

    assert offset_delete() == (ErrorCode.group_authorization_failed, [])
    deleted = call(broker, 42, 2, {"groups_names": ["g"]})
    assert deleted.results[0].error_code == ErrorCode.group_authorization_failed
    auth.allow(Op.DELETE, RT.GROUP, "g")
    assert offset_delete() == (ErrorCode.none, [ErrorCode.topic_authorization_failed])
    assert call(broker, 42, 2, {"groups_names": ["g"]}).results[0].error_code == ErrorCode.none


def test_consumer_group_heartbeat_and_describe(broker: Broker, auth: FakeAuthorizer) -> None:
    body = {"group_id": "cg", "member_id": "m", "member_epoch": 0, "instance_id": None, "rack_id": None,
            "rebalance_timeout": 30_000, "subscribed_topic_names": ["t", "secret"], "server_assignor": None,
            "topic_partitions": []}
    assert broker.groups.consumer_protocol_enabled, "KIP-848 is on by default"
    assert call(broker, 68, 0, body).error_code == ErrorCode.group_authorization_failed
    auth.allow(Op.READ, RT.GROUP, "cg")
    auth.allow(Op.DESCRIBE, RT.TOPIC, "t")
    refused = call(broker, 68, 0, body)
    assert refused.error_code == ErrorCode.topic_authorization_failed and "secret" in refused.error_message
    described = call(broker, 69, 0, {"group_ids": ["cg", "other"], "include_authorized_operations": True})
    assert [g.error_code for g in described.groups][1] == ErrorCode.group_authorization_failed


# --- transactions -----------------------------------------------------------------------------------


def _init(b: Broker, txn_id: str | None) -> Any:
    return call(b, 22, 4, {"transactional_id": txn_id, "transaction_timeout": datetime.timedelta(seconds=30),
                           "producer_id": -1, "producer_epoch": -1})


def test_init_producer_id(broker: Broker, auth: FakeAuthorizer) -> None:
    assert _init(broker, "tx").error_code == ErrorCode.transactional_id_authorization_failed
    assert _init(broker, None).error_code == ErrorCode.cluster_authorization_failed
    auth.allow(Op.WRITE, RT.TOPIC, "t")  # KIP-679: WRITE on any topic is enough for idempotence
    assert _init(broker, None).error_code == ErrorCode.none
    auth.rules.clear()
    auth.allow(Op.IDEMPOTENT_WRITE, RT.CLUSTER)
    assert _init(broker, None).error_code == ErrorCode.none
    auth.allow(Op.WRITE, RT.TRANSACTIONAL_ID, "tx")
    assert _init(broker, "tx").error_code == ErrorCode.none


def test_transaction_apis(broker: Broker, auth: FakeAuthorizer) -> None:
    auth.allow(Op.WRITE, RT.TRANSACTIONAL_ID, "tx")
    init = _init(broker, "tx")
    pid, epoch = int(init.producer_id), int(init.producer_epoch)
    auth.rules.clear()

    def add(topics: dict[str, list[int]]) -> dict[tuple[str, int], int]:
        r = call(broker, 24, 3, {"v3_and_below_transactional_id": "tx", "v3_and_below_producer_id": pid,
                                 "v3_and_below_producer_epoch": epoch,
                                 "v3_and_below_topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]})
        return {(t.name, int(x.partition_index)): int(x.partition_error_code)
                for t in r.results_by_topic_v3_and_below for x in t.results_by_partition}

    assert add({"t": [0]}) == {("t", 0): ErrorCode.transactional_id_authorization_failed}
    auth.allow(Op.WRITE, RT.TRANSACTIONAL_ID, "tx")
    assert add({"t": [0], "secret": [0]}) == {("t", 0): ErrorCode.topic_authorization_failed,
                                              ("secret", 0): ErrorCode.topic_authorization_failed}
    auth.allow(Op.WRITE, RT.TOPIC, "t")
    assert add({"t": [0], "secret": [0]}) == {("t", 0): ErrorCode.operation_not_attempted,
                                              ("secret", 0): ErrorCode.topic_authorization_failed}
    assert add({"t": [0]}) == {("t", 0): ErrorCode.none}
    v4 = call(broker, 24, 4, {"transactions": [{"transactional_id": "tx", "producer_id": pid,
                                                "producer_epoch": epoch, "verify_only": True,
                                                "topics": [{"name": "t", "partitions": [0]}]}]})
    assert v4.error_code == ErrorCode.cluster_authorization_failed and v4.results_by_transaction == ()

    offsets = {"transactional_id": "tx", "producer_id": pid, "producer_epoch": epoch, "group_id": "g"}
    assert call(broker, 25, 3, offsets).error_code == ErrorCode.group_authorization_failed
    auth.allow(Op.READ, RT.GROUP, "g")
    assert call(broker, 25, 3, offsets).error_code == ErrorCode.none
    commit = {"transactional_id": "tx", "group_id": "g", "producer_id": pid, "producer_epoch": epoch,
              "generation_id": -1, "member_id": "", "group_instance_id": None,
              "topics": [{"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 0,
                                                       "committed_leader_epoch": -1, "committed_metadata": ""}]}]}
    assert call(broker, 28, 3, commit).topics[0].partitions[0].error_code == ErrorCode.topic_authorization_failed
    auth.allow(Op.READ, RT.TOPIC, "t")
    assert call(broker, 28, 3, commit).topics[0].partitions[0].error_code == ErrorCode.none

    described = call(broker, 65, 0, {"transactional_ids": ["tx"]}).transaction_states[0]
    assert described.error_code == ErrorCode.none
    # Only the partitions of topics alice may DESCRIBE (READ on t implies it; not __consumer_offsets).
    assert [t.topic for t in described.topics] == ["t"]
    auth.allow(Op.DESCRIBE, RT.TOPIC, "__consumer_offsets")
    described = call(broker, 65, 0, {"transactional_ids": ["tx"]}).transaction_states[0]
    assert sorted(t.topic for t in described.topics) == ["__consumer_offsets", "t"]
    assert call(broker, 66, 0, {"state_filters": [], "producer_id_filters": []}).transaction_states[0] \
        .transactional_id == "tx"
    auth.rules.discard((Op.WRITE, RT.TRANSACTIONAL_ID, "tx"))
    assert call(broker, 66, 0, {"state_filters": [], "producer_id_filters": []}).transaction_states == ()
    assert call(broker, 65, 0, {"transactional_ids": ["tx"]}).transaction_states[0].error_code == \
        ErrorCode.transactional_id_authorization_failed
    ended = call(broker, 26, 3, {"transactional_id": "tx", "producer_id": pid, "producer_epoch": epoch,
                                 "committed": True})
    assert ended.error_code == ErrorCode.transactional_id_authorization_failed

    markers = call(broker, 27, 1, {"markers": [{"producer_id": pid, "producer_epoch": epoch,
                                                "transaction_result": False, "coordinator_epoch": 0,
                                                "topics": [{"name": "t", "partition_indexes": [0]}]}]})
    assert markers.markers[0].topics[0].partitions[0].error_code == ErrorCode.cluster_authorization_failed
    producers = call(broker, 61, 0, {"topics": [{"name": "secret", "partition_indexes": [0]}]})
    assert producers.topics[0].partitions[0].error_code == ErrorCode.topic_authorization_failed


# --- admin -------------------------------------------------------------------------------------------


def test_topic_admin(broker: Broker, auth: FakeAuthorizer) -> None:
    def create(name: str) -> Any:
        return call(broker, 19, 7, {"topics": [{"name": name, "num_partitions": 1, "replication_factor": 1,
                                                "assignments": [], "configs": []}], "timeout": 1000}).topics[0]

    refused = create("new")
    assert refused.error_code == ErrorCode.topic_authorization_failed and refused.error_message
    auth.allow(Op.CREATE, RT.TOPIC, "new")
    made = create("new")
    assert made.error_code == ErrorCode.none and made.num_partitions == 1
    assert made.topic_config_error_code == ErrorCode.topic_authorization_failed and made.configs == ()
    auth.allow(Op.CREATE, RT.CLUSTER)
    auth.allow(Op.DESCRIBE_CONFIGS, RT.TOPIC, "new2")
    made2 = create("new2")
    assert made2.error_code == ErrorCode.none and made2.configs

    grow = call(broker, 37, 3, {"topics": [{"name": "new", "count": 2, "assignments": None}], "timeout_ms": 1000,
                                "validate_only": False})
    assert grow.results[0].error_code == ErrorCode.topic_authorization_failed
    secret = broker.store.topic("secret")
    assert secret is not None
    deleted = call(broker, 20, 6, {"topics": [{"name": "new", "topic_id": None},
                                              {"name": None, "topic_id": secret.topic_id}],
                                   "timeout": 1000})
    assert [(r.name, r.error_code) for r in deleted.responses] == [
        ("new", ErrorCode.topic_authorization_failed), (None, ErrorCode.topic_authorization_failed)]
    auth.allow(Op.DELETE, RT.TOPIC, "new")
    assert call(broker, 20, 6, {"topics": [{"name": "new", "topic_id": None}], "timeout": 1000}) \
        .responses[0].error_code == ErrorCode.none


def test_config_apis(broker: Broker, auth: FakeAuthorizer) -> None:
    def describe() -> list[int]:
        r = call(broker, 32, 4, {"resources": [
            {"resource_type": 2, "resource_name": "t", "configuration_keys": None},
            {"resource_type": 4, "resource_name": "0", "configuration_keys": None},
            {"resource_type": 32, "resource_name": "g", "configuration_keys": None}],
            "include_synonyms": False, "include_documentation": False})
        return [int(x.error_code) for x in r.results]

    assert describe() == [ErrorCode.topic_authorization_failed, ErrorCode.cluster_authorization_failed,
                          ErrorCode.group_authorization_failed]
    auth.allow(Op.DESCRIBE_CONFIGS, RT.TOPIC, "t")
    auth.allow(Op.DESCRIBE_CONFIGS, RT.CLUSTER)
    assert describe()[:2] == [ErrorCode.none, ErrorCode.none]

    def alter(incremental: bool) -> int:
        if incremental:
            r = call(broker, 44, 1, {"resources": [{"resource_type": 2, "resource_name": "t", "configs": [
                {"name": "retention.ms", "config_operation": 0, "value": "1000"}]}], "validate_only": True})
        else:
            r = call(broker, 33, 2, {"resources": [{"resource_type": 2, "resource_name": "t", "configs": [
                {"name": "retention.ms", "value": "1000"}]}], "validate_only": True})
        assert r.responses[0].error_message is None or r.responses[0].error_code == 0
        return int(r.responses[0].error_code)

    assert alter(True) == alter(False) == ErrorCode.topic_authorization_failed
    auth.allow(Op.ALTER_CONFIGS, RT.TOPIC, "t")
    assert alter(True) == alter(False) == ErrorCode.none


def test_cluster_admin_apis(broker: Broker, auth: FakeAuthorizer) -> None:
    quotas = call(broker, 48, 1, {"components": [], "strict": False})
    assert quotas.error_code == ErrorCode.cluster_authorization_failed and quotas.entries is None
    altered = call(broker, 49, 1, {"entries": [{"entity": [{"entity_type": "user", "entity_name": "bob"}],
                                                "ops": [{"key": "producer_byte_rate", "value": 1.0,
                                                         "remove": False}]}], "validate_only": True})
    assert altered.entries[0].error_code == ErrorCode.cluster_authorization_failed
    assert altered.entries[0].entity[0].entity_name == "bob"
    dirs = call(broker, 35, 4, {"topics": None})
    assert dirs.error_code == ErrorCode.cluster_authorization_failed and dirs.results == ()
    moved = call(broker, 34, 2, {"dirs": [{"path": "/x", "topics": [{"name": "t", "partitions": [0]}]}]})
    assert moved.results[0].partitions[0].error_code == ErrorCode.cluster_authorization_failed
    elect = call(broker, 43, 2, {"election_type": 0, "topic_partitions": [{"topic": "t", "partitions": [0]}],
                                 "timeout": 1000})
    assert elect.error_code == ErrorCode.cluster_authorization_failed
    assert elect.replica_election_results[0].partition_result[0].error_code == ErrorCode.cluster_authorization_failed
    reassign = call(broker, 45, 0, {"timeout": 1000, "topics": [{"name": "t", "partitions": [
        {"partition_index": 0, "replicas": [0]}]}]})
    assert reassign.error_code == ErrorCode.cluster_authorization_failed
    listed = call(broker, 46, 0, {"timeout": 1000, "topics": None})
    assert listed.error_code == ErrorCode.cluster_authorization_failed
    metrics = call(broker, 74, 0, {})
    assert metrics.error_code == ErrorCode.cluster_authorization_failed

    auth.allow(Op.ALL, RT.CLUSTER)
    assert call(broker, 48, 1, {"components": [], "strict": False}).error_code == ErrorCode.none
    assert call(broker, 35, 4, {"topics": None}).error_code == ErrorCode.none
    assert call(broker, 46, 0, {"timeout": 1000, "topics": None}).error_code == ErrorCode.none
    assert call(broker, 74, 0, {}).error_code == ErrorCode.none


# --- with the ACL authorizer (pykbroker.security.acl_authorizer) -------------------------------------


def _acl(rtype: ResourceType, name: str, op: AclOperation, *, prefixed: bool = False, deny: bool = False,
         principal: str = "User:alice") -> Any:
    from pykbroker.security.acl import AccessControlEntry, AclBinding, PatternType, PermissionType, ResourcePattern

    return AclBinding(ResourcePattern(int(rtype), name, PatternType.PREFIXED if prefixed else PatternType.LITERAL),
                      AccessControlEntry(principal, "*", op, PermissionType.DENY if deny else PermissionType.ALLOW))


def test_with_the_acl_authorizer(broker: Broker) -> None:
    from pykbroker.security.acl_authorizer import AclAuthorizer

    for name in ("pre-a", "pre-b"):
        call_anonymous(broker, 19, 7, {"topics": [{"name": name, "num_partitions": 1, "replication_factor": 1,
                                                   "assignments": [], "configs": []}], "timeout": 1000})
    acls = AclAuthorizer(super_users=["User:ANONYMOUS"])
    broker.services.authorizer = acls
    # No ACLs: alice may do nothing; super users (the setup's ANONYMOUS) everything.
    assert produce(broker, ["t"]) == {"t": ErrorCode.topic_authorization_failed}
    assert produce_anonymous(broker, "t") == ErrorCode.none
    assert _init(broker, None).error_code == ErrorCode.cluster_authorization_failed
    # A prefixed ALLOW, a literal DENY overriding it.
    acls.load([_acl(RT.TOPIC, "pre-", Op.WRITE, prefixed=True), _acl(RT.TOPIC, "pre-b", Op.WRITE, deny=True)])
    assert produce(broker, ["pre-a", "pre-b", "t"]) == {
        "pre-a": ErrorCode.none, "pre-b": ErrorCode.topic_authorization_failed,
        "t": ErrorCode.topic_authorization_failed}
    # WRITE on some topic makes an idempotent producer (KIP-679); Metadata shows what WRITE implies DESCRIBE on.
    assert _init(broker, None).error_code == ErrorCode.none
    # (a DENY of WRITE is not a DENY of DESCRIBE: pre-b stays visible, t and secret do not).
    md = call(broker, 3, 12, {"topics": None, "allow_auto_topic_creation": False})
    assert sorted(t.name for t in md.topics) == ["pre-a", "pre-b"]
    # Groups: READ on the topic alone does not let a consumer commit.
    acls.load([_acl(RT.TOPIC, "t", Op.READ)])
    assert _commit(broker) == [ErrorCode.group_authorization_failed]
    acls.load([_acl(RT.TOPIC, "t", Op.READ), _acl(RT.GROUP, "g", Op.READ)])
    assert _commit(broker) == [ErrorCode.none]
    # Admin without ALTER on the topic.
    grow = call(broker, 37, 3, {"topics": [{"name": "t", "count": 2, "assignments": None}], "timeout_ms": 1000,
                                "validate_only": False})
    assert grow.results[0].error_code == ErrorCode.topic_authorization_failed
