"""The web console in a real browser (Debian's chromium-headless-shell driven by Playwright) against broker
subprocesses under load from confluent-kafka clients: what an operator sees on each page, checked against
what the clients see.

Two brokers: an open one (PLAINTEXT only, writable console, metrics on) and a secured one (an ACL authorizer,
a SASL_PLAINTEXT listener, the default read-only console). Screenshots go to build/artifacts/console/."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import AcknowledgeType, Consumer, Producer, ShareConsumer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from tests.integration.test_security_sasl import sasl_overrides
from tests.support.admin_cli import run
from tests.support.broker import BrokerProcess, free_port
from tests.support.cluster import wait_for

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "artifacts" / "console"
CHROMIUM = "/usr/bin/chromium-headless-shell"
TIMEOUT = 20.0
PAGE_TIMEOUT_MS = 20_000
ORDERS, LAG_GROUP, LIVE_GROUP = "orders", "lag-group", "live-group"


@dataclass
class Console:
    broker: BrokerProcess
    url: str
    sasl: str | None = None


def _start(base: Path, overrides: dict[str, str], *, sasl_port: int | None = None) -> Console:
    port = free_port()
    b = BrokerProcess(base, {})
    b.overrides.update({"pykbroker.console.listener": f"http://127.0.0.1:{port}", **overrides})
    if sasl_port is not None:
        b.overrides["listeners"] = b.overrides["listeners"].replace("{p0}", str(b.port))
    b.start()
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    wait_for(up, timeout=TIMEOUT, what="the console to answer")
    return Console(b, url, f"127.0.0.1:{sasl_port}" if sasl_port else None)


class Load:
    """A producer writing to a topic all along (the overview's messages-in rate) and a consumer group member
    polling another (a group with members, whose offsets cannot be reset)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._guard, args=(f,), daemon=True)
                        for f in (self._produce, self._consume)]
        self.member_joined = threading.Event()

    def _guard(self, fn: Any) -> None:
        try:
            fn()
        except BaseException as e:
            self.errors.append(e)

    def _produce(self) -> None:
        p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        i = 0
        while not self.stop.is_set() and i < 100_000:
            p.produce("load", json.dumps({"i": i}).encode())
            p.poll(0)
            i += 1
            time.sleep(0.01)
        p.flush(TIMEOUT)

    def _consume(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": LIVE_GROUP, "auto.offset.reset": "earliest",
                      "session.timeout.ms": 10000})
        c.subscribe([ORDERS], on_assign=lambda *_: self.member_joined.set())
        try:
            for _ in range(100_000):
                if self.stop.is_set():
                    break
                c.poll(0.2)
        finally:
            c.close()

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(TIMEOUT)


