"""Message builders and comparisons shared by the scenarios."""

from __future__ import annotations

import os
from collections import defaultdict

from compat.clients.base import ClientError, Msg, Record


def text_msgs(n: int, prefix: str = "m", partition: int | None = None, headers: bool = True,
              null_every: int = 0) -> list[Msg]:
    """Printable keys, values and headers (what every client, kcat included, can carry).

    Headers are the same for the whole batch (kcat sets them per invocation); the repeated key
    checks that order and duplicates survive."""
    out = []
    for i in range(n):
        value = None if null_every and i % null_every == null_every - 1 else f"{prefix}-value-{i}".encode()
        hs = [("src", prefix.encode()), ("kind", b"text"), ("kind", b"repeated")] if headers else []
        out.append(Msg(value=value, key=f"{prefix}-key-{i % 7}".encode(), headers=hs, partition=partition))
    return out


def binary_msgs(partition: int) -> list[Msg]:
    """Keys, values and headers at the edges: null and empty keys and values, raw bytes, repeated
    header keys."""
    raw = bytes(range(256))
    return [
        Msg(value=b"plain", key=b"k1", partition=partition),
        Msg(value=None, key=b"tombstone-key", partition=partition),
        Msg(value=b"no key", key=None, partition=partition),
        Msg(value=b"", key=b"", partition=partition),
        Msg(value=raw, key=raw[::-1], partition=partition),
        Msg(value=b"\x00\x00\x00", key=b"\xff", partition=partition,
            headers=[("h", b"1"), ("h", b"2"), ("empty", b""), ("utf8-\u00e9", b"\xe9")]),
        Msg(value=os.urandom(3000), key=b"random", partition=partition, headers=[("bin", os.urandom(40))]),
    ]


def by_partition(records: list[Record]) -> dict[int, list[Record]]:
    out: dict[int, list[Record]] = defaultdict(list)
    for r in records:
        out[r.partition].append(r)
    for recs in out.values():
        recs.sort(key=lambda r: r.offset)
    return dict(out)


def assert_same(sent: list[Msg], got: list[Record], check_headers: bool = True) -> None:
    """Every sent message arrived once, in order within its partition, with its key, value and headers.

    Messages without an explicit partition are matched by order of (key, value) within the partition
    they landed in."""
    parts = by_partition(got)
    assert len(got) == len(sent), f"sent {len(sent)} records, consumed {len(got)}"
    if all(m.partition is not None for m in sent):
        want: dict[int, list[Msg]] = defaultdict(list)
        for m in sent:
            assert m.partition is not None
            want[m.partition].append(m)
        assert sorted(want) == sorted(parts), f"partitions: sent {sorted(want)}, consumed {sorted(parts)}"
        for p, msgs in want.items():
            recs = parts[p]
            offs = [r.offset for r in recs]
            assert offs == sorted(set(offs)), f"partition {p}: offsets not increasing/unique {offs}"
            for i, (m, r) in enumerate(zip(msgs, recs, strict=True)):
                where = f"partition {p} record {i} (offset {r.offset})"
                assert r.key == m.key, f"{where}: key {r.key!r} != {m.key!r}"
                assert r.value == m.value, f"{where}: value {_short(r.value)} != {_short(m.value)}"
                if check_headers:
                    assert list(r.headers) == list(m.headers), f"{where}: headers {r.headers} != {m.headers}"
    else:
        want_set = sorted((m.key or b"", m.value or b"", m.value is None) for m in sent)
        got_set = sorted((r.key or b"", r.value or b"", r.value is None) for r in got)
        assert want_set == got_set


def _short(b: bytes | None) -> str:
    if b is None:
        return "None"
    return repr(b[:40]) + (f"...({len(b)} bytes)" if len(b) > 40 else "")


def expect_error(name: str | tuple[str, ...], fn, *args, **kwargs) -> ClientError:  # type: ignore[no-untyped-def]
    names = (name,) if isinstance(name, str) else name
    try:
        fn(*args, **kwargs)
    except ClientError as e:
        assert e.name in names, f"expected {' or '.join(names)}, got {e.name}: {e.message}"
        return e
    raise AssertionError(f"expected {' or '.join(names)}, but the call succeeded")
