"""bench.py --busy: burners in a session of their own (the default) or in the benchmark's session."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "bench.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_bench", _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


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
