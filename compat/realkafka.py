"""Apache Kafka itself, run by the suite from Maven Central's jars (``--kafka LINE``), to hold the scenarios to.

The jars come from ``compat/kafka/pom.xml``: one Maven profile per release line (``kafka-3.9``,
``kafka-4``) pins a version; ``resolve`` copies the broker, kafka-tools and a logging binding into
``compat/kafka/lib/<version>/`` (ignored by git; Maven keeps its downloads in ``~/.m2``) and skips a
folder that is complete. The brokers run with the machine's JDK as ``java -cp 'lib/<version>/*'
kafka.Kafka server.properties``:

* a ZooKeeper line (3.9): a ZooKeeper (Debian's package, as for ``--pykbroker-cluster``) and N brokers;
* a KRaft line (4.x): one node that is broker and controller, its log dirs formatted first with
  ``kafka.tools.StorageTool format``.

Each broker is set up as compat/README.md says for a Kafka under test, as the suite's own pykbroker is:
the single-node (or cluster) settings of compat/cluster.py, a ``SASL_PLAINTEXT`` listener with the
authorizer for the security scenarios (compat/security.py), two log dirs, the consumer group protocol
(KIP-848) where the version has it in that mode, and a client telemetry reporter
(``compat/kafka/CompatTelemetryReporter.java``, compiled against the version's own jars) so that Kafka
advertises the KIP-714 APIs. Data lives in a temporary directory; the logs stay there and are named at
the end of the run.

    python -m compat.realkafka resolve [LINE ...]   # fetch the jars (compat/setup.sh does it)
    python -m compat.realkafka versions              # LINE VERSION MODE, one a line
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from compat import security
from compat.cluster import SINGLE_NODE_OVERRIDES, ClusterInfo, cluster_overrides, wait_api_versions, wait_registered
from compat.env import dir_lock
from tests.support.broker import free_port

if TYPE_CHECKING:
    from tests.support.zookeeper import ZooKeeperEnsemble

COMPAT = Path(__file__).resolve().parent
KAFKA_DIR = COMPAT / "kafka"
POM = KAFKA_DIR / "pom.xml"
LIB = KAFKA_DIR / "lib"
BUILD = KAFKA_DIR / "build"
REPORTER_SRC = KAFKA_DIR / "CompatTelemetryReporter.java"
REPORTER_CLASS = "CompatTelemetryReporter"
COMPLETE = ".complete"  # in a lib folder: the jar names, written once Maven copied them all
_NS = {"m": "http://maven.apache.org/POM/4.0.0"}

# The authorizer each metadata mode has: KRaft's keeps ACLs in the metadata log, the ZooKeeper-mode one in
# ZooKeeper (StandardAuthorizer does not run on a ZooKeeper-mode broker).
KRAFT_AUTHORIZER = security.AUTHORIZER
ZOOKEEPER_AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"


class KafkaSetupError(RuntimeError):
    pass


@dataclass(frozen=True)
class KafkaRelease:
    """One release line of compat/kafka/pom.xml: the profile ``kafka-<line>`` pins ``version``."""

    line: str
    version: str

    @property
    def profile(self) -> str:
        return f"kafka-{self.line}"

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def zookeeper(self) -> bool:
        """3.x runs on ZooKeeper here (its last release line still can); 4.0 removed ZooKeeper mode."""
        return self.major < 4

    @property
    def lib(self) -> Path:
        return LIB / self.version

    def label(self, size: int) -> str:
        if size > 1:
            return f"Apache Kafka {self.version}, {size} brokers + {'ZooKeeper' if self.zookeeper else 'KRaft'}"
        return f"Apache Kafka {self.version} ({'ZooKeeper' if self.zookeeper else 'KRaft'})"


def releases(pom: Path = POM) -> dict[str, KafkaRelease]:
    """{line: release} from the pom's ``kafka-<line>`` profiles, in the pom's order."""
    root = ET.parse(pom).getroot()
    out: dict[str, KafkaRelease] = {}
    for prof in root.iterfind("m:profiles/m:profile", _NS):
        pid = prof.findtext("m:id", default="", namespaces=_NS)
        version = prof.findtext("m:properties/m:kafka.version", default="", namespaces=_NS)
        if pid.startswith("kafka-") and version:
            out[pid.removeprefix("kafka-")] = KafkaRelease(pid.removeprefix("kafka-"), version)
    if not out:
        raise KafkaSetupError(f"{pom} has no kafka-<line> profile with a kafka.version")
    return out


def release(name: str) -> KafkaRelease:
    """A release by its line (``3.9``, ``4``), ``4.x``, or its exact version (``3.9.2``)."""
    known = releases()
    key = name.removesuffix(".x")
    if key in known:
        return known[key]
    for r in known.values():
        if r.version == name:
            return r
    choices = ", ".join(f"{line} ({r.version})" for line, r in known.items())
    raise KafkaSetupError(f"no Apache Kafka {name!r} in {POM.relative_to(COMPAT.parent)}: choose from {choices}")




def _complete(lib: Path) -> bool:
    marker = lib / COMPLETE
    if not marker.is_file():
        return False
    names = marker.read_text().split()
    return bool(names) and all((lib / n).is_file() for n in names)


def resolve(rel: KafkaRelease, timeout: float = 1800.0) -> Path:
    """The release's lib folder, copied by Maven (``dependency:copy-dependencies``) unless already complete."""
    with dir_lock(LIB, f"resolve-{rel.version}"):
        if _complete(rel.lib):
            return rel.lib
        mvn = shutil.which("mvn")
        if mvn is None:
            raise KafkaSetupError("Apache Kafka's jars come from Maven Central through mvn: apt-get install maven "
                                  "(scripts/install.sh --test)")
        tmp = LIB / f"{rel.version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        args = [mvn, "-q", "-B", "-f", str(POM), "-P", rel.profile, f"-Dkafka.lib={tmp}",
                "dependency:copy-dependencies"]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise KafkaSetupError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                                  f"{proc.stderr[-4000:]}")
        jars = sorted(p.name for p in tmp.glob("*.jar"))
        broker = f"kafka_2.13-{rel.version}.jar"
        if broker not in jars:
            raise KafkaSetupError(f"{' '.join(args)} copied no {broker} into {tmp}: {jars}")
        (tmp / COMPLETE).write_text("\n".join(jars) + "\n")
        shutil.rmtree(rel.lib, ignore_errors=True)
        tmp.rename(rel.lib)
        return rel.lib


