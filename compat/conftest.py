"""The compatibility suite's harness: the cluster under test, the clients, outcomes and the results file.

    pytest compat                          # starts pykbroker (behind a recording proxy) itself
    pytest compat --pykbroker-cluster 3    # starts ZooKeeper and 3 pykbroker brokers (a proxy each)
    pytest compat --kafka 3.9              # starts Apache Kafka 3.9 from Maven Central's jars (compat/kafka/)
    pytest compat --kafka 3.9 --kafka-brokers 3   # ... as ZooKeeper and 3 brokers
    pytest compat --bootstrap HOST:PORT    # runs against an existing cluster
"""

from __future__ import annotations

import json
import os
import struct
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from compat import admin_cli as compat_admin_cli
from compat import env, wire
from compat import tools as compat_tools
from compat.clients import CLIENT_NAMES, client_versions, make_client
from compat.clients.base import CAP_TEXT, Client, ClientError, NotSupportedByClient, Sasl
from compat.cluster import ClusterInfo, ManagedPykbroker, ManagedPykbrokerCluster, external, recorded_requests
from compat.realkafka import KafkaSetupError, ManagedKafka, release, releases
from compat.scenario import NS_BROKER, NS_CLIENT, NS_CLUSTER, broker_gaps, needed_versions

_CONFIG: dict[str, pytest.Config] = {}
RESULTS_DIR = Path(__file__).resolve().parent / "results"

# Cross-client pairs use these (every ordered pair, the same client included).
CROSS_CLIENTS = ["confluent-kafka", "java", "kafka-python", "kafkajs", "aiokafka", "kcat", "franz-go", "sarama",
                 "kafka-go"]


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("compat", "compatibility suite")
    g.addoption("--bootstrap", default=None,
                help="HOST:PORT of an existing cluster to test (default: start a pykbroker subprocess)")
    g.addoption("--sasl-bootstrap", default=None, metavar="HOST:PORT",
                help="with --bootstrap: the cluster's SASL_PLAINTEXT listener, set up as compat/README.md says, "
                     "for the security scenarios (without it they are 'not possible on this cluster')")
    g.addoption("--broker-label", default=None,
                help='what the cluster is, for the results (e.g. "Apache Kafka 3.9.0")')
    g.addoption("--clients", default=None, help=f"comma-separated subset of {','.join(CLIENT_NAMES)}")
    g.addoption("--results", default=None, help="results file (default compat/results/<UTC time>.json)")
    g.addoption("--wire-trace", default=None, metavar="FILE",
                help="with the pykbroker the suite starts: write every request and response frame on every "
                     "connection (time, client id, API key/version, correlation id) to FILE as JSON lines")
    g.addoption("--pykbroker-cluster", type=int, default=0, metavar="N",
                help="start a ZooKeeper and N pykbroker brokers (ids 1..N, each behind its own recording "
                     "proxy, internal topics with min(3, N) replicas) and test through the first broker's "
                     "address, instead of one broker")
    g.addoption("--kafka", default=None, metavar="LINE",
                help="start Apache Kafka from Maven Central's jars (compat/kafka/pom.xml) and test it instead of "
                     "pykbroker: a release line the pom pins (" + _kafka_lines() + "); 3.x runs on ZooKeeper, "
                     "4.x in KRaft mode")
    g.addoption("--kafka-brokers", type=int, default=1, metavar="N",
                help="with --kafka on a ZooKeeper line: N brokers (ids 1..N, internal topics with min(3, N) "
                     "replicas), clients bootstrap from the first")
    g.addoption("--pykbroker-override", action="append", default=[], metavar="KEY=VALUE",
                help="a setting for the pykbroker the suite starts (repeatable), e.g. "
                     "group.coordinator.rebalance.protocols=classic to see the suite against a broker without KIP-848")


def _kafka_lines() -> str:
    try:
        return ", ".join(f"{line} = {r.version}" for line, r in releases().items())
    except (OSError, KafkaSetupError) as e:
        return f"unreadable: {e}"