@pytest.fixture(scope="module")
def open_console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """A PLAINTEXT broker with a writable console, its metrics endpoint on, and client load."""
    c = _start(tmp_path_factory.mktemp("console-open"), {
        "pykbroker.console.read.only": "false", "pykbroker.metrics.listener": f"http://127.0.0.1:{free_port()}",
        "num.partitions": "1", "group.share.enable": "true"})
    try:
        admin = AdminClient({"bootstrap.servers": c.broker.bootstrap})
        for f in admin.create_topics([NewTopic(ORDERS, 3, 1), NewTopic("load", 1, 1)]).values():
            f.result(TIMEOUT)
        p = Producer({"bootstrap.servers": c.broker.bootstrap})
        for i in range(90):
            p.produce(ORDERS, json.dumps({"order": i}).encode(), key=f"k{i}".encode(), partition=i % 3)
        assert p.flush(TIMEOUT) == 0
        # A group that consumed the topic, committed and left; 15 more records make a lag that stays put.
        consumer = Consumer({"bootstrap.servers": c.broker.bootstrap, "group.id": LAG_GROUP,
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe([ORDERS])
        got = 0
        deadline = time.monotonic() + TIMEOUT
        while got < 90 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got += 1
        assert got == 90
        consumer.commit(asynchronous=False)
        consumer.close()
        for i in range(15):
            p.produce(ORDERS, json.dumps({"order": 90 + i}).encode(), partition=i % 3)
        assert p.flush(TIMEOUT) == 0
        with Load(c.broker.bootstrap) as load:
            assert load.member_joined.wait(TIMEOUT), "the live group's member was not assigned partitions"
            yield c
        assert not load.errors, load.errors
    finally:
        c.broker.stop()


@pytest.fixture(scope="module")
def secure_console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """A broker with an ACL authorizer and a SASL_PLAINTEXT listener (PLAIN: admin, alice); read-only console."""
    sasl_port = free_port()
    c = _start(tmp_path_factory.mktemp("console-sasl"), {
        **sasl_overrides(sasl_port), "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
        "super.users": "User:ANONYMOUS;User:admin", "allow.everyone.if.no.acl.found": "false"},
        sasl_port=sasl_port)
    try:
        admin = AdminClient({"bootstrap.servers": c.broker.bootstrap})
        for f in admin.create_topics([NewTopic("alice-topic", 2, 1), NewTopic("secret-topic", 1, 1)]).values():
            f.result(TIMEOUT)
        acl = AclBinding(ResourceType.TOPIC, "alice-topic", ResourcePatternType.LITERAL, "User:alice", "*",
                         AclOperation.DESCRIBE, AclPermissionType.ALLOW)
        for f in admin.create_acls([acl]).values():
            f.result(TIMEOUT)
        yield c
    finally:
        c.broker.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"], timeout=60_000)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    ctx.set_default_timeout(PAGE_TIMEOUT_MS)
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    return context.new_page()


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def watermarks(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex[:6]}"})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT) for p in range(partitions)]
    finally:
        c.close()


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return [tp.offset for tp in c.committed([TopicPartition(topic, p) for p in range(partitions)],
                                                 timeout=TIMEOUT)]
    finally:
        c.close()


def cell(page: Page, row: str, column: str) -> str:
    return page.locator(f"{row} td.{column}").inner_text().strip()


# --- the open, writable console ---

def test_overview_shows_the_cluster_and_its_message_rate(open_console: Console, page: Page) -> None:
    md = AdminClient({"bootstrap.servers": open_console.broker.bootstrap}).list_topics(timeout=TIMEOUT)
    page.goto(open_console.url + "/")
    expect(page.locator("#cluster-id")).to_have_text(md.cluster_id)
    expect(page.locator("#controller")).to_have_text(str(md.controller_id))
    expect(page.locator("#broker-count")).to_have_text("1")
    expect(page.locator("#under-replicated")).to_have_text("0")
    expect(page.locator("#offline")).to_have_text("0")
    assert int(page.locator("#partition-count").inner_text()) == sum(len(t.partitions) for t in md.topics.values())

    def rate_shown() -> float | None:  # two scrapes of the broker's metrics make the first rate
        page.goto(open_console.url + "/")
        return float(page.locator("#rate").inner_text()) if page.locator("#rate").count() else None

    rate = wait_for(rate_shown, timeout=TIMEOUT, interval=1.0, what="the messages-in rate")
    assert rate > 0  # the load producer writes all along
    expect(page.locator("svg.spark polyline")).to_have_count(1)
    shot(page, "overview")


def test_topics_page_filters_and_counts_messages(open_console: Console, page: Page) -> None:
    page.goto(open_console.url + "/topics")
    expect(page.locator("#topics tr[data-topic='load']")).to_have_count(1)

    def load_rate() -> float | None:  # the producer under load keeps writing to "load"
        page.reload()
        text = cell(page, "#topics tr[data-topic='load']", "rate-in")
        return float(text) if text not in ("-", "0.0") else None

    assert wait_for(load_rate, timeout=TIMEOUT, interval=1.0, what="a messages-in rate for the loaded topic") > 0
    assert float(cell(page, "#topics tr[data-topic='load']", "bytes-in")) > 0
    expect(page.locator("#topics tr[data-topic='__consumer_offsets']")).to_have_count(0)  # internal: opt in
    page.fill("#filter", "orde")
    page.click("form.filter button")
    expect(page.locator("#topics tbody tr")).to_have_count(1)
    row = page.locator(f"#topics tr[data-topic='{ORDERS}']")
    expect(row.locator("td").nth(1)).to_have_text("3")
    expect(row.locator("td").nth(2)).to_have_text("1")
    marks = watermarks(open_console.broker.bootstrap, ORDERS, 3)
    expect(row.locator("td.messages")).to_have_text(str(sum(hi - lo for lo, hi in marks)))
    # the size is the bytes of the partitions' segment files (one replica each here)
    on_disk = sum(f.stat().st_size for p in range(3)
                  for f in (open_console.broker.data_dir / "logs" / f"{ORDERS}-{p}").glob("*.log"))
    assert on_disk > 0
    expect(row.locator("td.size")).to_have_attribute("data-bytes", str(on_disk))
    expect(row.locator("td.size")).to_contain_text("KiB")
    shot(page, "topics")


def test_topic_detail_shows_partitions_offsets_and_configs(open_console: Console, page: Page) -> None:
    page.goto(open_console.url + "/topics")
    page.click(f"#topics a:text-is('{ORDERS}')")
    expect(page.locator("#topic-name")).to_have_text(ORDERS)
    marks = watermarks(open_console.broker.bootstrap, ORDERS, 3)
    for p, (lo, hi) in enumerate(marks):
        row = f"#partitions tr[data-partition='{p}']"
        assert cell(page, row, "start") == str(lo)
        assert cell(page, row, "end") == str(hi)
        assert page.locator(f"{row} td").nth(1).inner_text() == "0"  # the leader
    expect(page.locator("#configs tr[data-config='retention.ms'] td").nth(1)).to_have_text("604800000")
    shot(page, "topic")
    # A page of a topic that does not exist says so, and does not create it (the broker auto-creates topics).
    page.goto(open_console.url + "/topics/no-such-topic")
    expect(page.locator("#error")).to_contain_text("UNKNOWN_TOPIC_OR_PARTITION")
    page.goto(open_console.url + "/topics/no-such-topic/messages?partition=0")
    expect(page.locator("#error")).to_contain_text("UNKNOWN_TOPIC_OR_PARTITION")
    admin = AdminClient({"bootstrap.servers": open_console.broker.bootstrap})
    assert "no-such-topic" not in admin.list_topics(timeout=TIMEOUT).topics


def test_a_produced_message_shows_up_in_the_browser(open_console: Console, page: Page) -> None:
    marker = uuid.uuid4().hex
    p = Producer({"bootstrap.servers": open_console.broker.bootstrap})
    delivered: list[Any] = []
    p.produce(ORDERS, json.dumps({"marker": marker, "items": [1, 2]}).encode(), key=b"\x00\xffkey", partition=1,
              headers=[("trace", marker.encode())], on_delivery=lambda err, msg: delivered.append((err, msg)))
    assert p.flush(TIMEOUT) == 0 and delivered[0][0] is None
    offset = delivered[0][1].offset()
    page.goto(f"{open_console.url}/topics/{ORDERS}/messages")
    page.select_option("#partition", "1")
    page.fill("#offset", str(offset))
    page.click("#show")
    row = page.locator(f"#records tr[data-offset='{offset}']")
    expect(row).to_have_count(1)
    value = row.locator("pre.json").first.inner_text()
    assert json.loads(value) == {"marker": marker, "items": [1, 2]}
    assert "\n  " in value  # pretty-printed
    expect(row.locator("pre.hex").first).to_have_text("00 ff 6b 65 79")  # a key that is not text
    expect(row.locator(".header")).to_contain_text(f"trace: {marker}")
    # From a time: the first record at or after it is the marker's.
    page.fill("#offset", "")
    page.fill("#timestamp", str(delivered[0][1].timestamp()[1]))
    page.click("#show")
    expect(page.locator("#records tbody tr").first).to_have_attribute("data-offset", str(offset))
    # The newest records when no offset is given: the marker is among them.
    page.goto(f"{open_console.url}/topics/{ORDERS}/messages?partition=1&limit=5")
    expect(page.locator("#records")).to_contain_text(marker)
    shot(page, "messages")


def test_message_search_finds_the_records_holding_the_text(open_console: Console, page: Page) -> None:
    """Order 42 went to partition 0 as its 15th record (offset 14): a search for it from the partition's start
    finds that record alone; a search for text no record holds finds none, within the bounded scan."""
    page.goto(f"{open_console.url}/topics/{ORDERS}/messages")
    page.select_option("#partition", "0")
    page.fill("#offset", "0")
    page.fill("#contains", '"order": 42}')
    page.click("#show")
    expect(page.locator("#records tbody tr")).to_have_count(1)
    expect(page.locator("#records tbody tr")).to_have_attribute("data-offset", "14")
    expect(page.locator("#found")).to_contain_text("containing")
    page.fill("#contains", "no-record-holds-this")
    page.click("#show")
    expect(page.locator("#found")).to_contain_text("0 record(s)")
    expect(page.locator("#records tbody tr")).to_have_count(0)


def test_group_lag_in_the_browser_equals_the_clients(open_console: Console, page: Page) -> None:
    b = open_console.broker.bootstrap
    marks = watermarks(b, ORDERS, 3)
    offsets = committed(b, LAG_GROUP, ORDERS, 3)
    # and the admin CLI's view of the same group (pykbroker group describe -o json)
    cli = json.loads(run(["group", "describe", LAG_GROUP, "-o", "json", "-b", b]).stdout)[0]
    assert {p["partition"]: p["lag"] for p in cli["partitions"]} == {p: marks[p][1] - offsets[p] for p in range(3)}
    page.goto(open_console.url + "/groups")
    expect(page.locator(f"#groups tr[data-group='{LAG_GROUP}']")).to_contain_text("EMPTY")
    expect(page.locator(f"#groups tr[data-group='{LIVE_GROUP}']")).to_contain_text("STABLE")
    page.click(f"#groups a:text-is('{LAG_GROUP}')")
    expect(page.locator("#group-id")).to_have_text(LAG_GROUP)
    total = 0
    for p in range(3):
        row = f"#offsets tr[data-tp='{ORDERS}-{p}']"
        lag = marks[p][1] - offsets[p]
        total += lag
        assert cell(page, row, "committed") == str(offsets[p])
        assert cell(page, row, "end") == str(marks[p][1])
        assert cell(page, row, "lag") == str(lag)
        # the chart's bar for the partition carries the same lag
        expect(page.locator(f"#lag-chart g[data-tp='{ORDERS}-{p}']")).to_have_attribute("data-lag", str(lag))
    assert total > 0
    expect(page.locator("#total-lag")).to_have_text(str(total))
    assert total == cli["total_lag"]
    shot(page, "group")
    page.goto(f"{open_console.url}/groups/{LIVE_GROUP}")
    expect(page.locator("#members tbody tr")).to_have_count(1)
    expect(page.locator("#members")).to_contain_text(f"{ORDERS}-0")


def test_share_group_members_and_lag_in_the_browser(open_console: Console, page: Page) -> None:
    """A share group with a ShareConsumer that acquired ten records and accepted none: its member, assignment and
    a lag of ten (the share-partition starts at 0) on the page, then five after accepting five."""
    b = open_console.broker.bootstrap
    topic, group = f"jobs-{uuid.uuid4().hex[:6]}", f"workers-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": b})
    for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        f.result(TIMEOUT)
    resource = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=TIMEOUT)
    p = Producer({"bootstrap.servers": b})
    for i in range(10):
        p.produce(topic, b"job-%d" % i)
    assert p.flush(TIMEOUT) == 0
    c = ShareConsumer({"bootstrap.servers": b, "group.id": group, "client.id": "console-worker",
                       "share.acknowledgement.mode": "explicit"})
    try:
        c.subscribe([topic])
        got: list[Any] = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < 10 and time.monotonic() < deadline:
            got += [m for m in c.poll(0.5) if m.error() is None]
        assert len(got) == 10
        page.goto(open_console.url + "/share-groups")
        expect(page.locator(f"#share-groups tr[data-group='{group}']")).to_contain_text("Stable")
        page.click(f"#share-groups a:text-is('{group}')")
        expect(page.locator("#group-id")).to_have_text(group)
        expect(page.locator("#members")).to_contain_text("console-worker")
        expect(page.locator("#members")).to_contain_text(f"{topic}-0")
        row = f"#offsets tr[data-tp='{topic}-0']"
        assert (cell(page, row, "start"), cell(page, row, "end"), cell(page, row, "lag")) == ("0", "10", "10")
        expect(page.locator(f"#lag-chart g[data-tp='{topic}-0']")).to_have_attribute("data-lag", "10")
        shot(page, "share-group")
        for m in got[:5]:
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        for m in got[5:]:
            c.acknowledge(m, AcknowledgeType.RELEASE)
        c.commit_sync()

        def lag_five() -> bool | None:
            page.reload()
            return cell(page, row, "lag") == "5" or None

        wait_for(lag_five, timeout=TIMEOUT, what="the share group's lag down to 5 after accepting 5")
        assert cell(page, row, "start") == "5"
    finally:
        c.close()


