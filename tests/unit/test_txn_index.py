"""Transaction index: Kafka's 34-byte aborted-transaction entries."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from pykbroker.storage.index import CorruptIndex
from pykbroker.storage.txn_index import ENTRY_SIZE, AbortedTxn, TransactionIndex


def test_append_and_file_format(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.txnindex"
    idx = TransactionIndex(path, 0)
    assert idx.entries == 0 and not path.exists()  # created lazily
    assert idx.dup_fd() is None
    idx.append(AbortedTxn(7, 2, 10, 11))
    idx.append(AbortedTxn(8, 5, 12, 13))
    assert ENTRY_SIZE == 34
    data = path.read_bytes()
    assert len(data) == 68
    assert struct.unpack(">hqqqq", data[:34]) == (0, 7, 2, 10, 11)
    assert idx.all() == [AbortedTxn(7, 2, 10, 11), AbortedTxn(8, 5, 12, 13)]
    with pytest.raises(ValueError):
        idx.append(AbortedTxn(9, 3, 12, 13))  # markers must move forward
    fd = idx.dup_fd()
    assert fd is not None
    import os

    os.close(fd)
    assert idx.dup_fd() is None  # clean until the next write


def test_collect(tmp_path: Path) -> None:
    idx = TransactionIndex(tmp_path / "x.txnindex", 0)
    idx.append(AbortedTxn(1, 0, 5, 3))  # LSO pinned at 3 by another open txn
    idx.append(AbortedTxn(2, 3, 8, 9))
    idx.append(AbortedTxn(3, 20, 25, 26))
    assert idx.collect(0, 4) == ([AbortedTxn(1, 0, 5, 3), AbortedTxn(2, 3, 8, 9)], True)
    assert idx.collect(6, 9) == ([AbortedTxn(2, 3, 8, 9)], True)  # txn 1 ended before 6
    assert idx.collect(9, 20) == ([], True)  # LSO 26 >= 20 ends the search
    assert idx.collect(9, 30) == ([AbortedTxn(3, 20, 25, 26)], False)  # may continue in later segments


def test_truncate_reset_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000100.txnindex"
    idx = TransactionIndex(path, 100)
    for i in range(4):
        idx.append(AbortedTxn(i, 100 + 10 * i, 105 + 10 * i, 106 + 10 * i))
    idx.truncate_to(125)  # drops the entry whose marker is at 125 and later ones
    assert [t.last_offset for t in idx.all()] == [105, 115]
    idx.append(AbortedTxn(9, 120, 121, 122))
    reopened = TransactionIndex(path, 100)
    assert reopened.entries == 3
    reopened.sanity_check()
    reopened.append(AbortedTxn(10, 123, 124, 125))  # reads the last offset lazily
    with pytest.raises(ValueError):
        reopened.append(AbortedTxn(10, 123, 124, 125))
    reopened.reset()
    assert reopened.entries == 0 and not path.exists()
    reopened.append(AbortedTxn(1, 100, 101, 102))
    reopened.delete()
    assert not path.exists()


def test_torn_file_fails_sanity_check(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.txnindex"
    idx = TransactionIndex(path, 0)
    idx.append(AbortedTxn(1, 0, 5, 6))
    with open(path, "ab") as f:
        f.write(b"\x00" * 10)
    torn = TransactionIndex(path, 0)
    assert torn.all() == [AbortedTxn(1, 0, 5, 6)]  # whole entries still readable
    with pytest.raises(CorruptIndex):
        torn.sanity_check()
