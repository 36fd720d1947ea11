"""Log compaction (pykbroker/storage/cleaner.py) on a real Log in a temp dir."""

from __future__ import annotations

from pathlib import Path

from pykbroker.protocol.records import build_batch, decode_records, iter_batches, validate_for_append
from pykbroker.storage.cleaner import clean_log
from pykbroker.storage.log import Log
from pykbroker.storage.log_config import LogConfig

NOW = 1_700_000_000_000


def _append(lg: Log, records: list[tuple[bytes | None, bytes | None]], ts: int = NOW) -> None:
    buf = bytearray(build_batch([(k, v, ()) for k, v in records], timestamp_ms=ts))
    batches = validate_for_append(buf, max_batch_bytes=1 << 20, now_ms=ts, timestamp_type=0)
    lg.append(buf, batches)


def _read_all(lg: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    out = []
    offset = lg.log_start_offset
    while offset < lg.log_end_offset:
        res = lg.read(offset, 1 << 20)
        if not res.records:
            break
        for h in iter_batches(res.records):
            for r in decode_records(memoryview(res.records)[h.position:h.position + h.size]):
                if r.offset >= offset:
                    out.append((r.offset, r.key, r.value))
            offset = max(offset, h.next_offset)
    return out


def _open(tmp_path: Path) -> Log:
    return Log.open(tmp_path / "t-0", LogConfig(segment_bytes=600, cleanup_policy="compact"), recover=True,
                    now_ms=lambda: NOW)


def test_compaction_keeps_latest_per_key_and_drops_tombstones_after_horizon(tmp_path: Path) -> None:
    lg = _open(tmp_path)
    for i in range(60):
        _append(lg, [(b"k%d" % (i % 5), b"v%d" % i)])
    _append(lg, [(b"k0", None)], ts=NOW - 10_000)  # an old tombstone: age does not matter (KIP-534)
    _append(lg, [(b"k1", None)])
    _append(lg, [(None, b"keyless")])
    lg.roll()
    _append(lg, [(b"k2", b"latest-in-active")])
    end = lg.log_end_offset
    before = _read_all(lg)
    stats = clean_log(lg, delete_retention_ms=5_000, now_ms=NOW)
    assert stats.records_removed > 0 and stats.bytes_after < stats.bytes_before
    assert stats.next_horizon == NOW + 5_000
    after = _read_all(lg)
    assert lg.log_end_offset == end
    keys = [k for _o, k, _v in after]
    # One record per key in the cleaned part (k2 also in the active segment); tombstones stay for now.
    assert (60, b"k0", None) in after and (61, b"k1", None) in after
    assert (62, None, b"keyless") in after
    assert keys.count(b"k3") == 1 and keys.count(b"k4") == 1 and keys.count(b"k2") == 2
    latest = {k: v for _o, k, v in before}
    assert {k: v for _o, k, v in after} == latest
    # The tombstones' batches now carry the delete horizon; record timestamps are unchanged.
    res = lg.read(60, 1 << 20)
    h = next(iter_batches(res.records))
    assert h.has_delete_horizon and h.base_timestamp == NOW + 5_000
    assert decode_records(memoryview(res.records)[h.position:h.position + h.size])[0].timestamp == NOW - 10_000
    # Offsets are preserved and increasing.
    offs = [o for o, _k, _v in after]
    assert offs == sorted(offs)
    # Reads from any offset in a removed range land on the next kept record.
    res = lg.read(1, 1 << 20)
    assert res.records
    # Before the horizon a second clean keeps them; after it they go.
    clean_log(lg, delete_retention_ms=5_000, now_ms=NOW + 4_999)
    assert (60, b"k0", None) in _read_all(lg)
    clean_log(lg, delete_retention_ms=5_000, now_ms=NOW + 5_000)
    final = _read_all(lg)
    assert not any(v is None for _o, _k, v in final)
    lg.close()
    # Reopen (indexes rebuilt, data identical).
    lg2 = _open(tmp_path)
    assert _read_all(lg2) == final
    lg2.close()


def test_stray_cleaned_file_from_a_crash_is_discarded(tmp_path: Path) -> None:
    lg = _open(tmp_path)
    for i in range(30):
        _append(lg, [(b"k%d" % (i % 3), b"v%d" % i)])
    lg.roll()
    before = _read_all(lg)
    seg = lg.inactive_segments()[0]
    # A crash mid-clean leaves a half-written .cleaned file next to the original.
    seg.log_path.with_name(seg.log_path.name + ".cleaned").write_bytes(b"\x00garbage")
    lg.close()
    lg2 = _open(tmp_path)
    assert _read_all(lg2) == before
    assert not list((tmp_path / "t-0").glob("*.cleaned"))
    clean_log(lg2, delete_retention_ms=0, now_ms=NOW)
    assert len(_read_all(lg2)) == 3
    lg2.close()


def test_repeated_cleaning_keeps_size_bounded(tmp_path: Path) -> None:
    lg = _open(tmp_path)
    sizes = []
    for round_ in range(10):
        for i in range(50):
            _append(lg, [(b"only-key", b"value-%d-%d" % (round_, i))])
        clean_log(lg, delete_retention_ms=0, now_ms=NOW)
        sizes.append(lg.size_bytes)
    assert max(sizes[3:]) < 3000, sizes
    assert _read_all(lg)[-1][2] == b"value-9-49"
    lg.close()
