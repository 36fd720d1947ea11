"""The log cleaner's Kafka rules: compaction lags, dirty ratio, transactions, producers, merging, swaps."""

from __future__ import annotations

import shutil
from pathlib import Path

from pykbroker.protocol.records import build_batch, decode_records, iter_batches, validate_for_append
from pykbroker.storage.cleaner import CleanerConfig, LogCleaner, clean_log, cleanable_range
from pykbroker.storage.log import Log
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.producer_state import end_txn_marker_record

NOW = 1_700_000_000_000


def _open(path: Path, segment_bytes: int = 600) -> Log:
    return Log.open(path, LogConfig(segment_bytes=segment_bytes, cleanup_policy="compact"), recover=True,
                    now_ms=lambda: NOW)


def _append(lg: Log, records: list[tuple[bytes | None, bytes | None]], ts: int = NOW, *, pid: int = -1,
            seq: int = -1, txn: bool = False) -> None:
    buf = bytearray(build_batch([(k, v, ()) for k, v in records], timestamp_ms=ts, producer_id=pid,
                                producer_epoch=0 if pid >= 0 else -1, base_sequence=seq, is_transactional=txn))
    lg.append(buf, validate_for_append(buf, max_batch_bytes=1 << 20, now_ms=ts, timestamp_type=0))


def _marker(lg: Log, pid: int, commit: bool) -> None:
    key, value, headers = end_txn_marker_record(commit, 0)
    buf = bytearray(build_batch([(key, value, headers)], timestamp_ms=NOW, producer_id=pid, producer_epoch=0,
                                is_control=True, is_transactional=True))
    hs = validate_for_append(buf, max_batch_bytes=1 << 20, now_ms=NOW, timestamp_type=0, from_client=False)
    lg.append(buf, hs, origin="coordinator")


def _batches(lg: Log) -> list[tuple[int, int, bool, list[tuple[bytes | None, bytes | None]]]]:
    """(base offset, producer id, is control, [(key, value)]) of every batch."""
    out = []
    offset = lg.log_start_offset
    while offset < lg.log_end_offset:
        res = lg.read(offset, 1 << 20)
        if not res.records:
            break
        for h in iter_batches(res.records):
            if h.next_offset <= offset:
                continue
            recs = decode_records(memoryview(res.records)[h.position:h.position + h.size])
            out.append((h.base_offset, h.producer_id, h.is_control, [(r.key, r.value) for r in recs]))
            offset = h.next_offset
    return out


def _values(lg: Log) -> list[tuple[bytes | None, bytes | None]]:
    return [kv for _b, _p, control, kvs in _batches(lg) if not control for kv in kvs]


def test_min_compaction_lag_protects_recent_segments(tmp_path: Path) -> None:
    lg = _open(tmp_path / "t-0")
    for i in range(20):
        _append(lg, [(b"k", b"old%d" % i)], ts=NOW - 60_000)
    lg.roll()
    for i in range(20):
        _append(lg, [(b"k", b"new%d" % i)], ts=NOW - 1_000)
    lg.roll()
    _append(lg, [(b"x", b"active")])
    cfg = CleanerConfig(min_compaction_lag_ms=10_000, min_cleanable_ratio=0.0)
    ltc = cleanable_range(lg, lg.log_start_offset, cfg, NOW)
    assert ltc.first_uncleanable == 20  # the second segment is too young
    clean_log(lg, delete_retention_ms=0, now_ms=NOW, config=cfg)
    vals = [v for k, v in _values(lg) if k == b"k"]
    assert vals == [b"old19"] + [b"new%d" % i for i in range(20)]  # only the old segment was compacted
    clean_log(lg, delete_retention_ms=0, now_ms=NOW + 20_000, config=cfg)
    assert [v for k, v in _values(lg) if k == b"k"] == [b"new19"]
    lg.close()


