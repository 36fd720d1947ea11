"""Turning measurements and errors into text for the bench scripts: progress lines on stderr,
percentiles, table cells and client errors."""

from __future__ import annotations

import sys
import time
from typing import Any

try:
    from confluent_kafka import KafkaError, KafkaException
except ImportError:  # pragma: no cover - reported at run time
    print("bench.py needs confluent-kafka: pip install 'confluent-kafka>=2.6'", file=sys.stderr)
    raise


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q / 100.0 * (len(s) - 1))))
    return s[k]


def err_str(e: BaseException) -> str:
    if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
        ke = e.args[0]
        return f"{ke.name()}: {ke.str()}"
    return f"{type(e).__name__}: {e}"


def fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        if digits == 0:
            return f"{v:,.0f}"
        return f"{v:,.{digits}f}"
    return str(v)


def mib(kib: int | None) -> str:
    return "n/a" if kib is None else f"{kib / 1024:.0f}"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
