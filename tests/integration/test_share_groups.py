"""Share groups (KIP-932) with confluent-kafka's ShareConsumer against a broker subprocess.

Several share consumers on one partition get distinct records that together are all of them; released
and lock-expired records come back with a growing delivery count; rejected records and records past the
delivery count limit land in the dead-letter topic with their provenance headers; a broker killed with
SIGKILL forgets no acknowledgement and delivers nothing acknowledged again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Consumer, ShareConsumer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from tests.integration.conftest import (
    BrokerFactory,
    RawConnection,
    admin_for,
    create_topic,
    make_producer,
    unique_topic,
)
from tests.support.broker import BrokerProcess

SHARE = {"group.share.enable": "true"}
CLIENT_TIMEOUT = 20


@pytest.fixture(scope="module")
def broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    return module_broker_factory(SHARE)


def set_group_configs(b: BrokerProcess, group: str, configs: dict[str, str]) -> None:
    admin = admin_for(b)
    res = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    admin.incremental_alter_configs([res])[res].result(timeout=CLIENT_TIMEOUT)


def share_consumer(b: BrokerProcess, group: str, **conf: Any) -> ShareConsumer:
    base: dict[str, Any] = {"bootstrap.servers": b.bootstrap, "broker.address.family": "v4", "group.id": group}
    base.update(conf)
    return ShareConsumer(base)


def produce(b: BrokerProcess, topic: str, n: int, start: int = 0, headers: list[tuple[str, bytes]] | None = None
            ) -> None:
    p = make_producer(b)
    for i in range(start, start + n):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, headers=headers)
    assert p.flush(CLIENT_TIMEOUT) == 0


def wait_share_members(b: BrokerProcess, group: str, members: int, timeout: float) -> None:
    """Until the share group has ``members`` members (DescribeShareGroups v1), each with an assignment."""
    deadline = time.monotonic() + timeout
    seen: Any = None
    while time.monotonic() < deadline:
        with RawConnection(b) as conn:
            [seen] = conn.request(77, 1, {"group_ids": [group], "include_authorized_operations": False}, 3).groups
        if len(seen.members) == members and all(m.assignment.topic_partitions for m in seen.members):
            return
        time.sleep(0.2)
    raise AssertionError(f"share group {group} did not reach {members} assigned members: {seen}")


def poll_until(c: ShareConsumer, want: int, timeout: float) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        for m in c.poll(0.5):
            assert m.error() is None, m.error()
            out.append(m)
    return out


def read_all(b: BrokerProcess, topic: str, want: int, timeout: float = 20) -> list[Any]:
    c = Consumer({"bootstrap.servers": b.bootstrap, "broker.address.family": "v4", "group.id": unique_topic("r"),
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < want and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                out.append(m)
    finally:
        c.close()
    return out


@pytest.fixture
def closing() -> Iterator[list[ShareConsumer]]:
    consumers: list[ShareConsumer] = []
    yield consumers
    for c in consumers:
        try:
            c.close()
        except Exception:  # best effort after a failed test
            pass


def test_consumers_share_one_partition(broker: BrokerProcess, closing: list[ShareConsumer]) -> None:
    topic, group = unique_topic("share"), unique_topic("g")
    create_topic(broker, topic, 1)
    set_group_configs(broker, group, {"share.auto.offset.reset": "earliest"})
    total = 300
    got: dict[int, list[int]] = {i: [] for i in range(3)}
    lock = threading.Lock()
    done = threading.Event()
    consumers = [share_consumer(broker, group, **{"max.poll.records": 10}) for _ in range(3)]
    closing.extend(consumers)
    for c in consumers:
        c.subscribe([topic])

    def run(i: int) -> None:
        deadline = time.monotonic() + 60
        while not done.is_set() and time.monotonic() < deadline:
            msgs = consumers[i].poll(0.3)
            with lock:
                got[i].extend(m.offset() for m in msgs if m.error() is None)
                if sum(len(v) for v in got.values()) >= total:
                    done.set()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    # Produce only once all three have joined: records already there when the first member's fetch arrives
    # are all acquirable by it alone (a loaded machine made the others join late: [300, 0, 0]).
    wait_share_members(broker, group, 3, 30)
    produce(broker, topic, total)
    for t in threads:
        t.join(70)
    everything = [o for v in got.values() for o in v]
    assert sorted(everything) == list(range(total)), "every record exactly once"
    assert sum(1 for v in got.values() if v) >= 2, f"records spread over consumers: {[len(v) for v in got.values()]}"


def test_release_redelivers_then_dead_letters_at_the_limit(broker: BrokerProcess,
                                                           closing: list[ShareConsumer]) -> None:
    topic, group, dlq = unique_topic("share"), unique_topic("g"), unique_topic("dlq")
    create_topic(broker, topic, 1)
    set_group_configs(broker, group, {"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "3",
                                      "pykbroker.share.dlq.topic": dlq})
    produce(broker, topic, 1, headers=[("h", b"x")])
    c = share_consumer(broker, group, **{"share.acknowledgement.mode": "explicit"})
    closing.append(c)
    c.subscribe([topic])
    counts = []
    for _ in range(3):
        msgs = poll_until(c, 1, 20)
        assert [m.offset() for m in msgs] == [0]
        counts.append(msgs[0].delivery_count())
        c.acknowledge(msgs[0], AcknowledgeType.RELEASE)
        c.commit_sync(CLIENT_TIMEOUT)
    assert counts == [1, 2, 3]
    assert poll_until(c, 1, 3) == [], "archived after the third delivery"
    dead = read_all(broker, dlq, 1)
    assert len(dead) == 1
    m = dead[0]
    assert (m.key(), m.value()) == (b"k0", b"v0")
    h = dict(m.headers())
    assert h["h"] == b"x"
    assert h["pykbroker.dlq.source.topic"] == topic.encode()
    assert h["pykbroker.dlq.source.partition"] == b"0"
    assert h["pykbroker.dlq.source.offset"] == b"0"
    assert h["pykbroker.dlq.group"] == group.encode()
    assert h["pykbroker.dlq.delivery.count"] == b"3"
    assert h["pykbroker.dlq.reason"] == b"delivery-count-exceeded"


def test_reject_goes_to_the_dead_letter_topic(broker: BrokerProcess, closing: list[ShareConsumer]) -> None:
    topic, group, dlq = unique_topic("share"), unique_topic("g"), unique_topic("dlq")
    create_topic(broker, topic, 1)
    set_group_configs(broker, group, {"share.auto.offset.reset": "earliest", "pykbroker.share.dlq.topic": dlq})
    produce(broker, topic, 4)
    c = share_consumer(broker, group, **{"share.acknowledgement.mode": "explicit"})
    closing.append(c)
    c.subscribe([topic])
    msgs = poll_until(c, 4, 20)
    assert [m.offset() for m in msgs] == [0, 1, 2, 3]
    for m in msgs:
        c.acknowledge(m, AcknowledgeType.REJECT if m.offset() in (1, 3) else AcknowledgeType.ACCEPT)
    c.commit_sync(CLIENT_TIMEOUT)
    dead = read_all(broker, dlq, 2)
    assert sorted(m.value() for m in dead) == [b"v1", b"v3"]
    for m in dead:
        h = dict(m.headers())
        assert h["pykbroker.dlq.reason"] == b"rejected"
        assert h["pykbroker.dlq.delivery.count"] == b"1"
    assert poll_until(c, 1, 2) == [], "nothing comes back"


def test_lock_expiry_redelivers_to_another_consumer(broker: BrokerProcess, closing: list[ShareConsumer]) -> None:
    topic, group = unique_topic("share"), unique_topic("g")
    create_topic(broker, topic, 1)
    set_group_configs(broker, group, {"share.auto.offset.reset": "earliest",
                                      "share.record.lock.duration.ms": "1500"})
    produce(broker, topic, 3)
    a = share_consumer(broker, group, **{"share.acknowledgement.mode": "explicit"})
    closing.append(a)
    a.subscribe([topic])
    first = poll_until(a, 3, 20)
    assert [(m.offset(), m.delivery_count()) for m in first] == [(0, 1), (1, 1), (2, 1)]
    # a holds them and never acknowledges: after the lock expires, b gets them again.
    b = share_consumer(broker, group, **{"share.acknowledgement.mode": "explicit"})
    closing.append(b)
    b.subscribe([topic])
    again = poll_until(b, 3, 20)
    assert sorted((m.offset(), m.delivery_count()) for m in again) == [(0, 2), (1, 2), (2, 2)]
    for m in again:
        b.acknowledge(m, AcknowledgeType.ACCEPT)
    b.commit_sync(CLIENT_TIMEOUT)


def test_kill9_loses_no_acknowledgement(broker_factory: BrokerFactory, closing: list[ShareConsumer]) -> None:
    b = broker_factory(SHARE)
    topic, group = unique_topic("share"), unique_topic("g")
    create_topic(b, topic, 1)
    set_group_configs(b, group, {"share.auto.offset.reset": "earliest"})
    total = 200
    produce(b, topic, total)
    # socket.timeout.ms: closing it once the broker is killed may wait that long for a queued request.
    c = share_consumer(b, group, **{"share.acknowledgement.mode": "explicit", "max.poll.records": 20,
                                    "socket.timeout.ms": 5000})
    c.subscribe([topic])
    acked: set[int] = set()
    deadline = time.monotonic() + 30
    while len(acked) < total // 2 and time.monotonic() < deadline:
        msgs = c.poll(0.5)
        for m in msgs:
            assert m.error() is None
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        if msgs:
            result = c.commit_sync(CLIENT_TIMEOUT)
            assert all(e is None for e in result.values()), result
            acked.update(m.offset() for m in msgs)
    assert len(acked) >= total // 2
    # A few more acquired but never acknowledged: those may come back; the acknowledged ones may not.
    c.poll(0.5)
    b.kill()
    try:
        c.close()
    except Exception:  # the broker is gone
        pass
    b.restart()
    c2 = share_consumer(b, group, **{"share.acknowledgement.mode": "explicit", "max.poll.records": 50})
    closing.append(c2)
    c2.subscribe([topic])
    after: list[int] = []
    deadline = time.monotonic() + 60
    while len(acked) + len(set(after)) < total and time.monotonic() < deadline:
        msgs = c2.poll(0.5)
        for m in msgs:
            assert m.error() is None
            c2.acknowledge(m, AcknowledgeType.ACCEPT)
            after.append(m.offset())
        if msgs:
            c2.commit_sync(CLIENT_TIMEOUT)
    assert not acked & set(after), f"acknowledged records delivered again: {sorted(acked & set(after))[:10]}"
    assert acked | set(after) == set(range(total))


def test_share_group_is_listed_and_described(broker: BrokerProcess, closing: list[ShareConsumer]) -> None:
    topic, group = unique_topic("share"), unique_topic("g")
    create_topic(broker, topic, 1)
    set_group_configs(broker, group, {"share.auto.offset.reset": "earliest"})
    produce(broker, topic, 1)
    c = share_consumer(broker, group)
    closing.append(c)
    c.subscribe([topic])
    assert len(poll_until(c, 1, 20)) == 1
    with RawConnection(broker) as conn:
        versions = {k.api_key: (k.min_version, k.max_version) for k in conn.request(18, 3, {
            "client_software_name": "t", "client_software_version": "1"}).api_keys}
        assert versions[76] == (1, 1) and versions[78] == (1, 2)
        listed = conn.request(16, 5, {"states_filter": [], "types_filter": ["share"]}, 2).groups
        assert [(g.group_id, g.group_type, g.protocol_type, g.group_state) for g in listed
                if g.group_id == group] == [(group, "share", "share", "Stable")]
        assert all(g.group_type == "share" for g in listed)
        described = conn.request(77, 1, {"group_ids": [group, "nope"], "include_authorized_operations": False},
                                 3).groups
        assert described[0].group_state == "Stable" and described[0].assignor_name == "simple"
        [member] = described[0].members
        assert member.subscribed_topic_names == (topic,)
        assert [(tp.topic_name, tp.partitions) for tp in member.assignment.topic_partitions] == [(topic, (0,))]
        assert described[1].error_code == 69  # GROUP_ID_NOT_FOUND


# --- membership persistence: share groups in __consumer_offsets ---------------------------------------

def test_share_group_is_listed_after_a_restart(broker_factory: BrokerFactory, closing: list[ShareConsumer]) -> None:
    """The group's ShareGroupMetadata record brings it back Empty, with its epoch, before any member rejoins."""
    b = broker_factory(SHARE)
    topic, group = unique_topic("share"), unique_topic("g")
    create_topic(b, topic, 1)
    produce(b, topic, 1)
    set_group_configs(b, group, {"share.auto.offset.reset": "earliest"})
    # socket.timeout.ms: closing it once the broker is killed may wait that long for a queued request.
    c = share_consumer(b, group, **{"socket.timeout.ms": 5000})
    c.subscribe([topic])
    assert len(poll_until(c, 1, 20)) == 1
    with RawConnection(b) as conn:
        before = conn.request(77, 1, {"group_ids": [group], "include_authorized_operations": False}).groups[0]
    assert before.group_state == "Stable" and before.group_epoch >= 1
    b.kill()
    try:
        c.close()
    except Exception:  # the broker is gone
        pass
    b.restart()
    deadline = time.monotonic() + 30
    listed: list[Any] = []
    with RawConnection(b) as conn:
        for _ in range(120):
            resp = conn.request(16, 5, {"states_filter": [], "types_filter": ["share"]})
            listed = [(g.group_id, g.group_type, g.group_state) for g in resp.groups if g.group_id == group]
            if (listed and resp.error_code == 0) or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert listed == [(group, "share", "Empty")]
        after = conn.request(77, 1, {"group_ids": [group], "include_authorized_operations": False}).groups[0]
    assert (after.error_code, after.group_state, after.members) == (0, "Empty", ())
    assert after.group_epoch >= before.group_epoch
    # A member rejoining continues from the persisted epoch.
    c2 = share_consumer(b, group)
    closing.append(c2)
    c2.subscribe([topic])
    rejoined = after
    for _ in range(40):
        c2.poll(0.5)
        with RawConnection(b) as conn:
            rejoined = conn.request(77, 1, {"group_ids": [group], "include_authorized_operations": False}).groups[0]
        if rejoined.group_state == "Stable":
            break
    assert rejoined.group_state == "Stable" and rejoined.group_epoch > after.group_epoch


