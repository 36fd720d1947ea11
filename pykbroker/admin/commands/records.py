"""``pykbroker produce`` and ``pykbroker consume``: records from stdin to a topic and from a topic to stdout, in
the spirit of kcat, with librdkafka's producer and consumer (so -X takes their properties: acks,
compression.type, linger.ms, fetch.max.bytes, ...).

In JSON lines, keys, values and header values are strings when they are valid UTF-8 and ``{"base64": "..."}``
otherwise (``null`` for a null key or value); ``produce --format json`` reads the same shapes back."""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

import click
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from ..client import librdkafka_config
from ..errors import EXIT_FAILED, EXIT_UNREACHABLE, EXIT_USAGE, AdminError, from_kafka
from ..session import Session, connection_options
from .common import existing_topic, offsets_of

# librdkafka's logical offsets for Consumer.assign.
_OFFSET_BEGINNING, _OFFSET_END = -2, -1


def encode_bytes(data: bytes | None) -> Any:
    """Bytes in a JSON document: the text when it is UTF-8, else ``{"base64": ...}``."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def decode_bytes(value: Any, what: str) -> bytes | None:
    """The inverse of ``encode_bytes`` for ``produce --format json``."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict) and set(value) == {"base64"} and isinstance(value["base64"], str):
        try:
            return base64.b64decode(value["base64"], validate=True)
        except ValueError as e:
            raise AdminError(f"{what}: invalid base64", EXIT_USAGE) from e
    raise AdminError(f"{what} must be a string, null or {{\"base64\": ...}}, not {value!r}", EXIT_USAGE)


def _headers_in(value: Any, line: int) -> list[tuple[str, bytes | None]]:
    if value is None:
        return []
    if isinstance(value, dict):
        return [(str(k), decode_bytes(v, f"line {line}: header {k}")) for k, v in value.items()]
    if isinstance(value, list) and all(isinstance(h, list) and len(h) == 2 and isinstance(h[0], str)
                                       for h in value):
        return [(h[0], decode_bytes(h[1], f"line {line}: header {h[0]}")) for h in value]
    raise AdminError(f"line {line}: headers must be an object or a list of [name, value] pairs", EXIT_USAGE)


def _lines(stream: IO[bytes]) -> Iterator[bytes]:
    for raw in stream:
        yield raw[:-1] if raw.endswith(b"\n") else raw


class _Record:
    __slots__ = ("headers", "key", "partition", "timestamp", "value")

    def __init__(self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]],
                 partition: int | None, timestamp: int | None = None) -> None:
        self.key, self.value, self.headers, self.partition = key, value, headers, partition
        self.timestamp = timestamp


def _records(stream: IO[bytes], fmt: str, key_delimiter: bytes | None, headers: list[tuple[str, bytes | None]],
             partition: int | None) -> Iterator[_Record]:
    for n, line in enumerate(_lines(stream), 1):
        if fmt == "json":
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError as e:
                raise AdminError(f"line {n}: not JSON: {e}", EXIT_USAGE) from e
            if not isinstance(doc, dict) or set(doc) - {"key", "value", "headers", "partition", "timestamp"}:
                raise AdminError(f"line {n}: a record is an object with key, value, headers, partition and "
                                 "timestamp", EXIT_USAGE)
            p, ts = doc.get("partition", partition), doc.get("timestamp")
            if any(v is not None and not isinstance(v, int) for v in (p, ts)):
                raise AdminError(f"line {n}: partition and timestamp are integers", EXIT_USAGE)
            yield _Record(decode_bytes(doc.get("key"), f"line {n}: key"),
                          decode_bytes(doc.get("value"), f"line {n}: value"),
                          headers + _headers_in(doc.get("headers"), n), p, ts)
        elif key_delimiter is not None:
            key, sep, value = line.partition(key_delimiter)
            yield _Record(key, value, headers, partition) if sep else _Record(None, line, headers, partition)
        else:
            yield _Record(None, line, headers, partition)


def _delimiter(text: str | None) -> bytes | None:
    if text is None:
        return None
    if not text:
        raise AdminError("-k/--key-delimiter must not be empty", EXIT_USAGE)
    return text.encode("utf-8").decode("unicode_escape").encode("latin-1")


@click.command("produce")
@click.argument("topic")
@click.option("-f", "--file", "path", type=click.Path(dir_okay=False, exists=True, allow_dash=True),
              default="-", help="read the records from FILE (default: stdin)")
