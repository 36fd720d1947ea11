"""kafka-go (segmentio/kafka-go), a Go client, against pykbroker: its ``Conn`` reads and writes concurrently
on one connection, so a Fetch waiting at the log end (max wait 2^31-1 ms) is followed by the Produce that
writes there.  The program is tests/clients/kafkago, built with the machine's Go from the Go module proxy at
the version its go.mod pins (the module and build caches are Go's own, kept between runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import BrokerFactory, create_topic, unique_topic

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "clients" / "kafkago"


@pytest.fixture(scope="module")
def kafkago() -> Iterator[Path]:
    go = "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else shutil.which("go")
    assert go, "Go is needed (scripts/install.sh --test installs it from the Go module proxy)"
    out = ROOT / "build" / "kafkago"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([go, "build", "-o", str(out), "."], cwd=SOURCE, check=True, timeout=600,
                   env={**os.environ, "GOFLAGS": "-mod=mod"})
    yield out


@pytest.mark.parametrize("max_inflight", ["5", "1"])
def test_kafka_go_conn_reads_and_writes_at_once(broker_factory: BrokerFactory, kafkago: Path,
                                                max_inflight: str) -> None:
    b = broker_factory({"pykbroker.max.inflight.requests.per.connection": max_inflight})
    topic = unique_topic("kafkago")
    create_topic(b, topic)
    run = subprocess.run([str(kafkago), b.bootstrap, topic, "50"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "read 50", (run.stdout, run.stderr)