def test_share_apis_hidden_when_disabled(broker_factory: BrokerFactory) -> None:
    b = broker_factory()
    with RawConnection(b) as conn:
        keys = {k.api_key for k in conn.request(18, 3, {"client_software_name": "t",
                                                        "client_software_version": "1"}).api_keys}
        assert not keys & {76, 77, 78, 79}
        res = conn.request(76, 1, {"group_id": "g", "member_id": "m", "member_epoch": 0,
                                   "subscribed_topic_names": ["x"]}, 2)
        assert res.error_code == 35  # UNSUPPORTED_VERSION


def test_share_group_offsets_admin(broker: BrokerProcess) -> None:
    topic, group = unique_topic("share"), unique_topic("g")
    create_topic(broker, topic, 1)
    set_group_configs(broker, group, {"share.auto.offset.reset": "earliest"})
    produce(broker, topic, 5)
    c = share_consumer(broker, group, **{"share.acknowledgement.mode": "explicit"})
    c.subscribe([topic])
    msgs = poll_until(c, 5, 20)
    for m in msgs:
        c.acknowledge(m, AcknowledgeType.ACCEPT)
    c.commit_sync(CLIENT_TIMEOUT)
    with RawConnection(broker) as conn:
        def describe() -> tuple[int, int]:
            res = conn.request(90, 1, {"groups": [{"group_id": group, "topics": None}]}, 9)
            [t] = res.groups[0].topics
            assert t.topic_name == topic
            return t.partitions[0].start_offset, t.partitions[0].lag

        assert describe() == (5, 0)
        body = {"group_id": group, "topics": [{"topic_name": topic,
                                               "partitions": [{"partition_index": 0, "start_offset": 2}]}]}
        assert conn.request(91, 0, body, 10).error_code == 68  # NON_EMPTY_GROUP while c is a member
        c.close()
        res = conn.request(91, 0, body, 11)
        assert res.error_code == 0 and res.responses[0].partitions[0].error_code == 0
        assert describe() == (2, 3)
        c2 = share_consumer(broker, group)
        try:
            c2.subscribe([topic])
            assert sorted(m.offset() for m in poll_until(c2, 3, 20)) == [2, 3, 4]
        finally:
            c2.close()
        res = conn.request(92, 0, {"group_id": group, "topics": [{"topic_name": topic}]}, 12)
        assert res.error_code == 0 and res.responses[0].error_code == 0
        assert conn.request(90, 1, {"groups": [{"group_id": group, "topics": None}]}, 13).groups[0].topics == ()


