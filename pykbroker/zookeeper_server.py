"""Run ZooKeeper for a pykbroker cluster from Debian's ``zookeeper`` package, with a configuration of one's own.

Debian's package ships the server's jars but no service, and its ``zkServer.sh``/``zkEnv.sh`` read their
configuration from a fixed directory (an operator's own ``zoo.cfg`` elsewhere is silently ignored) whose
default listens on every interface and keeps its data in /tmp.  This module writes a ``zoo.cfg`` that
listens on one address, keeps data in a directory of the operator's choice and allows the four-letter
words a health check needs, and starts ``QuorumPeerMain`` on it directly: one node, or one member of an
ensemble.  It imports nothing of the broker (``pykbroker zookeeper`` and the test suite both use it).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
# Debian's zookeeper package: the server jar, whose manifest names the jars it needs (log4j, netty, ...).
DEBIAN_JAR = Path("/usr/share/java/zookeeper.jar")
FOUR_LETTER_WORDS = "srvr,ruok,stat,mntr"
CONFIG_NAME = "zoo.cfg"


class ZooKeeperSetupError(Exception):
    """A setting that cannot work (said at once, before anything is written or started)."""


@dataclass(frozen=True)
class ZooKeeperSettings:
    """One ZooKeeper server: standalone (no ``servers``) or member ``myid`` of an ensemble."""

    dir: Path
    address: str = "127.0.0.1"
    client_port: int = 2181
    servers: dict[int, str] = field(default_factory=dict)  # myid -> host:quorum_port:election_port
    myid: int | None = None
    tick_time_ms: int = 2000
    admin_port: int | None = None  # ZooKeeper's admin HTTP server on ``address``; None: off
    max_session_timeout_ms: int | None = None  # ZooKeeper's default: 20 ticks

    def check(self) -> None:
        if not 0 < self.client_port < 65536:
            raise ZooKeeperSetupError(f"client port {self.client_port} is not a TCP port")
        if self.servers:
            if self.myid is None or self.myid not in self.servers:
                raise ZooKeeperSetupError(f"an ensemble member needs --myid, one of {sorted(self.servers)}")
            for sid, spec in self.servers.items():
                parts = spec.rsplit(":", 2)
                if len(parts) != 3 or not all(p.isdigit() for p in parts[1:]):
                    raise ZooKeeperSetupError(f"server.{sid}={spec!r} is not host:quorum_port:election_port")
            if len(self.servers) % 2 == 0:
                raise ZooKeeperSetupError(f"an ensemble of {len(self.servers)} servers tolerates no more failures "
                                          f"than one of {len(self.servers) - 1}: use an odd number (3 or 5)")
        elif self.myid is not None:
            raise ZooKeeperSetupError("--myid is for a member of an ensemble (give --servers too)")

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def connect(self) -> str:
        return f"{self.address}:{self.client_port}"


def parse_servers(text: str) -> dict[int, str]:
    """``1=host:2888:3888,2=...`` or ``host:2888:3888,...`` (numbered from 1 in order)."""
    out: dict[int, str] = {}
    for i, item in enumerate((x.strip() for x in text.split(",") if x.strip()), start=1):
        sid, sep, spec = item.partition("=")
        if sep:
            if not sid.isdigit():
                raise ZooKeeperSetupError(f"{item!r}: server ids are numbers (1=host:2888:3888)")
            out[int(sid)] = spec
        else:
            out[i] = item
    return out


def config_text(s: ZooKeeperSettings) -> str:
    lines = [
        f"# Written by `pykbroker zookeeper init` for {'member ' + str(s.myid) + ' of an ensemble' if s.servers else 'a standalone server'}.",  # noqa: E501
        f"tickTime={s.tick_time_ms}",
        "initLimit=10",
        "syncLimit=5",
        f"dataDir={s.data_dir}",
        f"clientPort={s.client_port}",
        f"clientPortAddress={s.address}",
        "# The four-letter words health checks and monitoring use (srvr: is it serving, and as what).",
        f"4lw.commands.whitelist={FOUR_LETTER_WORDS}",
        # Old snapshots and transaction logs are removed daily, keeping 3 (ZooKeeper keeps all by default).
        "autopurge.snapRetainCount=3",
        "autopurge.purgeInterval=24",
    ]
    if s.max_session_timeout_ms is not None:
        lines.append(f"maxSessionTimeout={s.max_session_timeout_ms}")
    if s.admin_port is None:
        lines.append("admin.enableServer=false")
    else:
        lines += ["admin.enableServer=true", f"admin.serverAddress={s.address}", f"admin.serverPort={s.admin_port}"]
    for sid, spec in sorted(s.servers.items()):
        lines.append(f"server.{sid}={spec}")
    return "\n".join(lines) + "\n"


def log4j_text(s: ZooKeeperSettings) -> str:
    return ("log4j.rootLogger=INFO, F\n"
            "log4j.appender.F=org.apache.log4j.RollingFileAppender\n"
            f"log4j.appender.F.File={s.dir / 'zookeeper.log'}\n"
            "log4j.appender.F.MaxFileSize=10MB\nlog4j.appender.F.MaxBackupIndex=5\n"
            "log4j.appender.F.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.F.layout.ConversionPattern=%d %p [%t] %c{1}: %m%n\n")


def write_config(s: ZooKeeperSettings) -> Path:
    """``zoo.cfg``, ``log4j.properties`` and (for an ensemble member) ``data/myid`` under ``s.dir``."""
    s.check()
    s.data_dir.mkdir(parents=True, exist_ok=True)
    if s.servers:
        (s.data_dir / "myid").write_text(f"{s.myid}\n")
    (s.dir / "log4j.properties").write_text(log4j_text(s))
    cfg = s.dir / CONFIG_NAME
    cfg.write_text(config_text(s))
    return cfg


def java() -> str:
    found = shutil.which("java")
    if found is None:
        raise ZooKeeperSetupError("no java on PATH: install a JDK or JRE (Debian: default-jre-headless)")
    return found


def classpath() -> str:
    if not DEBIAN_JAR.exists():
        raise ZooKeeperSetupError("ZooKeeper's jars are not installed: apt-get install zookeeper "
                                  "(Debian's package; its service scripts are not needed)")
    return str(DEBIAN_JAR)


def command(dir_: Path, heap_mb: int = 512, jvm_options: tuple[str, ...] = ()) -> list[str]:
    """The java command line that runs the server configured in ``dir_`` in the foreground."""
    cfg = dir_ / CONFIG_NAME
    if not cfg.exists():
        raise ZooKeeperSetupError(f"{cfg} does not exist: run `pykbroker zookeeper init --dir {dir_}` first")
    return [java(), f"-Xmx{heap_mb}m", *jvm_options, f"-Dlog4j.configuration=file:{dir_ / 'log4j.properties'}",
            "-Dzookeeper.jmx.log4j.disable=true", "-cp", f"{dir_}:{classpath()}", MAIN, str(cfg)]


def systemd_unit(dir_: Path, user: str = "zookeeper", heap_mb: int = 512) -> str:
    """A systemd service that runs the configured server (``systemctl enable --now`` it)."""
    cmd = " ".join(command(dir_, heap_mb))
    return (f"[Unit]\nDescription=ZooKeeper for pykbroker ({dir_})\n"
            "After=network-online.target\nWants=network-online.target\n\n"
            f"[Service]\nUser={user}\nExecStart={cmd}\nRestart=on-failure\nRestartSec=5\n"
            "LimitNOFILE=65536\nTimeoutStopSec=30\n\n"
            "[Install]\nWantedBy=multi-user.target\n")