def test_acls_users_and_broker_config_pages(open_console: Console, page: Page) -> None:
    admin = AdminClient({"bootstrap.servers": open_console.broker.bootstrap})
    user = f"ops-{uuid.uuid4().hex[:6]}"
    for f in admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"pw-" + user.encode())]).values():
        f.result(TIMEOUT)
    page.goto(open_console.url + "/users")
    expect(page.locator(f"#users tr[data-user='{user}']")).to_contain_text("SCRAM-SHA-256 (4096 iterations)")
    page.click("nav a:text-is('ACLs')")
    expect(page.locator("#acls tbody")).to_have_text("no ACLs")  # no authorizer here (see the secured broker)
    page.click("nav a:text-is('Broker configs')")
    page.fill("#filter", "log.retention.hours")
    page.click("form.filter button")
    expect(page.locator("#configs tr[data-config='log.retention.hours'] td").nth(1)).to_have_text("168")
    expect(page.locator("#configs tbody tr")).to_have_count(1)


def test_writable_console_creates_produces_resets_and_deletes(open_console: Console, page: Page) -> None:
    admin = AdminClient({"bootstrap.servers": open_console.broker.bootstrap})
    name = f"made-{uuid.uuid4().hex[:6]}"
    page.goto(open_console.url + "/topics")
    page.fill("#new-topic", name)
    page.fill("#create-topic input[name=partitions]", "2")
    page.click("#create-topic button")
    expect(page.locator("#topic-name")).to_have_text(name)
    expect(page.locator("#partitions tbody tr")).to_have_count(2)
    assert len(admin.list_topics(name, timeout=TIMEOUT).topics[name].partitions) == 2

    marker = uuid.uuid4().hex
    page.fill("#produce input[name=partition]", "1")
    page.fill("#produce-key", "console-key")
    page.fill("#produce-value", json.dumps({"from": "console", "marker": marker}))
    page.click("#produce button")
    expect(page.locator("#message")).to_contain_text("produced to partition 1 at offset 0")
    expect(page.locator("#records tr[data-offset='0']")).to_contain_text(marker)
    c = Consumer({"bootstrap.servers": open_console.broker.bootstrap, "group.id": "probe-produced"})
    c.assign([TopicPartition(name, 1, 0)])
    m = wait_for(lambda: (lambda x: x if x is not None and x.error() is None else None)(c.poll(0.5)),
                 timeout=TIMEOUT, what="the record produced from the console")
    c.close()
    assert m.key() == b"console-key" and json.loads(m.value()) == {"from": "console", "marker": marker}

    # Offsets of a group with a member are not reset; of an empty group they are.
    page.goto(f"{open_console.url}/groups/{LIVE_GROUP}")
    page.click("#reset-offsets button")
    expect(page.locator("#message")).to_contain_text("has 1 member(s)")
    page.goto(f"{open_console.url}/groups/{LAG_GROUP}")
    page.select_option("#reset-to", "latest")
    page.click("#reset-offsets button")
    expect(page.locator("#message")).to_contain_text("reset 3 partition(s) to latest")
    assert committed(open_console.broker.bootstrap, LAG_GROUP, ORDERS, 3) == \
        [hi for _, hi in watermarks(open_console.broker.bootstrap, ORDERS, 3)]
    expect(page.locator("#total-lag")).to_have_text("0")

    page.goto(f"{open_console.url}/topics/{name}")
    page.fill("#confirm-delete", name)
    page.click("#delete-topic button")
    expect(page.locator("#message")).to_contain_text(f"deleted topic {name}")
    wait_for(lambda: name not in admin.list_topics(timeout=TIMEOUT).topics, timeout=TIMEOUT,
             what="the topic deleted from the console to go")
    expect(page.locator(f"#topics tr[data-topic='{name}']")).to_have_count(0)


