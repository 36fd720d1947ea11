"""The ``pykbroker`` command: ``serve`` runs a broker, ``healthcheck`` asks one if it is alive, ``zookeeper``
sets up and runs the ZooKeeper a cluster needs, ``scram`` writes SCRAM users where the brokers read them.

Each subcommand imports what it needs inside its function: ``healthcheck`` runs every few seconds in
containers and must start fast, so nothing of the broker is loaded at import time."""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import socket
import struct
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pykbroker import __version__, logsetup
from pykbroker.admin import COMMANDS as ADMIN_COMMANDS
from pykbroker.admin import COMPLETE_VAR
from pykbroker.logsetup import fields

if TYPE_CHECKING:
    from pykbroker.config import BrokerConfig
    from pykbroker.metadata.scram_admin import CredentialRequest

log = logging.getLogger("pykbroker")


def _serve(args: argparse.Namespace) -> int:
    # Imported here so that `pykbroker healthcheck` (run every few seconds by containers) stays light.
    import anyio

    from pykbroker.config import ConfigError, load_config

    logsetup.configure(args.log_level)
    # Each failure is told once, as one log line with its cause (no traceback for a user's mistake).
    try:
        config = load_config(args.config, args.override or [])
    except ConfigError as e:
        log.error("invalid configuration: %(error)s", {"error": e})
        return 2
    logsetup.configure(args.log_level, config["pykbroker.log.format"], config["pykbroker.log.levels"])
    if args.log_broker_id is not None:  # a child of `serve --processes`
        from pykbroker.multiprocess.logtag import tag_log_lines

        tag_log_lines(args.log_broker_id)
    if args.processes is not None:
        return _serve_processes(args, config)
    if config.no_effect_keys():
        log.info("settings accepted with no effect on this broker (see README 'Settings not implemented')",
                 extra=fields(settings=",".join(config.no_effect_keys())))
    from pykbroker.server.allocator import tune_allocator
    from pykbroker.server.broker import Broker, StartupError
    from pykbroker.server.cpu_slice import SliceUnavailable, apply_time_slice
    from pykbroker.server.gil import set_switch_interval

    tune_allocator()
    set_switch_interval(config["pykbroker.gil.switch.interval.us"])
    try:  # before the broker starts its threads, which inherit it
        apply_time_slice(config["pykbroker.scheduler.slice.us"],
                         explicit=config.is_explicit("pykbroker.scheduler.slice.us"))
    except SliceUnavailable as e:
        log.error("cannot start: pykbroker.scheduler.slice.us cannot be applied: %(error)s", {"error": e},
                  extra=fields(setting="pykbroker.scheduler.slice.us", value=config["pykbroker.scheduler.slice.us"]))
        return 1

    backend_options: dict[str, Any] = {}
    if config["pykbroker.event.loop"] == "uvloop":
        try:
            import uvloop  # noqa: F401
        except ImportError:
            log.error("cannot start: pykbroker.event.loop=uvloop but uvloop is not installed "
                      "(pip install 'pykbroker[uvloop]')")
            return 1
        backend_options["use_uvloop"] = True
    try:
        broker = Broker(config)
        if config["pykbroker.console.listener"]:  # the web console runs in the broker's task group
            from pykbroker.console.service import ConsoleService

            broker.extra_services.append(ConsoleService(config))
        anyio.run(broker.run, backend_options=backend_options)
    except (OSError, StartupError) as e:
        log.error("cannot start: %(error)s", {"error": e})
        return 1
    except BaseExceptionGroup as eg:  # anyio's task group wraps a failing listener's OSError
        matched, rest = eg.split(OSError)
        if matched is None or rest is not None:
            raise
        log.error("cannot start: %(error)s", {"error": '; '.join(str(e) for e in _leaves(matched))})
        return 1
    return 0