def test_dirty_ratio_filthiest_first_and_max_compaction_lag(tmp_path: Path) -> None:
    logs = {("a", 0): _open(tmp_path / "a-0"), ("b", 0): _open(tmp_path / "b-0"), ("c", 0): _open(tmp_path / "c-0")}
    for i in range(30):
        _append(logs[("a", 0)], [(b"k%d" % (i % 2), b"v%d" % i)])  # very dirty
        _append(logs[("b", 0)], [(b"k%d" % (i % 10), b"v%d" % i)])
    for lg in logs.values():
        lg.roll()
    ratios = {"min.cleanable.dirty.ratio": 0.5}
    cleaner = LogCleaner(lambda: logs, lambda _t: 0, lambda _t: ratios, clock=lambda: NOW)
    order = [tp for tp, *_ in cleaner.candidates(NOW)]
    assert order[:2] in ([("a", 0), ("b", 0)], [("b", 0), ("a", 0)]) and ("c", 0) not in order
    st = cleaner.run_once()
    assert st.records_removed > 0
    # Both are clean now: nothing dirty, nothing to do.
    assert cleaner.candidates(NOW) == []
    # A little new dirt (below the ratio) is left alone...
    lg = logs[("a", 0)]
    _append(lg, [(b"k0", b"late")], ts=NOW - 3_600_000)
    lg.roll()
    ratios["min.cleanable.dirty.ratio"] = 0.99
    assert cleaner.candidates(NOW) == []
    # ...unless it is older than max.compaction.lag.ms.
    ratios["max.compaction.lag.ms"] = 60_000
    cands = cleaner.candidates(NOW)
    assert [tp for tp, *_ in cands] == [("a", 0)] and cands[0][3].need_compaction_now
    cleaner.run_once()
    assert [v for k, v in _values(lg) if k == b"k0"] == [b"late"]
    for x in logs.values():
        x.close()


def test_aborted_transactions_and_markers_are_removed(tmp_path: Path) -> None:
    lg = _open(tmp_path / "t-0", segment_bytes=100_000)
    _append(lg, [(b"a", b"1")], pid=7, seq=0, txn=True)
    _append(lg, [(b"b", b"aborted")], pid=8, seq=0, txn=True)
    _marker(lg, 8, commit=False)
    _marker(lg, 7, commit=True)
    _append(lg, [(b"a", b"2")], pid=7, seq=1, txn=True)
    _marker(lg, 7, commit=True)
    _append(lg, [(b"z", b"plain")])
    lg.roll()
    _append(lg, [(b"y", b"active")])
    clean_log(lg, delete_retention_ms=1_000, now_ms=NOW)
    batches = _batches(lg)
    # The aborted data is gone; markers stay until their horizon (and while their data remains).
    assert (b"b", b"aborted") not in _values(lg)
    assert sum(1 for b in batches if b[2]) == 3
    assert (b"a", b"2") in _values(lg) and (b"a", b"1") not in _values(lg)
    # After the horizon the first commit marker (no batch of its txn left) goes; the last one guards a
    # retained batch.  Producer 8's aborted batch is its last batch: kept empty (as Kafka), and so is
    # the abort marker, until the producer expires.
    clean_log(lg, delete_retention_ms=1_000, now_ms=NOW + 2_000)
    clean_log(lg, delete_retention_ms=1_000, now_ms=NOW + 4_000)
    markers = [b for b in _batches(lg) if b[2]]
    assert [m[1] for m in markers] == [8, 7]
    assert (1, 8, False, []) in _batches(lg)
    assert _values(lg) == [(b"a", b"2"), (b"z", b"plain"), (b"y", b"active")]
    assert lg.remove_expired_producers(NOW + 10**9, 1_000) >= 1
    for t in (6_000, 8_000, 10_000):
        clean_log(lg, delete_retention_ms=1_000, now_ms=NOW + t)
    assert [b[1] for b in _batches(lg) if b[2]] == [7] and all(b[1] != 8 for b in _batches(lg))
    lg.close()