def test_a_post_without_the_csrf_token_is_refused(open_console: Console, page: Page) -> None:
    page.goto(open_console.url + "/topics")
    token = page.locator("#create-topic input[name=csrf]").get_attribute("value")
    assert token
    for form in ({"name": "csrf-victim"}, {"name": "csrf-victim", "csrf": "forged"}):
        r = page.request.post(open_console.url + "/topics", form=form, max_redirects=0)
        assert r.status == 403, r.text()
    assert "csrf-victim" not in AdminClient({"bootstrap.servers": open_console.broker.bootstrap}).list_topics(
        timeout=TIMEOUT).topics
    r = page.request.post(open_console.url + "/topics", form={"name": "csrf-ok", "csrf": token}, max_redirects=0)
    assert r.status == 303


def test_the_open_console_is_announced_with_a_warning(open_console: Console) -> None:
    line = next(x for x in open_console.broker.log().splitlines() if "web console at" in x)
    assert "WARN" in line and "open to anyone" in line and "writes allowed" in line


# --- the secured, read-only console ---

def login(page: Page, c: Console, user: str, password: str) -> None:
    page.goto(c.url + "/topics")
    expect(page).to_have_url(re.compile(r"/login\?next=/topics$"))
    page.fill("#username", user)
    page.fill("#password", password)
    page.click("#login")


