"""The console's pieces without a browser or a broker: how bytes are shown, paging, where it connects, and the
app's refusals (CSRF, read-only, login) through Starlette's TestClient — they come before any call to a cluster."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from pykbroker.config import load_config, parse_console_listener
from pykbroker.console.app import Access, Console, build_app, paginate
from pykbroker.console.cluster import render
from pykbroker.console.rates import MessagesInRate
from pykbroker.console.service import choose_access
from pykbroker.server.extra_services import BoundListener
from tests.support.broker import BrokerProcess, free_port
from tests.support.cluster import wait_for

ROOT = Path(__file__).resolve().parents[2]


def test_values_are_shown_as_json_text_or_hex() -> None:
    assert render(b'{"a":[1,2]}').kind == "json"
    assert render(b'{"a":[1,2]}').text == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    assert (render(b"hello world").kind, render(b"hello world").text) == ("text", "hello world")
    assert (render(b"\x00\xffab").kind, render(b"\x00\xffab").text) == ("hex", "00 ff 61 62")
    assert render(b"ctl\x01char").kind == "hex"  # valid UTF-8, but not something to print
    assert render(b"{not json").kind == "text"
    assert render(None).kind == "null"
    assert render(b"42").kind == "json"


def test_pages_never_hold_more_than_their_size() -> None:
    rows = list(range(10_000))
    shown, page = paginate(rows, 7, 100)
    assert shown == list(range(600, 700)) and (page.number, page.pages, page.total) == (7, 100, 10_000)
    assert paginate(rows, 1_000, 100)[0] == list(range(9_900, 10_000))  # past the end: the last page
    assert paginate([], 3, 50)[1].pages == 1


def test_listener_setting_is_checked_at_start(tmp_path: Path) -> None:
    assert parse_console_listener("http://127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_console_listener("0.0.0.0:0") == ("0.0.0.0", 0)
    for bad in ("https://127.0.0.1:8080", "127.0.0.1", "http://127.0.0.1:8080/console"):
        with pytest.raises(ValueError, match="pykbroker.console.listener"):
            parse_console_listener(bad)
    p = subprocess.run([sys.executable, "-m", "pykbroker", "serve", "--override", f"log.dirs={tmp_path}",
                        "--override", "pykbroker.console.listener=https://127.0.0.1:8080"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and "pykbroker.console.listener" in p.stderr + p.stdout


def test_the_console_logs_in_on_a_sasl_listener_and_is_open_on_plaintext(tmp_path: Path) -> None:
    config = load_config(None, [f"log.dirs={tmp_path}", "sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512",
                                "listeners=PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://0.0.0.0:0"])
    plain = BoundListener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092)
    sasl = BoundListener("SASL_PLAINTEXT", "SASL_PLAINTEXT", "0.0.0.0", 9093)
    access, chosen = choose_access(config, (plain, sasl))
    assert chosen == sasl and access.needs_login and access.mechanisms == ("SCRAM-SHA-256", "SCRAM-SHA-512")
    assert access.properties == {"bootstrap.servers": "127.0.0.1:9093", "security.protocol": "SASL_PLAINTEXT"}
    access, chosen = choose_access(config, (plain,))
    assert chosen == plain and not access.needs_login
    with pytest.raises(ValueError, match="TLS listeners is not implemented"):
        choose_access(config, (BoundListener("SSL", "SSL", "127.0.0.1", 9094),))


def _client(read_only: bool, mechanisms: tuple[str, ...] = ()) -> TestClient:
    # Port 9 (discard) on loopback: nothing here may reach a cluster, and none of these requests needs one.
    access = Access({"bootstrap.servers": "127.0.0.1:9"}, mechanisms, timeout=1.0)
    return TestClient(build_app(Console(access, read_only=read_only, rates=MessagesInRate(None))),
                      follow_redirects=False)


def _token(client: TestClient) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text)
    assert found
    return found.group(1)


def test_posts_need_the_session_csrf_token() -> None:
    with _client(read_only=True, mechanisms=("PLAIN",)) as client:
        token = _token(client)
        assert client.post("/login", data={"username": "u", "password": "p"}).status_code == 403
        assert client.post("/login", data={"username": "u", "password": "p", "csrf": "x" + token}).status_code == 403
        assert client.post("/topics", data={"name": "t", "csrf": token}).status_code == 401  # not logged in
        assert client.get("/topics").headers["location"] == "/login?next=/topics"
    with _client(read_only=False) as client:  # open and writable: still no POST without the token
        r = client.post("/topics", data={"name": "t"})
        assert r.status_code == 403 and "CSRF" in r.text


def test_login_redirects_only_within_the_console() -> None:
    with _client(read_only=True, mechanisms=("PLAIN",)) as client:
        page = client.get("/login?next=//evil.example/x").text
        assert 'name="next" value="/"' in page


def test_console_runs_on_uvloop_and_stops_with_the_broker(tmp_path: Path) -> None:
    """uvicorn serves on the broker's own loop (here uvloop); SIGTERM stops both, the console first."""
    port = free_port()
    b = BrokerProcess(tmp_path, {"pykbroker.event.loop": "uvloop",
                                 "pykbroker.console.listener": f"http://127.0.0.1:{port}"})
    with b:
        url = f"http://127.0.0.1:{port}"
        page = wait_for(lambda: _get(url + "/"), timeout=30.0, what="the console's overview")
        assert 'id="cluster-id"' in page and "event_loop=uvloop" in b.log()
        assert b.stop() == 0
    assert _get(url + "/") is None  # the port is closed with the broker
    log = b.log()
    assert log.index("web console listening") < log.index("shutdown complete")


def _get(url: str) -> str | None:
    try:
        return httpx.get(url, timeout=5.0).text
    except httpx.HTTPError:
        return None
