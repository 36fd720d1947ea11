"""Bring this machine's page cache to a steady state before a benchmark, and show what page writes cost.

Why: on a VM whose guest returns free pages to the host (virtio_balloon free page reporting), writing into
memory that has not been touched recently costs several times more CPU per MiB than writing into page-cache
pages the kernel reclaims and reuses. A freshly booted or idle machine with gigabytes free is in the first
state; a long-running broker host, whose memory is full of page cache, is in the second. A *ballast* file
fills the free memory with clean (written and fsync'd, hence reclaimable) page cache, so the benchmark's own
writes reuse reclaimed pages as they would on such a host. ``pwrite_probe`` measures the cost directly.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

MIB = 1 << 20
GIB = 1 << 30
CHUNK = 8 * MIB
SYNC_EVERY = GIB  # fsync this often, so the dirty pages never pile up and the deadline stays honoured
DISK_MARGIN = 8 * GIB  # left free on the ballast's file system for the benchmark's own logs


def meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """/proc/meminfo in bytes (the ``kB`` fields; counts without a unit are left as they are)."""
    out: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[name] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def mem_free_gib() -> float:
    return meminfo()["MemFree"] / GIB


@dataclass(frozen=True)
class BallastPlan:
    size: int  # bytes to write (0: nothing to do)
    reason: str  # why that size, for the bench's output


def plan_ballast(mem_free: int, free_target: int, disk_free: int, cap: int) -> BallastPlan:
    """The ballast size that leaves about ``free_target`` bytes of MemFree, bounded by ``cap`` and the disk.

    Raises ValueError when the file system lacks room for it plus a margin for the benchmark's logs: a
    ballast that fills the disk would fail the benchmark, not describe it.
    """
    want = max(0, mem_free - free_target)
    want -= want % CHUNK
    if want == 0:
        return BallastPlan(0, f"MemFree {mem_free / GIB:.2f} GiB is already at or below {free_target / GIB:.2f} GiB")
    size, reason = want, f"MemFree {mem_free / GIB:.2f} GiB - target {free_target / GIB:.2f} GiB"
    if size > cap:
        size, reason = cap, f"{reason}, capped at {cap / GIB:.2f} GiB"
    if size + DISK_MARGIN > disk_free:
        raise ValueError(f"ballast of {size / GIB:.2f} GiB needs {(size + DISK_MARGIN) / GIB:.2f} GiB of disk "
                         f"(with {DISK_MARGIN / GIB:.0f} GiB for the benchmark), {disk_free / GIB:.2f} GiB free")
    return BallastPlan(size, reason)


TOP_UP_MIN = 256 * MIB  # a smaller shortfall is not worth a pass


@dataclass
class BallastResult:
    planned: int
    written: int
    seconds: float
    mem_free_before: int
    mem_free_after: int
    stopped_early: bool

    def describe(self) -> str:
        return (f"{self.written / GIB:.2f} of {self.planned / GIB:.2f} GiB written and fsync'd in "
                f"{self.seconds:.1f} s{' (deadline reached)' if self.stopped_early else ''}; MemFree "
                f"{self.mem_free_before / GIB:.2f} -> {self.mem_free_after / GIB:.2f} GiB")


def write_ballast(path: Path, size: int, deadline_s: float, position: int = 0,
                  wrap: int | None = None) -> tuple[int, float, bool]:
    """Write ``size`` bytes to ``path`` from ``position`` and fsync it; stops at the deadline.

    With ``wrap`` the file is a ring of that many bytes: writing past its end continues at its start, over
    the oldest part (the part the kernel reclaims first). Returns (written, seconds, stopped early).
    """
    buf = bytes(range(256)) * (CHUNK // 256)
    t0 = time.monotonic()
    written = since_sync = 0
    early = False
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        for _ in range(size // CHUNK):
            if time.monotonic() - t0 > deadline_s:
                early = True
                break
            at = position + written
            written += os.pwrite(fd, buf, at % wrap if wrap else at)
            since_sync += CHUNK
            if since_sync >= SYNC_EVERY:
                os.fsync(fd)
                since_sync = 0
        os.fsync(fd)
    finally:
        os.close(fd)
    return written, time.monotonic() - t0, early


class Ballast:
    """A clean file that holds MemFree near a target; ``fill`` writes more when memory was freed meanwhile.

    Memory comes back when other processes exit or files are deleted (the benchmark deletes each phase's
    topic), and the guest hands free pages back to the host after a few seconds, so a phase started after
    such a release would write into fresh memory again: topping up before each phase keeps every phase in
    the same state. The file is a ring of at most ``cap`` bytes (the kernel drops its oldest pages from the
    cache as others need memory; rewriting them brings them back), so the disk it takes stays bounded.
    """

    def __init__(self, path: Path, free_target: int, cap: int, log: Callable[[str], None]) -> None:
        self.path = path
        self.free_target = free_target
        self.cap = cap - cap % CHUNK
        self.log = log
        self.position = 0  # bytes written so far; the file holds min(position, cap)

    @property
    def size(self) -> int:
        return min(self.position, self.cap)

    def fill(self, deadline_s: float, rounds: int = 1) -> BallastResult:
        """Up to ``rounds`` passes (MemFree can rise while a pass runs), within ``deadline_s`` in all."""
        t0 = time.monotonic()
        before = meminfo()["MemFree"]
        planned = written = 0
        early = False
        for _ in range(rounds):
            left = deadline_s - (time.monotonic() - t0)
            # at most one ring's worth per fill; the ring grows the file by at most cap - size, so what it
            # already holds counts as available disk
            plan = plan_ballast(meminfo()["MemFree"], self.free_target,
                                shutil.disk_usage(self.path.parent).free + self.size, self.cap - written)
            if plan.size < TOP_UP_MIN or left <= 0:
                break
            n, _seconds, early = write_ballast(self.path, plan.size, left, self.position, self.cap)
            planned, written, self.position = planned + plan.size, written + n, self.position + n
            if early:
                break
        return BallastResult(planned, written, time.monotonic() - t0, before, meminfo()["MemFree"], early)

    def top_up(self, deadline_s: float) -> str:
        """One pass before a phase; a description for the bench's log (a full disk is logged, not raised)."""
        try:
            r = self.fill(deadline_s)
        except ValueError as e:
            return f"ballast not topped up: {e}"
        return f"ballast topped up ({self.position / GIB:.2f} GiB written in all, file {self.size / GIB:.2f} GiB): " \
            + r.describe()


