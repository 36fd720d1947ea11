"""The CPU time slice the broker's threads ask the Linux scheduler for.

Since Linux 6.6 the fair scheduler is EEVDF: a thread that wakes runs ahead of a CPU-bound neighbour only
once its virtual deadline is the earlier one, and that deadline is one slice past its start.  With the
kernel's default slice (0.7 ms times 1 + log2 of the CPUs, 1.4 ms on 2 CPUs) a broker thread woken by a
request can wait most of a neighbour's slice on every hop, and a message's path wakes the broker's loop
and its fsync threads several times.  Since Linux 6.12 a thread may ask for a shorter slice of its own
(``sched_setattr`` with ``sched_runtime``, 0.1-100 ms, no privilege needed): it then preempts a busy
neighbour when it wakes, and is itself preempted sooner, which costs a task that sleeps as often as the
broker nothing measurable (docs/performance.md, "Sharing the CPU").

Threads inherit the slice, so the ``serve`` command asks once, for every thread of its process, before the
broker starts the rest; a broker embedded in someone else's process leaves their threads alone.  Older
kernels accept the call and ignore the value, which a read-back shows.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import sys

log = logging.getLogger("pykbroker.cpu_slice")

# sched_setattr / sched_getattr: asm-generic numbers, except x86_64's own table.
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275), "riscv64": (274, 275)}
_FAIR_POLICIES = (0, 3)  # SCHED_OTHER, SCHED_BATCH: the policies a slice applies to


class SliceUnavailable(Exception):
    """This platform cannot give the broker's threads a slice of their own; says why."""


class _SchedAttr(ctypes.Structure):
    _fields_ = [  # struct sched_attr (include/uapi/linux/sched/types.h), version 1
        ("size", ctypes.c_uint32),
        ("sched_policy", ctypes.c_uint32),
        ("sched_flags", ctypes.c_uint64),
        ("sched_nice", ctypes.c_int32),
        ("sched_priority", ctypes.c_uint32),
        ("sched_runtime", ctypes.c_uint64),
        ("sched_deadline", ctypes.c_uint64),
        ("sched_period", ctypes.c_uint64),
        ("sched_util_min", ctypes.c_uint32),
        ("sched_util_max", ctypes.c_uint32),
    ]


def _syscalls() -> tuple[ctypes.CDLL, int, int]:
    if not sys.platform.startswith("linux"):
        raise SliceUnavailable(f"not Linux ({sys.platform})")
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise SliceUnavailable(f"sched_setattr's number is not known here for {platform.machine()}")
    return ctypes.CDLL(None, use_errno=True), numbers[0], numbers[1]


def _get(libc: ctypes.CDLL, nr_get: int, tid: int) -> _SchedAttr:
    attr = _SchedAttr()
    if libc.syscall(nr_get, tid, ctypes.byref(attr), ctypes.sizeof(attr), 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return attr


def thread_slice_ns(tid: int = 0) -> int:
    """The slice thread ``tid`` (0: the caller) runs with, as ``sched_getattr`` reports it; 0 on a kernel
    without slices of its own."""
    libc, _, nr_get = _syscalls()
    return int(_get(libc, nr_get, tid).sched_runtime)


def request_time_slice(microseconds: int) -> int:
    """Give every thread of this process that runs under a fair policy a slice of ``microseconds`` (0:
    the kernel's default).  Returns how many threads took it; raises SliceUnavailable where the kernel
    ignores or refuses the request."""
    libc, nr_set, nr_get = _syscalls()
    want = microseconds * 1000
    set_count = 0
    for name in sorted(os.listdir("/proc/self/task")):
        tid = int(name)
        try:
            attr = _get(libc, nr_get, tid)
        except OSError as e:
            if e.errno == errno.ESRCH:  # the thread ended meanwhile
                continue
            raise SliceUnavailable(f"sched_getattr failed: {e.strerror}") from None
        if attr.sched_policy not in _FAIR_POLICIES:
            log.info("thread %(thread_id)d runs under scheduling policy %(policy)d, to which a slice does not apply; "
                     "left as it is",
                     {"thread_id": tid, "policy": attr.sched_policy})
            continue
        attr.size = ctypes.sizeof(attr)
        attr.sched_runtime = want
        if libc.syscall(nr_set, tid, ctypes.byref(attr), 0) != 0:
            err = ctypes.get_errno()
            raise SliceUnavailable(f"sched_setattr refused: {os.strerror(err)}")
        if want and _get(libc, nr_get, tid).sched_runtime != want:
            raise SliceUnavailable("this kernel keeps no slice per thread (Linux 6.12 or later does)")
        set_count += 1
    return set_count


def apply_time_slice(microseconds: int, *, explicit: bool) -> None:
    """``pykbroker.scheduler.slice.us`` for the ``serve`` process.  Where the platform cannot do it, a
    value the operator set is an error (raised), the default one a log line."""
    if microseconds == 0:
        return
    try:
        threads = request_time_slice(microseconds)
    except SliceUnavailable as e:
        if explicit:
            raise
        log.info("pykbroker.scheduler.slice.us: %(error)s; the broker's threads keep the kernel's default slice",
                 {"error": e})
        return
    log.debug("scheduler slice %(microseconds)d us for %(threads)d thread(s)",
              {"microseconds": microseconds, "threads": threads})
