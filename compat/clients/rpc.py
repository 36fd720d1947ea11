"""Clients in another runtime (the JVM, Node): a long-lived process speaking JSON lines.

Request:  {"id": n, "op": "produce", ...arguments}
Response: {"id": n, "ok": true, "result": ...} or {"id": n, "ok": false, "error": {"code", "name", "message"}}
The process answers {"id": 0, "ok": true, "result": {"version": ...}} once it is ready.  Requests
run concurrently in the process (group members live there and poll on their own).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from compat.clients import base
from compat.clients.base import ClientError, Delivery, Member, Msg, Record


class RpcProcess:
    def __init__(self, args: list[str], cwd: Path | None = None, ready_timeout: float = 60.0) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="compat-rpc-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen(args, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     start_new_session=True)
        self._lock = threading.Lock()
        self._next = 1
        # Held here too: the reader takes the future out of _pending when the hello arrives, which a
        # process that starts fast (the Go drivers) can send before this thread asks for it.
        ready: Future[Any] = Future()
        self._pending: dict[int, Future[Any]] = {0: ready}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            self.hello = ready.result(ready_timeout)
        except FutureTimeout:
            self.close()
            raise RuntimeError(f"{args[0]} driver not ready in {ready_timeout}s:\n{self.stderr_tail()}") from None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                fut = self._pending.pop(msg.get("id"), None)
            if fut is None:
                continue
            if msg.get("ok"):
                fut.set_result(msg.get("result"))
            else:
                fut.set_exception(_error(msg.get("error") or {}))
        with self._lock:
            pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(RuntimeError(f"driver process exited:\n{self.stderr_tail()}"))

    def stderr_tail(self, n: int = 3000) -> str:
        try:
            return Path(self.log.name).read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def call(self, op: str, rpc_timeout: float = 60.0, **args: Any) -> Any:
        with self._lock:
            rid = self._next
            self._next += 1
            fut: Future[Any] = Future()
            self._pending[rid] = fut
        data = json.dumps({"id": rid, "op": op, **args}) + "\n"
        assert self.proc.stdin is not None
        try:
            with self._lock:
                self.proc.stdin.write(data.encode())
                self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise RuntimeError(f"driver process is gone:\n{self.stderr_tail()}") from None
        try:
            return fut.result(rpc_timeout)
        except FutureTimeout:
            with self._lock:
                self._pending.pop(rid, None)
            raise ClientError("REQUEST_TIMED_OUT", f"{op} got no answer from the driver in {rpc_timeout}s") from None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(20)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


def _error(err: dict[str, Any]) -> Exception:
    if err.get("not_supported"):
        return base.NotSupportedByClient(err.get("message", ""))
    code = err.get("code", -1)
    name = base.error_name(code) if isinstance(code, int) and code > 0 else err.get("name") or "CLIENT_ERROR"
    return ClientError(name, f"{err.get('class', '')}: {err.get('message', '')}".strip(": "))


class RpcClient(base.Client):
    """A Client whose every call is an op of a driver process."""

    rpc: RpcProcess

    def security_args(self) -> list[str]:
        """The driver's optional second argument: the SASL identity as JSON (one process per identity)."""
        if self.sasl is None:
            return []
        return [json.dumps({"mechanism": self.sasl.mechanism, "username": self.sasl.username,
                            "password": self.sasl.password})]

    def close(self) -> None:
        self.rpc.close()

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     configs: dict[str, str] | None = None) -> None:
        self.rpc.call("create_topic", name=name, partitions=partitions, replication_factor=replication_factor,
                      configs=configs or {})

    def delete_topic(self, name: str) -> None:
        self.rpc.call("delete_topic", name=name)

    def create_partitions(self, name: str, total: int) -> None:
        self.rpc.call("create_partitions", name=name, total=total)

    def describe_topic(self, name: str) -> int:
        return int(self.rpc.call("describe_topic", name=name))

    def topic_configs(self, name: str) -> dict[str, str]:
        return dict(self.rpc.call("topic_configs", name=name))

    def delete_records(self, topic: str, partition: int, before: int) -> int:
        return int(self.rpc.call("delete_records", topic=topic, partition=partition, before=before))

    def metadata(self) -> dict[str, Any]:
        md = self.rpc.call("metadata")
        return {"brokers": sorted(md["brokers"]), "topics": dict(md["topics"])}

    def produce(self, topic: str, msgs: list[Msg], *, acks: str = "all", compression: str = "none",
                idempotent: bool = False, timeout: float = 30.0) -> list[Delivery]:
        res = self.rpc.call("produce", timeout + 30, topic=topic, msgs=[m.to_json() for m in msgs],
                            acks={"all": "all"}.get(acks, acks), compression=compression, idempotent=idempotent,
                            timeout=timeout)
        return [Delivery(d["partition"], d["offset"]) for d in res]

    def produce_transactions(self, topic: str, txns: list[tuple[list[Msg], bool]], transactional_id: str,
                             timeout: float = 60.0) -> None:
        self.rpc.call("produce_transactions", timeout + 30, topic=topic, transactional_id=transactional_id,
                      txns=[{"msgs": [m.to_json() for m in ms], "commit": c} for ms, c in txns], timeout=timeout)

    def transactional_offsets(self, topic: str, msgs: list[Msg], transactional_id: str, group: str,
                              offsets_topic: str, offsets: dict[int, int], commit: bool,
                              timeout: float = 60.0) -> None:
        self.rpc.call("transactional_offsets", timeout + 30, topic=topic, msgs=[m.to_json() for m in msgs],
                      transactional_id=transactional_id, group=group, offsets_topic=offsets_topic,
                      offsets={str(k): v for k, v in offsets.items()}, commit=commit, timeout=timeout)

    def consume(self, topic: str, partitions: list[int], *, start: int | str = "earliest", count: int,
                timeout: float = 20.0, isolation: str = "read_uncommitted", reset: str = "earliest",
                idle: float | None = None) -> list[Record]:
        res = self.rpc.call("consume", timeout + 30, topic=topic, partitions=partitions, start=start, count=count,
                            timeout=timeout, isolation=isolation, reset=reset, idle=idle)
        return [Record.from_json(r) for r in res]

    def list_offset(self, topic: str, partition: int, spec: int | str) -> int:
        return int(self.rpc.call("list_offset", topic=topic, partition=partition, spec=spec))

    def start_member(self, group: str, topics: list[str], *, protocol: str = "classic",
                     assignor: str = "roundrobin", reset: str = "earliest", auto_commit: bool = True,
                     session_timeout_ms: int = 10000) -> Member:
        mid = self.rpc.call("start_member", group=group, topics=topics, protocol=protocol, assignor=assignor,
                            reset=reset, auto_commit=auto_commit, session_timeout_ms=session_timeout_ms)
        return RpcMember(self.rpc, mid)

    def commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        self.rpc.call("commit_offsets", group=group, topic=topic, offsets={str(k): v for k, v in offsets.items()})

    def committed_offsets(self, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
        res = self.rpc.call("committed_offsets", group=group, topic=topic, partitions=partitions)
        return {int(k): int(v) for k, v in res.items()}

    def list_groups(self) -> set[str]:
        return set(self.rpc.call("list_groups"))

    def describe_group(self, group: str) -> dict[str, Any]:
        d = self.rpc.call("describe_group", group=group)
        return {"state": base.norm_state(d["state"]), "members": int(d["members"])}

    def delete_group(self, group: str) -> None:
        self.rpc.call("delete_group", group=group)

    def delete_committed_offsets(self, group: str, topic: str, partitions: list[int]) -> None:
        self.rpc.call("delete_committed_offsets", group=group, topic=topic, partitions=partitions)

    def list_transactions(self) -> dict[str, str]:
        return {k: base.norm_state(v) for k, v in self.rpc.call("list_transactions").items()}

    def describe_transaction(self, transactional_id: str) -> str:
        return base.norm_state(self.rpc.call("describe_transaction", transactional_id=transactional_id))

    def describe_producers(self, topic: str, partition: int) -> list[int]:
        return [int(x) for x in self.rpc.call("describe_producers", topic=topic, partition=partition)]


    # --- configs and cluster admin ---
    def alter_configs(self, rtype: str, name: str, ops: list[tuple[str, str, str | None]], *,
                      incremental: bool = True, validate_only: bool = False) -> None:
        self.rpc.call("alter_configs", rtype=rtype, name=name, ops=[list(o) for o in ops], incremental=incremental,
                      validate_only=validate_only)

    def describe_configs(self, rtype: str, name: str, *, synonyms: bool = False) -> dict[str, base.ConfigValue]:
        res = self.rpc.call("describe_configs", rtype=rtype, name=name, synonyms=synonyms)
        return {k: base.ConfigValue(v["value"], base.norm_source(v["source"]),
                                    [(n, val, base.norm_source(src)) for n, val, src in v.get("synonyms") or []],
                                    v.get("read_only"))
                for k, v in res.items()}

    def describe_cluster(self, authorized_operations: bool = False) -> dict[str, Any]:
        d = self.rpc.call("describe_cluster", authorized_operations=authorized_operations)
        ops = d.get("authorized_operations")
        return {"cluster_id": d["cluster_id"], "controller": int(d["controller"]),
                "brokers": sorted(int(b) for b in d["brokers"]),
                "authorized_operations": None if ops is None else {str(o).upper() for o in ops}}

    def describe_topic_detail(self, name: str, authorized_operations: bool = False) -> dict[str, Any]:
        d = self.rpc.call("describe_topic_detail", name=name, authorized_operations=authorized_operations)
        ops = d.get("authorized_operations")
        return {"topic_id": d.get("topic_id"),
                "partitions": {int(p): v for p, v in d["partitions"].items()},
                "authorized_operations": None if ops is None else {str(o).upper() for o in ops}}

    def topic_authorized_operations(self, name: str) -> set[str] | None:
        ops = self.describe_topic_detail(name, authorized_operations=True)["authorized_operations"]
        return None if ops is None else set(ops)

    def group_authorized_operations(self, group: str) -> set[str] | None:
        ops = self.rpc.call("group_authorized_operations", group=group)
        return None if ops is None else {str(o).upper() for o in ops}

    def describe_log_dirs(self, broker: int) -> dict[str, dict[str, Any]]:
        res = self.rpc.call("describe_log_dirs", broker=broker)
        return {path: {"error": d.get("error") if d.get("error") not in ("NONE", "") else None,
                       "replicas": {(x["topic"], int(x["partition"])): {"size": int(x["size"]),
                                                                       "future": bool(x["future"])}
                                    for x in d["replicas"]}}
                for path, d in res.items()}

    def alter_replica_log_dir(self, topic: str, partition: int, broker: int, path: str) -> None:
        self.rpc.call("alter_replica_log_dir", topic=topic, partition=partition, broker=broker, path=path)

    def elect_leaders(self, topic: str, partitions: list[int]) -> dict[int, str | None]:
        return {int(p): e for p, e in self.rpc.call("elect_leaders", topic=topic, partitions=partitions).items()}

    def alter_reassignments(self, topic: str, targets: dict[int, list[int] | None]) -> dict[int, str | None]:
        res = self.rpc.call("alter_reassignments", topic=topic, targets={str(p): r for p, r in targets.items()})
        return {int(p): e for p, e in res.items()}

    def list_reassignments(self, topic: str, partitions: list[int]) -> dict[int, dict[str, list[int]]]:
        res = self.rpc.call("list_reassignments", topic=topic, partitions=partitions)
        return {int(p): v for p, v in res.items()}

    def describe_client_quotas(self, entity: dict[str, str]) -> dict[str, float]:
        return {k: float(v) for k, v in self.rpc.call("describe_client_quotas", entity=entity).items()}

    def alter_client_quotas(self, entity: dict[str, str], quotas: dict[str, float | None],
                            validate_only: bool = False) -> None:
        self.rpc.call("alter_client_quotas", entity=entity, quotas=quotas, validate_only=validate_only)

    def max_timestamp_offset(self, topic: str, partition: int) -> tuple[int, int]:
        off, ts = self.rpc.call("max_timestamp_offset", topic=topic, partition=partition)
        return int(off), int(ts)

    def consume_validated(self, topic: str, partition: int, offset: int, count: int,
                          timeout: float = 30.0) -> list[Record]:
        res = self.rpc.call("consume_validated", timeout + 30, topic=topic, partition=partition, offset=offset,
                            count=count, timeout=timeout)
        return [Record.from_json(r) for r in res]

    def push_telemetry(self, client_id: str, hold: float) -> str | None:
        return self.client_instance_id(client_id=client_id, hold=hold)

    def client_instance_id(self, client_id: str | None = None, hold: float = 0.0) -> str:
        return str(self.rpc.call("client_instance_id", 60 + hold, timeout=30, client_id=client_id, hold=hold))


class RpcMember(Member):
    """A member living in the driver process; its state is fetched on demand (at most every 50 ms)."""

    def __init__(self, rpc: RpcProcess, member_id: str) -> None:
        super().__init__()
        self._rpc = rpc
        self._id = member_id
        self._closed = False
        self._last = 0.0

    def _refresh(self, state: dict[str, Any] | None = None) -> None:
        if state is None:
            if self._closed or time.monotonic() - self._last < 0.05:
                return
            state = self._rpc.call("member_state", member=self._id)
            self._last = time.monotonic()
        self._set_assignment([(t, int(p)) for t, p in state["assignment"]])
        self._add([Record.from_json(r) for r in state["records"]])
        if state.get("error"):
            self.error = state["error"]
        if state.get("failed"):
            self.failed = True

    def assignment(self) -> list[tuple[str, int]]:
        self._refresh()
        return super().assignment()

    def records(self) -> list[Record]:
        self._refresh()
        return super().records()

    def close(self) -> None:
        if self._closed:
            return
        state = self._rpc.call("member_close", 60, member=self._id)
        self._closed = True
        if state:
            self._refresh(state)
