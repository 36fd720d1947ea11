"""Listening sockets for the HTTP services the broker serves beside Kafka (the schema registry, the web console).

Made with ``IPPROTO_TCP`` as their protocol: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on accepted
sockets whose protocol says TCP, and a plain ``socket(family, SOCK_STREAM)`` says 0. With Nagle on, a response
written as headers then body waits for the client's delayed acknowledgement: about 40 ms per request on a
keep-alive connection."""

from __future__ import annotations

import socket


def listen(host: str, port: int, what: str, backlog: int = 128) -> socket.socket:
    """A bound, listening socket on ``host``:``port`` (0 picks a port); ``what`` names the setting in errors."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {what}: {exc.strerror or exc}") from exc
    return sock