def java() -> str:
    """The JDK's java: $JAVA_HOME's, else the one on PATH (Kafka 4 needs 17 or newer)."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise KafkaSetupError("Apache Kafka needs a JDK: apt-get install openjdk-17-jdk-headless")
    return found


def reporter_classes(rel: KafkaRelease) -> Path:
    """CompatTelemetryReporter compiled against the release's jars (once per source and version)."""
    javac = shutil.which("javac", path=str(Path(java()).parent)) or shutil.which("javac")
    if javac is None:
        raise KafkaSetupError("compiling the telemetry reporter needs javac: apt-get install openjdk-17-jdk-headless")
    digest = hashlib.sha256(REPORTER_SRC.read_bytes()).hexdigest()[:16]
    out = BUILD / rel.version / digest
    with dir_lock(LIB, f"javac-{rel.version}"):
        if not (out / f"{REPORTER_CLASS}.class").exists():
            tmp = out.with_name(f"{digest}.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            proc = subprocess.run([javac, "-nowarn", "-encoding", "UTF-8", "-cp", str(rel.lib / "*"), "-d", str(tmp),
                                   str(REPORTER_SRC)], capture_output=True, text=True, timeout=300)
            if proc.returncode != 0:
                raise KafkaSetupError(f"javac {REPORTER_SRC.name} failed:\n{proc.stdout}\n{proc.stderr}")
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
            for old in out.parent.iterdir():  # builds of earlier versions of the reporter
                if old != out:
                    shutil.rmtree(old, ignore_errors=True)
    return out


def _properties(settings: dict[str, str]) -> str:
    """A Java properties file (backslashes escaped; values such as JAAS configs are otherwise literal)."""
    return "".join(f"{k}={v.replace(chr(92), chr(92) * 2)}\n" for k, v in settings.items())


