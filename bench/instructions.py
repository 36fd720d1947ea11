"""Instructions per request on the produce and fetch paths, counted by valgrind's callgrind (repeatable whatever
else the machine does, unlike seconds): ``Dispatcher.handle`` in process, no sockets, one Produce v10 (one
5-record batch of 100 B per partition, acks=1) then one Fetch v16 of those records, per round.

    python bench/instructions.py                       # this checkout, 6 partitions
    python bench/instructions.py --tree /tmp/other     # another checkout (C helpers built in place)

It runs the rounds twice under callgrind (``--rounds`` A and B) and prints (B - A) / (B - A rounds): start-up
and warm-up cancel out. Needs valgrind (Debian package valgrind).
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _inner(tree: str, rounds: int, partitions: int) -> None:
    # Import the broker of ``tree``, not the one this interpreter has installed in editable mode.
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, tree)
    import anyio

    import pykbroker
    from pykbroker.config import BrokerConfig
    from pykbroker.protocol import codec
    from pykbroker.protocol.records import build_batch
    from pykbroker.server.broker import Broker

    assert pykbroker.__file__ is not None and pykbroker.__file__.startswith(tree), pykbroker.__file__

    def frame(api_key: int, version: int, body: dict[str, object]) -> bytes:
        client = b"bench"
        header = struct.pack(">hhih", api_key, version, 1, len(client)) + client
        if codec.is_flexible(api_key, version):
            header += b"\x00"
        return header + codec.encode_entity(codec.build(codec.request_class(api_key, version), body))

    broker = Broker(BrokerConfig({"log.dirs": tempfile.mkdtemp(), "listeners": "PLAINTEXT://127.0.0.1:0"}))
    broker.startup()
    handle = broker.dispatcher.handle

    async def run() -> None:
        await handle(frame(19, 4, {"topics": [{"name": "t", "num_partitions": partitions, "replication_factor": 1}],
                                   "timeout": 30000}))
        topic_id = broker.services.store.topic("t").topic_id
        batch = bytes(build_batch([(None, b"x" * 100, [])] * 5, timestamp_ms=int(time.time() * 1000)))
        produce = frame(0, 10, {"acks": 1, "timeout": 30000, "topic_data": [
            {"name": "t", "partition_data": [{"index": i, "records": batch} for i in range(partitions)]}]})
        for _ in range(50):  # warm-up
            await handle(produce)
        fetched = 0
        for _ in range(rounds):
            await handle(produce)
            hw = broker.services.replicas.partition("t", 0).high_watermark
            fetched += _size(await handle(frame(1, 16, {
                "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 52428800, "isolation_level": 0,
                "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
                "topics": [{"topic_id": topic_id, "partitions": [
                    {"partition": i, "fetch_offset": hw - 5, "current_leader_epoch": -1, "last_fetched_epoch": -1,
                     "log_start_offset": -1, "partition_max_bytes": 1048576} for i in range(partitions)]}]})))
        # What was measured is the real work: every produce appended, every fetch carried its records.
        hws = [broker.services.replicas.partition("t", i).high_watermark for i in range(partitions)]
        print(f"high watermarks {hws}, fetch response bytes per round {fetched // max(rounds, 1)}")

    anyio.run(run)


def _size(response: object) -> int:
    """Bytes of a response: bytes, or the server's ResponseParts (bytes and file ranges)."""
    return len(response) if isinstance(response, bytes | bytearray) else int(getattr(response, "size", 0))


def _count(tree: str, rounds: int, partitions: int, out_dir: str) -> int:
    out = os.path.join(out_dir, f"callgrind.{rounds}.out")
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__,
                    "--inner", "--tree", tree, "--rounds", str(rounds), "--partitions", str(partitions)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for line in Path(out).read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"no summary in {out}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]), help="checkout whose broker to count")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--rounds", default="100,400", help="A,B: rounds of the two runs")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        _inner(args.tree, int(args.rounds), args.partitions)
        return 0
    a, b = (int(x) for x in args.rounds.split(","))
    with tempfile.TemporaryDirectory(prefix="pykbroker-instructions-") as d, ThreadPoolExecutor(2) as pool:
        ia, ib = pool.map(lambda n: _count(args.tree, n, args.partitions, d), (a, b))  # both counts in parallel
    per_round = (ib - ia) / (b - a)
    print(f"tree: {args.tree}")
    print(f"command: {' '.join(sys.argv)}")
    print(f"instructions, start-up + warm-up + {a} rounds: {ia:,}")
    print(f"instructions per round (Produce v10 + Fetch v16, {args.partitions} partitions): {per_round:,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