def test_bad_share_requests_get_kafka_errors(broker: BrokerProcess) -> None:
    topic, group = unique_topic("share"), unique_topic("g")
    create_topic(broker, topic, 1)
    produce(broker, topic, 2)
    with RawConnection(broker) as conn:
        md = conn.request(3, 12, {"topics": [{"name": topic, "topic_id": None}], "allow_auto_topic_creation": False,
                                  "include_topic_authorized_operations": False}, 1)
        topic_id = md.topics[0].topic_id

        def fetch(epoch: int, acks: list[dict[str, Any]] | None = None, member: str = "m1", corr: int = 2) -> Any:
            return conn.request(78, 1, {
                "group_id": group, "member_id": member, "share_session_epoch": epoch, "max_wait": 0,
                "min_bytes": 1, "max_bytes": 1 << 20, "max_records": 10, "batch_size": 10,
                "topics": [{"topic_id": topic_id, "partitions": [
                    {"partition_index": 0, "acknowledgement_batches": acks or []}]}],
                "forgotten_topics_data": []}, corr)

        assert fetch(0).error_code == 25  # UNKNOWN_MEMBER_ID: not in the group
        assert fetch(5).error_code == 122  # SHARE_SESSION_NOT_FOUND
        hb = conn.request(76, 1, {"group_id": group, "member_id": "m1", "member_epoch": 0,
                                  "subscribed_topic_names": [topic]}, 3)
        assert hb.error_code == 0 and hb.member_epoch > 0
        ack = [{"first_offset": 0, "last_offset": 0, "acknowledge_types": [1]}]
        assert fetch(0, ack).error_code == 42  # INVALID_REQUEST: acknowledgements while opening
        opened = fetch(0)
        assert opened.error_code == 0
        assert fetch(7).error_code == 123  # INVALID_SHARE_SESSION_EPOCH
        huge = [{"first_offset": 0, "last_offset": 2**62, "acknowledge_types": [1]}]
        res = fetch(1, huge)
        assert res.error_code == 0
        assert res.responses[0].partitions[0].acknowledge_error_code == 121  # INVALID_RECORD_STATE
        bad_type = [{"first_offset": 0, "last_offset": 0, "acknowledge_types": [9]}]
        assert fetch(2, bad_type).responses[0].partitions[0].acknowledge_error_code == 42
        zero = conn.request(79, 1, {"group_id": group, "member_id": "m1", "share_session_epoch": 0,
                                    "topics": []}, 4)
        assert zero.error_code == 123
    assert broker.proc is not None and broker.proc.poll() is None


