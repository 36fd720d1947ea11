"""The Grafana dashboard (docker/monitoring/grafana/dashboards/pykbroker.json) shows data from a real run.

A broker with its metrics endpoint, real clients producing and consuming, and a real Prometheus
(Debian's package) scraping it every second. Every panel's PromQL is then asked of that Prometheus
over its HTTP API, exactly as Grafana would (with $__rate_interval given a value), and must return
data. Grafana itself cannot run here (it is not packaged by Debian, and no registry this machine
reaches ships it), so the panels are drawn by this test as SVG from the same query results and the
page is photographed with headless Chromium; the PNG is kept in build/artifacts/ (PYKB_ARTIFACTS).
"""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from tests.integration.conftest import (
    BrokerFactory,
    create_topic,
    make_consumer,
    make_producer,
    unique_topic,
    wait_until,
)
from tests.support.broker import free_port

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
        label = ",".join(f"{k}={v}" for k, v in s["metric"].items()) or "value"
        lines.append(f'<polyline fill="none" stroke="{colors[i % 6]}" stroke-width="2" points="{" ".join(pts)}"/>'
                     f'<text x="{pad}" y="{h - 8 - 12 * (len(series[:6]) - 1 - i)}" font-size="10" '
                     f'fill="{colors[i % 6]}">{html.escape(label[:70])}</text>')
    return (f'<div class="panel"><h3>{html.escape(title)}</h3><svg width="{w}" height="{h}">'
            f'<rect width="{w}" height="{h}" fill="#181b1f"/><text x="{w - pad}" y="14" font-size="10" '
            f'fill="#ccc" text-anchor="end">max {top:.4g}</text>{"".join(lines)}</svg></div>')


def test_every_dashboard_panel_shows_data(broker_factory: BrokerFactory, tmp_path: Path) -> None:
    prometheus = shutil.which("prometheus")
    chromium = next((p for p in map(shutil.which, CHROMIUM) if p), None)
    assert prometheus and chromium, "scripts/install.sh --test installs prometheus and chromium-headless-shell"
    port = free_port()
    b = broker_factory({"pykbroker.metrics.listener": f"http://127.0.0.1:{port}"})
    prom_port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: pykbroker\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
    prom_log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=prom_log, stderr=prom_log)
    prom = f"http://127.0.0.1:{prom_port}"
    stop = threading.Event()
    try:
        def scraping() -> bool:
            try:
                targets = _get(f"{prom}/api/v1/targets")["data"]["activeTargets"]
            except OSError:  # not listening yet
                return False
            return bool(targets) and targets[0]["health"] == "up"

        wait_until(scraping, timeout=30, what="Prometheus scraping the broker")
        topic = unique_topic("dash")
        create_topic(b, topic, partitions=2)
        start = time.time()

        def traffic() -> None:
            p = make_producer(b)
            c = make_consumer(b, **{"group.id": f"dash-{uuid.uuid4().hex[:6]}", "enable.auto.commit": True,
                                    "auto.commit.interval.ms": 500})
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
            p.flush(20)
            c.close()

        t = threading.Thread(target=traffic, daemon=True)
        t.start()
        t.join(60)
        time.sleep(2)  # the last scrapes
        end = time.time()
        dash = json.loads(DASHBOARD.read_text())
        rendered = []
        for panel in dash["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$__rate_interval", "4s")
                series = _query_range(prom, expr, start, end)
                assert series and any(s["values"] for s in series), f"panel {panel['title']!r}: no data for {expr}"
                rendered.append(_svg(panel["title"], series, start, end))
        page = tmp_path / "dashboard.html"
        page.write_text("<html><body style='background:#111217;color:#ccc;font-family:sans-serif'>"
                        f"<h2>{html.escape(dash['title'])} (panels of {DASHBOARD.name}, data from Prometheus)</h2>"
                        "<style>.panel{display:inline-block;margin:6px}h3{font-size:13px;margin:4px}</style>"
                        + "".join(rendered) + "</body></html>")
        shot = _artifacts() / "dashboard.png"
        shot.unlink(missing_ok=True)
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--screenshot={shot}", "--window-size=1520,1180", page.as_uri()],
                       check=True, timeout=120, capture_output=True)
        assert shot.exists() and shot.stat().st_size > 10_000, "a screenshot with the panels in it"
    finally:
        stop.set()
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        prom_log.close()