def test_login_is_the_brokers_and_acls_apply(secure_console: Console, page: Page) -> None:
    login(page, secure_console, "alice", "not-her-password")
    expect(page.locator("#error")).to_contain_text("Login refused")
    expect(page.locator("nav")).to_have_count(0)
    shot(page, "login")
    page.fill("#username", "alice")
    page.fill("#password", "alice-secret")
    page.click("#login")
    expect(page).to_have_url(secure_console.url + "/topics")
    expect(page.locator("#user")).to_have_text("alice")
    expect(page.locator("#topics tr[data-topic='alice-topic']")).to_have_count(1)
    expect(page.locator("#topics tr[data-topic='secret-topic']")).to_have_count(0)  # no ACL for alice
    page.click("nav a:text-is('ACLs')")
    expect(page.locator("#error")).to_contain_text("CLUSTER_AUTHORIZATION_FAILED")
    page.click("#logout")
    expect(page).to_have_url(re.compile(r"/login$"))
    page.goto(secure_console.url + "/groups")
    expect(page).to_have_url(re.compile(r"/login\?next=/groups$"))


def test_read_only_console_offers_no_writes_and_refuses_them(secure_console: Console, page: Page) -> None:
    login(page, secure_console, "admin", "admin-secret")
    expect(page.locator(".badge")).to_have_text("read-only")
    expect(page.locator("#topics tr[data-topic='secret-topic']")).to_have_count(1)  # a super user
    expect(page.locator("form[method=post]")).to_have_count(1)  # only the logout
    page.goto(secure_console.url + "/topics/alice-topic")
    expect(page.locator("#produce, #delete-topic")).to_have_count(0)
    token = page.locator("form[action='/logout'] input[name=csrf]").get_attribute("value")
    assert token
    for path, form in (("/topics", {"name": "ro-topic"}), ("/topics/alice-topic/delete", {"confirm": "alice-topic"}),
                       ("/topics/alice-topic/produce", {"value": "x"})):
        r = page.request.post(secure_console.url + path, form={**form, "csrf": token}, max_redirects=0)
        assert r.status == 403 and "read-only" in r.text(), (path, r.status, r.text())
    topics = AdminClient({"bootstrap.servers": secure_console.broker.bootstrap}).list_topics(timeout=TIMEOUT).topics
    assert "ro-topic" not in topics and "alice-topic" in topics
    page.click("nav a:text-is('ACLs')")
    expect(page.locator("#acls tbody tr")).to_have_count(1)
    expect(page.locator("#acls tbody tr td")).to_have_text(["TOPIC", "alice-topic", "LITERAL", "User:alice", "*",
                                                            "DESCRIBE", "ALLOW"])
    shot(page, "acls")
    page.goto(secure_console.url + "/brokers")
    page.fill("#filter", "sasl.jaas.config")
    page.click("form.filter button")
    expect(page.locator("#configs tbody")).to_contain_text("[hidden]")
    assert "admin-secret" not in page.content() and "alice-secret" not in page.content()
    shot(page, "brokers")


