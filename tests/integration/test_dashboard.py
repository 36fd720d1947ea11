"""The Grafana dashboard (docker/monitoring/grafana/dashboards/pykbroker.json) shows data from a real run.

A 3-broker cluster (a real ZooKeeper) with every broker's metrics endpoint, real clients producing
and consuming, one follower paused for a while (ISR churn, under-replicated partitions), and a real
Prometheus (Debian's package) scraping all three every second. The dashboard's broker variable is
resolved as Grafana resolves it, and every panel's PromQL is then asked of that Prometheus over its
HTTP API, exactly as Grafana would (with $__rate_interval and $broker given values), and must return
data. Grafana itself cannot run here (it is not packaged by Debian, and no registry this machine
reaches ships it), so the panels are drawn by this test as SVG from the same query results and the
page is photographed with headless Chromium; the PNG is kept in build/artifacts/ (PYKB_ARTIFACTS).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.conftest import unique_topic, wait_until
from tests.support.broker import free_port
from tests.support.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docker" / "monitoring" / "grafana" / "dashboards" / "pykbroker.json"
CHROMIUM = ("chromium-headless-shell", "chromium")


def _artifacts() -> Path:
    out = Path(os.environ.get("PYKB_ARTIFACTS", ROOT / "build" / "artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _query_range(prom: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "1"})
    doc = _get(f"{prom}/api/v1/query_range?{q}")
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


def _svg(title: str, series: list[dict[str, Any]], start: float, end: float) -> str:
    w, h, pad = 480, 220, 30
    values = [float(v) for s in series for _, v in s["values"] if v not in ("NaN", "+Inf", "-Inf")]
    top = max([*values, 1e-9])
    colors = ["#3274d9", "#e0752d", "#56a64b", "#a352cc", "#f2cc0c", "#e02f44"]
    lines = []
    for i, s in enumerate(series[:6]):
        pts = []
        for t, v in s["values"]:
            if v in ("NaN", "+Inf", "-Inf"):
                continue
            x = pad + (float(t) - start) / max(end - start, 1) * (w - 2 * pad)
            y = h - pad - float(v) / top * (h - 2 * pad)
            pts.append(f"{x:.1f},{y:.1f}")
        label = ",".join(f"{k}={v}" if k else v for k, v in s["metric"].items()) or "value"
        lines.append(f'<polyline fill="none" stroke="{colors[i % 6]}" stroke-width="2" points="{" ".join(pts)}"/>'
                     f'<text x="{pad}" y="{h - 8 - 12 * (len(series[:6]) - 1 - i)}" font-size="10" '
                     f'fill="{colors[i % 6]}">{html.escape(label[:70])}</text>')
    return (f'<div class="panel"><h3>{html.escape(title)}</h3><svg width="{w}" height="{h}">'
            f'<rect width="{w}" height="{h}" fill="#181b1f"/><text x="{w - pad}" y="14" font-size="10" '
            f'fill="#ccc" text-anchor="end">max {top:.4g}</text>{"".join(lines)}</svg></div>')


def _legend(fmt: str, labels: dict[str, str]) -> dict[str, str]:
    """A series' labels as Grafana's legendFormat shows them ("shrinks {{instance}}")."""
    if not fmt or fmt == "__auto":
        return labels
    return {"": re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)}


def _start_prometheus(tmp_path: Path, prometheus: str, targets: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    prom_port = free_port()
    listed = ", ".join(f"'{t}'" for t in targets)
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: pykbroker\n    static_configs:\n      - targets: [{listed}]\n")
    with open(tmp_path / "prometheus.log", "wb") as prom_log:
        proc = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=prom_log, stderr=prom_log)
    return proc, f"http://127.0.0.1:{prom_port}"


def _broker_values(prom: str, dash: dict[str, Any]) -> list[str]:
    """The broker variable's values, from its label_values() query, as Grafana resolves it."""
    var = next(v for v in dash["templating"]["list"] if v["name"] == "broker")
    metric, label = var["definition"].removeprefix("label_values(").removesuffix(")").split(", ")
    q = urllib.parse.urlencode({"match[]": metric})
    return list(_get(f"{prom}/api/v1/label/{label}/values?{q}")["data"])


