"""The metrics snapshot of a running broker: one short turn of the event loop copies what the
Prometheus families need (observability.collector.Snapshot) out of the broker's parts.  It lives with
the server because it reads every part of the broker; the collector below only knows the Snapshot."""

from __future__ import annotations

import anyio

from pykbroker.coordinator.group.service import GroupCoordinator
from pykbroker.coordinator.transaction.service import TransactionCoordinator
from pykbroker.observability.collector import PartitionRow, Snapshot
from pykbroker.observability.lag import consumer_lag
from pykbroker.server.context import Services
from pykbroker.server.network import SocketServer


def take_snapshot(svc: Services, server: SocketServer, groups: GroupCoordinator, txn: TransactionCoordinator,
                  broker_id: int) -> Snapshot:
    """On the event loop: copy what the families need. Nothing here blocks or awaits."""
    snap = Snapshot(partition_series=svc.config["pykbroker.metrics.partition.series"])
    stats = svc.stats
    for (key, version), h in stats.requests.items():
        snap.requests.append((key, version, h.cumulative(), h.sum, h.count))
    replicated = svc.replicas.replication_bytes_in
    for name in stats.topics.keys() | replicated.keys():
        c = stats.topic(name)
        snap.topics.append((name, (c.messages_in, c.bytes_in, c.bytes_out, replicated.get(name, 0),
                                   c.replication_bytes_out, c.produce_requests, c.fetch_requests)))
    snap.connections = server.connections_by_listener()
    replicas = svc.replicas
    snap.purgatory = {"Produce": replicas.produce_waiters.waiting,
                      "Fetch": replicas.fetch_waiters.waiting + replicas.replica_fetch_waiters.waiting}
    snap.isr_shrinks, snap.isr_expands = replicas.isr_shrinks, replicas.isr_expands
    snap.min_isr_refusals = [(topic, error, n) for (topic, error), n in stats.min_isr.counts.items()]
    end_offsets: dict[tuple[str, int], int] = {}
    for tp, p in replicas.partitions().items():
        lg = p.log
        offline = p.offline
        snap.partitions.append(PartitionRow(
            p.topic, p.index, 0 if offline else lg.size_bytes, 0 if offline else len(lg.segments),
            lg.log_start_offset, lg.log_end_offset, p.high_watermark, p.is_leader, len(p.replicas) or 1,
            len(p.isr) or 1, offline))
        end_offsets[tp] = p.high_watermark
    store = svc.store
    if store.is_cluster():
        snap.active_controller = int(store.controller_id() == broker_id)
        if snap.active_controller:  # as in Kafka, the controller reports offline partitions
            snap.offline_partitions = sum(1 for rec in store.topics().values()
                                          for a in rec.partitions.values() if a.leader < 0)
    else:
        snap.active_controller = 1
        snap.offline_partitions = sum(1 for r in snap.partitions if r.offline)
    manager = groups.manager
    for g in manager.list_groups():
        snap.groups[(g["group_type"], g["group_state"])] += 1
    snap.rebalances = dict(manager.rebalances)
    snap.lag = consumer_lag(manager.offsets, end_offsets)
    for meta in txn.sm.txns.values():
        snap.transactions[meta.state.name] += 1
    if svc.quotas is not None:
        snap.quotas = svc.quotas.snapshot(anyio.current_time() * 1000.0)
    telemetry = svc._telemetry
    if telemetry is not None:
        for inst in telemetry.instances.values():
            if inst.latest is not None:
                snap.client_pushes.append((str(inst.instance_id), inst.selector.client_id, inst.latest.data))
    return snap