def test_http_basic_logs_in_too(secure_console: Console) -> None:
    ok = httpx.get(secure_console.url + "/", auth=("alice", "alice-secret"), timeout=TIMEOUT)
    assert ok.status_code == 200 and 'id="cluster-id"' in ok.text
    # Every page as a user with next to no ACLs: answered (with the broker's refusals shown), the broker alive.
    for path in ("/topics", "/topics/alice-topic", "/topics/secret-topic", "/topics/alice-topic/messages?partition=0",
                 "/topics/secret-topic/messages?partition=0", "/groups", "/groups/some-group", "/acls", "/users",
                 "/brokers"):
        r = httpx.get(secure_console.url + path, auth=("alice", "alice-secret"), timeout=TIMEOUT)
        assert r.status_code == 200, (path, r.status_code, r.text[-500:])
    assert secure_console.broker.proc is not None and secure_console.broker.proc.poll() is None
    refused = httpx.get(secure_console.url + "/", auth=("alice", "wrong"), timeout=TIMEOUT)
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic")
    # A SCRAM user logs in the same way (the console tries the listener's mechanisms in turn).
    admin = AdminClient({"bootstrap.servers": secure_console.broker.bootstrap})
    for f in admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
            "scrammy", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"scram-secret")]).values():
        f.result(TIMEOUT)
    scram = httpx.get(secure_console.url + "/users", auth=("scrammy", "scram-secret"), timeout=TIMEOUT)
    assert scram.status_code == 200 and 'id="user">scrammy<' in scram.text
    # Listing SCRAM users needs DESCRIBE on the cluster: the page says so (and the broker keeps running).
    assert "CLUSTER_AUTHORIZATION_FAILED" in scram.text
    assert secure_console.broker.proc is not None and secure_console.broker.proc.poll() is None
    assert httpx.get(secure_console.url + "/", auth=("scrammy", "alice-secret"), timeout=TIMEOUT).status_code == 401
    anonymous = httpx.get(secure_console.url + "/topics", timeout=TIMEOUT, follow_redirects=False)
    assert anonymous.status_code == 303 and anonymous.headers["location"] == "/login?next=/topics"
    assert not any("web console at" in x and "open to anyone" in x for x in secure_console.broker.log().splitlines())