def _serve_processes(args: argparse.Namespace, config: BrokerConfig) -> int:
    """``--processes N``: N brokers of the ZooKeeper cluster on this host (pykbroker/multiprocess)."""
    from pykbroker.config import ConfigError, load_config
    from pykbroker.multiprocess.plan import plan_processes
    from pykbroker.multiprocess.supervisor import Supervisor, child_command

    try:
        plans = plan_processes(config, args.processes, socket.gethostname())
        for plan in plans:  # each child's whole configuration must pass before any child starts
            load_config(args.config, [*(args.override or []), *(f"{k}={v}" for k, v in plan.overrides.items())])
    except ConfigError as e:
        log.error("invalid configuration: %(error)s", {"error": e})
        return 2
    log.info("starting brokers under this process",
             extra=fields(brokers=len(plans), broker_ids=",".join(str(p.broker_id) for p in plans)))
    base = child_command(args.config, args.override or [], args.log_level)
    return Supervisor(plans, base, max_restarts=args.max_restarts).run()


def _leaves(eg: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for e in eg.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


class _Unhealthy(Exception):
    """Why the broker did not pass the check, as printed after ``unhealthy:``."""


def check_health(bootstrap: str, timeout: float) -> str | None:
    """An ApiVersions v0 round trip; None if the broker answered with error code 0 and a non-empty
    API list, else the reason, so that a failing container health check says what failed."""
    host, sep, port_text = bootstrap.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not sep or not port_text.isdigit():
        return f"invalid bootstrap address {bootstrap!r}: expected HOST:PORT"
    where = f"{host}:{port_text}"
    request = struct.pack(">hhih", 18, 0, 1, len(b"healthcheck")) + b"healthcheck"
    try:
        with socket.create_connection((host, int(port_text)), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack(">i", len(request)) + request)
            head = _recv_exact(sock, 4, where)
            (size,) = struct.unpack(">i", head)
            if not 10 <= size < 1 << 20:
                return f"{where} is not a Kafka broker: its answer begins {head!r}"
            body = _recv_exact(sock, size, where)
    except _Unhealthy as e:
        return str(e)
    except ConnectionRefusedError:
        return f"connection refused to {where}"
    except TimeoutError:
        return f"timed out after {timeout:g} s waiting for {where}"
    except socket.gaierror as e:
        return f"cannot resolve {host}: {e.strerror}"
    except OSError as e:
        return f"{where}: {e.strerror or e}"
    correlation_id, error_code, count = struct.unpack_from(">ihi", body, 0)
    if correlation_id != 1:
        return f"{where} answered correlation id {correlation_id}, not 1"
    if error_code != 0:
        return f"{where} answered ApiVersions with error code {error_code}"
    if count <= 0:
        return f"{where} answered ApiVersions with no APIs"
    return None


def healthcheck(bootstrap: str, timeout: float) -> bool:
    """True if the broker answers ApiVersions (see ``check_health`` for the reason when not)."""
    return check_health(bootstrap, timeout) is None


def _recv_exact(sock: socket.socket, n: int, where: str) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise _Unhealthy(f"{where} closed the connection without answering")
        buf += chunk
    return buf


def _zookeeper(args: argparse.Namespace) -> int:
    from pykbroker import zookeeper_server as zs

    dir_ = Path(args.dir).resolve()
    try:
        if args.zk_command == "init":
            settings = zs.ZooKeeperSettings(dir_, args.address, args.client_port, zs.parse_servers(args.servers),
                                            args.myid, admin_port=args.admin_port)
            cfg = zs.write_config(settings)
            print(f"wrote {cfg}; clients connect to {settings.connect} "
                  f"(zookeeper.connect={settings.connect}/pykbroker); run: pykbroker zookeeper start --dir {dir_}")
            return 0
        cmd = zs.command(dir_, args.heap_mb)
        if args.zk_command == "systemd-unit":
            sys.stdout.write(zs.systemd_unit(dir_, args.user, args.heap_mb))
            return 0
    except zs.ZooKeeperSetupError as e:
        print(f"pykbroker zookeeper: {e}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execv(cmd[0], cmd)  # the server in the foreground, in this process (signals reach it directly)


# --- pykbroker scram: SCRAM users written into the metadata store, without a broker ------------------

def _add_scram_parser(sub: Any) -> None:
    scram = sub.add_parser("scram", help="add, list or delete SCRAM users in the metadata store the brokers read "
                                         "(the first users of a SASL-only cluster; docs/security.md)")
    actions = scram.add_subparsers(dest="scram_command", required=True)
    where = argparse.ArgumentParser(add_help=False)
    target = where.add_mutually_exclusive_group(required=True)
    target.add_argument("--config", metavar="FILE", help="the broker's server.properties: its zookeeper.connect, "
                                                         "else the first of its log.dirs (a stopped broker)")
    target.add_argument("--log-dirs", metavar="DIR", help="the data directory of a stopped broker with embedded "
                                                          "metadata")
    target.add_argument("--zookeeper", metavar="HOST:PORT[/CHROOT]",
                        help="the cluster's zookeeper.connect (brokers may be running)")
    mechanisms = ("SCRAM-SHA-256", "SCRAM-SHA-512")
    add = actions.add_parser("add", parents=[where], help="create or replace a user's credentials")
    add.add_argument("--user", required=True)
    add.add_argument("--mechanism", action="append", type=str.upper, choices=mechanisms,
                     help="repeatable; or name them in --add-config")
    add.add_argument("--iterations", type=int, help="default 4096 (4096..16384)")
    add.add_argument("--add-config", metavar="'SCRAM-SHA-512=[iterations=8192,password=SECRET],...'",
                     help="kafka-configs' form; a mechanism without password= takes the one given otherwise")
    secret = add.add_mutually_exclusive_group()
    secret.add_argument("--password", help="visible to other local users in the process list: prefer a file")
    secret.add_argument("--password-file", metavar="FILE", help="its first line is the password ('-': stdin)")
    listing = actions.add_parser("list", parents=[where], help="users and their mechanisms and iterations")
    listing.add_argument("--user")
    delete = actions.add_parser("delete", parents=[where], help="delete some or all of a user's credentials")
    delete.add_argument("--user", required=True)
    delete.add_argument("--mechanism", action="append", type=str.upper, choices=mechanisms,
                        help="repeatable; default: every mechanism of the user")
    delete.add_argument("--delete-config", metavar="'SCRAM-SHA-512'", help="kafka-configs' form")


def _scram(args: argparse.Namespace) -> int:
    from pykbroker.metadata import scram_admin as sa

    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # its retries are noise: the outcome is printed below
    try:
        requests = _scram_requests(args) if args.scram_command == "add" else []
        with sa.open_store(config_file=args.config, log_dirs=args.log_dirs, zookeeper=args.zookeeper,
                           create=args.scram_command == "add") as store:
            if args.scram_command == "add":
                out = [sa.add(store, args.user, requests)]
            elif args.scram_command == "delete":
                named = (args.mechanism or []) + (sa.parse_delete_config(args.delete_config)
                                                  if args.delete_config else [])
                out = [sa.delete(store, args.user, named or None)]
            else:
                out = sa.describe(store, args.user)
    except sa.ScramAdminError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if out:
        print("\n".join(out))
    return 0


def _scram_requests(args: argparse.Namespace) -> list[CredentialRequest]:
    """The credentials to write; the password is read before the store is opened (a prompt may wait)."""
    from pykbroker.metadata import scram_admin as sa

    named = sa.parse_add_config(args.add_config) if args.add_config else []
    named += [(m, None, None) for m in args.mechanism or []]
    if not named:
        raise sa.ScramAdminError("name the mechanisms: --mechanism SCRAM-SHA-512 (repeatable) or --add-config")
    password: str | None = None
    if any(pw is None for _, pw, _ in named):
        password = _read_password(args)
    return [sa.CredentialRequest(m, pw if pw is not None else password or "",
                                 it if it is not None else
                                 args.iterations if args.iterations is not None else sa.DEFAULT_ITERATIONS)
            for m, pw, it in named]


def _read_password(args: argparse.Namespace) -> str:
    from pykbroker.metadata.scram_admin import ScramAdminError

    if args.password is not None:
        return str(args.password)
    if args.password_file is not None:
        try:
            if args.password_file == "-":
                text = sys.stdin.readline()
            else:
                with open(args.password_file, encoding="utf-8") as f:
                    text = f.readline()
        except OSError as e:
            raise ScramAdminError(f"--password-file: {e}") from None
        return text.rstrip("\r\n")
    if not sys.stdin.isatty():
        raise ScramAdminError("no password: give --password-file FILE ('-' for stdin), --password, or run on a "
                              "terminal to be asked")
    first = getpass.getpass(f"Password for {args.user}: ")
    if getpass.getpass("Again: ") != first:
        raise ScramAdminError("the passwords differ")
    return first


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if (args_in and args_in[0] in ADMIN_COMMANDS) or COMPLETE_VAR in os.environ:
        # The operator's admin commands (pykbroker.admin), loaded only for them.
        from pykbroker.admin.app import main as admin_main

        return admin_main(args_in)
    parser = argparse.ArgumentParser(
        prog="pykbroker", description="A Kafka-compatible broker in Python",
        epilog="Admin commands, for pykbroker or any Kafka cluster (each with --help; docs/admin.md): "
               + ", ".join(sorted(ADMIN_COMMANDS)))
    parser.add_argument("--version", action="version", version=f"pykbroker {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run a broker in the foreground")
    serve.add_argument("--config", help="a Kafka-style server.properties file")
    serve.add_argument("--override", action="append", metavar="KEY=VALUE",
                       help="set a config key (repeatable); wins over the file and PYKBROKER_* variables")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    serve.add_argument("--processes", type=int, metavar="N",
                       help="run N brokers of the ZooKeeper cluster as child processes, with ids, ports and log "
                            "dirs derived from the configuration (docs/deploy.md, 'Several processes per host')")
    serve.add_argument("--log-broker-id", type=int, help=argparse.SUPPRESS)  # set by --processes for its children
    serve.add_argument("--max-restarts", type=int, default=5, metavar="N",
                       help="with --processes: restarts of a child that died, within 5 minutes, before the "
                            "parent stops every broker and exits 1 (0: exit at the first death)")
    health = sub.add_parser("healthcheck", help="exit 0 if the broker answers ApiVersions")
    health.add_argument("--bootstrap", default="127.0.0.1:9092")
    health.add_argument("--timeout", type=float, default=5.0)
    zk = sub.add_parser("zookeeper", help="set up and run ZooKeeper (Debian's package) for a cluster "
                                          "(docs/deploy.md, 'ZooKeeper')")
    zk_sub = zk.add_subparsers(dest="zk_command", required=True)
    zk_init = zk_sub.add_parser("init", help="write zoo.cfg (and myid) into a directory")
    zk_init.add_argument("--dir", required=True, help="holds zoo.cfg, the data directory and the logs")
    zk_init.add_argument("--address", default="127.0.0.1", help="the one address clients connect to")
    zk_init.add_argument("--client-port", type=int, default=2181)
    zk_init.add_argument("--servers", default="", help="an ensemble: 1=host:2888:3888,2=...,3=... (odd count)")
    zk_init.add_argument("--myid", type=int, help="this server's id in --servers")
    zk_init.add_argument("--admin-port", type=int, help="ZooKeeper's admin HTTP server on --address (off if unset)")
    for name, text in (("start", "run the server of --dir in the foreground"),
                       ("systemd-unit", "print a systemd service for the server of --dir")):
        one = zk_sub.add_parser(name, help=text)
        one.add_argument("--dir", required=True)
        one.add_argument("--heap-mb", type=int, default=512)
        if name == "systemd-unit":
            one.add_argument("--user", default="zookeeper")
    _add_scram_parser(sub)
    args = parser.parse_args(args_in)
    if args.command == "serve":
        return _serve(args)
    if args.command == "zookeeper":
        return _zookeeper(args)
    if args.command == "scram":
        return _scram(args)
    problem = check_health(args.bootstrap, args.timeout)
    print("healthy" if problem is None else f"unhealthy: {problem}")
    return 0 if problem is None else 1
