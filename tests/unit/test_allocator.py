"""The allocator tuning: applied on glibc, left alone when the user set glibc's own variables."""

from __future__ import annotations

from pykbroker.server import allocator


def test_user_settings_win() -> None:
    assert allocator.tune_allocator({"MALLOC_TRIM_THRESHOLD_": "1"}) is False
    assert allocator.tune_allocator({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}) is False


def test_applied_on_glibc_and_release_runs() -> None:  # pykbroker runs on Linux (Debian)
    assert allocator.tune_allocator({}) is True
    blocks = [bytearray(1 << 20) for _ in range(8)]
    del blocks
    allocator.release_free_memory()  # gives the freed megabytes back; must not fail