@click.option("-k", "--key-delimiter", metavar="SEP", help="split each line at the first SEP into key and value "
              "(a line without SEP has a null key); \\t is a tab")
@click.option("-H", "--header", "header_items", multiple=True, metavar="NAME=VALUE",
              help="a header on every record (repeatable)")
@click.option("-p", "--partition", type=int, help="the partition (default: the partitioner's choice)")
@click.option("--format", "record_format", type=click.Choice(["text", "json"]), default="text",
              show_default=True,
              help='text: one value per line; json: one {"key","value","headers","partition","timestamp"} per line')
@connection_options
def produce(topic: str, path: str, key_delimiter: str | None, header_items: tuple[str, ...], partition: int | None,
            record_format: str, session: Session) -> None:
    """Produce records to TOPIC, one per line; print how many were written and where. Exit 1 if any failed."""
    delimiter = _delimiter(key_delimiter)
    headers: list[tuple[str, bytes | None]] = []
    for item in header_items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise AdminError(f"-H takes NAME=VALUE, not {item!r}", EXIT_USAGE)
        headers.append((name, value.encode("utf-8")))
    conf = librdkafka_config(session.props, session.timeout)
    conf.setdefault("message.timeout.ms", str(int(max(session.timeout, 1) * 1000)))
    producer = Producer(conf)
    delivered: dict[int, list[int]] = {}  # partition: [count, first offset, last offset]
    failures: list[str] = []

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            failures.append(str(err.name()) + ": " + str(err.str()))
            return
        stats = delivered.setdefault(msg.partition(), [0, msg.offset(), msg.offset()])
        stats[0] += 1
        stats[1], stats[2] = min(stats[1], msg.offset()), max(stats[2], msg.offset())

    sent = 0
    stream = click.open_file(path, "rb")
    with stream, session.out.progress(f"producing to {topic}", None) as bar:
        for record in _records(stream, record_format, delimiter, headers, partition):
            kwargs: dict[str, Any] = {"value": record.value, "key": record.key, "on_delivery": on_delivery}
            if record.headers:
                kwargs["headers"] = record.headers
            if record.partition is not None:
                kwargs["partition"] = record.partition
            if record.timestamp is not None:
                kwargs["timestamp"] = record.timestamp
            _send(producer, topic, kwargs, session.timeout)
            sent += 1
            bar.update(len(failures) + sum(s[0] for s in delivered.values()))
        left = producer.flush(session.timeout)
    if left:
        failures.extend(["not delivered within the timeout"] * left)
    docs = [{"partition": p, "records": s[0], "first_offset": s[1], "last_offset": s[2]}
            for p, s in sorted(delivered.items())]
    doc = {"topic": topic, "records": sent, "delivered": sent - len(failures), "failed": len(failures),
           "partitions": docs}
    if session.out.json:
        session.out.emit(doc)
    else:
        session.out.table(["PARTITION", "RECORDS", "FIRST-OFFSET", "LAST-OFFSET"],
                          [[d["partition"], d["records"], d["first_offset"], d["last_offset"]] for d in docs])
        session.out.note(f"{doc['delivered']} of {sent} records written to {topic}")
    if failures:
        reason = failures[0]
        exit_code = EXIT_UNREACHABLE if reason.startswith(("_MSG_TIMED_OUT", "_TRANSPORT", "not delivered")) \
            else EXIT_FAILED
        click.echo(f"error: {len(failures)} record(s) not written to {topic}, the first: {reason}", err=True)
        sys.exit(exit_code)


def _send(producer: Any, topic: str, kwargs: dict[str, Any], timeout: float) -> None:
    """Queue one record; when librdkafka's queue is full, serve deliveries until it has room (bounded in time)."""
    deadline = time.monotonic() + max(timeout, 1)
    while True:
        try:
            producer.produce(topic, **kwargs)
        except BufferError:
            if time.monotonic() > deadline:
                raise AdminError(f"the producer's queue stayed full for {timeout:g} s", EXIT_UNREACHABLE,
                                 error="QUEUE_FULL") from None
            producer.poll(0.1)
            continue
        except Exception as e:
            raise from_kafka(e, f"produce to {topic}") from e
        producer.poll(0)
        return


