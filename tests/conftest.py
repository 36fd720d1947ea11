from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A fresh broker subprocess per test, with small segments so rolls happen."""
    b = BrokerProcess(tmp_path / "broker")
    b.start()
    try:
        yield b
    finally:
        b.kill()


@pytest.fixture
def topic_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"
