"""Log lines in one of three formats, chosen with ``pykbroker.log.format``:

- ``text`` (default): ``time level logger: message key=value ...``, for people reading a terminal;
- ``logfmt``: ``ts=... level=... logger=... msg="..." key=value ...``, for Loki/grep-style tooling;
- ``json``: one JSON object per line, for log pipelines that parse JSON.

An event's data travels as fields, never as ``key=value`` text inside the message: either as the
named arguments of its message (``log.info("member %(member_id)s joined group %(group_id)s",
{"member_id": m, "group_id": g})``: the text reads as a sentence, logfmt and JSON carry each
argument as a field too) or as extra fields (``extra=fields(peer=..., principal=...)``, which
the text format appends as ``key=value``). One line per event (a traceback is folded into the
line in logfmt and JSON), without a JSON-logging dependency.

``pykbroker.log.levels`` sets levels per logger (``pykbroker.request=DEBUG,pykbroker.network=WARN``)
on top of the root level, as Kafka's log4j loggers do, so the request log needs no DEBUG elsewhere.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Mapping
from typing import Any

FORMATS = ("text", "logfmt", "json")
LEVELS = ("TRACE", "DEBUG", "INFO", "WARN", "WARNING", "ERROR", "FATAL", "CRITICAL", "OFF")
# log4j's names for the levels Python lacks or spells differently
_LEVEL_NUMBERS = {"TRACE": logging.DEBUG, "WARN": logging.WARNING, "FATAL": logging.CRITICAL,
                  "OFF": logging.CRITICAL + 10}


def fields(**data: Any) -> dict[str, Any]:
    """``extra=`` for a log call: the event's data as fields (in every format), in this order."""
    return {"kv": data}


def level_number(name: str) -> int:
    """A level name (Python's or log4j's, any case) as Python's number; ValueError when unknown."""
    upper = name.strip().upper()
    if upper not in LEVELS:
        raise ValueError(f"unknown log level {name!r} (one of {', '.join(LEVELS)})")
    number = _LEVEL_NUMBERS.get(upper, logging.getLevelName(upper))
    assert isinstance(number, int)
    return number


def parse_levels(value: str) -> dict[str, int]:
    """``logger=LEVEL,logger=LEVEL`` (``pykbroker.log.levels``) as logger name to level number."""
    levels: dict[str, int] = {}
    for item in (p.strip() for p in value.split(",")):
        if not item:
            continue
        name, sep, level = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{item!r} is not logger=LEVEL")
        levels[name.strip()] = level_number(level)
    return levels


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    """The fields given with ``extra=fields(...)``: not in the message text."""
    kv = getattr(record, "kv", None)
    return kv if isinstance(kv, dict) else {}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """Every field of the event: the named arguments of a ``%(name)s`` message, then the extra ones."""
    named = record.args if isinstance(record.args, Mapping) else {}
    return {**named, **_extra(record)} if named else _extra(record)


def _logfmt_value(value: Any) -> str:
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    if text and not any(c in text for c in ' "=\\\n\t') and text.isprintable():
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        for k, v in _extra(record).items():  # a message's named arguments are already in its text
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


def configure(level: str = "INFO", fmt: str = "text", levels: str = "") -> None:
    """One handler on the root logger, in format ``fmt``; the root at ``level`` and each logger named
    in ``levels`` at its own level (its children inherit it)."""
    if fmt not in _FORMATTERS:
        raise ValueError(f"unknown log format {fmt!r} (one of {', '.join(FORMATS)})")
    per_logger = parse_levels(levels)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_FORMATTERS[fmt]())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level_number(level))
    for name, number in per_logger.items():
        logging.getLogger(name).setLevel(number)


class RateLimitedLog:
    """At most one line per ``interval_s`` for a recurring event, saying how often it happened meanwhile."""

    __slots__ = ("_interval_s", "_last", "_logger", "_suppressed")

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._last = -math.inf
        self._suppressed = 0

    def log(self, now: float, level: int, msg: str, /, **data: Any) -> bool:
        """Log ``msg`` with ``data`` as its fields, unless a line went out less than the interval ago;
        the count of lines held back since the last one travels as the field ``suppressed``."""
        if now - self._last < self._interval_s:
            self._suppressed += 1
            return False
        if self._suppressed:
            data["suppressed"] = self._suppressed
        self._last = now
        self._suppressed = 0
        self._logger.log(level, msg, extra=fields(**data))
        return True