Managed = ManagedPykbroker | ManagedPykbrokerCluster | ManagedKafka


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _selected_clients(config: pytest.Config) -> list[str]:
    opt = config.getoption("--clients")
    if not opt:
        return list(CLIENT_NAMES)
    names = [c.strip() for c in opt.split(",") if c.strip()]
    bad = [n for n in names if n not in CLIENT_NAMES and not n.startswith(compat_tools.PREFIX)]
    if bad:
        raise pytest.UsageError(f"unknown clients {bad}; choose from {CLIENT_NAMES} and "
                                f"{compat_tools.PREFIX}<line> (Kafka's command-line tools)")
    return [n for n in names if n in CLIENT_NAMES]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "compat_scenario(name, family, needs, apis, consumes): a compat scenario")
    _CONFIG["config"] = config
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning")
    config._compat = {"results": {}, "started": time.time(), "cluster": None, "managed": None}  # type: ignore[attr-defined]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    state = config._compat  # type: ignore[attr-defined]
    if _is_worker(config):
        state["cluster"] = ClusterInfo.from_json(config.workerinput["compat_cluster"])  # type: ignore[attr-defined]
        return
    if config.getoption("collectonly"):
        return
    # Clients first (jars, javac, npm ci): a broken setup should fail before a broker is started.
    selected = set(_selected_clients(config))
    if "java" in selected:
        env.java_classpath()
    if "kafkajs" in selected:
        env.node_modules()
    if "kcat" in selected:
        env.kcat()
    for name in env.GO_DRIVERS:
        if name in selected:
            env.go_driver(name)
    bootstrap = config.getoption("--bootstrap")
    size = config.getoption("--pykbroker-cluster")
    if bootstrap and size:
        raise pytest.UsageError("--bootstrap tests an existing cluster, --pykbroker-cluster starts one: not both")
    if size < 0:
        raise pytest.UsageError(f"--pykbroker-cluster wants a number of brokers, got {size}")
    if config.getoption("--sasl-bootstrap") and not bootstrap:
        raise pytest.UsageError("--sasl-bootstrap goes with --bootstrap (the suite's own brokers have one already)")
    kafka = config.getoption("--kafka")
    kafka_brokers = config.getoption("--kafka-brokers")
    if kafka_brokers != 1 and not kafka:
        raise pytest.UsageError("--kafka-brokers goes with --kafka")
    if kafka and (bootstrap or size or config.getoption("--pykbroker-override") or config.getoption("--wire-trace")):
        raise pytest.UsageError("--kafka starts Apache Kafka: not with --bootstrap, --pykbroker-cluster, "
                                "--pykbroker-override or --wire-trace")
    if bootstrap:
        state["cluster"] = external(bootstrap, config.getoption("--broker-label"), config.getoption("--sasl-bootstrap"))
    elif kafka:
        try:
            kafka_managed = ManagedKafka(release(kafka), kafka_brokers)
        except (KafkaSetupError, ValueError) as e:
            raise pytest.UsageError(str(e)) from None
        state["managed"] = kafka_managed
        info = kafka_managed.start()
        if config.getoption("--broker-label"):
            info.label = config.getoption("--broker-label")
        state["cluster"] = info
    else:
        overrides = {}
        for kv in config.getoption("--pykbroker-override"):
            key, sep, value = kv.partition("=")
            if not sep:
                raise pytest.UsageError(f"--pykbroker-override wants KEY=VALUE, got {kv!r}")
            overrides[key.strip()] = value.strip()
        trace = config.getoption("--wire-trace")
        trace_file = Path(trace).resolve() if trace else None
        managed: ManagedPykbroker | ManagedPykbrokerCluster = (
            ManagedPykbrokerCluster(size, overrides=overrides, trace_file=trace_file) if size
            else ManagedPykbroker(overrides=overrides, trace_file=trace_file))
        state["managed"] = managed
        info = managed.start()
        if config.getoption("--broker-label"):
            info.label = config.getoption("--broker-label")
        state["cluster"] = info


def pytest_configure_node(node: Any) -> None:  # pytest-xdist: hand the cluster to each worker
    node.workerinput["compat_cluster"] = node.config._compat["cluster"].to_json()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    names = _selected_clients(metafunc.config)
    if "client" in metafunc.fixturenames:
        metafunc.parametrize("client", names, indirect=True)
    if "tools" in metafunc.fixturenames:
        lines = _selected_tool_lines(metafunc.config)
        metafunc.parametrize("tools", [compat_tools.PREFIX + ln for ln in lines], indirect=True)
    if "pair" in metafunc.fixturenames:
        pairs = [(p, c) for p in CROSS_CLIENTS for c in CROSS_CLIENTS if p in names and c in names]
        metafunc.parametrize("pair", pairs, ids=[f"{p}->{c}" for p, c in pairs], indirect=True)


