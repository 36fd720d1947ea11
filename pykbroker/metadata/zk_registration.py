"""This broker's ephemeral znodes: its registration under /brokers/ids and its controlled-shutdown
request, owned by its ZooKeeper session and re-created when a new session replaces the old one.

A broker restarted right after being killed finds its previous run's registration until that
session expires: when the znode names the same endpoints, registration waits (up to the session
timeout) for it to go; another broker's registration is a DuplicateBrokerId.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import WatchedEvent

from pykbroker.metadata import zk_layout as zl

__all__ = ["DuplicateBrokerId", "create_own_ephemeral", "ensure_registered", "register_broker", "session_id"]

log = logging.getLogger("pykbroker.metadata.zookeeper")  # the store's lines, wherever its code lives


class DuplicateBrokerId(Exception):
    """Another live broker holds /brokers/ids/<broker.id>."""


def session_id(zk: KazooClient) -> int:
    client_id = zk.client_id
    return int(client_id[0]) if client_id else -1


def register_broker(zk: KazooClient, broker_id: int, data: bytes, endpoints: list[tuple[str, str, int]],
                    chroot: str, session_timeout_ms: int) -> None:
    """Create the ephemeral /brokers/ids/<id> (``data``), or find it ours already; DuplicateBrokerId when
    another broker holds it."""
    path = zl.broker_path(broker_id)
    wait = session_timeout_ms / 1000.0 + 2.0
    deadline: float | None = None
    for _ in range(10_000):
        try:
            zk.create(path, data, ephemeral=True)
            log.info("registered broker %(broker_id)d at %(chroot)s%(path)s",
                     {"broker_id": broker_id, "chroot": chroot, "path": path})
            return
        except NodeExistsError:
            pass
        try:
            old, stat = zk.get(path)
        except NoNodeError:
            continue
        if stat.ephemeralOwner == session_id(zk):
            return
        try:
            other = zl.decode_broker(broker_id, old).endpoints
        except (ValueError, KeyError, TypeError):
            other = ()
        described = ", ".join(f"{n}://{h}:{p}" for n, h, p in other) or "unreadable registration"
        message = (f"Broker id {broker_id} is already registered in ZooKeeper at "
                   f"{chroot}{path} by another broker ({described})")
        if set(other) != set(endpoints):
            raise DuplicateBrokerId(message)
        now = time.monotonic()
        if deadline is None:
            deadline = now + wait
            log.warning("%(chroot)s%(path)s still holds the registration of a previous run of broker "
                        "%(broker_id)d with the same endpoints; waiting up to %(wait).0f s for its ZooKeeper "
                        "session to expire",
                        {"chroot": chroot, "path": path, "broker_id": broker_id, "wait": wait})
        if now >= deadline:
            raise DuplicateBrokerId(f"{message}; it did not expire within {wait:.0f} s")
        gone = threading.Event()
        if zk.exists(path, watch=_setter(gone)) is not None:
            gone.wait(min(deadline - now, 1.0))
    raise DuplicateBrokerId(f"Broker id {broker_id}: could not register at {chroot}{path}")


def ensure_registered(zk: KazooClient, broker_id: int, data: bytes, chroot: str) -> None:
    """Register again with a new session (the old session's znode went with it); logged when another
    session holds it."""
    path = zl.broker_path(broker_id)
    try:
        zk.create(path, data, ephemeral=True)
        log.info("re-registered broker %(broker_id)d at %(chroot)s%(path)s with the new ZooKeeper session",
                 {"broker_id": broker_id, "chroot": chroot, "path": path})
    except NodeExistsError:
        stat = zk.exists(path)
        if stat is not None and stat.ephemeralOwner != session_id(zk):
            log.error("broker id %(broker_id)d is registered at %(chroot)s%(path)s by another ZooKeeper session; "
                      "this broker is not registered",
                      {"broker_id": broker_id, "chroot": chroot, "path": path})


def create_own_ephemeral(zk: KazooClient, path: str, data: bytes) -> None:
    try:
        zk.create(path, data, ephemeral=True, makepath=True)
    except NodeExistsError:
        stat = zk.exists(path)
        if stat is not None and stat.ephemeralOwner != session_id(zk):
            # Left by an earlier ZooKeeper session of this broker: replace it with ours.
            try:
                zk.delete(path, version=stat.version)
                zk.create(path, data, ephemeral=True, makepath=True)
            except (NoNodeError, NodeExistsError, BadVersionError):
                log.warning("could not take over %(path)s from another ZooKeeper session", {"path": path})


def _setter(event: threading.Event) -> Callable[[WatchedEvent], None]:
    return lambda _e: event.set()