def test_every_dashboard_panel_shows_data(tmp_path: Path) -> None:
    prometheus = shutil.which("prometheus")
    chromium = next((p for p in map(shutil.which, CHROMIUM) if p), None)
    assert prometheus and chromium, "scripts/install.sh --test installs prometheus and chromium-headless-shell"
    ports = {i: free_port() for i in (1, 2, 3)}
    per_broker = {i: {"pykbroker.metrics.listener": f"http://127.0.0.1:{p}"} for i, p in ports.items()}
    overrides = {"offsets.topic.replication.factor": "3", "default.replication.factor": "3",
                 "replica.lag.time.max.ms": "2000"}
    with Cluster(tmp_path / "cluster", 3, overrides=overrides, broker_overrides=per_broker) as cluster:
        proc, prom = _start_prometheus(tmp_path, prometheus, [f"127.0.0.1:{p}" for p in ports.values()])
        try:
            _run(cluster, prom, chromium, tmp_path)
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def _run(cluster: Cluster, prom: str, chromium: str, tmp_path: Path) -> None:
    def scraping() -> bool:
        try:
            targets = _get(f"{prom}/api/v1/targets")["data"]["activeTargets"]
        except OSError:  # not listening yet
            return False
        return len(targets) == 3 and all(t["health"] == "up" for t in targets)

    wait_until(scraping, timeout=30, what="Prometheus scraping the three brokers")
    topic = unique_topic("dash")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=3)])[topic].result(30)
    leader = cluster.wait_leaders(topic, 1)[0]
    # Neither the leader nor the controller: pausing it drops it from the ISR and moves nothing.
    paused = next(b for b in cluster.brokers if b not in (leader, cluster.controller_id()))
    start = time.time()
    stop = threading.Event()

    def traffic() -> None:
        p = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5, "message.timeout.ms": 30000})
        c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"dash-{uuid.uuid4().hex[:6]}",
                      "enable.auto.commit": True, "auto.commit.interval.ms": 500, "auto.offset.reset": "earliest"})
        c.subscribe([topic])
        for i in range(120):  # bounded: about 12 s
            if stop.is_set():
                break
            for j in range(200):
                p.produce(topic, value=b"x" * 200, key=str(j).encode())
            p.poll(0)
            if i < 80:  # the consumer falls behind later on: the lag panel has something to show
                c.consume(500, 0.05)
            time.sleep(0.1)
        p.flush(30)
        c.close()

    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    time.sleep(2)
    cluster.pause(paused)
    try:
        wait_until(lambda: paused not in cluster.partition_states(topic, via=leader)[0][2], timeout=20,
                   what="the paused follower out of the ISR")
        time.sleep(1.5)  # scraped while under-replicated
    finally:
        cluster.resume(paused)
    t.join(60)
    stop.set()
    time.sleep(3)  # the last scrapes
    end = time.time()
    dash = json.loads(DASHBOARD.read_text())
    brokers = _broker_values(prom, dash)
    assert len(brokers) == 3, f"the broker variable lists every broker: {brokers}"
    rendered = []
    for panel in dash["panels"]:
        drawn: list[dict[str, Any]] = []
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "4s").replace("$broker", ".*")
            series = _query_range(prom, expr, start, end)
            assert series and any(s["values"] for s in series), f"panel {panel['title']!r}: no data for {expr}"
            drawn += [{**s, "metric": _legend(target.get("legendFormat", ""), s["metric"])} for s in series]
        rendered.append(_svg(panel["title"], drawn, start, end))
    controllers = _query_range(prom, "sum(kafka_controller_kafkacontroller_activecontrollercount)", end - 2, end)
    assert controllers and float(controllers[0]["values"][-1][1]) == 1, "exactly one active controller"
    for expr in ("max_over_time(sum(kafka_server_replicamanager_underreplicatedpartitions)[1h:1s])",
                 "sum(kafka_server_replicamanager_isrshrinks_total)"):
        got = _query_range(prom, expr, end - 2, end)
        assert got and float(got[0]["values"][-1][1]) >= 1, f"{expr}: the paused follower shows"
    page = tmp_path / "dashboard.html"
    page.write_text("<html><body style='background:#111217;color:#ccc;font-family:sans-serif'>"
                    f"<h2>{html.escape(dash['title'])}: panels of {DASHBOARD.name} drawn from Prometheus query "
                    "results (not Grafana), 3 brokers</h2>"
                    "<style>.panel{display:inline-block;margin:6px}h3{font-size:13px;margin:4px}</style>"
                    + "".join(rendered) + "</body></html>")
    shot = _artifacts() / "dashboard.png"
    shot.unlink(missing_ok=True)
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={shot}", "--window-size=1520,1330", page.as_uri()],
                   check=True, timeout=120, capture_output=True)
    assert shot.exists() and shot.stat().st_size > 10_000, "a screenshot with the panels in it"
