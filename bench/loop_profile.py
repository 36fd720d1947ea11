#!/usr/bin/env python3
"""``pykbroker`` with an account of its event-loop thread's CPU time per asyncio handle.

Run as the broker (``python bench/loop_profile.py serve --override ...``).  Every handle the loop runs is
timed with ``time.thread_time_ns`` (user and system time of the loop thread) and filed under what it resumes:
for a task, the innermost three coroutines it was waiting in before the step and after it; for a callback,
its name.  SIGUSR2 starts a window, SIGUSR1 ends it and writes the table to ``$LOOP_PROFILE_OUT``: per row
the CPU, the count and the mean, plus the loop thread's CPU outside any handle (epoll, scheduling).
``bench/ack_cpu.py --loop-profile`` drives it.  A measuring tool: it slows the broker by a few µs a handle.
It times asyncio's own loop only: with ``pykbroker.event.loop=uvloop`` (libuv runs the handles) the table is empty.
"""

from __future__ import annotations

import asyncio
import asyncio.events
import collections
import os
import signal
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_cpu = time.thread_time_ns
_stats: collections.defaultdict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
_window = {"on": 0, "cpu0": 0, "wall0": 0.0}
_original_run = asyncio.events.Handle._run


def _where(handle: asyncio.Handle) -> str:
    task = getattr(handle._callback, "__self__", None)  # type: ignore[attr-defined]
    if isinstance(task, asyncio.Task):
        names: list[str] = []
        coro: Any = task.get_coro()
        for _ in range(64):
            if coro is None:
                break
            names.append(getattr(coro, "__qualname__", type(coro).__name__))
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        return ">".join(names[-3:])
    return "callback " + getattr(handle._callback, "__qualname__", type(handle._callback).__name__)  # type: ignore[attr-defined]


def _run(self: asyncio.Handle) -> None:
    if not _window["on"]:
        _original_run(self)
        return
    before = _where(self)
    start = _cpu()
    try:
        _original_run(self)
    finally:
        spent = _cpu() - start
        key = before if before.startswith("callback ") else f"task {before}  ->  {_where(self)}"
        row = _stats[key]
        row[0] += 1
        row[1] += spent


def _start(*_: object) -> None:
    _stats.clear()
    _window.update(on=1, cpu0=_cpu(), wall0=time.monotonic())


def _stop(*_: object) -> None:
    _window["on"] = 0
    total = _cpu() - int(_window["cpu0"])
    wall = time.monotonic() - float(_window["wall0"])
    in_handles = sum(row[1] for row in _stats.values())
    lines = [f"loop thread CPU {total / 1e6:.1f} ms in {wall:.2f} s; in handles {in_handles / 1e6:.1f} ms; "
             f"outside them {(total - in_handles) / 1e6:.1f} ms"]
    for key, (count, spent) in sorted(_stats.items(), key=lambda kv: -kv[1][1])[:30]:
        lines.append(f"{spent / 1e6:9.1f} ms {count:8d} x {spent / max(count, 1) / 1e3:7.1f} µs  {key}")
    with open(os.environ.get("LOOP_PROFILE_OUT", "loop-profile.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> int:
    asyncio.events.Handle._run = _run  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR2, _start)
    signal.signal(signal.SIGUSR1, _stop)
    sys.argv[0] = "pykbroker"
    from pykbroker.cli import main as broker_main
    return broker_main()


if __name__ == "__main__":
    sys.exit(main())
