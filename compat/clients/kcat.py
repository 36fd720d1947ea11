"""kcat (the Debian package): one process per produce/consume/query, parsed from its JSON output.

kcat carries text lines, so it has no binary payloads, no per-record timestamps and no admin API;
headers given with -H apply to every record of one invocation, so records are sent in runs that
share partition and headers.
"""

from __future__ import annotations

import functools
import json
import queue
import re
import signal
import subprocess
import threading
import time
import uuid
from typing import Any

from compat import env
from compat.clients import base
from compat.clients.base import ClientError, Delivery, Member, Msg, Record

CLIENT_ID = "compat-kcat"
_ERR_RE = re.compile(r"(Broker|Local): ([^(\n]+)")


def _librdkafka_messages() -> dict[str, int]:
    """librdkafka's error strings ("Broker: Unknown topic or partition") to Kafka error codes."""
    from confluent_kafka import KafkaError

    out = {}
    for code in range(1, 130):
        try:
            out[KafkaError(code).str().split(": ", 1)[1].strip().lower()] = code
        except Exception:
            pass
    return out


_MESSAGES = _librdkafka_messages()


def _error_from_text(text: str) -> ClientError:
    if "SASL authentication error" in text or "Local: Authentication failure" in text:
        return ClientError("SASL_AUTHENTICATION_FAILED", text.strip()[-2000:])
    for m in _ERR_RE.finditer(text):
        kind, msg = m.group(1), m.group(2).strip().lower()
        if kind == "Broker" and msg in _MESSAGES:
            return ClientError(base.error_name(_MESSAGES[msg]), text.strip())
        if "offset out of range" in msg:
            return ClientError("OFFSET_OUT_OF_RANGE", text.strip())
    if "Offset out of range" in text:
        return ClientError("OFFSET_OUT_OF_RANGE", text.strip())
    return ClientError("CLIENT_ERROR", text.strip()[-2000:])


# librdkafka before 2.6.1 sends the client nonce twice in SCRAM's client-final message ("r=" client nonce
# + the server's nonce, which already starts with the client's); Kafka 4 compares the nonce exactly.
SCRAM_NONCE_FIXED = (2, 6, 1)


@functools.cache
def librdkafka_version(exe: str) -> tuple[int, ...]:
    """The librdkafka kcat is built with, from ``kcat -V`` ("... librdkafka 2.0.2 builtin.features=...")."""
    out = subprocess.run([exe, "-V"], capture_output=True, text=True, timeout=10).stdout
    m = re.search(r"librdkafka (\d+)\.(\d+)\.(\d+)", out)
    if m is None:
        raise RuntimeError(f"no librdkafka version in `{exe} -V`: {out[:300]!r}")
    return tuple(int(x) for x in m.groups())


