"""Run fault schedules against a 3-broker ZooKeeper cluster and check what the clients saw.

    python -m tests.nemesis.campaign --seeds 1-100 --duration 180      # the full campaign (bench size)
    python -m tests.nemesis.campaign --seeds 7 --duration 60            # one seed again, to debug it

Each run writes build/artifacts/nemesis/seed-<seed>/: ``report.json`` (the seed, the fault timeline as
applied, per-anomaly counts with examples, what the clients did), ``observations.json`` (everything the
clients observed, enough to re-check) and ``timeline.png`` (acknowledgements per second and p99 latency, the
faults shaded; when matplotlib is installed). The same seed gives the same schedule.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.steady import read_all
from tests.nemesis.checker import check
from tests.nemesis.host import HostFaults
from tests.nemesis.java_workload import JavaWorkload
from tests.nemesis.schedule import PARTITION_FAULTS, Fault, schedule
from tests.nemesis.transactional import SHARE_OVERRIDES, SideLoad
from tests.nemesis.workload import Reader, Writer
from tests.support.cluster import Cluster, wait_for
from tests.support.netns import CLIENT, unavailable

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "build" / "artifacts" / "nemesis"
PARTITIONS = 6
OVERRIDES = {"min.insync.replicas": "2", "offsets.topic.replication.factor": "3",
             "transaction.state.log.replication.factor": "3", "transaction.state.log.min.isr": "2",
             "unclean.leader.election.enable": "false", "auto.leader.rebalance.enable": "false"}


def _zookeeper_signal(cluster: Cluster, sig: signal.Signals) -> None:
    for server in cluster.zk.servers:
        if server.proc is not None and server.proc.poll() is None:
            os.killpg(server.proc.pid, sig)


def _elect_preferred(cluster: Cluster, topic: str) -> str:
    from confluent_kafka import ElectionType, TopicPartition

    admin = AdminClient({"bootstrap.servers": cluster.any_bootstrap(), "broker.address.family": "v4"})
    try:
        # (confluent-kafka 2.16.1's elect_leaders refuses request_timeout: SystemError.)
        res = admin.elect_leaders(ElectionType.PREFERRED,
                                  [TopicPartition(topic, p) for p in range(PARTITIONS)]).result(timeout=30)
    except KafkaException as e:
        return f"answered {e.args[0].name()}"
    errors = sorted({err.name() for err in res.values() if err is not None})
    return "elected" + (f" ({', '.join(errors)} for some)" if errors else "")


def _partition(cluster: Cluster, fault: Fault) -> str:
    """Cut the network as ``fault.kind`` says for its hold, then heal it; a note naming the cuts."""
    net = cluster.network
    if net is None:
        raise RuntimeError(f"{fault.kind} needs the cluster in network namespaces (Cluster(network=True))")
    b = f"b{fault.target}"
    others = [f"b{i}" for i in cluster.brokers if i != fault.target]
    zookeeper = [f"zk{s.myid}" for s in cluster.zk.servers]
    if fault.kind == "partition_isolate":
        net.partition([b], others + zookeeper + [CLIENT])
    elif fault.kind == "partition_majority":
        net.partition([b], others + zookeeper)
    elif fault.kind == "partition_bridge":
        net.cut(others[0], others[1])
    elif fault.kind == "partition_zookeeper":
        net.partition([b], zookeeper)
    elif fault.kind == "partition_clients":
        net.cut(CLIENT, b)
    else:
        raise ValueError(f"unknown partition {fault.kind}")
    cuts = ", ".join(sorted("-".join(sorted(pair)) for pair in net.cuts))
    time.sleep(fault.hold)
    net.heal()
    return f"cut {cuts}, healed after the hold"


def apply(cluster: Cluster, fault: Fault, topic: str, host: HostFaults | None = None) -> str:
    """Apply one fault, waiting out its hold; a note on what happened."""
    b = fault.target
    if fault.kind in PARTITION_FAULTS:
        return _partition(cluster, fault)
    note = host.apply(fault) if host is not None else None
    if note is not None:
        return note
    if fault.kind == "kill_restart":
        cluster.kill(b)
        cluster.broker(b).start(timeout=60)
        return "killed, started at once"
    if fault.kind == "kill_wait_restart":
        cluster.kill(b)
        time.sleep(fault.hold)
        cluster.broker(b).start(timeout=60)
        return "killed, started after the hold"
    if fault.kind == "pause_broker":
        cluster.pause(b)
        time.sleep(fault.hold)
        cluster.resume(b)
        return "SIGSTOP, SIGCONT after the hold"
    if fault.kind == "pause_zookeeper":
        _zookeeper_signal(cluster, signal.SIGSTOP)
        time.sleep(fault.hold)
        _zookeeper_signal(cluster, signal.SIGCONT)
        return "ZooKeeper SIGSTOP, SIGCONT after the hold"
    if fault.kind == "graceful_restart":
        code = cluster.stop(b, timeout=60)
        cluster.broker(b).start(timeout=60)
        return f"SIGTERM (exit {code}), started"
    if fault.kind == "preferred_election":
        return _elect_preferred(cluster, topic)
    raise ValueError(f"unknown fault {fault.kind}")


def heal(cluster: Cluster, topic: str, host: HostFaults | None = None) -> None:
    """No partition, every broker running and ZooKeeper going; every replica back in every ISR (bounded)."""
    if cluster.network is not None:
        cluster.network.heal()
    if host is not None:
        host.heal()
    _zookeeper_signal(cluster, signal.SIGCONT)
    for i, broker in cluster.brokers.items():
        if broker.proc is not None and broker.proc.poll() is None:
            cluster.resume(i)
        else:
            broker.start(timeout=60)
    cluster.wait_registered(list(cluster.brokers), timeout=90)
    wait_for(lambda: all(sorted(isr) == sorted(cluster.brokers) and leader > 0
                         for leader, _, isr in cluster.partition_states(topic).values()) or None,
             timeout=120, interval=0.5, what="every replica back in every ISR")


def run(seed: int, duration: float, base: Path, out_dir: Path | None = None, *, rate: int = 200) -> dict[str, Any]:
    """One seed: the cluster (in network namespaces, for the partitions), the load, the faults, the check. The
    report (also written under ``out_dir``)."""
    reason = unavailable()
    if reason is not None:
        raise RuntimeError(f"the campaign partitions the network in namespaces it builds, and cannot here: {reason}")
    faults = schedule(seed, duration, [1, 2, 3])
    tag = f"s{seed}-{uuid.uuid4().hex[:6]}"
    topic = f"nemesis-{tag}"
    applied: list[dict[str, Any]] = []
    cluster = Cluster(base, 3, overrides={**OVERRIDES, **SHARE_OVERRIDES}, network=True)
    with HostFaults(cluster, faults) as host, cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "broker.address.family": "v4"})
        admin.create_topics([NewTopic(topic, PARTITIONS, 3)])[topic].result(timeout=30)
        cluster.wait_leaders(topic, PARTITIONS, timeout=60)
        del admin
        java = JavaWorkload(cluster.bootstrap, tag, max_seconds=duration + 600, log=base / "java-client.log",
                            seed=seed)
        writer = Writer(cluster.bootstrap, topic, tag, rate=rate, max_seconds=duration + 600).start()
        readers = [Reader(cluster.bootstrap, topic, f"nemesis-{tag}", f"reader-{i}", max_seconds=duration + 600).start()
                   for i in (1, 2)]
        side = SideLoad(cluster.bootstrap, tag, seed, duration + 600).start()  # transactions and a share group
        java.start()  # the Java client's producer and group, on a topic of their own
        t0 = time.monotonic()
        stuck: str | None = None
        try:
            for fault in faults:
                time.sleep(max(0.0, t0 + fault.at - time.monotonic()))
                started = time.monotonic() - t0
                note = apply(cluster, fault, topic, host)
                applied.append({**fault.as_dict(), "started": round(started, 2),
                                "ended": round(time.monotonic() - t0, 2), "note": note})
            time.sleep(max(0.0, t0 + duration - time.monotonic()))
            heal(cluster, topic, host)
            unreported = writer.stop_and_flush() + side.stop_feeds()
            java_unreported = java.stop_and_flush()
            acknowledged = len(writer.acked)
            try:
                wait_for(lambda: (sum(r.consumed() for r in readers) >= acknowledged and side.drained()
                                  and java.drained()) or None,
                         timeout=120, interval=0.5, what="the groups consuming everything acknowledged")
            except AssertionError as e:
                # A stuck consumer is an anomaly of its own (the checks below say what was not read); the
                # logs are kept with the report, and the campaign goes on with the next seed.
                stuck = (f"{e}: the group consumed {sum(r.consumed() for r in readers)} of {acknowledged}; "
                         f"transactions and share group: {side.pending()}; the Java client: {java.pending()}")
        finally:
            for r in readers:
                r.stop()
            side.stop()
            java.stop()
            # Every client gone before the cluster's network: once its link is deleted, the private addresses
            # would be routed out of the host's default route.
            writer.close()
        final = [(p, o, v) for v, places in read_all(cluster.bootstrap, topic, PARTITIONS, timeout=120).items()
                 for p, o in places]
        side.read_final()
        java.read_final()
        ended = time.monotonic() - t0
    anomalies = check(writer.acked, {r.name: r.polls for r in readers}, {r.name: r.commits for r in readers}, final)
    anomalies.merge(side.check())
    anomalies.merge(java.check(), prefix="java-")  # the same checks over the Java client's observations
    if stuck is not None:
        anomalies.add("stuck", stuck)
    if anomalies.total and out_dir is not None:  # the brokers' logs (still in the run's directory), to see why
        _write_logs(out_dir, cluster, base)
    report: dict[str, Any] = {
        "seed": seed, "duration": duration, "wall_time": round(ended, 1), "topic": topic,
        # time.monotonic() when the faults' clock started: the observations' times are on that clock
        "t0_monotonic": round(t0, 3),
        "faults": applied, "anomalies": anomalies.as_dict(), "anomaly_total": anomalies.total,
        "sent": writer.sent, "acknowledged": len(writer.acked), "unreported": unreported,
        "producer_errors": writer.errors[:20], "producer_error_count": len(writer.errors),
        "consumed": {r.name: r.consumed() for r in readers},
        "consumer_errors": {r.name: r.errors[:10] for r in readers}, "final_records": len(final),
        **side.report(), **java.report(), "java_unreported": java_unreported,
    }
    if out_dir is not None:
        _write(out_dir, report, writer, readers, final, t0, {**side.observations(), **java.observations()})
    return report


def _write_logs(out_dir: Path, cluster: Cluster, base: Path) -> None:
    """The brokers' logs and the Java client's stderr, to see why a run went wrong."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for i, b in cluster.brokers.items():
        (out_dir / f"broker{i}.log").write_text(b.log())
    java_log = base / "java-client.log"
    if java_log.exists():
        (out_dir / "java-client.log").write_bytes(java_log.read_bytes())


