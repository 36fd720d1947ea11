"""The campaign's load with the Java client (kafka-clients, ``tests/nemesis/java/NemesisClient.java``), on topics
of its own: an idempotent acks=all producer, a consumer group committing synchronously after every poll, and
read-process-write processors (read_committed members of another group, transactional producers) copying the
producer's records to an output topic with the group's offsets in the same transactions.

The program runs as a JVM beside the campaign's process, where the confluent-kafka clients run (the root network
namespace, which reaches the brokers through the network's client link, so that ``partition_clients`` cuts it
too). Its observations arrive as JSON lines on its stdout, read as they come (the drain after the faults waits on
them), and go to the same checks as the confluent-kafka workload's (``tests/nemesis/checker.py``'s ``check``,
and ``check_transactions`` for the processors' transactions).
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
from tests.nemesis.checker import (
    ABORTED,
    ASSIGNED,
    COMMITTED,
    UNKNOWN,
    Anomalies,
    Record,
    Txn,
    check,
    check_transactions,
)
from tests.nemesis.transactional import CommittedPositions

SOURCE = Path(__file__).resolve().parent / "java" / "NemesisClient.java"
PARTITIONS = 6
MEMBERS = 2
PROCESSORS = 2
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
        self.txns: list[Txn] = []
        self.txn_errors: dict[str, list[str]] = {}

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
        if member is not None and kind not in ("txn", "txn-error"):
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
        elif kind == "txn":
            self.txns.append(Txn(
                e["id"], e["producer"], e["outcome"], [(p, v.encode()) for p, v in e["writes"]],
                [(p, o, v.encode()) for p, o, v in e["reads"]], commit_at=e["commit_at"], ended=e["ended"],
                offsets={int(p): o for p, o in e["offsets"].items()}))
        elif kind == "txn-error":
            errors = self.txn_errors.setdefault(e["c"], [])
            if len(errors) < 50:
                errors.append(e["error"])
        elif kind == "producer-closed":
            self.unreported = int(e["unreported"])
        elif kind == "closed":
            self.closed = True

    def consumed(self) -> int:
        """Distinct values the group polled."""
        return len({x[2] for seen in list(self.polls.values()) for x in list(seen) if not isinstance(x, str)})

    def transaction_counts(self) -> dict[str, dict[str, int]]:
        """Per processor (a transaction's id is ``<processor>-<n>``), how many transactions had each outcome."""
        out: dict[str, dict[str, int]] = {}
        for t in list(self.txns):
            counts = out.setdefault(t.id.rsplit("-", 1)[0], {COMMITTED: 0, ABORTED: 0, UNKNOWN: 0})
            counts[t.outcome] += 1
        return out

    def processed(self) -> set[bytes]:
        """The inputs of committed transactions."""
        return {v for t in list(self.txns) if t.outcome == COMMITTED for _, _, v in t.reads}

    def check(self, final: list[Record], output: str = "output", final_output: list[Record] | None = None) -> Anomalies:
        """The producer's and group's checks over ``final`` (the topic read back); with ``final_output`` (the
        output topic read back with read_committed) the transactional ones over the processors' transactions,
        every acknowledged record being an input."""
        out = check(self.acked, self.polls, self.commits, final)
        if final_output is not None:
            out.merge(check_transactions(self.txns, {}, {output: final_output}, list(self.acked), final_output))
        return out


class JavaWorkload:
    """The Java client's producer, group and processors on the topics ``nemesis-java-<tag>`` and
    ``nemesis-java-out-<tag>``; started after the topics exist, drained and stopped like the confluent-kafka
    workloads, checked against the topics read back whole."""

    def __init__(self, bootstrap: str, tag: str, *, rate: int = 100, max_seconds: float = 900.0,
                 log: Path | None = None, replication: int = 3, seed: int = 0) -> None:
        self.bootstrap = bootstrap
        self.topic = f"nemesis-java-{tag}"
        self.group = f"nemesis-java-{tag}"
        self.output = f"nemesis-java-out-{tag}"
        self.seed = seed
        self.prefix = f"{tag}-java-"
        self.rate = rate
        self.max_seconds = max_seconds
        self.log = log
        self.seen = Observations()
        self.final: list[Record] = []
        self.final_output: list[Record] = []
        self._positions: CommittedPositions | None = None  # the processors' committed offsets, for the drain
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._stderr: IO[bytes] | None = None
        admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
        topics = [NewTopic(t, PARTITIONS, replication) for t in (self.topic, self.output)]
        for f in admin.create_topics(topics).values():
            f.result(timeout=30)
        # The program compiled (once per source version) before the load starts, not while it runs.
        self._classpath = env.compile_java(SOURCE)

    def start(self) -> JavaWorkload:
        java = shutil.which("java") or "java"
        self._stderr = open(self.log, "wb") if self.log is not None else None  # noqa: SIM115 (closed in stop)
        self._proc = subprocess.Popen(
            [java, *JVM_OPTIONS, "-cp", self._classpath, SOURCE.stem, self.bootstrap, self.topic, self.group,
             self.prefix, str(self.rate), str(MEMBERS), str(int(self.max_seconds)), self.output, str(PROCESSORS),
             str(self.seed)],
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
        """Whether the group polled as many distinct values as were acknowledged, and every acknowledged value was
        processed by a committed transaction or passed by the processors' committed offsets."""
        return self.seen.consumed() >= len(self.seen.acked) and not self._unprocessed()

    def _unprocessed(self) -> dict[bytes, tuple[int, int]]:
        done = self.seen.processed()
        waiting = {v: po for v, po in list(self.seen.acked.items()) if v not in done}
        if waiting and self._positions is None:
            self._positions = CommittedPositions(self.bootstrap, f"{self.group}-rpw", self.topic, PARTITIONS)
        return self._positions.not_passed(waiting) if self._positions is not None else waiting

    def pending(self) -> dict[str, Any]:
        """What the drain still waits for."""
        unprocessed = sorted((p, o or 0) for p, o in self._unprocessed().values())
        return {"polled": self.seen.consumed(), "acknowledged": len(self.seen.acked),
                "unprocessed": len(unprocessed), "unprocessed_examples": unprocessed[:10],
                "running": self.running(), "exit": self.exit_status()}

    def stop(self) -> None:
        """Close the clients (bounded) and wait for the JVM; killed if it does not exit in time."""
        if self._positions is not None:
            self._positions.close()
            self._positions = None
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
        """Both topics read back whole (read_all's consumer is read_committed: librdkafka's default)."""
        self.final, self.final_output = ([(p, o, v) for v, places in read_all(self.bootstrap, t, PARTITIONS,
                                                                              timeout=120).items() for p, o in places]
                                         for t in (self.topic, self.output))

    def check(self) -> Anomalies:
        return self.seen.check(self.final, self.output, self.final_output)

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
            "java_transactions": s.transaction_counts(),
            "java_transaction_errors": {name: errors[:10] for name, errors in s.txn_errors.items()},
            "java_output_records": len(self.final_output),
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
            "java_transactions": [t.as_dict() for t in self.seen.txns],
            "java_final_output": [[p, o, v.decode()] for p, o, v in self.final_output],
        }