class KcatClient(base.Client):
    name = "kcat"
    caps = frozenset({base.ASSIGN, base.GROUPS, base.LIST_OFFSETS, base.DESCRIBE_UNKNOWN, base.IDEMPOTENCE,
                      base.RESET_NONE, base.HEADERS, base.NULL_VALUES, base.ACKS0, base.MAX_MESSAGE_OVERRIDE})

    def __init__(self, bootstrap: str, sasl: base.Sasl | None = None) -> None:
        self.exe = env.kcat()
        if sasl is not None and sasl.mechanism.startswith("SCRAM"):
            have = librdkafka_version(self.exe)
            if have < SCRAM_NONCE_FIXED:
                raise base.NotSupportedByClient(
                    f"SASL mechanism {sasl.mechanism}: kcat's librdkafka {'.'.join(map(str, have))} repeats the "
                    "client nonce in SCRAM's client-final message (fixed in librdkafka 2.6.1), which RFC 5802 "
                    "and Kafka from 4.0 reject")
        super().__init__(bootstrap, sasl)

    def _security(self) -> list[str]:
        from compat.clients.confluent import security_conf

        return [x for k, v in security_conf(self.sasl).items() for x in ("-X", f"{k}={v}")]

    def _base(self, *mode: str) -> list[str]:
        return [self.exe, *mode, "-b", self.bootstrap, "-X", f"client.id={CLIENT_ID}", *self._security(), "-m", "15"]

    def _run(self, args: list[str], stdin: bytes | None = None, timeout: float = 30.0) -> str:
        try:
            p = subprocess.run(args, input=stdin, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise ClientError("REQUEST_TIMED_OUT", f"kcat timed out: {(e.stderr or b'').decode()[-500:]}") from None
        err = p.stderr.decode(errors="replace")
        if p.returncode != 0 or "% ERROR" in err:
            raise _error_from_text(err or f"kcat exited {p.returncode}")
        return p.stdout.decode()

    # --- metadata ---
    def metadata(self) -> dict[str, Any]:
        md = json.loads(self._run(self._base("-L", "-J")))
        return {"brokers": sorted(b["id"] for b in md["brokers"]),
                "topics": {t["topic"]: len(t["partitions"]) for t in md["topics"] if not t.get("error")}}

    def describe_topic(self, name: str) -> int:
        md = json.loads(self._run(self._base("-L", "-J", "-t", name, "-X", "allow.auto.create.topics=false")))
        (t,) = md["topics"]
        if t.get("error"):
            raise _error_from_text(t["error"])
        return len(t["partitions"])

    # --- produce ---
    def produce(self, topic: str, msgs: list[Msg], *, acks: str = "all", compression: str = "none",
                idempotent: bool = False, timeout: float = 30.0) -> list[Delivery]:
        out: list[Delivery] = []
        i = 0
        while i < len(msgs):
            j = i
            while j < len(msgs) and msgs[j].partition == msgs[i].partition and msgs[j].headers == msgs[i].headers:
                j += 1
            self._produce_run(topic, msgs[i:j], acks, compression, idempotent, timeout)
            out += [Delivery(m.partition if m.partition is not None else -1, -1) for m in msgs[i:j]]
            i = j
        return out

    def _produce_run(self, topic: str, msgs: list[Msg], acks: str, compression: str, idempotent: bool,
                     timeout: float) -> None:
        first = msgs[0]
        args = self._base("-P", "-t", topic, "-K", r"\t", "-D", r"\n", "-Z",
                          "-X", f"acks={ {'all': -1}.get(acks, acks) }", "-X", f"compression.codec={compression}",
                          "-X", "message.max.bytes=10000000", "-X", f"enable.idempotence={str(idempotent).lower()}",
                          "-X", "linger.ms=5")
        if first.partition is not None:
            args += ["-p", str(first.partition)]
        for k, v in first.headers:
            if v is None:
                raise base.NotSupportedByClient("null header values")
            args += ["-H", f"{k}={v.decode()}"]
        lines = []
        for m in msgs:
            if m.timestamp is not None:
                raise base.NotSupportedByClient("record timestamps")
            v = m.value or b""
            if m.value is not None and not m.value:
                raise base.NotSupportedByClient("empty (non-null) values")
            if b"\n" in v or b"\t" in v or (m.key and (b"\n" in m.key or b"\t" in m.key)):
                raise base.NotSupportedByClient("binary keys/values")
            lines.append((m.key + b"\t" + v) if m.key is not None else v)
        self._run(args, stdin=b"\n".join(lines) + b"\n", timeout=timeout)

    # --- consume ---
    def consume(self, topic: str, partitions: list[int], *, start: int | str = "earliest", count: int,
                timeout: float = 20.0, isolation: str = "read_uncommitted", reset: str = "earliest",
                idle: float | None = None) -> list[Record]:
        offset = {"earliest": "beginning", "latest": "end"}.get(str(start), str(start))
        reset = {"none": "error"}.get(reset, reset)
        npart = self.describe_topic(topic)
        runs = [None] if sorted(partitions) == list(range(npart)) else partitions
        procs = []
        for p in runs:
            args = self._base("-C", "-t", topic, "-o", offset, "-J", "-u", "-c", str(count),
                              "-X", f"isolation.level={isolation}", "-X", f"auto.offset.reset={reset}",
                              "-X", "fetch.wait.max.ms=100")
            if p is not None:
                args += ["-p", str(p)]
            procs.append(_Lines(args))
        out: list[Record] = []
        deadline = time.monotonic() + timeout
        last = time.monotonic()
        try:
            while len(out) < count and time.monotonic() < deadline:
                if idle is not None and time.monotonic() - last > idle:
                    break
                got = False
                for pr in procs:
                    for line in pr.drain():
                        out.append(_record(json.loads(line)))
                        got = True
                    if pr.error():
                        raise _error_from_text(pr.error())
                if got:
                    last = time.monotonic()
                elif all(pr.done() for pr in procs):
                    break
                else:
                    time.sleep(0.05)
        finally:
            for pr in procs:
                pr.stop()
        return out[:count] if len(out) > count else out

    def list_offset(self, topic: str, partition: int, spec: int | str) -> int:
        ts = {"earliest": -2, "latest": -1}.get(spec, spec) if isinstance(spec, str) else spec
        res = json.loads(self._run(self._base("-Q", "-J", "-t", f"{topic}:{partition}:{ts}")))
        entry = res[topic][str(partition)]
        if "error" in entry:
            raise _error_from_text(entry["error"])
        return int(entry["offset"])

    # --- groups ---
    def start_member(self, group: str, topics: list[str], *, protocol: str = "classic",
                     assignor: str = "roundrobin", reset: str = "earliest", auto_commit: bool = True,
                     session_timeout_ms: int = 10000) -> Member:
        if protocol != "classic":
            raise base.NotSupportedByClient("group.protocol=consumer (librdkafka 2.0 inside kcat)")
        args = [self.exe, "-b", self.bootstrap, "-X", f"client.id={CLIENT_ID}", *self._security(),
                "-G", group, "-J", "-u",
                "-X", f"partition.assignment.strategy={assignor}", "-X", f"session.timeout.ms={session_timeout_ms}",
                "-X", "heartbeat.interval.ms=500", "-X", f"auto.offset.reset={reset}",
                "-X", "auto.commit.interval.ms=200", "-X", "fetch.wait.max.ms=100", *topics]
        return _KcatMember(args)


def _record(d: dict[str, Any]) -> Record:
    hs = d.get("headers") or []
    headers = [(hs[i], None if hs[i + 1] is None else hs[i + 1].encode()) for i in range(0, len(hs), 2)]
    return Record(d["partition"], d["offset"], None if d["key"] is None else d["key"].encode(),
                  None if d["payload"] is None else d["payload"].encode(), headers, d.get("ts", -1), d["topic"])


class _Lines:
    """A kcat process whose stdout lines are collected by a thread."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.q: queue.Queue[str] = queue.Queue()
        self.err: list[str] = []
        self.t_out = threading.Thread(target=self._read_out, daemon=True)
        self.t_err = threading.Thread(target=self._read_err, daemon=True)
        self.t_out.start()
        self.t_err.start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            s = line.decode(errors="replace").strip()
            if s:
                self.q.put(s)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.on_stderr(line.decode(errors="replace").rstrip())

    def on_stderr(self, line: str) -> None:
        if line.startswith("% ERROR"):
            self.err.append(line)

    def drain(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self.q.get_nowait())
            except queue.Empty:
                return out

    def error(self) -> str | None:
        return "\n".join(self.err) or None

    def done(self) -> bool:
        return self.proc.poll() is not None and self.q.empty() and not self.t_out.is_alive()

    def stop(self, sig: int = signal.SIGKILL, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.t_out.join(5)
        self.t_err.join(5)


_ASSIGN_RE = re.compile(r"(\S+) \[(\d+)\]")


class _KcatMember(Member):
    """kcat -G: a balanced consumer; its assignment is read from the rebalance lines it prints."""

    def __init__(self, args: list[str]) -> None:
        super().__init__()
        self.id = uuid.uuid4().hex[:6]
        self._lines = _Lines(args)
        self._lines.on_stderr = self._on_stderr  # type: ignore[method-assign]
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _on_stderr(self, line: str) -> None:
        # "% Group g rebalanced (memberid ...): assigned: t [0], t [1]" / "...: revoked: ..."
        if "rebalanced" in line and "assigned:" in line:
            parts = line.split("assigned:", 1)[1]
            self._set_assignment([(t, int(p)) for t, p in _ASSIGN_RE.findall(parts)])
        elif "rebalanced" in line and "revoked:" in line:
            self._set_assignment([])
        elif line.startswith("% ERROR"):
            self.error = line

    def _run(self) -> None:
        while not self._stop.is_set():
            lines = self._lines.drain()
            if lines:
                self._add([_record(json.loads(x)) for x in lines])
            time.sleep(0.05)

    def close(self) -> None:
        # SIGTERM: kcat closes the consumer (commit, LeaveGroup) before exiting.
        self._lines.stop(signal.SIGTERM, timeout=20)
        self._stop.set()
        self._t.join(5)
        self._add([_record(json.loads(x)) for x in self._lines.drain()])