def _write(out_dir: Path, report: dict[str, Any], writer: Writer, readers: list[Reader], final: list[Any],
           t0: float, side: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    observations = {
        "acked": {v.decode(): list(po) for v, po in writer.acked.items()},
        "polls": {r.name: [x if isinstance(x, str) else [x[0], x[1], x[2].decode()] for x in r.polls]
                  for r in readers},
        "commits": {r.name: [x if isinstance(x, str) else list(x) for x in r.commits] for r in readers},
        "final": [[p, o, v.decode()] for p, o, v in final],
        **side,
    }
    (out_dir / "observations.json").write_text(json.dumps(observations) + "\n")
    _plot(out_dir / "timeline.png", report, [(t - t0, lat) for t, lat in writer.acks])


def _plot(path: Path, report: dict[str, Any], acks: list[tuple[float, float]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    per_second: dict[int, list[float]] = {}
    for t, lat in acks:
        per_second.setdefault(int(t), []).append(lat)
    secs = sorted(per_second)
    every = list(range(int(report["wall_time"]) + 1))  # a second without an ack is a 0, not a gap
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(11, 6))
    ax1.plot(every, [len(per_second.get(s, ())) for s in every], lw=1)
    ax1.set_ylabel("acks / s")
    ax2.plot(secs, [sorted(per_second[s])[int(0.99 * (len(per_second[s]) - 1))] * 1000 for s in secs], ".-", lw=1,
             ms=3)
    ax2.set_ylabel("p99 ack latency (ms)")
    ax2.set_xlabel("seconds")
    for f in report["faults"]:
        for ax in (ax1, ax2):
            ax.axvspan(f["started"], max(f["ended"], f["started"] + 0.5), alpha=0.2, color="red")
        ax1.text(f["started"], ax1.get_ylim()[1] * 0.95, f"{f['kind']} {f['target'] or ''}", fontsize=7,
                 rotation=90, va="top")
    ax1.set_title(f"seed {report['seed']}: {report['acknowledged']} acknowledged, "
                  f"{report['anomaly_total']} anomalies")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _seeds(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="1", help="seeds: 7, 1-100 or 1,5,9")
    ap.add_argument("--duration", type=float, default=180.0, help="seconds of load and faults per seed")
    ap.add_argument("--rate", type=int, default=200, help="records per second the producer sends")
    ap.add_argument("--out", type=Path, default=ARTIFACTS)
    args = ap.parse_args(argv)
    failed = []
    for seed in _seeds(args.seeds):
        with tempfile.TemporaryDirectory(prefix=f"nemesis-{seed}-") as tmp:
            report = run(seed, args.duration, Path(tmp), args.out / f"seed-{seed}", rate=args.rate)
        counts = report["anomalies"]["counts"]
        print(f"seed {seed}: {len(report['faults'])} faults, {report['acknowledged']} acknowledged "
              f"(Java client: {report['java_acknowledged']}), {report['final_records']} in the log "
              f"({report['java_final_records']}), anomalies {counts or 0}, wall {report['wall_time']} s",
              flush=True)
        if report["anomaly_total"]:
            failed.append(seed)
    print(f"{len(failed)} seed(s) with anomalies: {failed}" if failed else "no anomalies")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
