"""Keep glibc from handing large buffers back to the kernel after every request.

Every produce, fetch and replica-fetch of a large batch allocates buffers of up to a megabyte
or more (the frame, the decoded records, the response).  glibc serves such blocks with
``mmap`` or by growing and trimming the heap, so each one is returned to the kernel when it is
freed and the next one page-faults its memory in again, zero-filled, 4 KiB at a time.  On the
replication path that is 150,000 page faults a second on a follower and most of the broker's
CPU time in the kernel (docs/performance.md, "acks=all and replication").

Raising ``M_MMAP_THRESHOLD`` to its maximum (32 MiB on 64-bit) and ``M_TRIM_THRESHOLD`` keeps
freed blocks in the heap for reuse.  So that a burst (a few large requests) does not keep its
memory for ever, the broker calls :func:`release_free_memory` (``malloc_trim``) every few seconds:
memory freed and not reused by then goes back to the kernel, at the cost of faulting it in again
if the load comes back.  A user who sets glibc's own ``MALLOC_*`` variables keeps their settings.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger("pykbroker.allocator")

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 128 << 20
RELEASE_INTERVAL_S = 5.0  # how often the broker hands unused freed memory back (release_free_memory)
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


_libc: ctypes.CDLL | None = None


def tune_allocator(environ: dict[str, str] | None = None) -> bool:
    """Apply the thresholds; False when not on glibc or the user chose their own."""
    env = os.environ if environ is None else environ
    if not sys.platform.startswith("linux") or any(k in env for k in _USER_SETTINGS):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl (Alpine) has no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not ok:
        log.info("could not set malloc thresholds; large buffers will be returned to the kernel when freed")
        return False
    global _libc
    _libc = libc
    return True


def release_free_memory() -> None:
    """glibc's ``malloc_trim(0)``: give freed, unused heap memory back to the kernel (a no-op unless
    :func:`tune_allocator` raised the thresholds)."""
    if _libc is not None:
        _libc.malloc_trim(0)
