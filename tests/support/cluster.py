"""A ZooKeeper-coordinated pykbroker cluster for tests: a real ZooKeeper plus N broker subprocesses.

Brokers are numbered from 1 and each has its own data directory and free loopback port, so tests
can SIGTERM (controlled shutdown), SIGKILL, SIGSTOP or restart any of them. Every wait here is
bounded in time and in rounds.

With ``network=True`` each ZooKeeper server (``zk1``...) and broker (``b1``...) runs in a network namespace of
its own (tests/support/netns.py), listening and advertising on that namespace's address, so that tests can
partition them (``cluster.network.cut``/``partition``/``heal``); the test's clients reach them from its own
namespace.
"""

from __future__ import annotations

import signal
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pykbroker.protocol import codec
from pykbroker.testing import wire
from tests.support.broker import BrokerProcess
from tests.support.netns import Network
from tests.support.zookeeper import ZooKeeperEnsemble

T = TypeVar("T")

# Internal topics as a 3-broker Kafka cluster has them, a fast first rebalance, and short timeouts so
# that failures are detected within a test's patience.
CLUSTER_DEFAULTS = {
    "group.initial.rebalance.delay.ms": "0",
    "zookeeper.session.timeout.ms": "6000",
    "replica.lag.time.max.ms": "4000",
    "offsets.topic.num.partitions": "6",
    "transaction.state.log.num.partitions": "6",
    "controlled.shutdown.retry.backoff.ms": "500",
    "log.flush.offset.checkpoint.interval.ms": "1000",
}


