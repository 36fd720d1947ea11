"""Imported at start (``PYTHONPATH``) only by processes that tests/support/faketime.py starts under libfaketime.

Debian's libfaketime 0.9.10 answers EINVAL to ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` when
``FAKETIME_DONT_FAKE_MONOTONIC`` is set, and that is the call behind Python's ``time.sleep``: every sleep of
such a process (kazoo's ZooKeeper client sleeps between retries) would fail. ``select()`` with a timeout is
left alone by libfaketime and sleeps on the real clock, so ``time.sleep`` uses it there.
"""

from __future__ import annotations

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    select.select([], [], [], seconds)  # retried with the time left when a signal interrupts it (PEP 475)


time.sleep = _sleep
