"""The campaign's load with the Java client (kafka-clients, ``tests/nemesis/java/NemesisClient.java``), on a topic
of its own: an idempotent acks=all producer and a consumer group committing synchronously after every poll.

The program runs as a JVM beside the campaign's process, where the confluent-kafka clients run (the root network
namespace, which reaches the brokers through the network's client link, so that ``partition_clients`` cuts it
too). Its observations arrive as JSON lines on its stdout, read as they come (the drain after the faults waits on
them), and go to the same checks as the confluent-kafka workload's (``tests/nemesis/checker.py``'s ``check``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

from confluent_kafka.admin import AdminClient, NewTopic

from compat import env
from tests.cluster.steady import read_all
from tests.nemesis.checker import ASSIGNED, Anomalies, Record, check

SOURCE = Path(__file__).resolve().parent / "java" / "NemesisClient.java"
PARTITIONS = 6
MEMBERS = 2
CLOSE_TIMEOUT = 60.0  # for the JVM to close its clients (each bounded at 10 s) and exit
JVM_OPTIONS = ["-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"]


class Observations:
    """What the Java clients reported, in the shapes the checker takes."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.acked: dict[bytes, tuple[int, int | None]] = {}  # value -> (partition, offset)
        self.errors: list[str] = []  # the producer's failed sends
        self.polls: dict[str, list[Record | str]] = {}
        self.commits: dict[str, list[tuple[int, int] | str]] = {}
        self.consumer_errors: dict[str, list[str]] = {}
        self.unreported: int | None = None  # set when the producer has stopped and flushed
        self.closed = False
        self.noise: list[str] = []  # stdout lines that were not events

    def add(self, line: str) -> None:
        """One line of the program's stdout."""
        try:
            e = json.loads(line)
            kind = e["e"]
        except (ValueError, KeyError, TypeError):
            if line.strip() and len(self.noise) < 20:
                self.noise.append(line.strip()[:200])
            return
        member = e.get("c")
        if member is not None:
            self.polls.setdefault(member, [])
            self.commits.setdefault(member, [])
            self.consumer_errors.setdefault(member, [])
        if kind == "send":
            self.sent.append(e["v"].encode())
        elif kind == "ack":
            self.acked[e["v"].encode()] = (e["p"], e["o"])
        elif kind == "error":
            self.errors.append(f"{e['v']}: {e['error']}")
        elif kind == "poll":
            self.polls[member].append((e["p"], e["o"], e["v"].encode()))
        elif kind == "commit":
            self.commits[member].append((e["p"], e["o"]))
        elif kind in ("assigned", "revoked", "lost"):  # a rebalance: positions may go back to the committed offsets
            self.polls[member].append(ASSIGNED)
            self.commits[member].append(ASSIGNED)
        elif kind in ("commit-error", "consumer-error"):
            self.consumer_errors[member].append(f"{kind}: {e['error']}")
        elif kind == "producer-closed":
            self.unreported = int(e["unreported"])
        elif kind == "closed":
            self.closed = True

    def consumed(self) -> int:
        """Distinct values the group polled."""
        return len({x[2] for seen in list(self.polls.values()) for x in list(seen) if not isinstance(x, str)})

    def check(self, final: list[Record]) -> Anomalies:
        return check(self.acked, self.polls, self.commits, final)