@contextmanager
def steady_page_cache(directory: Path, free_gib: float, cap_gib: float, deadline_s: float,
                      log: Callable[[str], None] = print) -> Iterator[tuple[Ballast, BallastResult]]:
    """Fill free memory with a clean ballast file in ``directory`` for the duration of the block.

    The file is removed when the block ends, whatever ends it (an error, Ctrl-C, or SIGTERM, which is turned
    into KeyboardInterrupt for the duration so that the ``finally`` runs).
    """
    ballast = Ballast(directory / "page-cache-ballast", int(free_gib * GIB), int(cap_gib * GIB), log)
    mem_free = meminfo()["MemFree"]
    plan = plan_ballast(mem_free, ballast.free_target, shutil.disk_usage(directory).free, ballast.cap)  # refuse early
    log(f"steady page cache: {plan.reason}; writing about {plan.size / GIB:.2f} GiB to {ballast.path} "
        f"(at most {deadline_s:.0f} s)")

    def _term(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt("SIGTERM")

    old = signal.signal(signal.SIGTERM, _term)
    try:
        result = ballast.fill(deadline_s, rounds=3)
        log(f"ballast of {ballast.size / GIB:.2f} GiB: {result.describe()}")
        yield ballast, result
    finally:
        try:
            ballast.path.unlink(missing_ok=True)
        finally:
            signal.signal(signal.SIGTERM, old)


def pwrite_probe(directory: Path, mib: int) -> tuple[float, float]:
    """CPU ms per MiB written by ``pwrite``: into a new file's pages, then over the same (now cached) pages.

    The first figure is what a broker pays per MiB appended in the machine's current state (fresh memory or
    reclaimed page cache); the second, overwriting pages already cached, is the floor (the copy alone).
    """
    buf = b"\x5a" * MIB
    path = directory / "page-cache-probe"
    figures = []
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
    try:
        for _pass in range(2):
            t = time.process_time()
            for i in range(mib):
                os.pwrite(fd, buf, i * MIB)
            figures.append((time.process_time() - t) * 1000 / max(1, mib))
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return figures[0], figures[1]
