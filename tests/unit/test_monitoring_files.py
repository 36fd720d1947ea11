"""The compose file's variables and the monitoring profile's scrape targets agree with the docs."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
PROMETHEUS = ROOT / "docker" / "monitoring" / "prometheus.yml"
DASHBOARD = ROOT / "docker" / "monitoring" / "grafana" / "dashboards" / "pykbroker.json"
DEPLOY = ROOT / "docs" / "deploy.md"


def _compose_variables() -> set[str]:
    return set(re.findall(r"\$\{(PYKB_[A-Z0-9_]+)", COMPOSE.read_text()))


def test_every_compose_variable_is_documented() -> None:
    compose = COMPOSE.read_text()
    header = "\n".join(line for line in compose.splitlines() if line.startswith("#"))
    table = DEPLOY.read_text()
    used = _compose_variables() - {"PYKB_CLUSTER_PORT_4"}  # the docs' example of adding a broker
    assert used, "compose.yaml reads PYKB_* variables"
    for var in sorted(used):
        assert var in header, f"{var} is not listed in compose.yaml's header"
        short = re.sub(r"_\d$", "", var)
        assert f"`{var}`" in table or f"`{short}_" in table, f"{var} is not in docs/deploy.md's variables table"


def test_prometheus_scrapes_every_broker_with_metrics() -> None:
    compose = COMPOSE.read_text()
    services = set(re.findall(r"^  (broker(?:-\d+)?):\n", compose, re.M))
    assert {"broker", "broker-1", "broker-2", "broker-3"} <= services
    assert compose.count('PYKBROKER_PYKBROKER_METRICS_LISTENER: "http://0.0.0.0:9404"') == 2  # single + cluster env
    targets = set(re.findall(r'"([\w-]+):9404"', PROMETHEUS.read_text()))
    assert targets == services, f"scrape targets {sorted(targets)} against broker services {sorted(services)}"


def test_dashboard_panels_filter_by_broker() -> None:
    """Every per-broker series is filtered by the broker variable; cluster-wide ones are marked as such."""
    dash = json.loads(DASHBOARD.read_text())
    assert any(v["name"] == "broker" for v in dash["templating"]["list"])
    cluster_wide = ("kafka_controller_kafkacontroller_offlinepartitionscount", "kafka_consumergroup_lag")
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            if not any(m in expr for m in cluster_wide):
                assert 'instance=~"$broker"' in expr, f"{panel['title']}: {expr}"