def _parse_from(text: str) -> tuple[str, int]:
    """--from: (kind, number) with kind earliest, latest, offset, tail or timestamp."""
    if text in ("earliest", "latest"):
        return text, 0
    try:
        if text.startswith("@"):
            return "timestamp", int(text[1:])
        n = int(text)
    except ValueError as e:
        raise AdminError(f"--from takes earliest, latest, OFFSET, -N or @TIMESTAMP_MS, not {text!r}",
                         EXIT_USAGE) from e
    return ("tail", -n) if n < 0 else ("offset", n)


def _parse_to(text: str | None) -> tuple[str, int]:
    if text is None:
        return "none", 0
    if text == "end":
        return "end", 0
    try:
        if text.startswith("@"):
            return "timestamp", int(text[1:])
        n = int(text)
    except ValueError as e:
        raise AdminError(f"--to takes OFFSET, @TIMESTAMP_MS or end, not {text!r}", EXIT_USAGE) from e
    if n < 0:
        raise AdminError("--to takes an offset >= 0", EXIT_USAGE)
    return "offset", n


def _render(msg: Any, fmt: str, delimiter: bytes | None) -> bytes:
    key, value = msg.key(), msg.value()
    if fmt == "json":
        ts_type, ts = msg.timestamp()
        doc = {"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset(),
               "timestamp": ts if ts_type else None,
               "timestamp_type": {1: "CreateTime", 2: "LogAppendTime"}.get(ts_type),
               "key": encode_bytes(key), "value": encode_bytes(value),
               "headers": [[n, encode_bytes(v)] for n, v in (msg.headers() or [])]}
        return json.dumps(doc, ensure_ascii=False).encode("utf-8") + b"\n"
    if fmt == "hex":
        def hx(b: bytes | None) -> bytes:
            return b"-" if b is None else (b.hex().encode("ascii") or b'""')
        return b" ".join([str(msg.partition()).encode(), str(msg.offset()).encode(), hx(key), hx(value)]) + b"\n"
    line = value or b""
    if delimiter is not None:
        line = (key or b"") + delimiter + line
    return line + b"\n"


@click.command("consume")
@click.argument("topic")
@click.option("-p", "--partition", "partitions", type=int, multiple=True,
              help="a partition (repeatable; default: every partition)")
@click.option("--from", "from_", default="earliest", show_default=True, metavar="WHERE",
              help="earliest, latest, OFFSET, -N (N records before the end) or @TIMESTAMP_MS; "
                   "with -g only earliest or latest, for partitions without a committed offset")
@click.option("--to", "to", metavar="WHERE",
              help="stop each partition before OFFSET, before the first record at or after @TIMESTAMP_MS, or at "
                   "its end (end); never waits past a partition's current end")
@click.option("-c", "--count", type=int, help="stop after N records")
@click.option("-g", "--group", "group_id", help="consume as a member of this group, committing its offsets")
@click.option("-k", "--key-delimiter", metavar="SEP", help="text format: print key SEP value")
@click.option("--format", "record_format", type=click.Choice(["text", "json", "hex"]), default="text",
              show_default=True,
              help="text: the value; json: a document per record; hex: partition offset key value, in hex")
@click.option("--isolation-level", type=click.Choice(["read_uncommitted", "read_committed"]),
              default="read_uncommitted", show_default=True)
