"""Turn a compat results file into docs/compatibility.md (and compat/protocol_coverage.json).

    python -m compat.report                      # the newest compat/results/*.json
    python -m compat.report compat/results/X.json [--out docs/compatibility.md]
    python -m compat.report PYKBROKER.json KAFKA.json   # one column per broker label in "Across brokers"
    python -m compat.report SINGLE.json CLUSTER3.json    # one pykbroker, then 3 brokers (--pykbroker-cluster 3)
    python -m compat.report --check FILES ...            # and exit 1 on a failure (scripts/test.sh)

With several results files the first is the table in full (the broker under test); each file, the
first included, also gets a column, named by its broker label (`--broker-label`, or the label the
suite gives the pykbroker it starts), in the totals per client and in the list of scenarios whose
outcome differs between the brokers; the page names the results file behind each column.

The coverage file lists which (API key, version) pairs the run's clients actually sent, as recorded
by the suite's proxy; tests/test_protocol_coverage.py reads it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from compat.admin_cli import CLIENT as ADMIN_CLI
from compat.clients import CLIENT_NAMES
from compat.tools import PREFIX as TOOLS_PREFIX
from compat.wire import api_name

COMPAT = Path(__file__).resolve().parent
REPO = COMPAT.parent
RESULTS = COMPAT / "results"
COVERAGE = COMPAT / "protocol_coverage.json"
DOC = REPO / "docs" / "compatibility.md"

CLIENT_IDS = [("compat-confluent", "confluent-kafka"), ("compat-kcat", "kcat"), ("compat-kafka-python", "kafka-python"),
              ("compat-aiokafka", "aiokafka"), ("compat-kafkajs", "kafkajs"), ("compat-java", "java")]
HARNESS_IDS = ("compat-probe",)

def client_names(results: list[dict[str, Any]]) -> list[str]:
    """The client libraries, then Kafka's command-line tools of each release line that ran, then pykbroker's admin
    CLI when it ran."""
    tools = sorted({r["client"] for r in results if r["client"].startswith(TOOLS_PREFIX)})
    cli = [ADMIN_CLI] if any(r["client"] == ADMIN_CLI for r in results) else []
    return [*CLIENT_NAMES, *tools, *cli]


CELL = {"pass": "✅", "fail": "❌", "skipped": "skip"}


def _count_word(n: int) -> str:
    return {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine",
            10: "ten"}.get(n, str(n))


def client_of(client_id: str) -> str | None:
    if client_id.startswith(HARNESS_IDS):
        return None
    for prefix, name in CLIENT_IDS:
        if client_id.startswith(prefix):
            return name
    return client_id or "(no client id)"


def cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return ""
    if r["outcome"] == "not_supported":
        return {"client": "—", "cluster": "n/p"}.get(r.get("by", ""), "n/s")
    return CELL.get(r["outcome"], r["outcome"])


def exercised(doc: dict[str, Any]) -> dict[int, dict[int, list[str]]]:
    out: dict[int, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    for req in doc.get("requests", []):
        who = client_of(req["client_id"])
        if who is not None:
            out[req["api_key"]][req["api_version"]].add(who)
    return {k: {v: sorted(c) for v, c in sorted(vs.items())} for k, vs in sorted(out.items())}


def _ranges(versions: list[int]) -> str:
    if not versions:
        return "—"
    out, start, prev = [], versions[0], versions[0]
    for v in [*versions[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(f"{start}" if start == prev else f"{start}–{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(out)


def tested_commit(doc: dict[str, Any]) -> str | None:
    """The commit the run tested: HEAD when the suite ran, as recorded in the results file (``commit``,
    or the ``(git SHA[+dirty])`` the suite puts in a managed broker's label), not the commit that
    later carries the generated document."""
    if doc.get("commit"):
        return str(doc["commit"])
    m = re.search(r"\(git ([0-9a-f]{7,40}(?:\+dirty)?)\)", doc["broker"].get("label", ""))
    return m.group(1) if m else None


def render(doc: dict[str, Any], source: str, compared_with: list[str] | None = None) -> str:
    results = doc["results"]
    single = [r for r in results if "producer" not in r and r["client"] != "mixed"]
    cross = [r for r in results if "producer" in r]
    mixed = [r for r in results if r["client"] == "mixed"]
    clients = [c for c in client_names(single) if any(r["client"] == c for r in single)]
    grid: dict[tuple[str, str], dict[str, Any]] = {(r["scenario"], r["client"]): r for r in single}
    families: dict[str, list[str]] = defaultdict(list)
    for r in single:
        if r["scenario"] not in families[r["family"]]:
            families[r["family"]].append(r["scenario"])

    b = doc["broker"]
    commit = tested_commit(doc)
    of_commit = f" of commit {commit}" if commit else ""
    lines = [
        "# Compatibility",
        "",
        f"<!-- Generated by `python -m compat.report` from {source}; do not edit by hand. -->",
        "",
        f"Generated from the results{of_commit} (the checked-out HEAD when the suite ran"
        + ("; `+dirty`: `pykbroker/` had uncommitted changes" if commit and commit.endswith("+dirty") else "")
        + "), which may be older than the commit that contains this page." if commit else
        "Generated from the results of a run against a broker whose commit the results do not record.",
        "",
        "The compatibility suite (`compat/`, see [compat/README.md](../compat/README.md)) runs the same scenarios",
        f"with {_count_word(len([c for c in clients if c in CLIENT_NAMES]))} independent implementations of the "
        "Kafka protocol" + (", Kafka's own command-line tools" if any(c.startswith(TOOLS_PREFIX) for c in clients)
                            else "")
        + (" and pykbroker's admin CLI" if ADMIN_CLI in clients else "") + ". Scenarios assert Kafka's documented",
        "behaviour only. This table comes from a real run:",
        "",
        f"- **Broker under test:** {b['label']}" + (" (started by the suite)" if b.get("managed") else ""),
        f"- **Date:** {doc['finished'][:10]} (run {doc['started']} – {doc['finished']}, "
        f"{doc['duration']:.0f} s with {doc.get('workers', 1)} pytest-xdist worker(s))",
        "- **Clients:** " + "; ".join(f"{k} {v}" for k, v in doc.get("clients", {}).items()),
        *([f"- **Compared with:** {'; '.join(compared_with)} (see [Across brokers](#across-brokers))"]
          if compared_with else []),
        "",
        "Legend: ✅ pass · ❌ fail · n/s not supported by the broker (its ApiVersions lacks an API the scenario "
        "needs) · — the client library cannot do this · n/p not possible on this cluster (e.g. one log dir).",
        "",
        "## Totals",
        "",
    ]
    # "Not possible on this cluster" gets a column only when some scenario had that outcome.
    np_col = _ns(results, "cluster") > 0
    lines += ["| client | pass | fail | not supported (broker) | not possible with the client |"
              + (" not possible on this cluster |" if np_col else ""),
              "|---|---:|---:|---:|---:|" + ("---:|" if np_col else "")]
    rows = [(c, [r for r in single if r["client"] == c]) for c in clients]
    rows += [("cross-client pairs", cross)] if cross else []
    rows += [("mixed-client group", mixed)] if mixed else []
    for name, rs in rows:
        lines.append(f"| {name} | {_count(rs, 'pass')} | {_count(rs, 'fail')} | {_ns(rs, 'broker')} | "
                     f"{_ns(rs, 'client')} |" + (f" {_ns(rs, 'cluster')} |" if np_col else ""))
    lines += ["", "## Scenarios", "", "| family | scenario | " + " | ".join(clients) + " |",
              "|---|---|" + "|".join(":---:" for _ in clients) + "|"]
    for fam in sorted(families):
        for sc in sorted(families[fam]):
            lines.append(f"| {fam} | `{sc}` | " + " | ".join(cell(grid.get((sc, c))) for c in clients) + " |")

    if cross:
        prods = [c for c in CLIENT_NAMES if any(r["producer"] == c for r in cross)]
        cons = [c for c in CLIENT_NAMES if any(r["consumer"] == c for r in cross)]
        cgrid = {(r["producer"], r["consumer"]): r for r in cross}
        lines += ["", "## Cross-client: produce with one, consume with another",
                  "", "Each pair writes one batch per codec (none, gzip, snappy, lz4, zstd) with keys, headers and "
                  "null values, and the other client reads them back.", "",
                  "| producer ↓ / consumer → | " + " | ".join(cons) + " |",
                  "|---|" + "|".join(":---:" for _ in cons) + "|"]
        for p in prods:
            lines.append(f"| {p} | " + " | ".join(cell(cgrid.get((p, c))) for c in cons) + " |")
    if mixed:
        lines += ["", "## One group, members from different clients", ""]
        for r in mixed:
            why = r["detail"].splitlines()[0][:200] if r.get("detail") and r["outcome"] != "pass" else ""
            lines.append(f"- `{r['scenario']}`: {cell(r)} {r['outcome']}" + (f" — {why}" if why else ""))

    reruns = [r for r in results if r.get("reruns")]
    if reruns:
        lines += ["", "## Reruns", "",
                  "Attempts that failed before a rerun (kept so that a flaky scenario stays visible):", ""]
        for r in sorted(reruns, key=lambda r: (r["scenario"], r["client"])):
            for attempt in r["reruns"]:
                detail = " ".join(attempt["detail"].replace("|", "\\|").split())[:300]
                lines.append(f"- `{r['scenario']}` with {r['client']} ({r['outcome']} in the end): {detail}")

    fails = [r for r in results if r["outcome"] == "fail"]
    if fails:
        lines += ["", "## Failures", ""]
        for r in sorted(fails, key=lambda r: (r["scenario"], r["client"])):
            detail = (r.get("detail") or "").replace("compat.clients.base.ClientError: ", "")
            detail = detail.replace("AssertionError: ", "")
            detail = detail.replace("\n", " ").replace("|", "\\|")
            detail = " ".join(detail.split())[:300]
            lines.append(f"- `{r['scenario']}` with {r['client']}: {detail}")
    ns = sorted({r["detail"] for r in results if r["outcome"] == "not_supported" and r.get("by") == "broker"})
    if ns:
        lines += ["", "## Not supported by this broker", ""] + [f"- {d}" for d in ns]

    adv = {int(k): tuple(v) for k, v in b.get("api_versions", {}).items()}
    ex = exercised(doc)
    if ex:
        lines += ["", "## Protocol coverage of this run", "",
                  "Versions of each API the clients sent during the run (recorded by the suite's proxy), against "
                  "what the broker advertises. `tests/test_protocol_coverage.py` checks that every advertised "
                  "version is exercised here or by a direct protocol test.", "",
                  "| key | API | advertised | sent by the clients | by |", "|---:|---|---|---|---|"]
        for k in sorted(set(adv) | set(ex)):
            vs = sorted(ex.get(k, {}))
            who = sorted({c for v in ex.get(k, {}).values() for c in v})
            a = f"{adv[k][0]}–{adv[k][1]}" if k in adv else "not advertised"
            lines.append(f"| {k} | {api_name(k)} | {a} | {_ranges(vs)} | {', '.join(who)} |")
    lines.append("")
    return "\n".join(lines)


def _row_key(r: dict[str, Any]) -> tuple[str, str]:
    return r["scenario"], r["client"]


def broker_labels(docs: list[dict[str, Any]]) -> list[str]:
    """One column name per results file: its broker label, made unique by the run's date if needed."""
    labels = [d["broker"]["label"] for d in docs]
    out = []
    for d, label in zip(docs, labels, strict=True):
        out.append(f"{label} ({d['finished'][:16]})" if labels.count(label) > 1 else label)
    return out


def _totals_cell(rs: list[dict[str, Any]]) -> str:
    if not rs:
        return ""
    np = _ns(rs, "cluster")
    return (f"{_count(rs, 'pass')} ✅ · {_count(rs, 'fail')} ❌ · {_ns(rs, 'broker')} n/s · "
            f"{_ns(rs, 'client')} —" + (f" · {np} n/p" if np else ""))


def _broker_setup(d: dict[str, Any]) -> str:
    b = d["broker"]
    if not b.get("managed"):
        return f"an existing cluster at {b.get('bootstrap', '?')}"
    n = int(b.get("brokers", 1))
    if b.get("kafka"):
        where = "Maven Central's jars (compat/kafka/pom.xml)"
        if b.get("zookeeper"):
            return (f"started by the suite from {where}: ZooKeeper and "
                    + (f"{n} brokers, clients bootstrap from one of them" if n != 1 else "one broker"))
        return f"started by the suite from {where}: one KRaft node (broker and controller)"
    if b.get("zookeeper"):
        return (f"started by the suite: ZooKeeper and {n} broker{'s' if n != 1 else ''}, clients bootstrap "
                "from one of them")
    return "started by the suite: one broker"


def wall_time(d: dict[str, Any]) -> str:
    """The run's wall time (broker start to results), e.g. "3 min 21 s with 2 workers"."""
    secs = round(float(d.get("duration", 0)))
    workers = int(d.get("workers", 1))
    return (f"{secs // 60} min {secs % 60} s" if secs >= 60 else f"{secs} s") + \
        f" with {workers} worker{'s' if workers != 1 else ''}"


def render_brokers(docs: list[dict[str, Any]], sources: list[str] | None = None) -> list[str]:
    """The "Across brokers" section: a column per broker label, and which results file each comes from."""
    labels = broker_labels(docs)
    sources = sources or ["" for _ in docs]
    lines = ["", "## Across brokers", "",
             "The same suite against each broker (one results file each; the column is named by the run's broker "
             "label). The first column is the run shown in full above. "
             "Cells: pass ✅ · fail ❌ · not supported by the broker n/s · not possible with the client — · "
             "not possible on this cluster n/p.", "",
             "| broker | results file | setup | run | wall time | clients |", "|---|---|---|---|---|---|"]
    for d, label, src in zip(docs, labels, sources, strict=True):
        lines.append(f"| {label} | {f'`{src}`' if src else '—'} | {_broker_setup(d)} | "
                     f"{d['started']} – {d['finished']} | {wall_time(d)} | "
                     + "; ".join(f"{k} {v}" for k, v in d.get("clients", {}).items()) + " |")
    groups: list[tuple[str, Any]] = [(c, lambda r, c=c: r["client"] == c and "producer" not in r)
                                     for c in client_names([r for d in docs for r in d["results"]])]
    groups += [("cross-client pairs", lambda r: "producer" in r),
               ("mixed-client group", lambda r: r["client"] == "mixed")]
    lines += ["", "| client | " + " | ".join(labels) + " |", "|---|" + "|".join("---" for _ in labels) + "|"]
    for name, pick in groups:
        cells = [_totals_cell([r for r in d["results"] if pick(r)]) for d in docs]
        if any(cells):
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    grids = [{_row_key(r): r for r in d["results"]} for d in docs]
    keys = sorted({k for g in grids for k in g})
    differ = [k for k in keys if len({cell(g.get(k)) for g in grids}) > 1]
    lines += ["", "### Scenarios whose outcome differs between brokers", ""]
    if not differ:
        lines.append("None: every scenario has the same outcome on every broker.")
        return lines
    lines += ["| scenario | client | " + " | ".join(labels) + " |",
              "|---|---|" + "|".join(":---:" for _ in labels) + "|"]
    for k in differ:
        lines.append(f"| `{k[0]}` | {k[1]} | " + " | ".join(cell(g.get(k)) or "not run" for g in grids) + " |")
    notes = []
    for k in differ:
        for g, label in zip(grids, labels, strict=True):
            r = g.get(k)
            if r is not None and r["outcome"] in ("fail", "not_supported") and r.get("detail"):
                detail = " ".join(r["detail"].replace("|", "\\|").split())[:300]
                notes.append(f"- `{k[0]}` with {k[1]} on {label}: {detail}")
    if notes:
        lines += ["", *notes]
    return lines


def _count(rs: list[dict[str, Any]], outcome: str) -> int:
    return sum(r["outcome"] == outcome for r in rs)


def _ns(rs: list[dict[str, Any]], by: str) -> int:
    return sum(r["outcome"] == "not_supported" and r.get("by") == by for r in rs)


def is_kafka(d: dict[str, Any]) -> bool:
    """A run against Apache Kafka that the suite started (``--kafka``)."""
    return bool(d["broker"].get("kafka"))


def _shape(d: dict[str, Any]) -> int:
    return int(d["broker"].get("brokers", 1))


def check(docs: list[dict[str, Any]], sources: list[str]) -> tuple[list[str], list[str]]:
    """What makes a set of runs fail, and what only differs.

    Problems: a scenario that fails on Apache Kafka (scenarios assert Kafka's behaviour, so the scenario is
    wrong, or asks for what that Kafka lacks and must say so), and any failure on another broker, named
    with the Kafka runs of the same shape (one broker, or as many) on which the same scenario and client
    passed. Differences: a scenario that passes on Kafka and is not supported by pykbroker of that shape."""
    problems: list[str] = []
    notes: list[str] = []
    labels = broker_labels(docs)
    kafka = [(d, label) for d, label in zip(docs, labels, strict=True) if is_kafka(d)]
    for d, label, src in zip(docs, labels, sources, strict=True):
        same = [(k, kl) for k, kl in kafka if _shape(k) == _shape(d) and k is not d]
        passed = {kl: {_row_key(r) for r in k["results"] if r["outcome"] == "pass"} for k, kl in same}
        for r in sorted(d["results"], key=_row_key):
            key = _row_key(r)
            on = [kl for kl, keys in passed.items() if key in keys]
            detail = " ".join((r.get("detail") or "").split())[:300]
            if r["outcome"] == "fail":
                if is_kafka(d):
                    problems.append(f"`{key[0]}` with {key[1]} fails on {label} ({src}): a scenario must hold on "
                                    f"Apache Kafka; fix it, or make it say what it needs that this Kafka lacks. "
                                    f"{detail}")
                else:
                    passes = f", and passes on {', '.join(on)}" if on else ""
                    problems.append(f"`{key[0]}` with {key[1]} fails on {label} ({src}){passes}. {detail}")
            elif r["outcome"] == "not_supported" and r.get("by") == "broker" and on and not is_kafka(d):
                notes.append(f"`{key[0]}` with {key[1]} is not supported by {label} and passes on "
                             f"{', '.join(on)}: {detail}")
    return problems, notes


def coverage_doc(doc: dict[str, Any], source: str) -> dict[str, Any]:
    return {
        "generated_from": source,
        "broker": doc["broker"]["label"],
        "date": doc["finished"],
        "advertised": doc["broker"].get("api_versions", {}),
        "exercised": {str(k): {str(v): c for v, c in vs.items()} for k, vs in exercised(doc).items()},
    }


def newest_results() -> Path:
    files = sorted(RESULTS.glob("*.json"))
    if not files:
        raise SystemExit("no results in compat/results/: run `pytest compat` first")
    return files[-1]


def _source(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return path.name


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="*", type=Path,
                   help="results files; the first is shown in full, each gets a column under 'Across brokers'")
    p.add_argument("--out", type=Path, default=DOC)
    p.add_argument("--coverage", type=Path, default=COVERAGE,
                   help="where to write the protocol coverage (only for a run against a suite-started pykbroker)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when a scenario fails on Apache Kafka (--kafka runs), or fails on another broker "
                        "(naming the Kafka runs of the same shape where it passed); list what Kafka passes and "
                        "the other broker does not support")
    a = p.parse_args(argv)
    paths = a.results or [newest_results()]
    docs = [json.loads(p.read_text()) for p in paths]
    doc, path = docs[0], paths[0]
    source = ", ".join(_source(p) for p in paths)
    text = render(doc, source, broker_labels(docs)[1:])
    if len(docs) > 1:
        text = text.rstrip("\n") + "\n" + "\n".join(render_brokers(docs, [_source(p) for p in paths])) + "\n"
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    print(f"wrote {a.out}")
    if doc["broker"].get("managed") and doc.get("requests"):
        a.coverage.write_text(json.dumps(coverage_doc(doc, _source(path)), indent=1, sort_keys=True) + "\n")
        print(f"wrote {a.coverage}")
    if a.check:
        problems, notes = check(docs, [_source(p) for p in paths])
        for n in notes:
            print(f"compat: differs: {n}")
        for x in problems:
            print(f"compat: FAIL: {x}")
        print(f"compat: {len(problems)} failure(s), {len(notes)} difference(s) across {len(docs)} run(s)")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
