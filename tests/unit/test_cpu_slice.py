"""pykbroker.scheduler.slice.us: validated; every thread of the process takes the slice, threads started later
inherit it; a kernel that ignores or refuses it is told apart from one that takes it."""

from __future__ import annotations

import ctypes
import json
import logging
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from pykbroker import cli
from pykbroker.config import BrokerConfig, ConfigError
from pykbroker.server import cpu_slice
from pykbroker.server.cpu_slice import SliceUnavailable, apply_time_slice, request_time_slice
from tests.support.slices import kernel_keeps_slices

KEY = "pykbroker.scheduler.slice.us"


def test_default_and_range() -> None:
    assert BrokerConfig({})[KEY] == 200
    for ok in ("0", "100", "100000", "750"):
        assert BrokerConfig({KEY: ok})[KEY] == int(ok)
    for bad in ("99", "1", "100001", "-1", "short"):
        with pytest.raises(ConfigError, match=KEY):
            BrokerConfig({KEY: bad})


_PROBE = textwrap.dedent(
    """
    import json, sys, threading
    from pykbroker.server.cpu_slice import request_time_slice, thread_slice_ns

    def tid_slice(out):
        out.append(thread_slice_ns(threading.get_native_id()))

    default = thread_slice_ns()
    gate, seen = threading.Event(), []
    before = threading.Thread(target=lambda: (gate.wait(10), tid_slice(seen)))
    before.start()  # started before the request: must take the slice too
    count = request_time_slice(int(sys.argv[1]))
    gate.set(); before.join(10)
    after = []
    t = threading.Thread(target=tid_slice, args=(after,)); t.start(); t.join(10)  # inherits it
    back = request_time_slice(0)
    print(json.dumps({"default": default, "count": count, "before": seen, "after": after,
                      "reset": thread_slice_ns(), "back": back}))
    """
)


def _probe(us: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", _PROBE, str(us)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_every_thread_takes_the_slice_and_new_threads_inherit_it() -> None:
    if not kernel_keeps_slices():
        with pytest.raises(SliceUnavailable, match="no slice per thread|refused"):
            request_time_slice(300)
        return
    r = _probe(300)
    assert r["default"] != 300_000 and r["default"] > 0
    assert r["count"] >= 2  # the main thread and the one already running
    assert r["before"] == [300_000]
    assert r["after"] == [300_000]
    assert r["reset"] == r["default"]  # 0 gives the kernel's default back
    for us, expected in ((100, 100_000), (100_000, 100_000_000)):
        assert _probe(us)["after"] == [expected]


class _FakeLibc:
    """sched_getattr/sched_setattr of an older kernel: accepts a runtime for a fair policy and forgets it."""

    def __init__(self, *, refuse: int = 0, policy: int = 0) -> None:
        self.refuse, self.policy, self.sets = refuse, policy, 0

    def syscall(self, nr: int, tid: int, attr: Any, *rest: int) -> int:
        a = attr._obj
        if nr == 2:  # set
            if self.refuse:
                ctypes.set_errno(self.refuse)
                return -1
            self.sets += 1
            return 0
        a.sched_policy, a.sched_runtime = self.policy, 0
        return 0


def _fake(monkeypatch: pytest.MonkeyPatch, libc: _FakeLibc) -> None:
    monkeypatch.setattr(cpu_slice, "_syscalls", lambda: (libc, 2, 1))


def test_a_kernel_that_forgets_the_slice_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, _FakeLibc())
    with pytest.raises(SliceUnavailable, match="keeps no slice per thread"):
        request_time_slice(200)


def test_a_refused_call_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, _FakeLibc(refuse=1))  # EPERM, as under a seccomp profile that forbids it
    with pytest.raises(SliceUnavailable, match="refused"):
        request_time_slice(200)


def test_threads_outside_the_fair_policies_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = _FakeLibc(policy=1)  # SCHED_FIFO
    _fake(monkeypatch, libc)
    assert request_time_slice(200) == 0
    assert libc.sets == 0


def test_not_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_slice.sys, "platform", "darwin")
    with pytest.raises(SliceUnavailable, match="not Linux"):
        request_time_slice(200)


def test_the_default_is_a_log_line_an_explicit_value_an_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _fake(monkeypatch, _FakeLibc())
    with caplog.at_level(logging.INFO, logger="pykbroker.cpu_slice"):
        apply_time_slice(200, explicit=False)
    assert "keep the kernel's default slice" in caplog.text
    with pytest.raises(SliceUnavailable):
        apply_time_slice(200, explicit=True)
    apply_time_slice(0, explicit=True)  # 0 asks nothing of the kernel


def test_serve_fails_at_start_when_an_explicit_slice_cannot_be_had(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake(monkeypatch, _FakeLibc())
    # what serve does to its process before the slice, kept out of this test process
    monkeypatch.setattr("pykbroker.server.allocator.tune_allocator", lambda: None)
    monkeypatch.setattr("pykbroker.server.gil.set_switch_interval", lambda us: None)
    monkeypatch.setattr("pykbroker.server.broker.Broker", lambda config: pytest.fail("the broker must not start"))
    assert cli.main(["serve", "--override", f"{KEY}=500"]) == 1
    err = capsys.readouterr().err
    assert "cannot start: pykbroker.scheduler.slice.us cannot be applied: this kernel keeps no slice per thread" in err
    assert "value=500" in err


def test_serve_rejects_a_bad_value() -> None:
    assert cli.main(["serve", "--override", f"{KEY}=50"]) == 2
