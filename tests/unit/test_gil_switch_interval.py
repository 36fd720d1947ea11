"""pykbroker.gil.switch.interval.us: validated, applied by the serve command, never by an embedded broker."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from pykbroker import cli
from pykbroker.config import BrokerConfig, ConfigError
from pykbroker.server.gil import set_switch_interval


def test_default_and_range() -> None:
    assert BrokerConfig({})["pykbroker.gil.switch.interval.us"] == 5000  # Python's own default
    assert BrokerConfig({"pykbroker.gil.switch.interval.us": "50"})["pykbroker.gil.switch.interval.us"] == 50
    for bad in ("49", "100001", "0", "-1", "fast"):
        with pytest.raises(ConfigError, match="pykbroker.gil.switch.interval.us"):
            BrokerConfig({"pykbroker.gil.switch.interval.us": bad})


def test_set_switch_interval_applies_to_the_process() -> None:
    before = sys.getswitchinterval()
    try:
        set_switch_interval(750)
        assert sys.getswitchinterval() == pytest.approx(0.00075)
    finally:
        sys.setswitchinterval(before)


def _median_handoff(interval_us: int) -> float:
    """Median time a thread back from a short blocking call waits for the GIL while the main thread runs
    pure Python (which never drops the GIL by itself)."""
    before = sys.getswitchinterval()
    waits: list[float] = []
    stop = threading.Event()

    def helper() -> None:
        for _ in range(40):  # bounded
            started = time.perf_counter()
            time.sleep(0.0002)  # releases the GIL, like an fsync; wants it back afterwards
            waits.append(time.perf_counter() - started - 0.0002)
        stop.set()

    try:
        set_switch_interval(interval_us)
        t = threading.Thread(target=helper)
        t.start()
        deadline = time.monotonic() + 10
        x = 0
        while not stop.is_set() and time.monotonic() < deadline:
            x += 1
        t.join(10)
    finally:
        sys.setswitchinterval(before)
    assert len(waits) == 40
    return sorted(waits)[len(waits) // 2]


def test_a_waiting_thread_gets_the_gil_sooner() -> None:
    """What the setting is for: the hand-off is bounded by the interval, not by Python's 5 ms.  Measured
    back to back, so a loaded machine adds its scheduling delay to both."""
    slow = _median_handoff(5000)
    fast = _median_handoff(200)
    assert slow > 0.004, slow  # Python's default: the waiter asks only after 5 ms
    assert fast < slow / 2, (fast, slow)


def test_serve_rejects_a_bad_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--override", "pykbroker.gil.switch.interval.us=10"]) == 2
