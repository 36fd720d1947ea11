"""The web console as a service of the broker (pykbroker.console.listener): uvicorn serving the app on the
broker's own event loop, registered into the broker's extra services at start.

It reaches the cluster as a Kafka client of this broker: through its SASL_PLAINTEXT listener (PLAIN or SCRAM) when
it has one, so that each person logs in as a Kafka user; else through a PLAINTEXT listener, open to anyone who
reaches the console (said at start with a WARN)."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator

import anyio
import anyio.to_thread
import uvicorn

from pykbroker import tcp
from pykbroker.config import BrokerConfig, parse_console_listener
from pykbroker.logsetup import fields
from pykbroker.server.extra_services import BoundListener, StartedBroker

from .app import Access, Console, build_app
from .rates import MessagesInRate

log = logging.getLogger("pykbroker.console")
LOGIN_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
RATE_INTERVAL_S = 5.0
CLOSE_TIMEOUT_S = 5.0


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0") else ("::1" if host == "::" else host)


def choose_access(config: BrokerConfig, listeners: tuple[BoundListener, ...]) -> tuple[Access, BoundListener]:
    """The listener the console connects to, and whether logins go through SASL. ValueError when the broker has
    no listener the console can use (TLS listeners need client settings the console does not have)."""
    for lst in listeners:
        if lst.security_protocol != "SASL_PLAINTEXT":
            continue
        enabled = config.listener_value(lst.name, "sasl.enabled.mechanisms") or config["sasl.enabled.mechanisms"]
        enabled = [m.strip().upper() for m in enabled]
        mechanisms = tuple(m for m in enabled if m in LOGIN_MECHANISMS)
        if mechanisms:
            props = {"bootstrap.servers": f"{_client_host(lst.host)}:{lst.port}",
                     "security.protocol": "SASL_PLAINTEXT"}
            return Access(props, mechanisms), lst
    for lst in listeners:
        if lst.security_protocol == "PLAINTEXT":
            return Access({"bootstrap.servers": f"{_client_host(lst.host)}:{lst.port}"}, ()), lst
    raise ValueError("pykbroker.console.listener needs a PLAINTEXT listener, or a SASL_PLAINTEXT listener with "
                     "PLAIN or SCRAM, to reach the cluster through: the console over TLS listeners is not "
                     "implemented")


class ConsoleService:
    """An `ExtraService` of the broker."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.listener = str(config["pykbroker.console.listener"])
        self.host, self.port = parse_console_listener(self.listener)
        self.read_only = bool(config["pykbroker.console.read.only"])
        self.console: Console | None = None
        self._server: _Server | None = None
        self._sock: socket.socket | None = None
        self._done = anyio.Event()

    async def open(self, broker: StartedBroker) -> None:
        access, lst = choose_access(self.config, broker.listeners)
        metrics = f"http://127.0.0.1:{broker.metrics_port}/metrics" if broker.metrics_port else None
        self.console = Console(access, read_only=self.read_only, rates=MessagesInRate(metrics))
        sock = tcp.listen(self.host, self.port, f"pykbroker.console.listener={self.listener}")
        self._sock = sock
        self.port = sock.getsockname()[1]
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)  # its start and stop lines repeat ours
        for name in ("pykbroker.admin.rdkafka", "pykbroker.console.rdkafka"):  # a refused login is not news
            logging.getLogger(name).propagate = False
            logging.getLogger(name).addHandler(logging.NullHandler())
        url = f"http://{f'[{self.host}]' if ':' in self.host else self.host}:{self.port}/"
        log.info("web console listening on %(url)s", {"url": url},
                 extra=fields(listener=lst.name, read_only=self.read_only))
        if not access.needs_login:
            log.warning("the web console at %(url)s is open to anyone who reaches it: the broker has no "
                        "SASL_PLAINTEXT listener with PLAIN or SCRAM to log its users in, so it acts as ANONYMOUS "
                        "on listener %(listener)s%(writes)s", {
                            "url": url, "listener": lst.name,
                            "writes": "" if self.read_only else ", with writes allowed (pykbroker.console.read.only"
                                                                "=false)"})

    async def serve(self) -> None:
        assert self.console is not None and self._sock is not None
        app = build_app(self.console)
        server = _Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
                                        server_header=False, proxy_headers=False))
        self._server = server
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._sample_rates)
                await server.serve(sockets=[self._sock])
                tg.cancel_scope.cancel()
        finally:
            self._done.set()

    async def _sample_rates(self) -> None:
        assert self.console is not None
        rates = self.console.rates
        if rates.url is None:
            return
        while True:
            await anyio.to_thread.run_sync(rates.sample, abandon_on_cancel=True)
            await anyio.sleep(RATE_INTERVAL_S)

    async def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            with anyio.move_on_after(CLOSE_TIMEOUT_S):
                await self._done.wait()
        if self.console is not None:
            await anyio.to_thread.run_sync(self.console.sessions.close)
            await anyio.to_thread.run_sync(self.console.basic.close)
        if self._sock is not None:
            self._sock.close()


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the broker owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