def test_read_committed_skips_aborted_transactions(broker: BrokerProcess, closing: list[ShareConsumer]) -> None:
    from confluent_kafka import Producer

    topic = unique_topic("share")
    create_topic(broker, topic, 1)
    p = Producer({"bootstrap.servers": broker.bootstrap, "broker.address.family": "v4",
                  "transactional.id": unique_topic("tx")})
    p.init_transactions(CLIENT_TIMEOUT)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, value=b"aborted%d" % i)
    assert p.flush(CLIENT_TIMEOUT) == 0  # in the log before the abort (an abort purges what is unsent)
    p.abort_transaction(CLIENT_TIMEOUT)
    p.begin_transaction()
    for i in range(2):
        p.produce(topic, value=b"committed%d" % i)
    p.commit_transaction(CLIENT_TIMEOUT)
    values = {}
    for level in ("read_committed", "read_uncommitted"):
        group = unique_topic("g")
        set_group_configs(broker, group, {"share.auto.offset.reset": "earliest", "share.isolation.level": level})
        c = share_consumer(broker, group)
        closing.append(c)
        c.subscribe([topic])
        want = 2 if level == "read_committed" else 5
        values[level] = sorted(m.value() for m in poll_until(c, want, 20))
        assert poll_until(c, 1, 1.5) == []
    assert values["read_committed"] == [b"committed0", b"committed1"]
    assert values["read_uncommitted"] == [b"aborted0", b"aborted1", b"aborted2", b"committed0", b"committed1"]


def test_topic_level_dead_letter_topic(broker: BrokerProcess, closing: list[ShareConsumer]) -> None:
    topic, group, dlq = unique_topic("share"), unique_topic("g"), unique_topic("dlq")
    create_topic(broker, topic, 1, config={"pykbroker.dlq.topic": dlq})
    set_group_configs(broker, group, {"share.auto.offset.reset": "earliest"})
    produce(broker, topic, 1)
    c = share_consumer(broker, group, **{"share.acknowledgement.mode": "explicit"})
    closing.append(c)
    c.subscribe([topic])
    [m] = poll_until(c, 1, 20)
    c.acknowledge(m, AcknowledgeType.REJECT)
    c.commit_sync(CLIENT_TIMEOUT)
    [dead] = read_all(broker, dlq, 1)
    assert dead.value() == b"v0" and dict(dead.headers())["pykbroker.dlq.reason"] == b"rejected"
