"""Plaintext vs SSL vs SASL_SSL: produce and consume msg/s and broker CPU seconds per 1M messages.

Starts one broker subprocess with a PLAINTEXT, an SSL and a SASL_SSL (PLAIN login) listener (test
certificates from tests/support/certs.py) and runs the same confluent-kafka produce and consume
phases on each.

    .venv/bin/python bench/security_bench.py --messages 50000 --size 100
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import BrokerProcess, free_port
from tests.support.certs import PASSWORD, make_pki


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_phase(name: str, fn: Any, pid: int, n: int) -> tuple[float, float]:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    fn()
    dt, cpu = time.monotonic() - t0, cpu_seconds(pid) - c0
    print(f"  {name:8s} {n / dt:10.0f} msg/s   broker CPU {cpu * 1_000_000 / n:7.2f} s per 1M messages")
    return n / dt, cpu


def bench(conf: dict[str, Any], admin_bootstrap: str, pid: int, n: int, size: int) -> None:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": admin_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    value = b"x" * size

    def produce() -> None:
        p = Producer({**conf, "linger.ms": 5, "batch.size": 262144, "acks": 1})
        for _ in range(n):
            while True:
                try:
                    p.produce(topic, value)
                    break
                except BufferError:
                    p.poll(0.01)
        assert p.flush(120) == 0

    def consume() -> None:
        c = Consumer({**conf, "group.id": topic, "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.subscribe([topic])
        got, deadline = 0, time.monotonic() + 300
        while got < n and time.monotonic() < deadline:
            for m in c.consume(10000, 0.5):
                if m.error() is None:
                    got += 1
        c.close()
        assert got >= n, f"consumed {got} of {n}"

    run_phase("produce", produce, pid, n)
    run_phase("consume", consume, pid, n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pykbroker-secbench-") as tmp:
        pki = make_pki(Path(tmp) / "pki")
        p0, p1, p2 = free_port(), free_port(), free_port()
        broker = BrokerProcess(Path(tmp) / "broker", {
            "listeners": f"PLAINTEXT://127.0.0.1:{p0},SSL://127.0.0.1:{p1},SASL_SSL://127.0.0.1:{p2}",
            "ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(pki.server.p12),
            "ssl.keystore.password": PASSWORD, "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_ssl.plain.sasl.jaas.config":
                'org.apache.kafka.common.security.plain.PlainLoginModule required user_bench="bench-secret";',
        }, port=p0).start()
        try:
            assert broker.proc is not None
            pid = broker.proc.pid
            print(f"{args.messages} messages of {args.size} bytes, one partition, confluent-kafka")
            print("PLAINTEXT")
            bench({"bootstrap.servers": broker.bootstrap}, broker.bootstrap, pid, args.messages, args.size)
            print("SSL")
            bench({"bootstrap.servers": f"127.0.0.1:{p1}", "security.protocol": "SSL",
                   "ssl.ca.location": str(pki.ca.cert_path)}, broker.bootstrap, pid, args.messages, args.size)
            print("SASL_SSL (PLAIN)")
            bench({"bootstrap.servers": f"127.0.0.1:{p2}", "security.protocol": "SASL_SSL",
                   "ssl.ca.location": str(pki.ca.cert_path), "sasl.mechanism": "PLAIN",
                   "sasl.username": "bench", "sasl.password": "bench-secret"},
                  broker.bootstrap, pid, args.messages, args.size)
        finally:
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