def _selected_tool_lines(config: pytest.Config) -> list[str]:
    """The release lines whose tools run: every line against pykbroker, the broker's own line against Apache
    Kafka (the comparison is per line); ``--clients`` without ``kafka-tools-<line>`` leaves a line out."""
    try:
        lines = list(releases())
    except (OSError, KafkaSetupError):
        return []
    kafka = config.getoption("--kafka")
    if kafka:
        lines = [ln for ln in lines if ln == kafka]
    opt = config.getoption("--clients")
    if opt:
        wanted = {c.strip() for c in opt.split(",")}
        lines = [ln for ln in lines if compat_tools.PREFIX + ln in wanted]
    return lines


# --- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> ClusterInfo:
    info = request.config._compat["cluster"]  # type: ignore[attr-defined]
    if info is None:
        pytest.fail("no cluster (collect-only run?)")
    return info


_clients: dict[str, Client] = {}
_secure_clients: dict[tuple[str, Sasl], Client] = {}


def get_client(name: str, cluster: ClusterInfo) -> Client:
    if name not in _clients:
        _clients[name] = make_client(name, cluster.bootstrap)
    return _clients[name]


def get_secure_client(name: str, cluster: ClusterInfo, sasl: Sasl) -> Client:
    """A client of the secured listener authenticating as ``sasl`` (one per client and identity; a wrong
    password gets a fresh one each time, so no failed state is shared)."""
    if cluster.sasl_bootstrap is None:
        pytest.skip(f"{NS_CLUSTER}: no SASL_PLAINTEXT listener (give --sasl-bootstrap with --bootstrap)")
    key = (name, sasl)
    if key not in _secure_clients:
        _secure_clients[key] = make_client(name, cluster.sasl_bootstrap, sasl)
    return _secure_clients[key]


@pytest.fixture(scope="session", autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    for c in [*_clients.values(), *_secure_clients.values()]:
        try:
            c.close()
        except Exception:
            pass
    _clients.clear()
    _secure_clients.clear()


def _check_supported(request: pytest.FixtureRequest, cluster: ClusterInfo, clients: list[Client],
                     consumers: list[Client] | None = None) -> None:
    mark = request.node.get_closest_marker("compat_scenario")
    if mark is None:
        return
    for c in clients:
        lacking = [n for n in mark.kwargs["needs"] if n not in c.caps]
        if lacking:
            pytest.skip(f"{NS_CLIENT}: {c.name} has no " + ", ".join(CAP_TEXT.get(x, x) for x in lacking))
    needed = list(mark.kwargs["apis"])
    if mark.kwargs["consumes"]:
        for c in clients if consumers is None else consumers:
            needed += list(getattr(c, "consume_apis", ()))
    versions = needed_versions(needed, [c.api_versions_needed for c in clients])
    gaps = broker_gaps(cluster.api_versions, versions)
    if gaps:
        pytest.skip(f"{NS_BROKER}: ApiVersions: " + "; ".join(gaps))


@pytest.fixture
def client(request: pytest.FixtureRequest, cluster: ClusterInfo) -> Client:
    c = get_client(request.param, cluster)
    _check_supported(request, cluster, [c])
    return c


@pytest.fixture
def pair(request: pytest.FixtureRequest, cluster: ClusterInfo) -> tuple[Client, Client]:
    p, c = request.param
    clients = [get_client(p, cluster), get_client(c, cluster)]
    _check_supported(request, cluster, clients, consumers=clients[1:])
    return clients[0], clients[1]


_tools: dict[str, compat_tools.KafkaTools] = {}


@pytest.fixture
def tools(request: pytest.FixtureRequest, cluster: ClusterInfo) -> compat_tools.KafkaTools:
    """Kafka's command-line tools of one release line (``kafka-tools-<line>``), pointed at the cluster."""
    name: str = request.param
    if name not in _tools:
        _tools[name] = compat_tools.KafkaTools.for_line(name.removeprefix(compat_tools.PREFIX), cluster.bootstrap)
    _check_supported(request, cluster, [])
    return _tools[name]


@pytest.fixture
def admin_cli(cluster: ClusterInfo) -> compat_admin_cli.AdminCli:
    """pykbroker's admin CLI (``python -m pykbroker``), pointed at the cluster (and its SASL listener)."""
    return compat_admin_cli.AdminCli(cluster.bootstrap, cluster.sasl_bootstrap)


@pytest.fixture
def helper(cluster: ClusterInfo) -> Client:
    """A client for a scenario's setup steps that the client under test cannot do (kcat has no admin API)."""
    return get_client("confluent-kafka", cluster)


@pytest.fixture
def new_topic(request: pytest.FixtureRequest, helper: Client, cluster: ClusterInfo) -> Any:
    """Factory: a uniquely named topic, created through the helper client (names are unique per run so
    a shared cluster can be used)."""
    mark = request.node.get_closest_marker("compat_scenario")
    base = (mark.kwargs["name"] if mark else request.node.name).replace("/", ".")
    created: list[str] = []

    def make(partitions: int = 1, configs: dict[str, str] | None = None, create: bool = True,
             name: str | None = None) -> str:
        name = name if name is not None else unique_topic(base)
        if create:
            helper.create_topic(name, partitions, 1, configs)
            created.append(name)
            wait_writable(helper, name, partitions)
            wait_known_everywhere(cluster, name, partitions)
        return name

    yield make
    for t in created:
        try:
            helper.delete_topic(t)
        except Exception:
            pass


def wait_writable(helper: Client, topic: str, partitions: int, timeout: float = 30.0) -> None:
    """Wait, as Kafka's own tests do after creating a topic, until every partition has a leader in the
    metadata and that leader answers ListOffsets for it, i.e. has taken up leadership and accepts writes.

    Why: CreateTopics returns before the leaders are ready, and Kafka answers NOT_LEADER_OR_FOLLOWER
    for a moment; a producer without idempotence (kafkajs) then resends its whole request, duplicating
    the partitions that had succeeded (seen in about 2 % of runs against Kafka 3.8).
    """
    deadline = time.monotonic() + timeout
    pending = set(range(partitions))
    last = ""
    while True:
        try:
            leaders = helper.partition_leaders(topic)
            for p in sorted(pending):
                if leaders.get(p, -1) >= 0:
                    helper.list_offset(topic, p, "latest")
                    pending.discard(p)
        except ClientError as e:  # e.g. NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION: not yet
            last = str(e)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"partitions {sorted(pending)} of {topic} have no writable leader after {timeout}s "
                               f"({last or 'no leader in the metadata'})")
        time.sleep(0.05)


