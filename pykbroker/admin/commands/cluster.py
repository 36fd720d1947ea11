"""``pykbroker cluster info``: the cluster id, the controller, and each broker with its address and rack."""

from __future__ import annotations

import click

from ..session import Session, connection_options


@click.group("cluster")
def cluster() -> None:
    """The cluster as a whole."""


@cluster.command("info")
@connection_options
def info(session: Session) -> None:
    """Cluster id, controller, brokers (id, address, rack) and the partitions each leads."""
    admin = session.admin
    described = admin.wait(admin.client.describe_cluster(request_timeout=admin.timeout), "describe cluster")
    md = admin.metadata()
    leads: dict[int, int] = {}
    for t in md.topics.values():
        for p in t.partitions.values():
            if p.leader >= 0:
                leads[p.leader] = leads.get(p.leader, 0) + 1
    controller = described.controller.id if described.controller is not None else None
    brokers = [{"id": n.id, "host": n.host, "port": n.port, "rack": n.rack, "controller": n.id == controller,
                "leaders": leads.get(n.id, 0)} for n in sorted(described.nodes, key=lambda n: n.id)]
    doc = {"cluster_id": described.cluster_id, "controller": controller, "brokers": brokers}
    if session.out.json:
        session.out.emit(doc)
        return
    session.out.fields([("Cluster", described.cluster_id), ("Controller", controller), ("Brokers", len(brokers))])
    session.out.table(["ID", "HOST", "PORT", "RACK", "CONTROLLER", "LEADERS"],
                      [[b["id"], b["host"], b["port"], b["rack"], b["controller"], b["leaders"]] for b in brokers])


COMMANDS = (cluster,)
