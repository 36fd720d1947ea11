"""``pykbroker cluster info``: the cluster id, the controller, and each broker with its address, rack, API version
ranges and features (ApiVersions, as kafka-broker-api-versions shows them)."""

from __future__ import annotations

from typing import Any

import click

from ..connection import Connection, api_name
from ..errors import EXIT_UNREACHABLE, AdminError
from ..session import Session, connection_options

PRODUCE, FETCH = 0, 1


@click.group("cluster")
def cluster() -> None:
    """The cluster as a whole."""


def _versions(conn: Connection) -> dict[str, Any]:
    """A broker's API version ranges and features, from its ApiVersions answer."""
    response = conn.api_versions_response
    features = {str(f.name): {"supported_min": int(f.min_version), "supported_max": int(f.max_version),
                              "finalized_min": None, "finalized_max": None}
                for f in getattr(response, "supported_features", ())}
    for f in getattr(response, "finalized_features", ()):
        entry = features.setdefault(str(f.name), {"supported_min": None, "supported_max": None})
        entry.update({"finalized_min": int(f.min_version_level), "finalized_max": int(f.max_version_level)})
    epoch = getattr(response, "finalized_features_epoch", -1)
    return {"api_versions": [{"api_key": k, "name": api_name(k), "min": lo, "max": hi}
                             for k, (lo, hi) in sorted(conn.api_versions.items())],
            "features": [{"name": n, **features[n]} for n in sorted(features)],
            "finalized_features_epoch": int(epoch) if epoch is not None and int(epoch) >= 0 else None}


def _max(versions: dict[str, Any] | None, api_key: int) -> int | None:
    for v in (versions or {}).get("api_versions", ()):
        if v["api_key"] == api_key:
            return int(v["max"])
    return None


@cluster.command("info")
@click.option("--api-versions", "show_versions", is_flag=True,
              help="each broker's version range of every API (the JSON document always has them)")
@connection_options
def info(show_versions: bool, session: Session) -> None:
    """Cluster id, controller, brokers (id, address, rack, highest Produce and Fetch versions) and the partitions
    each leads; the features the brokers support and the cluster has finalized."""
    admin = session.admin
    described = admin.wait(admin.client.describe_cluster(request_timeout=admin.timeout), "describe cluster")
    md = admin.metadata()
    leads: dict[int, int] = {}
    for t in md.topics.values():
        for p in t.partitions.values():
            if p.leader >= 0:
                leads[p.leader] = leads.get(p.leader, 0) + 1
    controller = described.controller.id if described.controller is not None else None
    brokers: list[dict[str, Any]] = []
    for n in sorted(described.nodes, key=lambda n: n.id):
        try:
            versions: dict[str, Any] | None = _versions(session.wire.connect(f"{n.host}:{n.port}"))
        except AdminError as e:
            if e.exit_code != EXIT_UNREACHABLE:
                raise
            session.out.note(f"broker {n.id}: {e}")
            versions = None
        brokers.append({"id": n.id, "host": n.host, "port": n.port, "rack": n.rack, "controller": n.id == controller,
                        "leaders": leads.get(n.id, 0), "reachable": versions is not None,
                        **(versions or {"api_versions": [], "features": [], "finalized_features_epoch": None})})
    doc = {"cluster_id": described.cluster_id, "controller": controller, "brokers": brokers}
    if session.out.json:
        session.out.emit(doc)
        return
    session.out.fields([("Cluster", described.cluster_id), ("Controller", controller), ("Brokers", len(brokers))])
    session.out.table(["ID", "HOST", "PORT", "RACK", "CONTROLLER", "LEADERS", "PRODUCE", "FETCH"],
                      [[b["id"], b["host"], b["port"], b["rack"], b["controller"], b["leaders"],
                        _max(b, PRODUCE), _max(b, FETCH)] for b in brokers])
    features = [[b["id"], f["name"], _range(f["supported_min"], f["supported_max"]),
                 _range(f["finalized_min"], f["finalized_max"])] for b in brokers for f in b["features"]]
    if features:
        session.out.table(["BROKER", "FEATURE", "SUPPORTED", "FINALIZED"], features)
    if show_versions:
        for b in brokers:
            session.out.table(["API", "KEY", "MIN", "MAX"],
                              [[v["name"], v["api_key"], v["min"], v["max"]] for v in b["api_versions"]],
                              title=f"Broker {b['id']} ({b['host']}:{b['port']})")


def _range(low: int | None, high: int | None) -> str | None:
    return None if low is None or high is None else f"{low}-{high}"


COMMANDS = (cluster,)
