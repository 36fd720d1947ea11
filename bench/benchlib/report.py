"""bench.py's Markdown report: per-figure medians over rounds, the throughput, latency, CPU and RSS
tables, the machine, the commands and the notes."""

from __future__ import annotations

import argparse
import datetime as _dt
import statistics
import sys
from typing import Any

from benchlib.brokers import Target
from benchlib.console import fmt, mib
from benchlib.procstats import broker_usage, machine_facts

PERF_COLUMNS = [
    ("produce msg/s", "produce", "msgs_per_s", 0),
    ("produce MB/s", "produce", "mb_per_s", 1),
    ("produce p50 ms", "produce", "lat_p50_ms", 1),
    ("produce p99 ms", "produce", "lat_p99_ms", 1),
    ("consume msg/s", "consume", "msgs_per_s", 0),
    ("consume MB/s", "consume", "mb_per_s", 1),
    ("consume last-1% s", "consume", "last_1pct_s", 2),
    ("e2e p50 ms", "e2e", "e2e_p50_ms", 2),
    ("e2e p99 ms", "e2e", "e2e_p99_ms", 2),
    ("ack p50 ms @rate", "e2e", "ack_p50_ms", 2),
    ("ack p99 ms @rate", "e2e", "ack_p99_ms", 2),
]


CPU_COLUMNS = [
    ("broker CPU-s/M produce", "produce", "broker_cpu_s_per_m", 2),
    ("broker CPU-s/M consume", "consume", "broker_cpu_s_per_m", 2),
    ("broker CPU % produce", "produce", "broker_cpu_pct", 0),
    ("broker CPU % consume", "consume", "broker_cpu_pct", 0),
    ("broker CPU % @rate", "e2e", "broker_cpu_pct", 0),
    ("client CPU-s/M produce", "produce", "client_cpu_s_per_m", 2),
    ("client CPU-s/M consume", "consume", "client_cpu_s_per_m", 2),
    ("other CPU % produce", "produce", "other_cpu_pct", 0),
    ("other CPU % consume", "consume", "other_cpu_pct", 0),
]


def markdown_table(results: list[dict[str, Any]], columns: list[tuple[str, str, str, int]]) -> str:
    head = ["scenario", "broker"] + [c[0] for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * len(columns)) + "|"]
    for r in results:
        row = [r["scenario"], r["broker"]]
        for _, phase, key, digits in columns:
            if phase not in r:
                row.append(
                    "not run"
                    if "error" in r or any("error" in (v or {}) for v in r.values() if isinstance(v, dict))
                    else "n/a"
                )
                continue
            ph = r.get(phase) or {}
            v = ph.get(key)
            cell = fmt(v, digits)
            if "error" in ph and v is not None:
                cell += " ⚠"
            elif "error" in ph:
                cell = "FAIL"
            row.append(cell)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def rss_table(targets: list[Target], results: list[dict[str, Any]]) -> str:
    lines = [
        "| broker | messages written | RSS start MiB | RSS end MiB | RSS peak MiB "
        "| anon RSS start MiB | anon RSS end MiB | anon RSS peak MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in targets:
        written = sum(
            (r.get("produce") or {}).get("delivered", 0) + (r.get("e2e") or {}).get("sent", 0)
            for r in results
            if r["broker"] == t.label
        )
        end = broker_usage(t.pid) if t.alive() else None
        s = t.sampler
        lines.append(
            f"| {t.label} | {written:,} | {mib(t.rss_start_kib)} | {mib(end.rss_kib if end else None)} "
            f"| {mib(max(s.peak_kib, end.rss_kib if end else 0) if s else None)} "
            f"| {mib(t.rss_anon_start_kib)} | {mib(end.rss_anon_kib if end else None)} "
            f"| {mib(max(s.peak_anon_kib, end.rss_anon_kib if end else 0) if s else None)} |"
        )
    return "\n".join(lines)


def aggregate(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median over rounds of every numeric figure, per (scenario, broker)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["scenario"], r["broker"]), []).append(r)
    out = []
    for (scenario, broker), runs in groups.items():
        agg: dict[str, Any] = {"scenario": scenario, "broker": broker, "rounds": len(runs)}
        errs = sorted({r["error"] for r in runs if "error" in r})
        if errs:
            agg["error"] = "; ".join(errs)
        phases = {k for r in runs for k, v in r.items() if isinstance(v, dict)}
        for ph in sorted(phases):
            vals = [r[ph] for r in runs if isinstance(r.get(ph), dict)]
            merged: dict[str, Any] = {}
            for key in {k for v in vals for k in v}:
                xs = [v[key] for v in vals if key in v]
                nums = [x for x in xs if isinstance(x, int | float) and not isinstance(x, bool)]
                if nums and len(nums) == len(xs):
                    merged[key] = statistics.median(nums)
                elif key in ("error", "note"):
                    merged[key] = "; ".join(sorted({str(x) for x in xs}))
                else:
                    merged[key] = xs[-1]
            agg[ph] = merged
        out.append(agg)
    return out


def build_report(
    args: argparse.Namespace,
    targets: list[Target],
    results: list[dict[str, Any]],
    started: _dt.datetime,
    raw: list[dict[str, Any]],
) -> str:
    facts = machine_facts()
    out = [
        f"## Benchmark run {started.strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in facts.items()),
        "",
        "Command: `" + " ".join(["python", *sys.argv]) + "`",
        "",
        *[
            f"- {t.label}: `{' '.join(t.cmd) if t.cmd else t.bootstrap}`"
            + (f" (pid {t.pid})" if t.pid else " (no pid: CPU/RSS not measured)")
            for t in targets
        ],
        "",
        *([f"Figures are per-figure medians of {args.repeat} rounds.", ""] if args.repeat > 1 else []),
        *([f"Under CPU contention: {args.busy} busy-loop processes ran beside the brokers (--busy, "
            f"--busy-session {args.busy_session}).", ""]
          if args.busy else []),
        f"Produce: linger.ms={args.linger_ms:g}, as fast as possible; consume: assign() from offset 0, "
        "fetch.queue.backoff.ms=1; "
        f"e2e: {args.e2e_rate:,} msg/s for {args.e2e_seconds:g}s after {args.e2e_warmup:g}s warm-up, "
        f"linger.ms={args.e2e_linger_ms:g}, fetch.wait.max.ms={args.e2e_fetch_wait_ms or 'default (500)'}. "
        "Latencies in ms; CPU-s/M = CPU seconds per million messages; ⚠ = phase reported an error "
        "(see notes).",
        "",
        markdown_table(results, PERF_COLUMNS),
        "",
        "CPU (broker = broker process tree; client = this benchmark process incl. librdkafka threads; "
        "other = the rest of the machine during the phase, a noise indicator):",
        "",
        markdown_table(results, CPU_COLUMNS),
        "",
        rss_table(targets, raw),
    ]
    notes = []
    for t in targets:
        for n in t.notes:
            notes.append(f"- {t.label}: {n}")
    for r in results:
        if "error" in r:
            notes.append(f"- {r['broker']} {r['scenario']}: {r['error']}")
        for ph, v in r.items():
            if isinstance(v, dict):
                if "error" in v:
                    notes.append(f"- {r['broker']} {r['scenario']} {ph}: {v['error']}")
                if "note" in v:
                    notes.append(f"- {r['broker']} {r['scenario']} {ph}: {v['note']}")
    if notes:
        out += ["", "Notes:", "", *notes]
    return "\n".join(out)
