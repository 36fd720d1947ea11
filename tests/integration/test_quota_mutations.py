"""Controller mutation quotas (KIP-599) on a real broker: kafka-python's admin client and raw requests.

Each test puts its own client id under ``controller_mutation_rate`` = 1 partition per second.  The bucket
holds Kafka's default burst of 11 windows x 1 s x 1 = 11 partitions and starts full, so the arithmetic
below is exact: a topic is accepted while any credit is left (which may put the bucket in debt), then
the rest of the request is refused with THROTTLING_QUOTA_EXCEEDED and the time the debt takes to refill.
"""

from __future__ import annotations

import datetime
import time
import uuid
from typing import Any

import pytest
from kafka.admin import KafkaAdminClient, NewPartitions
from kafka.errors import ThrottlingQuotaExceededError

from tests.integration.conftest import CLIENT_TIMEOUT, BrokerFactory, RawConnection, request_frame, unique_topic
from tests.support.broker import BrokerProcess
from tests.support.quotas import KpQuotas

THROTTLED = 89  # THROTTLING_QUOTA_EXCEEDED
MESSAGE = "The throttling quota has been exceeded."
TIMEOUT = datetime.timedelta(seconds=10)


@pytest.fixture(scope="module")
def broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    return module_broker_factory()


def limit(kp: KpQuotas, client_id: str, rate: float | None = 1.0) -> None:
    assert kp.alter((("client-id", client_id),), {"controller_mutation_rate": rate}) == (0, None)


def admin(broker: BrokerProcess, client_id: str) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id=client_id,
                            request_timeout_ms=int(CLIENT_TIMEOUT * 1000))


def raw(conn: RawConnection, api_key: int, version: int, body: dict[str, Any], client_id: str,
        correlation_id: int = 1) -> Any:
    conn.send(request_frame(api_key, version, body, correlation_id, client_id=client_id))
    return conn.read_response(api_key, version, correlation_id)


def ms(throttle: datetime.timedelta) -> float:
    return throttle.total_seconds() * 1000


def creatable(name: str, partitions: int) -> dict[str, Any]:
    return {"name": name, "num_partitions": partitions, "replication_factor": 1, "assignments": [], "configs": []}


def test_kafka_python_gets_throttling_quota_exceeded_then_succeeds_after_the_throttle(
        broker: BrokerProcess, kp: KpQuotas) -> None:
    limit(kp, "kp-mutator")
    a, b, c = (unique_topic(x) for x in ("mut-a", "mut-b", "mut-c"))
    client = admin(broker, "kp-mutator")
    try:
        # 11 credits: a takes them all, b is accepted on an empty (not negative) bucket and leaves a debt
        # of 2, c is refused until that is paid back (2 s at 1 per second).
        topics = {a: {"num_partitions": 11, "replication_factor": 1}, b: {"num_partitions": 2, "replication_factor": 1},
                  c: {"num_partitions": 1, "replication_factor": 1}}
        result = client.create_topics(topics, raise_errors=False)
        refused_at = time.monotonic()
        by_name = {t["name"]: t for t in result["topics"]}
        assert by_name[a]["error_code"] == 0 and by_name[b]["error_code"] == 0
        assert (by_name[c]["error_code"], by_name[c]["error_message"]) == (THROTTLED, MESSAGE)
        listed = kp.admin.list_topics()  # another client id: not throttled
        assert a in listed and b in listed and c not in listed
        # kafka-python holds its connection back for the throttle time it read from the response (and the
        # broker muted it): the same request once the debt is paid back succeeds.
        time.sleep(max(0.0, refused_at + 2.2 - time.monotonic()))
        client.create_topics({c: topics[c]})
        assert c in kp.admin.list_topics()
    finally:
        client.close()


def test_kafka_python_raises_throttling_quota_exceeded(broker: BrokerProcess, kp: KpQuotas) -> None:
    limit(kp, "kp-raiser")
    client = admin(broker, "kp-raiser")
    try:
        with pytest.raises(ThrottlingQuotaExceededError):
            client.create_topics({unique_topic("raise"): {"num_partitions": 12, "replication_factor": 1},
                                  unique_topic("raise"): {"num_partitions": 1, "replication_factor": 1}})
    finally:
        client.close()


def test_other_client_ids_are_not_limited(broker: BrokerProcess, kp: KpQuotas) -> None:
    limit(kp, "kp-limited")
    free = admin(broker, "kp-unlimited")
    try:
        names = [unique_topic("free") for _ in range(3)]
        result = free.create_topics({n: {"num_partitions": 8, "replication_factor": 1} for n in names},
                                    raise_errors=False)
        assert [t["error_code"] for t in result["topics"]] == [0, 0, 0]  # 24 partitions, no quota
    finally:
        free.close()


