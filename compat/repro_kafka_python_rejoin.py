"""Reproduce (or show the absence of) kafka-python 3.0.12's lost rejoin, with the client's own debug log.

    python -m compat.repro_kafka_python_rejoin --runs 40 [--without-workaround] [--load 3]

Each run creates a two-partition topic, writes 20 records and starts one kafka-python group member
(the compat driver's), which must read them within 30 s. ``--without-workaround`` skips the driver's
``_learn_partitions`` so the member joins before it knows the partitions and rejoins when it learns
them; ``--load N`` keeps N busy processes running meanwhile (the stall needs a loaded machine). The
kafka-python DEBUG log of every failed run is kept in ``--logs`` (``it<N>.log``); in it, the last
``coordinator.poll: timeout in ensure_active_group`` is followed only by ``need_rejoin: False``
although the SyncGroup response arrived, and no Heartbeat is sent afterwards.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import time
import uuid
from pathlib import Path

from compat.check import text_msgs
from compat.clients import kafka_python, make_client
from compat.clients.base import wait_until
from compat.cluster import ManagedPykbroker


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--without-workaround", action="store_true")
    p.add_argument("--load", type=int, default=0, help="busy processes to run meanwhile (bounded by the runs)")
    p.add_argument("--logs", type=Path, default=Path("/tmp/compat-repro-kafka-python"))
    a = p.parse_args()
    if a.without_workaround:
        kafka_python._learn_partitions = lambda consumer, topics, timeout=15.0: None  # type: ignore[assignment]
    a.logs.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    root.setLevel(logging.DEBUG)
    fmt = logging.Formatter("%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
    spinners = [multiprocessing.Process(target=_spin, args=(a.runs * 35.0,), daemon=True) for _ in range(a.load)]
    for s in spinners:
        s.start()
    broker = ManagedPykbroker()
    info = broker.start()
    helper = make_client("confluent-kafka", info.bootstrap)
    kp = make_client("kafka-python", info.bootstrap)
    failed = 0
    try:
        for i in range(a.runs):
            log_file = a.logs / f"it{i}.log"
            handler = logging.FileHandler(log_file, "w")
            handler.setFormatter(fmt)
            root.addHandler(handler)
            ok = True
            try:
                topic = f"repro-{uuid.uuid4().hex[:10]}"
                helper.create_topic(topic, 2, 1)
                helper.produce(topic, [m for p in range(2) for m in text_msgs(10, prefix=f"a{p}", partition=p)])
                member = kp.start_member(f"repro-{uuid.uuid4().hex[:10]}", [topic], auto_commit=False)
                try:
                    wait_until(lambda m=member: len(m.records()) >= 20, 30, what="20 records")
                finally:
                    member.close()
            except Exception as e:
                ok = False
                failed += 1
                print(f"run {i}: FAILED ({e}); kafka-python's log: {log_file}", flush=True)
            finally:
                root.removeHandler(handler)
                handler.close()
                if ok:
                    log_file.unlink()
    finally:
        broker.stop()
        broker.cleanup()
        for s in spinners:
            s.terminate()
    print(f"{failed} of {a.runs} runs failed ({'without' if a.without_workaround else 'with'} the workaround, "
          f"load {a.load})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