def wait_known_everywhere(cluster: ClusterInfo, topic: str, partitions: int, timeout: float = 30.0) -> None:
    """In a cluster of several brokers, wait until every broker's own Metadata lists every partition of
    ``topic`` with a leader.

    Why: each broker learns a new topic on its own (in ZooKeeper mode, from the controller's
    UpdateMetadata), and a request that names the topic to a broker that has not learnt it yet is
    answered UNKNOWN_TOPIC_OR_PARTITION; a client may send it to any broker (kafka-python's
    IncrementalAlterConfigs for a topic does), so the scenario waits as Kafka's own tests do.
    """
    deadline = time.monotonic() + timeout
    pending = wire.broker_addresses(cluster.bootstrap)
    if len(pending) < 2:
        return
    last: object = None
    while pending:
        for broker, address in sorted(pending.items()):
            try:
                leaders = wire.topic_leaders(address, topic)
                last = (broker, leaders)
                if len(leaders) == partitions and all(v >= 0 for v in leaders.values()):
                    del pending[broker]
            except (OSError, ConnectionError, RuntimeError, struct.error) as e:
                last = e
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"brokers {sorted(pending)} do not list all {partitions} partitions of {topic} with a "
                               f"leader after {timeout}s (last: {last})")
        time.sleep(0.05)


def unique_topic(base: str) -> str:
    clean = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in base)[:80]
    return f"compat-{clean}-{uuid.uuid4().hex[:10]}"


# --- outcomes ---------------------------------------------------------------------------------

