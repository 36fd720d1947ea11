"""A broker behind compat's recording proxy, so a test can check which API versions a client really sent."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.support.broker import BrokerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]


class Proxied:
    """A broker advertising a recording proxy's port, so every client connection goes through it."""

    def __init__(self, broker: BrokerProcess, proxy: subprocess.Popen[bytes], port: int, record: Path) -> None:
        self.broker = broker
        self.proxy = proxy
        self.bootstrap = f"127.0.0.1:{port}"
        self.record = record

    def versions(self, client_id: str, *, prefix: bool = False) -> set[tuple[int, int]]:
        """(api_key, api_version) pairs sent by that client id (or any id starting with it)."""
        lines = self.record.read_text().splitlines() if self.record.exists() else []
        return {(d["api_key"], d["api_version"]) for d in map(json.loads, lines)
                if (str(d["client_id"]).startswith(client_id) if prefix else d["client_id"] == client_id)}


@contextlib.contextmanager
def proxied_broker(base: Path, name: str, overrides: dict[str, str], register: Callable[[BrokerProcess], None],
                   wait_until: Callable[..., object]) -> Iterator[Proxied]:
    """Start a broker in ``base/name`` and a recording proxy in front of it; ``register`` lets the
    caller's factory kill the broker at teardown."""
    proxy_port, broker_port = free_port(), free_port()
    b = BrokerProcess(base / name, {
        "listeners": f"PLAINTEXT://127.0.0.1:{broker_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy_port}",
        **overrides,
    }, port=broker_port)
    register(b)
    b.start()
    record = base / f"{name}-requests.jsonl"
    proxy = subprocess.Popen([sys.executable, "-m", "compat.proxy", "--listen", f"127.0.0.1:{proxy_port}",
                              "--upstream", f"127.0.0.1:{broker_port}", "--record", str(record)], cwd=ROOT)
    try:
        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", proxy_port), timeout=1).close()
                return True
            except OSError:
                return False
        wait_until(listening, timeout=15, what="the recording proxy")
        yield Proxied(b, proxy, proxy_port, record)
    finally:
        proxy.terminate()
        proxy.wait(10)