@connection_options
def consume(topic: str, partitions: tuple[int, ...], from_: str, to: str | None, count: int | None,
            group_id: str | None, key_delimiter: str | None, record_format: str, isolation_level: str,
            session: Session) -> None:
    """Print TOPIC's records on stdout as they arrive; stop at --to, after --count records, or after --timeout
    seconds without a record. A summary goes to stderr."""
    delimiter = _delimiter(key_delimiter)
    start_kind, start_n = _parse_from(from_)
    to_kind, to_n = _parse_to(to)
    if group_id is not None and (start_kind not in ("earliest", "latest") or partitions):
        raise AdminError("with -g, --from is earliest or latest (for partitions without a committed offset) and "
                         "the group assigns the partitions (no -p)", EXIT_USAGE)
    if group_id is not None and to_kind not in ("none", "end"):
        raise AdminError("with -g, --to is end (or not given)", EXIT_USAGE)
    if count is not None and count < 1:
        raise AdminError("--count takes N >= 1", EXIT_USAGE)
    conf = librdkafka_config(session.props, session.timeout)
    conf.update({"enable.partition.eof": True, "isolation.level": isolation_level,
                 "auto.offset.reset": "latest" if start_kind == "latest" else "earliest"})
    if group_id is None:
        conf.update({"group.id": "pykbroker-consume", "enable.auto.commit": False})
    else:
        conf.update({"group.id": group_id, "enable.auto.commit": True, "enable.auto.offset.store": False})
    stop_at: dict[int, int] = {}  # partition: the offset it stops before
    md = existing_topic(session, topic)
    if group_id is None:
        pids = sorted(partitions) if partitions else sorted(md.partitions)
        unknown = [p for p in pids if p not in md.partitions]
        if unknown:
            raise AdminError(f"topic {topic} has no partition {unknown[0]}", EXIT_USAGE)
        starts = _start_offsets(session, topic, pids, start_kind, start_n)
        if to_kind == "offset":
            stop_at = {p: to_n for p in pids}
        elif to_kind == "timestamp":
            found = offsets_of(session, topic, pids, to_n)
            stop_at = {p: o for p, o in found.items() if o >= 0}
    consumer = Consumer(conf)
    out = sys.stdout.buffer
    consumed = 0
    per_partition: dict[int, list[int]] = {}
    pending: set[int] = set()
    assigned = group_id is None

    def on_assign(c: Any, tps: list[Any]) -> None:
        nonlocal assigned
        assigned = True
        pending.update(tp.partition for tp in tps)

    def on_revoke(c: Any, tps: list[Any]) -> None:
        pending.difference_update(tp.partition for tp in tps)

    try:
        if group_id is None:
            consumer.assign([TopicPartition(topic, p, starts[p]) for p in pids])
            pending = {p for p in pids if not (p in stop_at and starts[p] >= 0 and starts[p] >= stop_at[p])}
        else:
            consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        last = time.monotonic()
        while to_kind == "none" or not assigned or pending:
            if count is not None and consumed >= count:
                break
            if time.monotonic() - last > session.timeout:
                session.out.note(f"no record for {session.timeout:g} s: stopping")
                break
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if to_kind != "none":
                        pending.discard(msg.partition())
                    continue
                if err.fatal() or not err.retriable():
                    raise AdminError(f"consume {topic}: {err.name()}: {err.str()}",
                                     EXIT_UNREACHABLE if err.name().startswith("_") else EXIT_FAILED,
                                     error=str(err.name()).lstrip("_"))
                continue
            last = time.monotonic()
            p, offset = int(msg.partition() or 0), int(msg.offset() or 0)
            if p in stop_at and offset >= stop_at[p]:
                pending.discard(p)
                continue
            if group_id is None and p not in pending and to_kind != "none":
                continue
            out.write(_render(msg, record_format, delimiter))
            out.flush()
            consumed += 1
            stats = per_partition.setdefault(p, [0, offset, offset])
            stats[0] += 1
            stats[2] = offset
            if group_id is not None:
                consumer.store_offsets(msg)
            if p in stop_at and offset + 1 >= stop_at[p]:
                pending.discard(p)
        if group_id is not None and consumed:
            try:
                consumer.commit(asynchronous=False)
            except Exception as e:
                raise from_kafka(e, f"commit the offsets of group {group_id}") from e
    finally:
        consumer.close()
    where = ", ".join(f"{topic}/{p} {s[1]}..{s[2]}" for p, s in sorted(per_partition.items()))
    session.out.note(f"{consumed} record(s) consumed" + (f": {where}" if where else ""))


def _start_offsets(session: Session, topic: str, pids: list[int], kind: str, n: int) -> dict[int, int]:
    if kind == "earliest":
        return {p: _OFFSET_BEGINNING for p in pids}
    if kind == "latest":
        return {p: _OFFSET_END for p in pids}
    if kind == "offset":
        return {p: n for p in pids}
    if kind == "timestamp":
        found = offsets_of(session, topic, pids, n)
        return {p: found[p] if found.get(p, -1) >= 0 else _OFFSET_END for p in pids}
    start, end = offsets_of(session, topic, pids, "earliest"), offsets_of(session, topic, pids, "latest")
    missing = [p for p in pids if p not in start or p not in end]
    if missing:
        raise AdminError(f"no offsets for {topic}/{missing[0]}: its leader did not answer", EXIT_FAILED)
    return {p: max(end[p] - n, start[p]) for p in pids}


COMMANDS = (produce, consume)
