"""Apache Kafka's own command-line tools, run from the jars Maven resolved (compat/kafka/pom.xml).

Each release line the pom pins gives one "client" of the tools family: ``kafka-tools-3.9`` runs the 3.9
release's ``kafka-topics``, ``kafka-consumer-groups``, ... and ``kafka-tools-4`` the 4.x release's. A tool
is started as its ``bin/kafka-*.sh`` script starts it (``java -cp 'lib/*' <main class> args``), with the
distribution's tools logging (WARN to standard error), so its standard output is what an operator reads.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from compat.env import CACHE
from compat.realkafka import KAFKA_DIR, KafkaRelease, java, release, releases, resolve

PREFIX = "kafka-tools-"

# The script name -> its main class, newest location first (several moved from kafka_2.13's Scala to
# kafka-tools' Java between 3.x and 4.x).
MAIN_CLASSES: dict[str, tuple[str, ...]] = {
    "kafka-topics": ("org.apache.kafka.tools.TopicCommand", "kafka.admin.TopicCommand"),
    "kafka-consumer-groups": ("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                              "kafka.admin.ConsumerGroupCommand"),
    "kafka-configs": ("org.apache.kafka.tools.ConfigCommand", "kafka.admin.ConfigCommand"),
    "kafka-acls": ("org.apache.kafka.tools.AclCommand", "kafka.admin.AclCommand"),
    "kafka-reassign-partitions": ("org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
                                  "kafka.admin.ReassignPartitionsCommand"),
    "kafka-leader-election": ("org.apache.kafka.tools.LeaderElectionCommand", "kafka.admin.LeaderElectionCommand"),
    "kafka-log-dirs": ("org.apache.kafka.tools.LogDirsCommand", "kafka.admin.LogDirsCommand"),
    "kafka-delete-records": ("org.apache.kafka.tools.DeleteRecordsCommand", "kafka.admin.DeleteRecordsCommand"),
    "kafka-transactions": ("org.apache.kafka.tools.TransactionsCommand",),
    "kafka-get-offsets": ("org.apache.kafka.tools.GetOffsetShell", "kafka.tools.GetOffsetShell"),
    "kafka-producer-perf-test": ("org.apache.kafka.tools.ProducerPerformance",),
    "kafka-consumer-perf-test": ("org.apache.kafka.tools.ConsumerPerformance", "kafka.tools.ConsumerPerformance"),
    "kafka-console-producer": ("org.apache.kafka.tools.ConsoleProducer", "kafka.tools.ConsoleProducer"),
    "kafka-console-consumer": ("org.apache.kafka.tools.consumer.ConsoleConsumer", "kafka.tools.ConsoleConsumer"),
}


def tool_clients() -> list[str]:
    """The tools family's clients: one per release line the pom pins (``kafka-tools-3.9``, ``kafka-tools-4``)."""
    return [PREFIX + line for line in releases()]


@dataclass
class ToolResult:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return [ln for ln in self.stdout.splitlines() if ln.strip()]

    def __str__(self) -> str:
        return (f"{' '.join(self.args)} exited {self.returncode}\n--- stdout\n{self.stdout[-3000:]}"
                f"\n--- stderr\n{self.stderr[-3000:]}")


@dataclass
class KafkaTools:
    """One release's tools, pointed at one cluster."""

    rel: KafkaRelease
    bootstrap: str
    classes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def for_line(cls, line: str, bootstrap: str) -> KafkaTools:
        rel = release(line)
        lib = resolve(rel)
        present: set[str] = set()
        for jar in (lib / f"kafka-tools-{rel.version}.jar", lib / f"kafka_2.13-{rel.version}.jar"):
            with zipfile.ZipFile(jar) as z:
                present.update(n[:-6].replace("/", ".") for n in z.namelist() if n.endswith(".class"))
        classes = {}
        for tool, candidates in MAIN_CLASSES.items():
            found = next((c for c in candidates if c in present), None)
            if found is not None:
                classes[tool] = found
        return cls(rel, bootstrap, classes)

    @property
    def name(self) -> str:
        return PREFIX + self.rel.line

    def _class_archive(self) -> list[str]:
        """A class-data-sharing archive of the tools' classes (JDK AppCDS), which halves a tool's start
        (about 1.3 s to 0.65 s here): the first run writes it, later runs map it. Keyed by the release and
        the JVM, as an archive only fits the JVM and class path that wrote it."""
        jvm = java()
        key = hashlib.sha256(f"{self.rel.version}\0{os.path.realpath(jvm)}".encode()).hexdigest()[:12]
        archive = CACHE / "tools-cds" / f"{self.rel.version}-{key}.jsa"
        if archive.exists():
            return [f"-XX:SharedArchiveFile={archive}"]
        archive.parent.mkdir(parents=True, exist_ok=True)
        # Written at exit under a name of this process's own, then renamed into place (runs in parallel).
        return [f"-XX:ArchiveClassesAtExit={archive}.{os.getpid()}.tmp"]

    def _jvm(self, cds: list[str]) -> list[str]:
        # The distribution's tools logging: WARN and above to standard error.
        log = (["-Dlog4j.configuration=file:" + str(KAFKA_DIR / "tools-log4j.properties")] if self.rel.major < 4
               else ["-Dlog4j2.configurationFile=" + str(KAFKA_DIR / "tools-log4j2.properties")])
        # The JVM's own warnings (a class-data archive that does not fit, say) to standard error, never
        # into the tool's output.
        return [java(), "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xlog:disable",
                "-Xlog:all=warning:stderr", *cds, *log, "-cp", str(self.rel.lib / "*")]

    def run(self, tool: str, *args: str, stdin: str | None = None, timeout: float = 90.0,
            bootstrap: bool = True) -> ToolResult:
        """Run ``tool`` (its script's name) with ``args``, after ``--bootstrap-server <cluster>`` unless
        ``bootstrap`` is false (tools that take the address another way)."""
        if tool not in self.classes:
            raise LookupError(f"{tool} is not in Apache Kafka {self.rel.version}'s jars")
        argv = [*(["--bootstrap-server", self.bootstrap] if bootstrap else []), *args]
        cds = self._class_archive()
        proc = subprocess.run([*self._jvm(cds), self.classes[tool], *argv], input=stdin, capture_output=True,
                              text=True, timeout=timeout)
        if cds[0].startswith("-XX:ArchiveClassesAtExit="):
            written = Path(cds[0].split("=", 1)[1])
            if written.exists():
                os.replace(written, written.with_name(written.name.rsplit(".", 2)[0]))
        return ToolResult([tool, *argv], proc.returncode, proc.stdout, proc.stderr)

    def ok(self, tool: str, *args: str, stdin: str | None = None, timeout: float = 90.0,
           bootstrap: bool = True) -> ToolResult:
        """``run``, asserting exit code 0."""
        res = self.run(tool, *args, stdin=stdin, timeout=timeout, bootstrap=bootstrap)
        assert res.returncode == 0, str(res)
        return res


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)
