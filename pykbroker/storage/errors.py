"""The errors a log raises, with the Kafka error code each is answered with."""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Concatenate, ParamSpec, Protocol, TypeVar


class OffsetOutOfRange(Exception):
    """The requested offset is outside [log start offset, log end offset]."""

    error_code = 1  # OFFSET_OUT_OF_RANGE


def out_of_descriptors(exc: BaseException) -> bool:
    """EMFILE/ENFILE: the process's (or system's) open-file limit, not a failing disk.

    Such an operation fails on its own, with a log line; its log dir stays online, since
    taking it offline would stop every partition in it for what closing a connection cures.
    """
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


class KafkaStorageError(Exception):
    """A disk operation on the log failed, or its log dir is offline (KAFKA_STORAGE_ERROR).

    Raised instead of the OSError so callers answer error code 56 rather than dropping the
    connection; the log has already reported the failure so that its whole dir goes offline.
    """

    error_code = 56  # KAFKA_STORAGE_ERROR


class OnDisk(Protocol):
    """What :func:`on_disk` needs of the object whose method it wraps (a log)."""

    dir: Path
    offline: bool

    @property
    def closed(self) -> bool: ...

    def storage_failure(self, exc: BaseException, what: str) -> KafkaStorageError: ...


_S = TypeVar("_S", bound=OnDisk)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def on_disk(what: str) -> Callable[[Callable[Concatenate[_S, _P], _R]], Callable[Concatenate[_S, _P], _R]]:
    """Turn an OSError escaping a log's method into :class:`KafkaStorageError` (the dir goes offline).

    A log closed meanwhile (its topic deleted, its directory renamed away) is not a disk
    failure: that case stays the RuntimeError callers already expect of a closed log.
    """

    def decorate(fn: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
        @functools.wraps(fn)
        def wrapper(self: _S, *args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return fn(self, *args, **kwargs)
            except OSError as exc:
                if self.closed and not self.offline:
                    raise RuntimeError(f"log {self.dir} is closed") from exc
                raise self.storage_failure(exc, what) from exc

        return wrapper

    return decorate