class JavaWorkload:
    """The Java client's producer and group on the topic ``nemesis-java-<tag>``; started after the topic exists,
    drained and stopped like the confluent-kafka workload, checked against the topic read back whole."""

    def __init__(self, bootstrap: str, tag: str, *, rate: int = 100, max_seconds: float = 900.0,
                 log: Path | None = None, replication: int = 3) -> None:
        self.bootstrap = bootstrap
        self.topic = f"nemesis-java-{tag}"
        self.group = f"nemesis-java-{tag}"
        self.prefix = f"{tag}-java-"
        self.rate = rate
        self.max_seconds = max_seconds
        self.log = log
        self.seen = Observations()
        self.final: list[Record] = []
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._stderr: IO[bytes] | None = None
        admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
        admin.create_topics([NewTopic(self.topic, PARTITIONS, replication)])[self.topic].result(timeout=30)
        # The program compiled (once per source version) before the load starts, not while it runs.
        self._classpath = env.compile_java(SOURCE)

    def start(self) -> JavaWorkload:
        java = shutil.which("java") or "java"
        self._stderr = open(self.log, "wb") if self.log is not None else None  # noqa: SIM115 (closed in stop)
        self._proc = subprocess.Popen(
            [java, *JVM_OPTIONS, "-cp", self._classpath, SOURCE.stem, self.bootstrap, self.topic, self.group,
             self.prefix, str(self.rate), str(MEMBERS), str(int(self.max_seconds))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr if self._stderr is not None else subprocess.DEVNULL,
            text=True, encoding="utf-8", bufsize=1)
        self._reader = threading.Thread(target=self._read, name="nemesis-java-stdout", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self.seen.add(line)

    def _tell(self, command: str) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdin.closed or proc.poll() is not None:
            return
        try:
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop_and_flush(self, flush_timeout: float = 180.0) -> int:
        """Stop sending and wait for every acknowledgement (at most ``flush_timeout``); the count still
        unreported (every send the program made, when it exited or did not answer)."""
        self._tell(f"stop-producer {int(flush_timeout)}")
        deadline = time.monotonic() + flush_timeout + 30
        for _ in range(int((flush_timeout + 30) / 0.1) + 1):
            if self.seen.unreported is not None or not self.running() or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if self.seen.unreported is None:
            return len(self.seen.sent) - len(self.seen.acked) - len(self.seen.errors)
        return self.seen.unreported

    def drained(self) -> bool:
        """Whether the group polled as many distinct values as were acknowledged."""
        return self.seen.consumed() >= len(self.seen.acked)

    def stop(self) -> None:
        """Close the clients (bounded) and wait for the JVM; killed if it does not exit in time."""
        proc = self._proc
        if proc is None:
            return
        self._tell("stop")
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        try:
            proc.wait(CLOSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if self._reader is not None:
            self._reader.join(10)
        if self._stderr is not None:
            self._stderr.close()

    def exit_status(self) -> int | None:
        return self._proc.returncode if self._proc is not None else None

    def read_final(self) -> None:
        self.final = [(p, o, v) for v, places in read_all(self.bootstrap, self.topic, PARTITIONS, timeout=120).items()
                      for p, o in places]

    def check(self) -> Anomalies:
        return self.seen.check(self.final)

    def report(self) -> dict[str, Any]:
        s = self.seen
        return {
            "java_sent": len(s.sent), "java_acknowledged": len(s.acked), "java_unreported": s.unreported,
            "java_producer_errors": s.errors[:20], "java_producer_error_count": len(s.errors),
            "java_consumed": {name: sum(1 for x in seen if not isinstance(x, str)) for name, seen in s.polls.items()},
            "java_commits": {name: sum(1 for x in done if not isinstance(x, str)) for name, done in s.commits.items()},
            "java_consumer_errors": {name: errors[:10] for name, errors in s.consumer_errors.items()},
            "java_final_records": len(self.final), "java_closed_cleanly": s.closed and self.exit_status() == 0,
            "java_noise": s.noise,
        }

    def observations(self) -> dict[str, Any]:
        s = self.seen
        return {
            "java_acked": {v.decode(): list(po) for v, po in s.acked.items()},
            "java_polls": {name: [x if isinstance(x, str) else [x[0], x[1], x[2].decode()] for x in seen]
                           for name, seen in s.polls.items()},
            "java_commits": {name: [x if isinstance(x, str) else list(x) for x in done]
                             for name, done in s.commits.items()},
            "java_final": [[p, o, v.decode()] for p, o, v in self.final],
        }
