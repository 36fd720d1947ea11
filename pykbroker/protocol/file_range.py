"""Record bytes left in their segment file: what a fetch response carries instead of a copy.

A :class:`FileRange` names ``length`` bytes at ``position`` of a segment's ``.log`` file.  The
network edge sends it with ``sendfile`` (``pykbroker.server.transmit``) or, where that is not
possible (TLS), reads it just before sending.  Its length is fixed when the fetch is answered,
because it is written into the response's records field before the bytes themselves.

Lifetime: the range holds the :class:`SegmentFile`, and the descriptor is closed only when
the segment and every range cut from it have let go of it (CPython's reference counting makes
that prompt).  Retention unlinking the file, or the cleaner renaming a compacted copy over its
name, leaves the old inode readable through the descriptor.  The one change that alters bytes
in place, a truncation (a follower cutting a divergent tail), is recorded on the file, and a
range it reached reports itself stale, so the sender closes the connection instead of sending
bytes other than those the response was built for.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["FileRange", "SegmentFile", "StaleRange"]


class StaleRange(Exception):
    """The bytes of a range are no longer those it was cut for (truncated, or the file is short)."""


class SegmentFile:
    """A segment's ``.log`` descriptor, shared by the segment and the ranges cut from it."""

    __slots__ = ("_cuts", "fd", "name")

    def __init__(self, fd: int, name: str) -> None:
        self.fd = fd
        self.name = name
        self._cuts: list[int] = []  # positions the file was truncated to, in order

    def fileno(self) -> int:
        """For ``loop.sendfile``, which wants a file object."""
        return self.fd

    @property
    def generation(self) -> int:
        """How many truncations happened so far; a range remembers it when it is cut."""
        return len(self._cuts)

    def truncated(self, position: int) -> None:
        """The file was cut to ``position``: ranges reaching past it (cut before now) are stale."""
        self._cuts.append(position)

    def cut_since(self, generation: int, end: int) -> bool:
        """Whether a truncation after ``generation`` removed bytes below ``end``."""
        cuts = self._cuts
        return len(cuts) > generation and min(cuts[generation:]) < end

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SegmentFile({self.name}, fd={self.fd})"


class FileRange:
    """``length`` bytes at ``position`` of a segment file, to be sent without passing through Python.

    ``len()`` is the length, so code that only measures or tests records for emptiness treats a
    range like the bytes it stands for.
    """

    __slots__ = ("_generation", "file", "length", "position")

    def __init__(self, file: SegmentFile, position: int, length: int) -> None:
        if position < 0 or length <= 0:
            raise ValueError(f"bad file range position={position} length={length}")
        self.file = file
        self.position = position
        self.length = length
        self._generation = file.generation

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"FileRange({self.file.name}, position={self.position}, length={self.length})"

    def check(self) -> None:
        """Raise :class:`StaleRange` if a truncation since the range was cut reached into it."""
        if self.file.fd < 0:
            raise StaleRange(f"{self.file.name} is closed")
        if self.file.cut_since(self._generation, self.position + self.length):
            raise StaleRange(f"{self.file.name} was truncated below {self.position + self.length} "
                             f"after a fetch response took {self.length} bytes at {self.position}")

    def read(self) -> bytes:
        """The bytes, read now (the fallback where sendfile cannot be used)."""
        self.check()
        data = os.pread(self.file.fd, self.length, self.position)
        if len(data) != self.length:
            raise StaleRange(f"{self.file.name} holds {len(data)} of the {self.length} bytes at {self.position} "
                             "a fetch response announced")
        return data
