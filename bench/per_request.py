"""Per-request cost of Dispatcher.handle (no sockets): produce v10 (1 small batch per partition)
and fetch v16 (max_wait 0, the tail of the log, so small responses), 1 and 6 partitions."""

import struct
import sys
import tempfile
import time

import anyio

from pykbroker.config import BrokerConfig
from pykbroker.protocol import codec
from pykbroker.protocol.records import build_batch
from pykbroker.server.broker import Broker

LABEL = sys.argv[1] if len(sys.argv) > 1 else "pykbroker"


def frame_for(api_key, version, body):
    client = b"bench"
    header = struct.pack(">hhih", api_key, version, 1, len(client)) + client
    if codec.is_flexible(api_key, version):
        header += b"\x00"
    return header + codec.encode_entity(codec.build(codec.request_class(api_key, version), body))


def main():
    d = tempfile.mkdtemp()
    b = Broker(BrokerConfig({"log.dirs": d, "listeners": "PLAINTEXT://127.0.0.1:0"}))
    b.startup()
    h = b.dispatcher.handle

    async def run():
        for parts in (1, 6):
            name = f"t{parts}"
            await h(
                frame_for(
                    19,
                    4,
                    {"topics": [{"name": name, "num_partitions": parts, "replication_factor": 1}], "timeout": 30000},
                )
            )
            tid = b.services.store.topic(name).topic_id
            batch = bytes(build_batch([(None, b"x" * 100, [])] * 5, timestamp_ms=int(time.time() * 1000)))
            prod = frame_for(
                0,
                10,
                {
                    "acks": 1,
                    "timeout": 30000,
                    "topic_data": [
                        {"name": name, "partition_data": [{"index": i, "records": batch} for i in range(parts)]}
                    ],
                },
            )
            n = 3000
            for _ in range(200):
                await h(prod)
            t0 = time.process_time()
            for _ in range(n):
                await h(prod)
            tp = (time.process_time() - t0) / n * 1e6
            hw = b.services.replicas.partition(name, 0).high_watermark
            fetch = frame_for(
                1,
                16,
                {
                    "replica_id": -1,
                    "max_wait": 0,
                    "min_bytes": 1,
                    "max_bytes": 52428800,
                    "isolation_level": 0,
                    "session_id": 0,
                    "session_epoch": -1,
                    "topics": [
                        {
                            "topic_id": tid,
                            "partitions": [
                                {
                                    "partition": i,
                                    "fetch_offset": hw - 5,
                                    "partition_max_bytes": 1048576,
                                    "current_leader_epoch": -1,
                                    "log_start_offset": -1,
                                }
                                for i in range(parts)
                            ],
                        }
                    ],
                    "forgotten_topics_data": [],
                    "rack_id": "",
                },
            )
            for _ in range(200):
                await h(fetch)
            t0 = time.process_time()
            for _ in range(n):
                await h(fetch)
            tf = (time.process_time() - t0) / n * 1e6
            print(f"{LABEL} partitions={parts}: produce v10 {tp:.0f} us/request, fetch v16 {tf:.0f} us/request")

    anyio.run(run)
    b.log_manager.shutdown()


main()