def wait_for(fn: Callable[[], T | None], *, timeout: float = 20.0, interval: float = 0.1, what: str = "it") -> T:
    """Poll ``fn`` until it returns something truthy; bounded in time and in attempts."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    for _ in range(int(timeout / interval) + 2):
        last = fn()
        if last:
            return last
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def request_frame(api_key: int, version: int, body: dict[str, Any], correlation_id: int = 7,
                  client_id: str = "cluster-test") -> bytes:
    """A whole request frame (size prefix included) of a flexible version (request header v2)."""
    cid = client_id.encode()
    header = struct.pack(">hhih", api_key, version, correlation_id, len(cid)) + cid + b"\x00"
    payload = header + codec.encode_entity(codec.build(codec.request_class(api_key, version), body))
    return struct.pack(">i", len(payload)) + payload


def read_frame(s: socket.socket) -> bytes:
    """One size-prefixed response frame (correlation id and header included)."""
    size = struct.unpack(">i", recv_exact(s, 4))[0]
    return recv_exact(s, size)


def raw_request(bootstrap: str, api_key: int, version: int, body: dict[str, Any], *, timeout: float = 10.0,
                client_id: str = "cluster-test") -> Any:
    """One flexible-version request on a fresh connection (no client library in the way); its response."""
    return wire.request(bootstrap.split(",")[0], api_key, version, body, timeout, client_id=client_id)


def metadata(bootstrap: str, topics: list[str] | None = None, timeout: float = 5.0) -> Any:
    """One Metadata v12 request on a fresh connection (no client library caching in the way)."""
    return wire.metadata(bootstrap.split(",")[0], topics, timeout)


recv_exact = wire.recv_exact


class Cluster:
    """ZooKeeper (standalone or an ensemble) and ``size`` brokers with ids 1..size."""

    def __init__(self, base: Path, size: int = 3, *, zk_size: int = 1,
                 overrides: dict[str, str] | None = None,
                 broker_overrides: dict[int, dict[str, str]] | None = None, network: bool = False) -> None:
        self.base = base
        zk_ids = range(1, zk_size + 1)
        self.network = Network([f"zk{i}" for i in zk_ids] + [f"b{i}" for i in range(1, size + 1)]) \
            if network else None
        net = self.network
        self.zk = ZooKeeperEnsemble(
            base / "zookeeper", zk_size,
            hosts={i: net.address(f"zk{i}") for i in zk_ids} if net else None,
            launchers={i: net.exec_prefix(f"zk{i}") for i in zk_ids} if net else None)
        self.overrides = {**CLUSTER_DEFAULTS, **(overrides or {})}
        self.brokers: dict[int, BrokerProcess] = {}
        for broker_id in range(1, size + 1):
            self.brokers[broker_id] = BrokerProcess(
                base / f"broker{broker_id}",
                {"broker.id": str(broker_id), "zookeeper.connect": self.zk.connect, **self.overrides,
                 **(broker_overrides or {}).get(broker_id, {})},
                host=net.address(f"b{broker_id}") if net else "127.0.0.1",
                launcher=net.exec_prefix(f"b{broker_id}") if net else None)

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values())

    def broker(self, broker_id: int) -> BrokerProcess:
        return self.brokers[broker_id]

    def running(self) -> list[int]:
        return [i for i, b in self.brokers.items() if b.proc is not None and b.proc.poll() is None]

    def any_bootstrap(self, exclude: tuple[int, ...] = ()) -> str:
        return next(self.brokers[i].bootstrap for i in self.running() if i not in exclude)

    def start(self, timeout: float = 60.0) -> Cluster:
        if self.network is not None:
            self.network.open()
        self.zk.start()
        for b in self.brokers.values():
            b.start(timeout)
        self.wait_registered(list(self.brokers), timeout=timeout)
        return self

    def wait_registered(self, ids: list[int], timeout: float = 30.0) -> None:
        """Until a broker's Metadata lists exactly ``ids`` and names a controller."""
        def ready() -> bool:
            try:
                md = metadata(self.any_bootstrap(), [])
            except (OSError, ConnectionError, StopIteration):
                return False
            return sorted(b.node_id for b in md.brokers) == sorted(ids) and md.controller_id in ids
        wait_for(ready, timeout=timeout, what=f"brokers {ids} registered with a controller")

    def controller_id(self) -> int:
        return int(metadata(self.any_bootstrap(), []).controller_id)

    def leaders(self, topic: str, via: int | None = None) -> dict[int, int]:
        bootstrap = self.brokers[via].bootstrap if via else self.any_bootstrap()
        md = metadata(bootstrap, [topic])
        return {p.partition_index: p.leader_id for t in md.topics for p in t.partitions}

    def partition_states(self, topic: str, via: int | None = None) -> dict[int, tuple[int, int, list[int]]]:
        """partition -> (leader, leader epoch, isr) as one broker's Metadata shows it."""
        bootstrap = self.brokers[via].bootstrap if via else self.any_bootstrap()
        md = metadata(bootstrap, [topic])
        return {p.partition_index: (p.leader_id, p.leader_epoch, sorted(p.isr_nodes))
                for t in md.topics for p in t.partitions}

    def wait_leaders(self, topic: str, partitions: int, *, timeout: float = 30.0,
                     exclude: tuple[int, ...] = ()) -> dict[int, int]:
        """Until every running broker agrees on a live leader (not in ``exclude``) for every partition."""
        def agreed() -> dict[int, int] | None:
            views = []
            for i in self.running():
                try:
                    views.append(self.leaders(topic, via=i))
                except (OSError, ConnectionError):
                    return None
            if not views or any(v != views[0] for v in views):
                return None
            view = views[0]
            ok = len(view) == partitions and all(
                leader in self.running() and leader not in exclude for leader in view.values())
            return view if ok else None
        return wait_for(agreed, timeout=timeout, what=f"leaders of {topic} agreed by all brokers")

    def kill(self, broker_id: int) -> None:
        self.brokers[broker_id].kill()

    def stop(self, broker_id: int, timeout: float = 60.0) -> int:
        return self.brokers[broker_id].stop(timeout)

    def pause(self, broker_id: int) -> None:
        proc = self.brokers[broker_id].proc
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)

    def resume(self, broker_id: int) -> None:
        proc = self.brokers[broker_id].proc
        assert proc is not None
        proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        for b in self.brokers.values():
            if b.proc is not None and b.proc.poll() is None:
                try:
                    b.proc.send_signal(signal.SIGCONT)
                except OSError:
                    pass
            b.kill()
        self.zk.kill()
        if self.network is not None:
            self.network.close()

    def logs(self) -> str:
        return "\n".join(f"==== broker {i}\n{b.log()[-6000:]}" for i, b in self.brokers.items())

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
