#!/usr/bin/env python3
"""The benchmarks' default Apache Kafka: one KRaft broker+controller from Maven Central's jars.

Implements the ``--kafka-cmd`` contract (``KAFKA_CMD PORT DATA_DIR``; ``$CONTROLLER_PORT``,
``$EXTRA_SERVER_PROPS``, see bench/README.md) with the release the compatibility suite pins in
compat/kafka/pom.xml (resolved with Maven on first use, as ``scripts/test.sh`` does), so every
side-by-side figure can be re-run from a clone:

    python bench/kafka_node.py [--line 4|3.9] PORT DATA_DIR

It formats DATA_DIR on first start, then replaces itself with the Kafka JVM (``exec``), which serves
PLAINTEXT on 127.0.0.1:PORT in the foreground until it is signalled.  The JVM gets the heap of
``kafka-server-start.sh`` (1 GiB) unless ``KAFKA_HEAP_OPTS`` says otherwise, as that script does.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compat.realkafka import KAFKA_DIR, java, random_cluster_id, release, resolve  # noqa: E402

DEFAULT_LINE = "4"


def server_properties(port: int, controller_port: int, data_dir: Path, extra: str) -> str:
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={data_dir / 'kafka-logs'}",
        "offsets.topic.replication.factor=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        extra,
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--line", default=DEFAULT_LINE, help="the release line of compat/kafka/pom.xml (default 4)")
    ap.add_argument("port", type=int)
    ap.add_argument("data_dir", type=Path)
    args = ap.parse_args(argv)
    controller = os.environ.get("CONTROLLER_PORT")
    if not controller:
        ap.error("$CONTROLLER_PORT is not set (the benchmarks set it: bench/README.md)")
    rel = release(args.line)
    lib = resolve(rel)
    data = args.data_dir.resolve()
    data.mkdir(parents=True, exist_ok=True)
    config = data / "server.properties"
    config.write_text(server_properties(args.port, int(controller), data, os.environ.get("EXTRA_SERVER_PROPS", "")))
    log = (["-Dlog4j.configuration=file:" + str(KAFKA_DIR / "log4j.properties")] if rel.major < 4
           else ["-Dlog4j2.configurationFile=" + str(KAFKA_DIR / "log4j2.properties")])
    heap = shlex.split(os.environ.get("KAFKA_HEAP_OPTS", "-Xmx1G -Xms1G"))
    # kafka-run-class.sh's JVM settings.
    jvm = [java(), *heap, "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
           "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true", *log, "-cp", str(lib / "*")]
    if not (data / "kafka-logs" / "meta.properties").exists():
        subprocess.run([*jvm, "kafka.tools.StorageTool", "format", "--cluster-id", random_cluster_id(),
                        "--config", str(config)], check=True, stdout=subprocess.DEVNULL, timeout=300)
    os.execv(jvm[0], [*jvm, "kafka.Kafka", str(config)])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
