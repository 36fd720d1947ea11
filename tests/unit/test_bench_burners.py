"""bench.py --busy: burners in a session of their own (the default) or in the benchmark's session."""

from __future__ import annotations

import os
from types import ModuleType

import pytest

from tests.support.bench_modules import load_bench


def _bench() -> ModuleType:
    return load_bench("bench")


@pytest.mark.parametrize(("session", "own"), [("own", True), ("client", False)])
def test_burners_session(session: str, own: bool) -> None:
    bench = _bench()
    procs = bench.start_burners(2, 30, session)
    try:
        assert len(procs) == 2
        for p in procs:
            assert p.poll() is None  # spinning
            assert (os.getsid(p.pid) == p.pid) is own  # a session leader of its own, or ours
            assert (os.getsid(p.pid) == os.getsid(0)) is not own
    finally:
        bench.stop_burners(procs)
    assert all(p.returncode is not None for p in procs)


def test_busy_session_option() -> None:
    bench = _bench()
    assert bench.parse_args(["--compare", "--busy", "2"]).busy_session == "own"
    assert bench.parse_args(["--compare", "--busy", "2", "--busy-session", "client"]).busy_session == "client"
