"""bench/page_cache.py: the ballast plan's bounds, and that the ballast file never outlives its block."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.bench_modules import load_bench

pc = load_bench("page_cache")
GIB, MIB = pc.GIB, pc.MIB


def test_plan_leaves_the_target_free() -> None:
    plan = pc.plan_ballast(mem_free=20 * GIB, free_target=GIB, disk_free=100 * GIB, cap=32 * GIB)
    assert plan.size == 19 * GIB


def test_plan_is_capped_and_chunk_aligned() -> None:
    plan = pc.plan_ballast(mem_free=20 * GIB + 3 * MIB, free_target=0, disk_free=100 * GIB, cap=32 * GIB)
    assert plan.size == 20 * GIB  # rounded down to whole chunks
    capped = pc.plan_ballast(mem_free=20 * GIB, free_target=GIB, disk_free=100 * GIB, cap=5 * GIB)
    assert capped.size == 5 * GIB and "capped" in capped.reason


def test_plan_nothing_when_memory_is_already_full() -> None:
    assert pc.plan_ballast(mem_free=GIB // 2, free_target=GIB, disk_free=100 * GIB, cap=32 * GIB).size == 0


def test_plan_refuses_without_disk_room() -> None:
    with pytest.raises(ValueError, match="GiB of disk"):
        pc.plan_ballast(mem_free=20 * GIB, free_target=GIB, disk_free=20 * GIB, cap=32 * GIB)


def test_write_ballast_continues_and_wraps_and_stops_at_the_deadline(tmp_path: Path) -> None:
    written, _seconds, early = pc.write_ballast(tmp_path / "b", 64 * MIB, deadline_s=-1.0)
    assert (written, early) == (0, True)
    written, _seconds, early = pc.write_ballast(tmp_path / "b", 16 * MIB, deadline_s=60.0)
    assert (written, early) == (16 * MIB, False)
    written, _seconds, early = pc.write_ballast(tmp_path / "b", 32 * MIB, 60.0, position=16 * MIB, wrap=40 * MIB)
    assert (written, early) == (32 * MIB, False)
    assert os.path.getsize(tmp_path / "b") == 40 * MIB  # 16 + 32 = 48 MiB written into a 40 MiB ring


def test_ballast_removed_on_error_and_sigterm_handler_restored(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    logs: list[str] = []
    with pytest.raises(RuntimeError), \
            pc.steady_page_cache(tmp_path, free_gib=0.0, cap_gib=0.25, deadline_s=60, log=logs.append) as (b, r):
        assert r.written == b.size == 256 * MIB and b.path.stat().st_size == 256 * MIB
        assert signal.getsignal(signal.SIGTERM) is not before
        b.top_up(30)
        assert b.size == 256 * MIB  # at the cap: nothing more written
        raise RuntimeError("phase failed")
    assert not (tmp_path / "page-cache-ballast").exists()
    assert signal.getsignal(signal.SIGTERM) is before
    assert any("0.25 of 0.25 GiB written" in m for m in logs), logs


def test_top_up_writes_the_shortfall_into_a_bounded_ring(tmp_path: Path) -> None:
    free = pc.meminfo()["MemFree"]
    b = pc.Ballast(tmp_path / "b", free_target=free - 300 * MIB, cap=384 * MIB, log=lambda _m: None)
    r = b.fill(60)
    # MemFree moves with the rest of the machine: the pass wrote what was missing then, a few hundred MiB
    assert b.position == r.written <= 384 * MIB
    b.free_target = 0  # wants all of MemFree: capped at the ring's size per pass
    r = b.fill(60)
    assert r.written == 384 * MIB and os.path.getsize(b.path) == b.size == 384 * MIB


def test_sigterm_inside_the_block_removes_the_ballast(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), \
            pc.steady_page_cache(tmp_path, free_gib=0.0, cap_gib=0.25, deadline_s=60, log=lambda _m: None):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # the handler's KeyboardInterrupt ends this at once
    assert not (tmp_path / "page-cache-ballast").exists()


def test_probe_reports_both_figures_and_cleans_up(tmp_path: Path) -> None:
    fresh, cached = pc.pwrite_probe(tmp_path, 4)
    assert fresh >= 0 and cached >= 0
    assert list(tmp_path.iterdir()) == []


def test_meminfo_in_bytes(tmp_path: Path) -> None:
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24683656 kB\nMemFree:          1000 kB\nHugePages_Total:       0\n")
    assert pc.meminfo(str(f)) == {"MemTotal": 24683656 * 1024, "MemFree": 1024000, "HugePages_Total": 0}