@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    try:
        return (yield)
    except NotSupportedByClient as e:
        pytest.skip(f"{NS_CLIENT}: {e}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        mark = item.get_closest_marker("compat_scenario")
        if mark is None:
            continue
        params = getattr(item, "callspec", None)
        p = params.params if params else {}
        if "pair" in p:
            prod, cons = p["pair"]
            info = {"client": f"{prod}->{cons}", "producer": prod, "consumer": cons}
        elif "tools" in p:
            info = {"client": p["tools"]}
        elif "client" in p:
            info = {"client": p["client"]}
        elif "admin_cli" in getattr(item, "fixturenames", ()):
            info = {"client": compat_admin_cli.CLIENT}
        else:
            info = {"client": "mixed"}
        name = mark.kwargs["name"]
        for k, v in p.items():
            if k not in ("client", "pair", "tools"):
                name += f"[{v}]"
        info.update({"scenario": name, "family": mark.kwargs["family"]})
        item.user_properties.append(("compat", info))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    config = _CONFIG.get("config")
    if config is None or _is_worker(config):
        return
    props = dict(report.user_properties).get("compat")
    if props is None:
        return
    results = config._compat["results"]  # type: ignore[attr-defined]
    r = results.setdefault(report.nodeid, {**props, "nodeid": report.nodeid, "outcome": "pass",
                                           "duration": 0.0, "detail": ""})
    r["duration"] = round(r["duration"] + report.duration, 3)
    if report.outcome == "rerun":
        # A failed attempt that a rerun plugin (pytest-rerunfailures) retries: kept, never hidden.
        r.setdefault("reruns", []).append({"phase": report.when, "detail": _failure_text(report)})
        return
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        if reason.startswith(NS_BROKER):
            r.update(outcome="not_supported", by="broker", detail=reason)
        elif reason.startswith(NS_CLIENT):
            r.update(outcome="not_supported", by="client", detail=reason)
        elif reason.startswith(NS_CLUSTER):
            r.update(outcome="not_supported", by="cluster", detail=reason)
        else:
            r.update(outcome="skipped", detail=reason)
    elif report.failed:
        r.update(outcome="fail", phase=report.when, detail=_failure_text(report))


def _failure_text(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)[-1500:]
    return text[:2000]


def _workers(config: pytest.Config) -> int:
    try:
        n = config.getoption("numprocesses")
    except ValueError:
        return 1
    return int(n or 1) if not isinstance(n, str) else os.cpu_count() or 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = config._compat  # type: ignore[attr-defined]
    if _is_worker(config):
        return
    managed: Managed | None = state.get("managed")
    if managed is not None:
        managed.stop()
    info: ClusterInfo | None = state.get("cluster")
    if info is None or not state["results"]:
        if managed is not None:
            managed.cleanup()
        return
    requests = recorded_requests(info.record_files)
    finished = time.time()
    doc = {
        "broker": {"label": info.label, "bootstrap": info.bootstrap, "managed": info.managed, "brokers": info.brokers,
                   "zookeeper": isinstance(managed, ManagedPykbrokerCluster)
                   or (isinstance(managed, ManagedKafka) and managed.zookeeper),
                   **({"kafka": managed.rel.version} if isinstance(managed, ManagedKafka) else {}),
                   "api_versions": {str(k): list(v) for k, v in sorted(info.api_versions.items())}},
        "started": datetime.fromtimestamp(state["started"], UTC).isoformat(timespec="seconds"),
        "finished": datetime.fromtimestamp(finished, UTC).isoformat(timespec="seconds"),
        "duration": round(finished - state["started"], 1),
        "workers": _workers(config),
        "clients": client_versions(),
        "results": sorted(state["results"].values(), key=lambda r: (r["family"], r["scenario"], r["client"])),
        "requests": requests,
    }
    out = config.getoption("--results")
    suffix = (managed.results_suffix if isinstance(managed, ManagedKafka)
              else f"-cluster{managed.size}" if isinstance(managed, ManagedPykbrokerCluster) else "")
    path = Path(out) if out else RESULTS_DIR / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}{suffix}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    counts: dict[str, int] = {}
    for r in doc["results"]:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(f"compat: results in {path} ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))})")
        for r in doc["results"]:
            for attempt in r.get("reruns", []):
                first = " ".join(attempt["detail"].split())[:500]
                tr.write_line(f"compat: RERUN {r['nodeid']} ({r['outcome']} in the end) failed first in "
                              f"{attempt['phase']}: {first}")
        if managed is not None:
            who = f"Apache Kafka {managed.rel.version}" if isinstance(managed, ManagedKafka) else "pykbroker"
            tr.write_line(f"compat: {who}'s log{'s are' if len(managed.log_files) > 1 else ' is'} "
                          + ", ".join(str(p) for p in managed.log_files))
    if managed is not None:
        managed.cleanup()
