"""The ``pykbroker`` command: ``serve`` runs a broker, ``healthcheck`` asks one if it is alive."""

from __future__ import annotations

import argparse
import logging
import socket
import struct
import sys

from pykbroker import __version__

log = logging.getLogger("pykbroker")


def _serve(args: argparse.Namespace) -> int:
    # Imported here so that `pykbroker healthcheck` (run every few seconds by containers) stays light.
    import anyio

    from pykbroker import logsetup
    from pykbroker.config import ConfigError, load_config

    logsetup.configure(args.log_level)
    try:
        config = load_config(args.config, args.override or [])
    except ConfigError as e:
        log.error("invalid configuration: %s", e)
        print(f"pykbroker: invalid configuration: {e}", file=sys.stderr)
        return 2
    from pykbroker.server.broker import Broker

    try:
        broker = Broker(config)
        anyio.run(broker.run)
    except OSError as e:
        log.error("cannot start: %s", e)
        return 1
    return 0


def healthcheck(bootstrap: str, timeout: float) -> bool:
    """An ApiVersions v0 round trip: the broker answers with error code 0 and a non-empty API list."""
    host, _, port = bootstrap.rpartition(":")
    request = struct.pack(">hhih", 18, 0, 1, len(b"healthcheck")) + b"healthcheck"
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack(">i", len(request)) + request)
            size_bytes = _recv_exact(sock, 4)
            (size,) = struct.unpack(">i", size_bytes)
            if not 0 < size < 1 << 20:
                return False
            body = _recv_exact(sock, size)
    except (OSError, ValueError):
        return False
    correlation_id, error_code, count = struct.unpack_from(">ihi", body, 0)
    return correlation_id == 1 and error_code == 0 and count > 0


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ValueError("connection closed")
        buf += chunk
    return buf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pykbroker", description="A Kafka-compatible broker in Python")
    parser.add_argument("--version", action="version", version=f"pykbroker {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run a broker in the foreground")
    serve.add_argument("--config", help="a Kafka-style server.properties file")
    serve.add_argument("--override", action="append", metavar="KEY=VALUE",
                       help="set a config key (repeatable); wins over the file and PYKBROKER_* variables")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    health = sub.add_parser("healthcheck", help="exit 0 if the broker answers ApiVersions")
    health.add_argument("--bootstrap", default="127.0.0.1:9092")
    health.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    ok = healthcheck(args.bootstrap, args.timeout)
    print("healthy" if ok else "unhealthy")
    return 0 if ok else 1
