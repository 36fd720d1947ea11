"""The Prometheus endpoint (pykbroker.metrics.listener) and structured logs, checked against what real
clients did: confluent-kafka produces and a group consumes and commits while a scraper polls the
endpoint over HTTP every 100 ms; then every count and the broker-computed lag must match."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import (
    CLIENT_TIMEOUT,
    BrokerFactory,
    admin_for,
    create_topic,
    make_consumer,
    make_producer,
    produce_all,
    unique_topic,
    wait_until,
)
from tests.integration.test_telemetry import subscribe
from tests.support.broker import BrokerProcess, free_port

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every series of `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


@pytest.fixture
def metered(broker_factory: BrokerFactory) -> tuple[BrokerProcess, int]:
    port = free_port()
    b = broker_factory({"pykbroker.metrics.listener": f"http://127.0.0.1:{port}"})
    return b, port


def test_counts_and_lag_match_what_the_clients_did(metered: tuple[BrokerProcess, int]) -> None:
    b, port = metered
    topic = unique_topic("metrics")
    create_topic(b, topic, partitions=3)
    scrapes: list[Samples] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def scraper() -> None:
        for _ in range(600):  # bounded: 60 s at most
            if stop.is_set() and len(scrapes) >= 3:  # traffic over (it may take less than 3 scrape periods)
                return
            try:
                scrapes.append(scrape(port))
            except BaseException as e:
                errors.append(e)
                return
            time.sleep(0.1)

    t = threading.Thread(target=scraper, daemon=True)
    t.start()
    try:
        p = make_producer(b, **{"client.id": "metrics-producer"})
        messages = [{"key": str(i).encode(), "value": b"v" * 100, "partition": i % 3} for i in range(3000)]
        reports = produce_all(p, topic, messages)
        assert all(r.error is None for r in reports)

        group = f"lag-{uuid.uuid4().hex[:8]}"
        c = make_consumer(b, **{"group.id": group, "client.id": "metrics-consumer"})
        try:
            c.subscribe([topic])
            got = 0
            deadline = time.monotonic() + CLIENT_TIMEOUT * 2
            while got < 3000 and time.monotonic() < deadline:
                got += sum(1 for m in c.consume(500, 0.2) if m.error() is None)
            assert got == 3000
            # Commit a known position: 1000 / 900 / 800 read of the 1000 each partition holds.
            c.commit(offsets=[TopicPartition(topic, i, 1000 - 100 * i) for i in range(3)], asynchronous=False)
            live = scrape(port)
            assert value(live, "kafka_coordinator_group_groupmetadatamanager_numgroups",
                         type="classic", state="Stable") >= 1
        finally:
            c.close()
    finally:
        stop.set()
        t.join(15)
    assert not errors, errors
    assert len(scrapes) >= 3, "the scraper ran from before the traffic to after it"

    final = scrape(port)
    assert value(final, "kafka_server_brokertopicmetrics_messagesin_total", topic=topic) == 3000
    assert value(final, "kafka_server_brokertopicmetrics_bytesin_total", topic=topic) >= 3000 * 100
    assert value(final, "kafka_server_brokertopicmetrics_bytesout_total", topic=topic) >= 3000 * 100
    assert total(final, "kafka_log_log_logendoffset", topic=topic) == 3000
    assert total(final, "kafka_log_log_size", topic=topic) >= 3000 * 100
    assert total(final, "kafka_log_log_numlogsegments", topic=topic) == 3
    # Counters only grow between scrapes.
    series = [value(s, "kafka_server_brokertopicmetrics_messagesin_total", topic=topic) for s in scrapes]
    assert series == sorted(series)

    lag = {int(dict(ls)["partition"]): v for (n, ls), v in final.items()
           if n == "kafka_consumergroup_lag" and dict(ls)["consumergroup"] == group}
    assert lag == {0: 0, 1: 100, 2: 200}
    assert value(final, "kafka_consumergroup_lag_sum", consumergroup=group, topic=topic) == 300
    assert value(final, "kafka_consumergroup_current_offset", consumergroup=group, topic=topic,
                 partition="2") == 800

    produces = value(final, "kafka_network_requestmetrics_requests_total", request="Produce",
                     version=_version(final, "Produce"))
    assert produces >= 1
    # The histogram's count is the request count, and its buckets are cumulative.
    assert value(final, "kafka_network_requestmetrics_totaltime_seconds_count", request="Produce",
                 version=_version(final, "Produce")) == produces
    assert total(final, "kafka_network_requestmetrics_requests_total", request="Fetch") >= 1
    assert total(final, "kafka_network_requestmetrics_requests_total", request="OffsetCommit") >= 1
    assert value(final, "kafka_server_replicamanager_partitioncount") >= 3
    assert value(final, "kafka_server_replicamanager_underreplicatedpartitions") == 0
    assert value(final, "kafka_controller_kafkacontroller_offlinepartitionscount") == 0
    assert total(final, "kafka_coordinator_group_rebalances_total", type="classic") >= 1
    assert value(final, "kafka_server_socketservermetrics_connection_count", listener="PLAINTEXT") >= 0
    assert value(final, "process_cpu_seconds_total") > 0


def _version(samples: Samples, request: str) -> str:
    versions = [dict(ls)["version"] for (n, ls), _ in samples.items()
                if n == "kafka_network_requestmetrics_requests_total" and dict(ls)["request"] == request]
    assert versions, f"no {request} requests counted"
    return max(versions, key=int)


def test_client_pushed_metrics_appear(metered: tuple[BrokerProcess, int]) -> None:
    """KIP-714: what librdkafka pushes under a CLIENT_METRICS subscription is on the endpoint."""
    b, port = metered
    client_id = f"pushed-{uuid.uuid4().hex[:8]}"
    subscribe(b, "all-producers", {"metrics": "org.apache.kafka.producer.", "interval.ms": "500",
                                   "match": f"client_id={client_id}"})
    topic = unique_topic("pushed")
    create_topic(b, topic)
    p = make_producer(b, **{"client.id": client_id})
    p.produce(topic, value=b"x")
    assert p.flush(CLIENT_TIMEOUT) == 0

    def pushed() -> list[str] | None:
        p.poll(0.1)
        names = [n for (n, ls) in scrape(port) if n.startswith("kafka_client_producer_")
                 and dict(ls).get("client_id") == client_id]
        return names or None

    names = wait_until(pushed, timeout=30, what="the producer's pushed metrics on the endpoint")
    assert all(n.startswith("kafka_client_producer_") for n in names)


def test_structured_logs_and_request_log(broker_factory: BrokerFactory) -> None:
    b = broker_factory({"pykbroker.log.format": "json"}, start=False)
    b.extra_args = ["--log-level", "DEBUG"]
    b.start()
    topic = unique_topic("logs")
    create_topic(b, topic)
    p = make_producer(b, **{"client.id": "log-probe"})
    produce_all(p, topic, [{"value": b"x"}])

    def request_lines() -> list[dict[str, Any]] | None:
        docs = []
        for line in b.log().splitlines():
            if line.startswith("{"):
                docs.append(json.loads(line))
        hits = [d for d in docs if d.get("logger") == "pykbroker.request.logger" and d.get("client_id") == "log-probe"
                and d.get("api") == "produce"]
        return hits or None

    hits = wait_until(request_lines, timeout=10, what="a JSON request log line for the produce")
    assert {"ts", "level", "msg", "version", "latency_ms", "peer", "correlation_id"} <= set(hits[0])
    assert hits[0]["level"] == "debug"
    started = [json.loads(line) for line in b.log().splitlines() if line.startswith("{")]
    assert any(d["msg"].endswith(" started") and d.get("broker_id") is not None for d in started), \
        "the broker's own lines are JSON too, with their data as fields"


def test_bad_metrics_listener_refuses_to_start(broker_factory: BrokerFactory) -> None:
    b = broker_factory({"pykbroker.metrics.listener": "https://127.0.0.1:9"}, start=False)
    with pytest.raises(RuntimeError, match="pykbroker.metrics.listener"):
        b.start(timeout=20)


def test_transaction_states(metered: tuple[BrokerProcess, int]) -> None:
    """Transactional ids by state, as the coordinator holds them: one committed, one left open."""
    b, port = metered
    topic = unique_topic("metrics-txn")
    create_topic(b, topic)
    done = make_producer(b, **{"transactional.id": f"done-{uuid.uuid4().hex[:6]}"})
    done.init_transactions(CLIENT_TIMEOUT)
    done.begin_transaction()
    done.produce(topic, value=b"x")
    done.commit_transaction(CLIENT_TIMEOUT)
    open_txn = make_producer(b, **{"transactional.id": f"open-{uuid.uuid4().hex[:6]}"})
    open_txn.init_transactions(CLIENT_TIMEOUT)
    open_txn.begin_transaction()
    open_txn.produce(topic, value=b"y")
    assert open_txn.flush(CLIENT_TIMEOUT) == 0
    samples = scrape(port)
    assert value(samples, "kafka_coordinator_transaction_transactions", state="COMPLETE_COMMIT") >= 1
    assert value(samples, "kafka_coordinator_transaction_transactions", state="ONGOING") >= 1
    open_txn.abort_transaction(CLIENT_TIMEOUT)


def _set_min_isr(b: BrokerProcess, topic: str, value: str) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("min.insync.replicas", value, incremental_operation=AlterConfigOpType.SET)])
    admin = admin_for(b)  # kept: a destroyed client fails its pending futures
    admin.incremental_alter_configs([res])[res].result(timeout=CLIENT_TIMEOUT)


def _refused_send(b: BrokerProcess, topic: str, retry: bool) -> str:
    """One acks=all record, not retried (the broker's error) or retried until its delivery timeout."""
    conf: dict[str, Any] = ({"message.timeout.ms": 2500, "retry.backoff.ms": 50, "retry.backoff.max.ms": 100}
                            if retry else {"retries": 0})
    p = make_producer(b, acks="all", **conf)
    errors: list[Any] = []
    p.produce(topic, value=b"x", on_delivery=lambda err, _msg: errors.append(err))
    p.flush(CLIENT_TIMEOUT)
    assert len(errors) == 1 and errors[0] is not None, errors
    return str(errors[0].name())


def test_not_enough_replicas_is_logged_once_and_counted(broker_factory: BrokerFactory) -> None:
    """A topic whose min.insync.replicas its ISR cannot meet: a retrying acks=all producer is refused with
    NOT_ENOUGH_REPLICAS many times; the leader logs it once, with the ISR it saw, and counts every answer.
    Once an append is accepted again, the next refusal is logged anew."""
    port = free_port()
    b = broker_factory({"pykbroker.metrics.listener": f"http://127.0.0.1:{port}", "pykbroker.log.format": "json"})
    topic = unique_topic("min-isr")
    create_topic(b, topic, config={"min.insync.replicas": "2"})
    assert _refused_send(b, topic, retry=False) == "NOT_ENOUGH_REPLICAS"
    assert _refused_send(b, topic, retry=True) == "_MSG_TIMED_OUT"  # refused on every retry meanwhile

    def lines() -> list[dict[str, Any]]:
        docs = [json.loads(ln) for ln in b.log().splitlines() if ln.startswith("{")]
        return [d for d in docs if d.get("logger") == "pykbroker.produce" and d.get("topic") == topic]

    first = wait_until(lambda: lines() or None, timeout=10, what="the NOT_ENOUGH_REPLICAS log line")
    counted = value(scrape(port), "pykbroker_produce_min_isr_refusals_total", topic=topic,
                    error="NOT_ENOUGH_REPLICAS")
    assert counted >= 3, f"the producer retried, each answer is counted: {counted}"
    assert len(first) == 1, first
    assert first[0]["level"] == "warning" and first[0]["error"] == "NOT_ENOUGH_REPLICAS"
    assert first[0]["partition"] == 0 and len(first[0]["isr"]) == 1 and first[0]["isr"] == first[0]["replicas"]
    assert first[0]["min_isr"] == 2
    assert "min.insync.replicas=2" in first[0]["msg"]

    _set_min_isr(b, topic, "1")
    produce_all(make_producer(b, acks="all"), topic, [{"value": b"ok"}])
    _set_min_isr(b, topic, "2")
    assert _refused_send(b, topic, retry=False) == "NOT_ENOUGH_REPLICAS"
    wait_until(lambda: len(lines()) == 2 or None, timeout=10, what="a second line after the partition recovered")
    assert value(scrape(port), "pykbroker_produce_min_isr_refusals_total", topic=topic,
                 error="NOT_ENOUGH_REPLICAS") > counted