def test_open_transaction_bounds_the_cleanable_range(tmp_path: Path) -> None:
    lg = _open(tmp_path / "t-0", segment_bytes=200)
    for i in range(5):
        _append(lg, [(b"k", b"v%d" % i)])
    _append(lg, [(b"t", b"open")], pid=3, seq=0, txn=True)  # never committed
    for i in range(10):
        _append(lg, [(b"k", b"w%d" % i)])
    lg.roll()
    ltc = cleanable_range(lg, lg.log_start_offset, CleanerConfig(), NOW)
    seg_of_txn = max(s.base_offset for s in lg.segments if s.base_offset <= 5)
    assert ltc.first_uncleanable == seg_of_txn
    clean_log(lg, delete_retention_ms=0, now_ms=NOW)
    assert (b"t", b"open") in _values(lg) and (b"k", b"w9") in _values(lg)
    lg.close()


def test_last_batch_of_each_producer_is_kept(tmp_path: Path) -> None:
    lg = _open(tmp_path / "t-0", segment_bytes=100_000)
    _append(lg, [(b"k", b"1")], pid=5, seq=0)
    _append(lg, [(b"k", b"2")], pid=5, seq=1)
    _append(lg, [(b"k", b"3")], pid=6, seq=0)  # supersedes producer 5's last batch
    lg.roll()
    _append(lg, [(b"x", b"active")])
    clean_log(lg, delete_retention_ms=0, now_ms=NOW)
    batches = _batches(lg)
    # Producer 5's last batch survives empty (offset 1), its first batch is gone.
    assert [(b[0], b[1], b[3]) for b in batches[:2]] == [(1, 5, []), (2, 6, [(b"k", b"3")])]
    lg.close()
    # The retained batch keeps idempotence across a reopen: a retry of seq 1 is a duplicate.
    lg2 = _open(tmp_path / "t-0", segment_bytes=100_000)
    entry = lg2.producer_state.last_entry(5)
    assert entry is not None and entry.last_seq == 1
    lg2.close()


def test_small_segments_are_merged_under_segment_bytes(tmp_path: Path) -> None:
    lg = _open(tmp_path / "t-0", segment_bytes=600)
    for i in range(80):
        _append(lg, [(b"k%d" % (i % 4), b"v%d" % i)])
    lg.roll()
    _append(lg, [(b"x", b"active")])
    n_before = len(lg.segments)
    expect = _values(lg)
    first = clean_log(lg, delete_retention_ms=0, now_ms=NOW)
    assert first.segments_merged == 0  # full segments: nothing to group yet (sizes before cleaning count)
    st = clean_log(lg, delete_retention_ms=0, now_ms=NOW)  # now the small cleaned segments merge
    assert st.segments_merged > 0 and len(lg.segments) < n_before
    assert all(s.size <= 600 for s in lg.segments)
    latest = {k: v for k, v in expect}
    assert {k: v for k, v in _values(lg)} == latest and len(_values(lg)) == 5
    lg.close()
    lg2 = _open(tmp_path / "t-0")
    assert {k: v for k, v in _values(lg2)} == latest
    lg2.close()


def test_interrupted_swap_is_completed_on_open(tmp_path: Path) -> None:
    src = tmp_path / "t-0"
    lg = _open(src, segment_bytes=600)
    for i in range(80):
        _append(lg, [(b"k%d" % (i % 4), b"v%d" % i)])
    lg.roll()
    _append(lg, [(b"x", b"active")])
    expect = {k: v for k, v in _values(lg)}
    offsets_before = [b[0] for b in _batches(lg)]
    # Simulate a crash right after the commit point: a swap file next to the old segments.
    group = lg.inactive_segments()[:3]
    data = b"".join(s.read_batch(h) for s in group for h in s.scan(0))
    lg.close()
    crashed = tmp_path / "crashed"
    shutil.copytree(src, crashed)
    base = group[0].log_path.name.split(".")[0]
    (crashed / f"{base}.log.swap").write_bytes(data)  # (uncleaned: the same batches, merged)
    lg2 = _open(crashed)
    assert not list(crashed.glob("*.swap"))
    assert [b[0] for b in _batches(lg2)] == offsets_before
    assert {k: v for k, v in _values(lg2)} == expect
    assert len(lg2.segments) == len(list(src.glob("*.log"))) - 2
    lg2.close()
    # A swap from before the commit point never exists; a stray .cleaned is just deleted (see test_group_cleaner).