def random_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (as ``kafka-storage random-uuid``)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class KafkaNode:
    """One Kafka JVM: its settings, its server.properties and log in its own directory."""

    def __init__(self, rel: KafkaRelease, workdir: Path, node_id: int, settings: dict[str, str]) -> None:
        self.rel = rel
        self.workdir = workdir
        self.node_id = node_id
        self.port = free_port()
        self.sasl_port = free_port()
        sasl = security.SASL_LISTENER
        listeners = {"PLAINTEXT": self.port, sasl: self.sasl_port}
        protocols = {"PLAINTEXT": "PLAINTEXT", sasl: "SASL_PLAINTEXT"}
        advertised = ",".join(f"{name}://127.0.0.1:{port}" for name, port in listeners.items())
        if not rel.zookeeper:
            self.controller_port = free_port()
            listeners["CONTROLLER"] = self.controller_port
            protocols["CONTROLLER"] = "PLAINTEXT"
        auth = security.broker_overrides()
        auth["authorizer.class.name"] = ZOOKEEPER_AUTHORIZER if rel.zookeeper else KRAFT_AUTHORIZER
        self.settings = {
            ("broker.id" if rel.zookeeper else "node.id"): str(node_id),
            "listeners": ",".join(f"{name}://127.0.0.1:{port}" for name, port in listeners.items()),
            "advertised.listeners": advertised,
            "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in protocols.items()),
            "inter.broker.listener.name": "PLAINTEXT",
            **auth,
            # Two log dirs, as the suite's own brokers have: AlterReplicaLogDirs is then possible.
            "log.dirs": f"{workdir / 'data'},{workdir / 'data2'}",
            # The KIP-714 APIs, as on pykbroker with pykbroker.client.telemetry.enable.
            "metric.reporters": REPORTER_CLASS,
            **settings,
        }
        self.config_file = workdir / "server.properties"
        self.log_file = workdir / "broker.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.sasl_port}"

    def _jvm(self, reporter: Path) -> list[str]:
        log_config = (["-Dlog4j.configuration=file:" + str(KAFKA_DIR / "log4j.properties")] if self.rel.major < 4
                      else ["-Dlog4j2.configurationFile=" + str(KAFKA_DIR / "log4j2.properties")])
        classpath = os.pathsep.join([str(self.rel.lib / "*"), str(reporter)])
        # kafka-run-class.sh's G1 settings with a smaller heap: several brokers share a small machine.
        return [java(), "-Xms256m", "-Xmx768m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                "-XX:InitiatingHeapOccupancyPercent=35", "-Djava.awt.headless=true", *log_config,
                "-cp", classpath]

    def write_config(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(_properties(self.settings))

    def format_storage(self, reporter: Path, cluster_id: str, timeout: float = 120.0) -> None:
        """KRaft: write meta.properties and the bootstrap metadata into the log dirs (kafka-storage format)."""
        args = [*self._jvm(reporter), "kafka.tools.StorageTool", "format", "--cluster-id", cluster_id,
                "--config", str(self.config_file)]
        with open(self.workdir / "format.log", "wb") as out:
            proc = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
        if proc.returncode != 0:
            text = (self.workdir / "format.log").read_text(errors="replace")[-4000:]
            raise KafkaSetupError(f"kafka.tools.StorageTool format exited with {proc.returncode}:\n{text}")

    def launch(self, reporter: Path) -> None:
        with open(self.log_file, "ab") as logf:
            self.proc = subprocess.Popen([*self._jvm(reporter), "kafka.Kafka", str(self.config_file)],
                                         stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float) -> None:
        """Wait for the JVM to exit after terminate(); SIGKILL its process group after ``timeout``."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)

    def cleanup(self) -> None:
        for d in ("data", "data2"):
            shutil.rmtree(self.workdir / d, ignore_errors=True)


class ManagedKafka:
    """Apache Kafka ``rel`` with ``size`` brokers, started for one run of the suite."""

    def __init__(self, rel: KafkaRelease, size: int = 1, workdir: Path | None = None) -> None:
        if size < 1:
            raise ValueError(f"a cluster needs at least one broker, not {size}")
        if size > 1 and not rel.zookeeper:
            raise KafkaSetupError(f"--kafka-brokers {size}: the suite starts several Kafka brokers on ZooKeeper "
                                  f"only; Kafka {rel.version} (KRaft) runs as one node")
        self.rel = rel
        self.size = size
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"compat-kafka-{rel.version}-"))
        self.nodes: dict[int, KafkaNode] = {}
        self.zookeeper_ensemble: ZooKeeperEnsemble | None = None

    @property
    def zookeeper(self) -> bool:
        return self.rel.zookeeper

    @property
    def results_suffix(self) -> str:
        return f"-kafka-{self.rel.version}" + (f"-cluster{self.size}" if self.size > 1 else "")

    @property
    def log_files(self) -> list[Path]:
        return [n.log_file for n in self.nodes.values()]

    def settings(self) -> dict[str, str]:
        """What the suite's pykbroker of the same shape gets (compat/cluster.py). KIP-848 needs nothing: 4.x
        has it on by default, and 3.9 refuses its preview (group.coordinator.rebalance.protocols with
        "consumer") in ZooKeeper mode, so there the consumer-protocol scenarios are "not supported"."""
        return dict(SINGLE_NODE_OVERRIDES) if self.size == 1 else cluster_overrides(self.size)

    def start(self, timeout: float = 180.0) -> ClusterInfo:
        deadline = time.monotonic() + timeout
        try:
            resolve(self.rel)
            reporter = reporter_classes(self.rel)
            self.nodes = {i: KafkaNode(self.rel, self.workdir / f"broker{i}", i, {}) for i in range(1, self.size + 1)}
            extra = self.settings()
            if self.rel.zookeeper:
                extra["zookeeper.connect"] = self._start_zookeeper()
            else:
                node = self.nodes[1]
                extra.update({"process.roles": "broker,controller",
                              "controller.listener.names": "CONTROLLER",
                              "controller.quorum.voters": f"1@127.0.0.1:{node.controller_port}"})
            for node in self.nodes.values():
                node.settings.update(extra)
                node.write_config()
            if not self.rel.zookeeper:
                self.nodes[1].format_storage(reporter, random_cluster_id())
            for node in self.nodes.values():
                node.launch(reporter)
            versions = {i: wait_api_versions(n.bootstrap, n.proc, max(1.0, deadline - time.monotonic()), n.log_file)
                        for i, n in self.nodes.items()}
            wait_registered({i: n.bootstrap for i, n in self.nodes.items()}, deadline)
            security.create_scram_users(self.nodes[1].sasl_bootstrap)
        except BaseException:
            self.stop()
            raise
        return ClusterInfo(self.nodes[1].bootstrap, self.rel.label(self.size), versions[1], managed=True,
                           brokers=self.size, sasl_bootstrap=self.nodes[1].sasl_bootstrap)

    def _start_zookeeper(self) -> str:
        # Imported here, as in compat/cluster.py: the ZooKeeper runner lives with the project's cluster tests.
        from tests.support.zookeeper import ZooKeeperEnsemble, zookeeper_available

        if not zookeeper_available():
            raise KafkaSetupError(f"Kafka {self.rel.version} runs on ZooKeeper here (Debian package zookeeper): "
                                  "run scripts/install.sh --test")
        zk = ZooKeeperEnsemble(self.workdir / "zookeeper", 1)
        self.zookeeper_ensemble = zk
        zk.start()
        return zk.connect

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every broker (a controlled shutdown), SIGKILL what still runs after ``timeout``; then ZooKeeper."""
        for node in self.nodes.values():
            node.terminate()
        deadline = time.monotonic() + timeout
        for node in self.nodes.values():
            node.wait_stopped(max(0.1, deadline - time.monotonic()))
        if self.zookeeper_ensemble is not None:
            self.zookeeper_ensemble.kill()

    def cleanup(self) -> None:
        for node in self.nodes.values():
            node.cleanup()
        shutil.rmtree(self.workdir / "zookeeper", ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("resolve", help="copy each release's jars from Maven into compat/kafka/lib/<version>/")
    r.add_argument("lines", nargs="*", help="release lines (default: every profile of compat/kafka/pom.xml)")
    sub.add_parser("versions", help="the release lines the pom pins")
    a = p.parse_args(argv)
    if a.command == "versions":
        for line, rel in releases().items():
            print(line, rel.version, "zookeeper" if rel.zookeeper else "kraft")
        return 0
    for rel in ([release(x) for x in a.lines] if a.lines else list(releases().values())):
        started = time.monotonic()
        lib = resolve(rel)
        print(f"Apache Kafka {rel.version}: {lib} ({len(list(lib.glob('*.jar')))} jars, "
              f"{time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