def test_strict_versions_answer_the_throttle_time_and_mute_the_connection(broker: BrokerProcess, kp: KpQuotas) -> None:
    limit(kp, "raw-strict")
    names = [unique_topic("strict") for _ in range(3)]
    with RawConnection(broker) as conn:
        r = raw(conn, 19, 7, {"topics": [creatable(names[0], 10), creatable(names[1], 4), creatable(names[2], 1)],
                              "timeout": TIMEOUT, "validate_only": False}, "raw-strict")
        codes = [(t.name, int(t.error_code), t.error_message) for t in r.topics]
        assert codes == [(names[0], 0, None), (names[1], 0, None), (names[2], THROTTLED, MESSAGE)]
        # The debt is 3 partitions: 3 s at 1 per second, less the little time the request took.
        assert 2000 < ms(r.throttle_time) <= 3000
        # KIP-219: the broker reads nothing more from the connection until the throttle has passed.
        sent = time.monotonic()
        raw(conn, 18, 3, {"client_software_name": "raw", "client_software_version": "1"}, "raw-strict", 2)
        assert time.monotonic() - sent >= ms(r.throttle_time) / 1000 - 0.3


def test_permissive_versions_accept_everything_and_throttle(broker: BrokerProcess, kp: KpQuotas) -> None:
    limit(kp, "raw-permissive")
    names = [unique_topic("permissive") for _ in range(3)]
    with RawConnection(broker) as conn:
        # CreateTopics v5 predates the error: every topic is created, and the debt (14 - 11) is throttled.
        r = raw(conn, 19, 5, {"topics": [creatable(n, p) for n, p in zip(names, (10, 2, 2), strict=True)],
                              "timeout": TIMEOUT, "validate_only": False}, "raw-permissive")
        assert [int(t.error_code) for t in r.topics] == [0, 0, 0]
        assert 2000 < ms(r.throttle_time) <= 3000


def test_create_partitions_and_delete_topics_are_charged_too(broker: BrokerProcess, kp: KpQuotas) -> None:
    big, doomed = unique_topic("grow"), unique_topic("doomed")
    setup = admin(broker, "kp-setup")
    try:
        setup.create_topics({big: {"num_partitions": 1, "replication_factor": 1},
                             doomed: {"num_partitions": 1, "replication_factor": 1}})
    finally:
        setup.close()
    limit(kp, "kp-grower")
    client = admin(broker, "kp-grower")
    try:
        # CreatePartitions v3+: 14 new partitions take the 11 credits and leave a debt of 3.
        client.create_partitions({big: NewPartitions(total_count=15)})
        with pytest.raises(ThrottlingQuotaExceededError):
            client.create_partitions({big: NewPartitions(total_count=16)})
        # DeleteTopics v5+ charges the same bucket: refused while it is in debt.
        with RawConnection(broker) as conn:
            r = raw(conn, 20, 6, {"topics": [{"name": doomed, "topic_id": uuid.UUID(int=0)}], "timeout": TIMEOUT},
                    "kp-grower")
            refused_at = time.monotonic()
            assert [(t.name, int(t.error_code), t.error_message) for t in r.responses] == [
                (doomed, THROTTLED, MESSAGE)]
            assert 2000 < ms(r.throttle_time) <= 3000
        assert doomed in kp.admin.list_topics()
        # Once the throttle time has passed the debt is paid back and the deletion goes through.
        time.sleep(max(0.0, refused_at + ms(r.throttle_time) / 1000 + 0.2 - time.monotonic()))
        result = client.delete_topics([doomed], raise_errors=False)
        assert [(t["name"], t["error_code"]) for t in result["topics"]] == [(doomed, 0)]
    finally:
        client.close()


def test_removing_the_quota_lifts_it(broker: BrokerProcess, kp: KpQuotas) -> None:
    limit(kp, "kp-lifted")
    first, second = unique_topic("lift"), unique_topic("lift")
    client = admin(broker, "kp-lifted")
    try:
        client.create_topics({first: {"num_partitions": 20, "replication_factor": 1}})  # a debt of 9 s
        with pytest.raises(ThrottlingQuotaExceededError):
            client.create_topics({second: {"num_partitions": 1, "replication_factor": 1}})
    finally:
        client.close()
    limit(kp, "kp-lifted", None)
    again = admin(broker, "kp-lifted")  # a new connection: the old one is muted for its throttle time
    try:
        started = time.monotonic()
        again.create_topics({second: {"num_partitions": 1, "replication_factor": 1}})
        assert time.monotonic() - started < 5.0  # well within the 9 s the debt would have taken
    finally:
        again.close()
