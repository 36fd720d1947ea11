"""Log lines in one of three formats, chosen with ``pykbroker.log.format``:

- ``text`` (default): ``time level logger: message key=value ...``, for people reading a terminal;
- ``logfmt``: ``ts=... level=... logger=... msg="..." key=value ...``, for Loki/grep-style tooling;
- ``json``: one JSON object per line, for log pipelines that parse JSON.

Structured fields travel in ``extra={"kv": {...}}`` so every format carries them as fields, not
only inside the message text. One line per event (a traceback is folded into the line in logfmt
and JSON), without a JSON-logging dependency.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from typing import Any

FORMATS = ("text", "logfmt", "json")


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    kv = getattr(record, "kv", None)
    return kv if isinstance(kv, dict) else {}


def _logfmt_value(value: Any) -> str:
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    if text and not any(c in text for c in ' "=\\\n\t') and text.isprintable():
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        for k, v in _fields(record).items():
            line += f" {k}={_logfmt_value(v)}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        pairs: dict[str, Any] = {"ts": _timestamp(record), "level": record.levelname.lower(),
                                 "logger": record.name, "msg": record.getMessage()}
        pairs.update(_fields(record))
        if record.exc_info:
            pairs["exception"] = self.formatException(record.exc_info)
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in pairs.items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {"ts": _timestamp(record), "level": record.levelname.lower(),
                               "logger": record.name, "msg": record.getMessage()}
        doc.update(_fields(record))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


_FORMATTERS: dict[str, type[logging.Formatter]] = {
    "text": TextFormatter, "logfmt": LogfmtFormatter, "json": JsonFormatter}


def configure(level: str = "INFO", fmt: str = "text") -> None:
    if fmt not in _FORMATTERS:
        raise ValueError(f"unknown log format {fmt!r} (one of {', '.join(FORMATS)})")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_FORMATTERS[fmt]())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class RateLimitedLog:
    """At most one line per ``interval_s`` for a recurring event, saying how often it happened meanwhile."""

    __slots__ = ("_interval_s", "_last", "_logger", "_suppressed")

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._last = -math.inf
        self._suppressed = 0

    def log(self, now: float, level: int, msg: str, *args: object) -> bool:
        if now - self._last < self._interval_s:
            self._suppressed += 1
            return False
        if self._suppressed:
            msg += " (%d more since the last such line)"
            args = (*args, self._suppressed)
        self._last = now
        self._suppressed = 0
        self._logger.log(level, msg, *args)
        return True
