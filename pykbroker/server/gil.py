"""The interpreter's GIL switch interval, for the broker's few helper threads.

The event loop thread runs nearly all the broker's Python; the other threads (the fsync flushers of
``log.flush.on.ack`` in ``group_commit``, anyio's worker threads) block in a system call and then need the
GIL for a few microseconds to hand their result back.  A thread that wants the GIL waits up to the switch
interval before it asks the holder to let go, and under CPU contention it is often not running at the
moments the loop thread drops the GIL on its own (around each system call), so each hand-off can wait the
whole interval: Python's default of 5 ms, per fsync, in a path that acknowledges ~600 requests a second.
A shorter interval bounds that wait; it costs nothing while no other thread wants the GIL.  The default
stays at Python's 5 ms: the fsyncs of ``log.flush.on.ack`` run in native threads that never take the GIL
(``pykbroker._native.syncer``) wherever the extension is built, and with them a shorter interval showed
no clear gain (docs/performance.md, "Sharing the CPU").
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("pykbroker.gil")


def set_switch_interval(microseconds: int) -> None:
    """Apply ``pykbroker.gil.switch.interval.us`` to this process (a process-wide setting: called by the
    ``serve`` command, never by a broker embedded in someone else's process)."""
    sys.setswitchinterval(microseconds / 1_000_000)
    log.debug("GIL switch interval %(microseconds)d us", {"microseconds": microseconds})
