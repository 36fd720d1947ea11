"""Reaching ZooKeeper and writing to it atomically: what the broker's metadata store, its
controller and ``pykbroker scram`` share.

A client rooted at the chroot of ``zookeeper.connect`` (created first, as Kafka's brokers do),
the commit of a multi that raises its first failed operation, and the read-modify-write of
entity config znodes with their ``/config/changes`` notification, as Kafka's tools write them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    RolledBackError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

from pykbroker.metadata import zk_layout as zl
from pykbroker.metadata.zk_layout import parse_connect
from pykbroker.security.sasl.scram import ScramCredential

__all__ = ["UNAVAILABLE", "WRITE_RETRIES", "ZkConnectError", "commit", "edit_entity_configs",
           "scram_edits", "scram_entries", "start_client"]

# Bounded retries of conditional writes that lost a race (BadVersion / NodeExists).
WRITE_RETRIES = 20

# kazoo's errors that mean ZooKeeper is not reachable now (rather than a refused operation).
UNAVAILABLE = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, OperationTimeoutError,
               KazooTimeoutError)


class ZkConnectError(Exception):
    """ZooKeeper could not be reached within zookeeper.connection.timeout.ms."""


_RETRY = {"max_tries": -1, "delay": 0.05, "backoff": 2, "max_delay": 1.0}


def start_client(connect: str, session_timeout_ms: int, connection_timeout_ms: int,
                 listener: Callable[[str], None] | None = None) -> KazooClient:
    """A started kazoo client rooted at the chroot of ``connect`` (created first when missing, as Kafka's
    brokers do); raises ZkConnectError when ZooKeeper is not reached within ``connection_timeout_ms``."""
    hosts, chroot = parse_connect(connect)
    deadline = time.monotonic() + connection_timeout_ms / 1000.0
    if chroot:
        _create_chroot(connect, session_timeout_ms, connection_timeout_ms, deadline)
    zk = KazooClient(hosts=hosts + chroot, timeout=session_timeout_ms / 1000.0, connection_retry=_RETRY,
                     logger=logging.getLogger("kazoo.client"))
    if listener is not None:
        zk.add_listener(listener)
    _start(zk, connect, connection_timeout_ms, deadline)
    return zk


def _start(zk: KazooClient, connect: str, connection_timeout_ms: int, deadline: float) -> None:
    try:
        zk.start(timeout=max(deadline - time.monotonic(), 0.05))
    except KazooTimeoutError:
        raise ZkConnectError(
            f"Timed out waiting for connection while in state: CONNECTING (zookeeper.connect={connect}, "
            f"waited {connection_timeout_ms} ms: zookeeper.connection.timeout.ms)") from None
    except KazooException as e:
        zk.stop()
        zk.close()
        raise ZkConnectError(f"cannot connect to ZooKeeper {connect}: {e}") from None


def _create_chroot(connect: str, session_timeout_ms: int, connection_timeout_ms: int, deadline: float) -> None:
    """Create the chroot path, as Kafka does, with a client not rooted there."""
    hosts, chroot = parse_connect(connect)
    boot = KazooClient(hosts=hosts, timeout=session_timeout_ms / 1000.0, connection_retry=_RETRY)
    _start(boot, connect, connection_timeout_ms, deadline)
    try:
        boot.ensure_path(chroot)
    except UNAVAILABLE as e:
        raise ZkConnectError(f"cannot create the chroot {chroot} in ZooKeeper {hosts}: "
                             f"{type(e).__name__}") from None
    finally:
        boot.stop()
        boot.close()


def commit(tx: Any, timeout: float) -> list[Any]:
    """Commit a multi; raise the first failed operation's exception."""
    results = list(tx.commit_async().get(timeout=timeout))
    for r in results:
        if isinstance(r, Exception) and not isinstance(r, RolledBackError):
            raise r
    return results


def edit_entity_configs(zk: KazooClient, changes: dict[str, dict[str, str | None]], timeout: float) -> bool:
    """Set (or, for None, remove) keys of entity config znodes (/config/users/<u>...) in one multi with a
    /config/changes notification each, as Kafka's tools write them, keeping the keys not named (quotas and
    SCRAM credentials share a user's znode); retried when it lost a race. False when it kept losing."""
    for _ in range(WRITE_RETRIES):
        tx = zk.transaction()
        for path, ops in changes.items():
            try:
                data, stat = zk.get(path)
                current = zl.decode_entity_config(data)
                version: int | None = stat.version
            except NoNodeError:
                current, version = {}, None
            for key, value in ops.items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = value
            if version is None:
                tx.create(path, zl.encode_entity_config(current))
            else:
                tx.set_data(path, zl.encode_entity_config(current), version=version)
            tx.create(zl.CONFIG_CHANGE_PREFIX, zl.encode_config_change(zl.config_change_entity(path)),
                      sequence=True)
        try:
            commit(tx, timeout)
        except (BadVersionError, NodeExistsError, NoNodeError):
            continue
        return True
    return False


def scram_edits(upserts: dict[tuple[str, str], ScramCredential],
                deletions: list[tuple[str, str]]) -> dict[str, dict[str, str | None]]:
    """user -> SCRAM config key -> Kafka's credential string (None: delete), for edit_entity_configs."""
    changes: dict[str, dict[str, str | None]] = {}
    for user, mech in deletions:
        changes.setdefault(user, {})[mech] = None
    for (user, mech), cred in upserts.items():
        changes.setdefault(user, {})[mech] = cred.to_kafka_string()
    return changes


def scram_entries(configs: dict[str, str]) -> dict[str, str]:
    """The SCRAM credentials among a /config/users/<u> znode's configs (the rest are quotas)."""
    return {k: v for k, v in configs.items() if k.startswith("SCRAM-SHA-")}
