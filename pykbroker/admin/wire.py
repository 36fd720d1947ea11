"""Where each request librdkafka's AdminClient cannot make goes: any broker, every broker, the controller (from
Metadata) or a group's or transaction's coordinator (FindCoordinator); connections are kept for the command's
life. Retriable answers (NOT_CONTROLLER, a coordinator still loading) are retried until the command's timeout."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .connection import Connection
from .errors import EXIT_FAILED, EXIT_UNREACHABLE, AdminError, error_name

METADATA, FIND_COORDINATOR = 3, 10
GROUP, TRANSACTION = 0, 1  # FindCoordinator's key types
NOT_CONTROLLER = 41
# Answers that mean "ask again shortly, perhaps elsewhere" (Kafka's retriable coordinator errors).
RETRIABLE = frozenset({14, 15, 16, 41})  # COORDINATOR_LOAD_IN_PROGRESS, _NOT_AVAILABLE, NOT_COORDINATOR, NOT_CONTROLLER

T = TypeVar("T")


class Retry(Exception):
    """A retriable answer: the routed request is sent again (to a freshly looked-up broker) until the timeout."""

    def __init__(self, code: int) -> None:
        super().__init__(error_name(code))
        self.code = code


class Wire:
    """The command's connections to the cluster, by address."""

    def __init__(self, props: Mapping[str, str], timeout: float) -> None:
        self.props = dict(props)
        self.timeout = timeout
        self.bootstrap = [a.strip() for a in self.props["bootstrap.servers"].split(",") if a.strip()]
        self._connections: dict[str, Connection] = {}

    def close(self) -> None:
        for c in self._connections.values():
            c.close()
        self._connections.clear()

    def connect(self, address: str) -> Connection:
        c = self._connections.get(address)
        if c is None:
            c = self._connections[address] = Connection(address, self.props, self.timeout)
        return c

    def any(self) -> Connection:
        """The first bootstrap broker that answers."""
        failures: list[AdminError] = []
        for address in self.bootstrap:
            try:
                return self.connect(address)
            except AdminError as e:
                if e.exit_code != EXIT_UNREACHABLE:
                    raise
                failures.append(e)
        # An authentication failure says more than a refused connection: show it first.
        failures.sort(key=lambda e: e.error != "SASL_AUTHENTICATION_FAILED")
        first = failures[0] if failures else None
        raise AdminError(f"no broker of {','.join(self.bootstrap)} answered: {first}", EXIT_UNREACHABLE,
                         error=first.error if first else "NETWORK_EXCEPTION")

    def metadata(self, topics: list[str] | None = None) -> Any:
        """Metadata (the brokers, the controller; ``topics``' partitions, None: every topic's)."""
        conn = self.any()
        body = {"topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
                "allow_auto_topic_creation": False, "include_topic_authorized_operations": False,
                "include_cluster_authorized_operations": False}
        _, response = conn.request(METADATA, body, minimum=1)
        return response

    def brokers(self) -> dict[int, str]:
        """Every broker's id and address."""
        return {int(b.node_id): f"{b.host}:{b.port}" for b in self.metadata([]).brokers}

    def controller(self) -> Connection:
        """The controller, which Kafka's cluster-changing requests go to."""
        md = self.metadata([])
        for b in md.brokers:
            if int(b.node_id) == int(md.controller_id):
                return self.connect(f"{b.host}:{b.port}")
        raise Retry(NOT_CONTROLLER)

    def coordinator(self, key: str, key_type: int) -> tuple[int, Connection]:
        """The broker that coordinates a group (GROUP) or a transactional id (TRANSACTION)."""
        conn = self.any()
        body = {"key": key, "key_type": key_type, "coordinator_keys": [key]}
        version, response = conn.request(FIND_COORDINATOR, body, minimum=1)
        found = response.coordinators[0] if version >= 4 else response
        code = int(found.error_code)
        if code in RETRIABLE:
            raise Retry(code)
        if code != 0:
            name = error_name(code)
            raise AdminError(f"FindCoordinator {key}: {name}" + (f": {found.error_message}" if found.error_message
                                                                  else ""), EXIT_FAILED, error=name)
        return int(found.node_id), self.connect(f"{found.host}:{found.port}")

    def retrying(self, what: str, call: Callable[[], T]) -> T:
        """``call`` until it does not raise Retry, at most until the command's timeout."""
        deadline = time.monotonic() + self.timeout
        delay = 0.05
        for _ in range(1000):
            try:
                return call()
            except Retry as e:
                last = e
            if time.monotonic() + delay > deadline:
                break
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        raise AdminError(f"{what}: {last} until the timeout ({self.timeout:g} s)", EXIT_UNREACHABLE, error=str(last))


def retriable(code: Any) -> None:
    """Raise Retry for a retriable error code (the caller's ``retrying`` asks again)."""
    if int(code) in RETRIABLE:
        raise Retry(int(code))


def ms(value: Any) -> int | None:
    """Milliseconds of a kio duration or instant (timedelta, datetime) or an int."""
    if value is None:
        return None
    if hasattr(value, "total_seconds"):
        return int(value.total_seconds() * 1000)
    if hasattr(value, "timestamp"):
        return int(value.timestamp() * 1000)
    return int(value)
